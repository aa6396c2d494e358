//! `cortiq logits`: the logits at every position of an exact token sequence (no BOS added),
//! written to a .npy file [T, vocab], for comparing against a reference implementation.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use cortiq_engine::Logits;

use crate::common::{Common, open_model};

/// The flags of `cortiq logits`.
#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub common: Common,
    /// Comma-separated token ids (no BOS is added).
    #[arg(long, value_delimiter = ',', required = true)]
    pub tokens: Vec<u32>,
    /// Output .npy file (f32 [T, vocab]).
    #[arg(short, long)]
    pub out: PathBuf,
    /// Positions per forward step.
    #[arg(short, long, default_value_t = 512)]
    pub batch: usize,
}

/// `cortiq logits`: the tokens in `--batch`-sized forward steps, every position's logits kept.
pub fn cmd_logits(a: LogitsArgs) -> Result<()> {
    let loaded = open_model(&a.common)?;
    let model = &loaded.model;
    let n = a.tokens.len();
    let mut state = model.new_state(n);
    let mut out = Vec::with_capacity(n * model.cfg.vocab);
    for c in a.tokens.chunks(a.batch.max(1)) {
        out.extend(model.forward(c, &mut state, Logits::From(0))?);
    }
    cortiq_formats::npy::write_f32(&a.out, &[n, model.cfg.vocab], &out)?;
    eprintln!("wrote {} [{n}, {}]", a.out.display(), model.cfg.vocab);
    Ok(())
}
