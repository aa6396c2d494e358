//! `--profile`: where the time of a run went, per op class (matvec/matmat per weight type,
//! activation quantization, attention, norms, RoPE, activations, embedding, sampling, and the
//! pool's wait for stragglers). Counters are process-wide atomics; when profiling is off a
//! span costs one relaxed load and a branch (no clock read), so the hooks stay in release
//! builds. Spans are taken on the calling thread around whole parallel loops (wall time of the
//! op, all threads together), never inside kernels.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use cortiq_kernels::quant::QuantType;

static ON: AtomicBool = AtomicBool::new(false);

/// Op classes other than the per-dtype matrix products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    QuantizeAct,
    Attention,
    Mixer,
    Conv,
    DeltaRule,
    Norm,
    Rope,
    Activation,
    Embedding,
    Sampling,
    Experts,
    Other,
}

const OPS: [(Op, &str); 12] = [
    (Op::QuantizeAct, "quantize activations"),
    (Op::Attention, "attention"),
    (Op::Mixer, "mixers (gates, gathers, output norm)"),
    (Op::Conv, "causal conv"),
    (Op::DeltaRule, "delta rule (heads over the pool)"),
    (Op::Norm, "norms"),
    (Op::Rope, "rope"),
    (Op::Activation, "ffn activation"),
    (Op::Embedding, "embedding"),
    (Op::Sampling, "sampling"),
    (Op::Experts, "experts (one per thread)"),
    (Op::Other, "other"),
];

/// Slots per dtype table: QuantType is a field-less enum well under this many variants.
const TYPES: usize = 64;

struct Counter {
    ns: AtomicU64,
    calls: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: Counter = Counter { ns: AtomicU64::new(0), calls: AtomicU64::new(0) };
static OP_COUNTERS: [Counter; OPS.len()] = [ZERO; OPS.len()];
static MATVEC: [Counter; TYPES] = [ZERO; TYPES];
static MATMAT: [Counter; TYPES] = [ZERO; TYPES];
static TYPE_NAME: [OnceLock<&'static str>; TYPES] = [const { OnceLock::new() }; TYPES];

/// Turn counting on or off (also the pool's wait timing).
pub fn enable(on: bool) {
    ON.store(on, Ordering::Relaxed);
    crate::par::pool().set_timing(on);
}

pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

thread_local! {
    /// Nanoseconds of the spans that ended inside the innermost running span of this thread.
    static NESTED: Cell<u64> = const { Cell::new(0) };
    /// Set while this thread runs work that a span of the calling thread times as a whole
    /// (`muted`): its own spans count nothing.
    static MUTED: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` with this thread's spans muted: for work spread over the pool's threads inside one
/// span of the caller (an MoE layer's experts, one per thread), whose ops would otherwise count
/// once per thread.
pub fn muted<R>(f: impl FnOnce() -> R) -> R {
    let was = MUTED.with(|m| m.replace(true));
    let r = f();
    MUTED.with(|m| m.set(was));
    r
}

fn on_here() -> bool {
    enabled() && !MUTED.with(|m| m.get())
}

/// A running span; adds its wall time less its nested spans' to its counter when dropped
/// (exclusive time: the activation quantization inside a prefill product counts once, as
/// quantization, and the lines of a report add up to at most the whole).
pub struct Span {
    start: Option<(Instant, &'static Counter, u64)>,
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((t0, c, outer)) = self.start {
            let ns = t0.elapsed().as_nanos() as u64;
            let inner = NESTED.with(|n| n.replace(outer.saturating_add(ns)));
            c.ns.fetch_add(ns.saturating_sub(inner), Ordering::Relaxed);
            c.calls.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn span_on(c: &'static Counter) -> Span {
    Span { start: on_here().then(|| (Instant::now(), c, NESTED.with(|n| n.replace(0)))) }
}

/// Time an op class until the returned guard drops.
#[inline]
pub fn span(op: Op) -> Span {
    if !on_here() {
        return Span { start: None };
    }
    let i = OPS.iter().position(|(o, _)| *o == op).unwrap_or(OPS.len() - 1);
    span_on(&OP_COUNTERS[i])
}

/// Time a matrix product over weights of `ty`: one token (`n_t == 1`, matvec) or several.
#[inline]
pub fn matmul(ty: QuantType, n_t: usize) -> Span {
    if !on_here() {
        return Span { start: None };
    }
    let i = (ty as usize).min(TYPES - 1);
    TYPE_NAME[i].get_or_init(|| ty.name());
    span_on(if n_t == 1 { &MATVEC[i] } else { &MATMAT[i] })
}

/// Add `ns` to the matrix-product counter of `ty` (one call), for a dispatch shared by several
/// matrices whose time the caller splits (timed on this thread, like a span).
pub fn add_matmul(ty: QuantType, n_t: usize, ns: f64) {
    if MUTED.with(|m| m.get()) {
        return;
    }
    let i = (ty as usize).min(TYPES - 1);
    TYPE_NAME[i].get_or_init(|| ty.name());
    let c = if n_t == 1 { &MATVEC[i] } else { &MATMAT[i] };
    c.ns.fetch_add(ns as u64, Ordering::Relaxed);
    c.calls.fetch_add(1, Ordering::Relaxed);
    // Time a running span of this thread encloses: not its own.
    NESTED.with(|n| n.set(n.get().saturating_add(ns as u64)));
}

/// Zero every counter (and the pool's wait time).
pub fn reset() {
    for c in OP_COUNTERS.iter().chain(&MATVEC).chain(&MATMAT) {
        c.ns.store(0, Ordering::Relaxed);
        c.calls.store(0, Ordering::Relaxed);
    }
    crate::par::pool().take_wait_nanos();
    crate::par::pool().take_busy_nanos();
}

/// One line of a profile report.
#[derive(Clone, Debug)]
pub struct Line {
    pub what: String,
    pub ms: f64,
    pub calls: u64,
}

/// The counters since the last `reset`, largest first (zero lines left out), plus "pool wait"
/// (time callers spent waiting for workers, part of the ops' own times) and "unaccounted"
/// (`total_ms` minus the op classes: serial glue the spans do not cover).
pub fn report(total_ms: f64) -> Vec<Line> {
    let get = |c: &Counter| (c.ns.load(Ordering::Relaxed) as f64 / 1e6, c.calls.load(Ordering::Relaxed));
    let mut lines = Vec::new();
    for (i, (_, name)) in OPS.iter().enumerate() {
        let (ms, calls) = get(&OP_COUNTERS[i]);
        lines.push(Line { what: name.to_string(), ms, calls });
    }
    for (i, name) in TYPE_NAME.iter().enumerate() {
        let name = name.get().copied().unwrap_or("?");
        let (ms, calls) = get(&MATVEC[i]);
        lines.push(Line { what: format!("matvec {name}"), ms, calls });
        let (ms, calls) = get(&MATMAT[i]);
        lines.push(Line { what: format!("matmat {name}"), ms, calls });
    }
    let accounted: f64 = lines.iter().map(|l| l.ms).sum();
    lines.retain(|l| l.calls > 0);
    lines.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    let wait = crate::par::pool().take_wait_nanos() as f64 / 1e6;
    lines.push(Line { what: "(pool wait, inside the above)".into(), ms: wait, calls: 0 });
    lines.push(Line { what: "unaccounted".into(), ms: (total_ms - accounted).max(0.0), calls: 0 });
    // Worker-thread time not spent in jobs, per worker: the caller's serial sections plus its
    // share of jobs running past the workers'.
    let pool = crate::par::pool();
    let workers = pool.n_threads().saturating_sub(1);
    if workers > 0 {
        let busy = pool.take_busy_nanos() as f64 / 1e6 / workers as f64;
        lines.push(Line { what: "(workers idle, per worker)".into(), ms: (total_ms - busy).max(0.0), calls: 0 });
    }
    lines
}

/// The report as text: one line per class with ms, share of `total_ms` and calls.
pub fn format_report(total_ms: f64) -> String {
    let mut s = format!("profile: {total_ms:.1} ms in all\n");
    for l in report(total_ms) {
        let share = if total_ms > 0.0 { 100.0 * l.ms / total_ms } else { 0.0 };
        let calls = if l.calls > 0 { format!("{:>9} calls", l.calls) } else { String::new() };
        s.push_str(&format!("  {:<34} {:>10.2} ms {:>6.1}% {calls}\n", l.what, l.ms, share));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A span inside another counts once: the outer line gets its own time only, so the lines
    /// add up to the wall time, not more (prefill's quantization inside its product did).
    #[test]
    fn nested_spans_count_exclusive_time() {
        let sleep = |ms| std::thread::sleep(std::time::Duration::from_millis(ms));
        enable(true);
        reset();
        let t0 = Instant::now();
        {
            let _outer = span(Op::Other);
            sleep(30);
            {
                let _inner = span(Op::Embedding);
                sleep(30);
            }
            // A shared dispatch timed by hand, its time given to a matrix type.
            sleep(10);
            add_matmul(QuantType::Q4_0, 1, 10e6);
        }
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        enable(false);
        let lines = report(wall);
        let ms = |what: &str| lines.iter().find(|l| l.what == what).map_or(0.0, |l| l.ms);
        let (other, inner, mv) = (ms("other"), ms("embedding"), ms("matvec q4_0"));
        // (Other tests in this process may add to the embedding and q4_0 lines while counting
        // is on, never to "other", which no op uses: only lower bounds on those two.)
        assert!(inner >= 30.0 && mv >= 10.0, "embedding {inner} ms, matvec {mv} ms");
        // The outer span's own time: its 30 ms sleep, not the 30 ms inside nor the 10 ms given.
        assert!((30.0..wall - 40.0 + 0.01).contains(&other), "other {other} ms of {wall} ms");
    }
}
