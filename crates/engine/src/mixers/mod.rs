//! Token mixers, one module each (STYLE principle 9): softmax attention and its variants
//! (`attention`: exact or sliding, f32 or f16 cache, the sealed O(1) state), GatedDeltaNet
//! (`gdn`), Kimi Delta Attention (`kda`), the Mamba2 state-space mixer (`mamba2`), multi-head
//! latent attention (`mla`) and LFM2's short convolution (`shortconv`), cortiq's vmf_phase linear core (`vmf`) and its windowed option (`vmf_window`); `nystrom` is the O(1) operator a sealed attention state runs.
//!
//! Each module owns its weights (and their loading by GGUF names), its per-sequence state, its
//! forward over a chunk of one sequence and over the decode rows of many, and its state's
//! operations, behind two interfaces: `Mixer` (weights side) and `MixerState` (state side).
//! `Model` and `SeqState` dispatch through them once per layer and never look inside; `load`
//! is the registry. A new mixer is one module here, a `MixerKind` variant (its validated
//! config, config.rs) and one line in `load`.
//!
//! Dispatch cost: one virtual call per layer per step (and per sequence in the decode batch),
//! beside a layer's ~µs-to-ms of matmuls; nothing inside a mixer is dynamic.

use std::any::Any;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::numerics::{LlamaCppCtx, Numerics};
use crate::o1::{AttnO1, Serve};
use crate::qtensor::QTensor;

pub mod attention;
pub mod gdn;
pub mod identity;
pub mod kda;
pub mod mamba2;
pub mod mla;
pub mod parallel;
pub mod registry;
pub mod shortconv;
pub mod vmf;
pub mod vmf_window;

/// Add a bias to every row.
pub fn add_bias(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_mut(b.len()) {
        for (v, bi) in row.iter_mut().zip(b) {
            *v += bi;
        }
    }
}

/// How attention layers store their KV cache (`--kv-type`): f32, f16 (llama.cpp's default
/// cache type; values rounded to nearest-even) or 8-bit blocks with an f32 scale
/// (`kvattn::quantize_q8`). Decode reads every type in place (`kvattn`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    #[default]
    F32,
    F16,
    Q8,
}

impl KvType {
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8 => "q8",
        }
    }
}

/// One layer's state: its mixer's own type (`Mixer::new_state`), reached by the mixer through
/// `get_mut` and by everything else through `MixerState`.
pub struct LayerState(pub(crate) Box<dyn MixerState>);

impl Clone for LayerState {
    fn clone(&self) -> LayerState {
        LayerState(self.0.box_clone())
    }
}

impl LayerState {
    pub fn new(s: impl MixerState + 'static) -> LayerState {
        LayerState(Box::new(s))
    }

    /// Whether the state can only go forward (no truncation to an earlier length: a
    /// checkpoint must snapshot it).
    pub fn is_recurrent(&self) -> bool {
        self.0.is_recurrent()
    }

    /// The mixer's own state type, if this layer holds one.
    pub fn get<S: MixerState + 'static>(&self) -> Option<&S> {
        self.0.as_any().downcast_ref()
    }

    pub fn get_mut<S: MixerState + 'static>(&mut self) -> Option<&mut S> {
        self.0.as_any_mut().downcast_mut()
    }

    /// The mixer's own state type; the model builds every layer's state from that layer's
    /// mixer, so another type is a bug.
    pub(crate) fn of<S: MixerState + 'static>(&mut self) -> &mut S {
        self.get_mut().expect("a layer's state is made by its own mixer")
    }

    pub fn bytes(&self) -> StateBytes {
        self.0.bytes()
    }

    /// Become a copy of `other`, reusing this state's buffers where it is of the same type.
    pub(crate) fn copy_from(&mut self, other: &LayerState) {
        other.0.clone_into_box(&mut self.0);
    }

    /// Keep the first `len` positions of a state that is not recurrent.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }
}

/// A sequence's state bytes by kind (`SeqState::bytes_by_kind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateBytes {
    /// KV caches (exact attention, sliding layers, MLA), by their values' length.
    pub kv: usize,
    /// Sealed O(1) attention layers, scratch included, and the plan's prompt bookkeeping.
    pub o1: usize,
    /// Recurrent mixers (GatedDeltaNet, KDA, Mamba2, short conv).
    pub recurrent: usize,
}

impl StateBytes {
    pub fn total(&self) -> usize {
        self.kv + self.o1 + self.recurrent
    }
}

impl std::ops::Add for StateBytes {
    type Output = StateBytes;
    fn add(self, o: StateBytes) -> StateBytes {
        StateBytes { kv: self.kv + o.kv, o1: self.o1 + o.o1, recurrent: self.recurrent + o.recurrent }
    }
}

/// One layer's per-sequence state, whatever its mixer. A checkpoint snapshots a recurrent state
/// whole (a clone) and restores it by replacement; any other state is truncated instead.
pub trait MixerState: StateAny + Send + Sync {
    /// Whether the state only goes forward (constant-size recurrent states, sealed O(1)
    /// attention): `truncate` cannot take it back, a checkpoint snapshots it.
    fn is_recurrent(&self) -> bool;

    /// Keep the first `len` positions. Called only on a state that is not recurrent (the
    /// default, for recurrent states, says so).
    fn truncate(&mut self, _len: usize) {
        unreachable!("a recurrent state is restored from its snapshot, never truncated");
    }

    /// Room for `extra` more positions without reallocating (constant-size states: nothing).
    fn reserve(&mut self, _extra: usize) {}

    /// Back to an empty sequence (recurrent states zeroed).
    fn clear(&mut self);

    /// Bytes held, by kind.
    fn bytes(&self) -> StateBytes;

    /// Append the state to a session file's body (`session`: its arrays, length-prefixed); Err
    /// when this kind of state is not saved (a sealed O(1) layer).
    fn save(&self, out: &mut Vec<u8>) -> std::result::Result<(), String>;

    /// Become the state `save` wrote, read from the front of `r` (advanced past it), for a
    /// sequence of `len` positions; `self` is a fresh state of the layer (its format and
    /// sizes). Err names what does not fit, leaving `self` unspecified.
    fn load(&mut self, r: &mut &[u8], len: usize) -> std::result::Result<(), String>;
}

/// The object plumbing every `MixerState` gets for free: a boxed clone (checkpoints) and the
/// downcast to its mixer's own type (the mixer's forward, the O(1) seal).
pub trait StateAny {
    fn box_clone(&self) -> Box<dyn MixerState>;
    /// `dst` becomes a copy of this state, reusing its buffers when it is of the same type.
    fn clone_into_box(&self, dst: &mut Box<dyn MixerState>);
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: MixerState + Clone + 'static> StateAny for T {
    fn box_clone(&self) -> Box<dyn MixerState> {
        Box::new(self.clone())
    }
    fn clone_into_box(&self, dst: &mut Box<dyn MixerState>) {
        match dst.as_any_mut().downcast_mut::<T>() {
            Some(d) => d.clone_from(self),
            None => *dst = Box::new(self.clone()),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The model-wide settings a mixer's forward reads.
pub struct Env<'a> {
    pub cfg: &'a ModelConfig,
    pub num: Numerics,
}

/// One sequence's side of a layer step: the layer's state, the chunk's first position, what
/// llama.cpp's attention order depends on, and the sequence's O(1) plan for this layer (`Off`
/// for layers the plan does not touch).
pub struct Seq<'a> {
    pub state: &'a mut LayerState,
    pub pos0: usize,
    pub lc: LlamaCppCtx,
    pub o1: AttnO1<'a>,
}

/// A layer's token mixer: its weights and how it advances a sequence.
pub trait Mixer: Any + Send + Sync {
    /// What it is, for messages ("a gated delta net").
    fn name(&self) -> &'static str;

    /// The weight matrices, in a fixed order.
    fn matrices(&self) -> Vec<&QTensor>;

    fn matrices_mut(&mut self) -> Vec<&mut QTensor>;

    /// A fresh per-sequence state (`kv`: how K/V are stored where the mixer caches them).
    fn new_state(&self, kv: KvType) -> LayerState;

    /// The positions a prefill call must start at a multiple of for its values not to depend
    /// on the cut (`prefix`): a chunked kernel's chunk, else 1.
    fn cut_grid(&self) -> usize {
        1
    }

    /// How an O(1) plan serves the layer (only softmax attention is planned or bounded).
    fn o1_serve(&self) -> Serve {
        Serve::Untouched
    }

    /// The mixer over `n` positions of one sequence from `seq.pos0`: h [n, d_model] normed
    /// input -> [n, d_model]; the state grows by n positions. Errors only from the O(1)
    /// check's solve.
    fn forward(&self, env: &Env, h: &[f32], n: usize, seq: Seq<'_>, trace: &mut dyn FnMut(&str, &[f32])) -> Result<Vec<f32>>;

    /// One decode position for each of several sequences (the decode batch): h [k, d_model],
    /// row i the next position of `rows[i]` -> [k, d_model], row for row bit-identical to
    /// `forward(.., n = 1, ..)`. By default the rows run one by one; a mixer whose projections
    /// have a multi-row decode path overrides it.
    fn forward_rows(&self, env: &Env, h: &[f32], rows: Vec<Seq<'_>>) -> Result<Vec<f32>> {
        let d = env.cfg.d_model;
        let mut out = Vec::with_capacity(h.len()); // [k, d_model]
        for (hr, seq) in h.chunks_exact(d).zip(rows) {
            out.extend(self.forward(env, hr, 1, seq, &mut |_, _| {})?);
        }
        Ok(out)
    }

    /// Several sequences' chunks in one step (the serving core's batch, `Model::forward_batch`):
    /// h [Σ n_i, d_model] holds the rows of `segs[0]` first, then those of `segs[1]`, ...;
    /// `segs[i]` is (its side, n_i ≥ 1 positions) -> [Σ n_i, d_model], each segment's rows
    /// bit-identical to `forward(.., n_i, ..)` alone. By default the one-position segments go
    /// through `forward_rows` together and the longer ones run alone (`segments_apart`); a mixer
    /// whose projections are row-wise over chunks (`QTensor::rowwise`) merges them all.
    fn forward_segments(&self, env: &Env, h: &[f32], segs: Vec<(Seq<'_>, usize)>) -> Result<Vec<f32>> {
        segments_apart(self, env, h, segs)
    }

    /// `forward_segments` where some segments are verifies (`steps[i]` Some: segment i's
    /// positions each as its own decode step, journaled there as `forward_steps` does), row for
    /// row bit-identical to running each segment alone (`forward` or `forward_steps`). A step of
    /// decode rows and verifies only goes to `forward_rows_verifies`; with a prompt chunk in it
    /// (its mixer's chunked path) the verified segments run apart (`steps_apart`). Attention,
    /// which merges prompt chunks too, overrides this.
    fn forward_segments_steps(
        &self,
        env: &Env,
        h: &[f32],
        segs: Vec<(Seq<'_>, usize)>,
        steps: Vec<Option<&mut Journal>>,
    ) -> Result<Vec<f32>> {
        if rows_and_verifies(&segs, &steps) {
            self.forward_rows_verifies(env, h, segs, steps)
        } else {
            steps_apart(self, env, h, segs, steps)
        }
    }

    /// Decode rows (one position each) and verifies, at least one: by default the verifies run
    /// apart (`forward_steps`, the mixer's weights read once more for each); a mixer whose
    /// projections are row-wise overrides it to read its weights once for all.
    fn forward_rows_verifies(
        &self,
        env: &Env,
        h: &[f32],
        segs: Vec<(Seq<'_>, usize)>,
        steps: Vec<Option<&mut Journal>>,
    ) -> Result<Vec<f32>> {
        steps_apart(self, env, h, segs, steps)
    }

    /// `n` positions of one sequence from `seq.pos0`, each computed as its own decode step (the
    /// verify of speculative decoding): h [n, d_model] -> [n, d_model], row i bit-identical to
    /// the i-th of n successive `forward(.., 1, ..)` calls, and the state after them the same.
    /// `journal` receives what `rewind` needs to take the state back to any prefix of the n
    /// positions. By default the positions run one by one (the mixer's weights are read n
    /// times) and a recurrent state is journaled as its snapshot and the input rows; a mixer
    /// whose projections have a multi-row decode path overrides it.
    fn forward_steps(&self, env: &Env, h: &[f32], n: usize, seq: Seq<'_>, journal: &mut Journal) -> Result<Vec<f32>> {
        journal.begin(seq.state, n);
        if journal.is_recurrent() {
            journal.record = Some(Box::new(h.to_vec()));
        }
        steps_one_by_one(self, env, h, n, seq)
    }

    /// Keep the first `keep` (≤ n) positions of the last `forward_steps` on this state
    /// (`seq.pos0` its first position): the state is then bit for bit what `keep` single steps
    /// leave. A cache is truncated; by default a recurrent state is restored from its snapshot
    /// and the kept input rows are stepped again.
    fn rewind(&self, env: &Env, seq: Seq<'_>, journal: &mut Journal, keep: usize) -> Result<()> {
        if journal.restore(seq.state) {
            let h: &Vec<f32> = journal.record();
            steps_one_by_one(self, env, &h[..keep * env.cfg.d_model], keep, seq)?;
        } else {
            seq.state.truncate(seq.pos0 + keep);
        }
        Ok(())
    }
}

/// What a mixer keeps of `forward_steps` to take its state back to any prefix of those
/// positions (`rewind`): nothing for a cache (it truncates); for a recurrent state, the state
/// before the first position and what steps a position again (the mixer's own record: its
/// input rows by default, its projected rows where it overrides). Kept from verify to verify:
/// the snapshot's buffers are reused (copied into, swapped out), not allocated per verify.
#[derive(Default)]
pub struct Journal {
    /// Positions journaled.
    pub n: usize,
    /// The state before them (while `recurrent`; else a buffer to reuse).
    snap: Option<LayerState>,
    /// The journaled state is recurrent: `snap` holds it as it was before the positions.
    recurrent: bool,
    /// What replays them, in the journaling mixer's own type.
    pub record: Option<Box<dyn Any + Send + Sync>>,
}

impl Journal {
    /// Start journaling `n` positions of `state`: a recurrent state is snapshotted.
    pub fn begin(&mut self, state: &LayerState, n: usize) {
        self.n = n;
        self.record = None;
        self.recurrent = state.is_recurrent();
        if self.recurrent {
            match &mut self.snap {
                Some(s) => s.copy_from(state),
                None => self.snap = Some(state.clone()),
            }
        }
    }

    /// Whether the journaled state is recurrent (a snapshot was taken).
    pub fn is_recurrent(&self) -> bool {
        self.recurrent
    }

    /// Put the snapshot back into `state` (false, nothing done, for a state that truncates).
    /// The journal keeps the replaced state's buffers for the next snapshot.
    pub fn restore(&mut self, state: &mut LayerState) -> bool {
        if !std::mem::take(&mut self.recurrent) {
            return false;
        }
        std::mem::swap(state, self.snap.as_mut().expect("a recurrent journal holds its snapshot"));
        true
    }

    /// The record the journaling mixer stored, as its own type.
    pub fn record<T: 'static>(&self) -> &T {
        self.record.as_ref().and_then(|r| r.downcast_ref()).expect("the mixer that journaled reads its own record")
    }
}

/// `n` positions of one sequence as n single `forward` steps (the default `forward_steps`).
fn steps_one_by_one<M: Mixer + ?Sized>(m: &M, env: &Env, h: &[f32], n: usize, mut seq: Seq<'_>) -> Result<Vec<f32>> {
    let d = env.cfg.d_model;
    let mut out = Vec::with_capacity(n * d); // [n, d_model]
    for (i, hr) in h.chunks_exact(d).take(n).enumerate() {
        let one = Seq { state: &mut *seq.state, pos0: seq.pos0 + i, lc: seq.lc, o1: seq.o1.reborrow() };
        out.extend(m.forward(env, hr, 1, one, &mut |_, _| {})?);
    }
    Ok(out)
}

/// `Mixer::forward_segments` without merging the chunks: a lone segment takes `forward`, the
/// one-position segments `forward_rows` together, each longer one `forward` alone.
pub fn segments_apart<M: Mixer + ?Sized>(m: &M, env: &Env, h: &[f32], segs: Vec<(Seq<'_>, usize)>) -> Result<Vec<f32>> {
    let d = env.cfg.d_model;
    let noop = &mut |_: &str, _: &[f32]| {};
    if segs.len() == 1 {
        let (seq, n) = segs.into_iter().next().expect("one segment");
        return m.forward(env, h, n, seq, noop);
    }
    if segs.iter().all(|(_, n)| *n == 1) {
        return m.forward_rows(env, h, segs.into_iter().map(|(s, _)| s).collect());
    }
    let mut out = vec![0f32; h.len()]; // [Σ n_i, d_model]
    let (mut singles, mut single_at, mut hs) = (Vec::new(), Vec::new(), Vec::new());
    let mut r0 = 0;
    for (seq, n) in segs {
        let rows = r0 * d..(r0 + n) * d;
        if n == 1 {
            singles.push(seq);
            single_at.push(r0);
            hs.extend_from_slice(&h[rows]);
        } else {
            let o = m.forward(env, &h[rows.clone()], n, seq, noop)?;
            out[rows].copy_from_slice(&o);
        }
        r0 += n;
    }
    let o = match singles.len() {
        0 => Vec::new(),
        1 => m.forward(env, &hs, 1, singles.pop().expect("one"), noop)?,
        _ => m.forward_rows(env, &hs, singles)?,
    };
    for (row, &at) in o.chunks_exact(d).zip(&single_at) {
        out[at * d..(at + 1) * d].copy_from_slice(row);
    }
    Ok(out)
}

/// Whether a step is decode rows and verifies only, at least one verify (no prompt chunk, which
/// takes its mixer's chunked path): then `forward_segments_steps` hands it to
/// `forward_rows_verifies`, else to `steps_apart`.
pub fn rows_and_verifies(segs: &[(Seq<'_>, usize)], verifies: &[Option<&mut Journal>]) -> bool {
    let chunk = segs.iter().zip(verifies).any(|((_, n), j)| *n > 1 && j.is_none());
    !chunk && verifies.iter().any(Option::is_some)
}

/// The per-sequence half of a recurrent mixer's merged step (`forward_rows_verifies`, after
/// its projections over every row): sequence by sequence its projected rows (`part(r0, n)`),
/// a verify's positions stepped one at a time and journaled with those rows (what a rewind
/// replays), a decode row run as one position. `run(part, n, verify, state)` gives the rows'
/// outputs; they are concatenated in sequence order.
pub(crate) fn rows_or_verifies<P: Any + Send + Sync>(
    segs: Vec<(Seq<'_>, usize)>,
    verifies: Vec<Option<&mut Journal>>,
    mut part: impl FnMut(usize, usize) -> P,
    mut run: impl FnMut(&P, usize, bool, &mut LayerState) -> Vec<f32>,
) -> Vec<f32> {
    let mut o = Vec::new();
    let mut r0 = 0;
    for ((seq, n), journal) in segs.into_iter().zip(verifies) {
        let p = part(r0, n);
        match journal {
            Some(j) => {
                j.begin(seq.state, n);
                o.extend(run(&p, n, true, seq.state));
                j.record = Some(Box::new(p));
            }
            None => o.extend(run(&p, 1, false, seq.state)),
        }
        r0 += n;
    }
    o
}

/// `forward_segments_steps` with the verified segments apart: each through `forward_steps`,
/// the others through `forward_segments` together.
pub fn steps_apart<M: Mixer + ?Sized>(
    m: &M,
    env: &Env,
    h: &[f32],
    segs: Vec<(Seq<'_>, usize)>,
    steps: Vec<Option<&mut Journal>>,
) -> Result<Vec<f32>> {
    if steps.iter().all(Option::is_none) {
        return m.forward_segments(env, h, segs);
    }
    let d = env.cfg.d_model;
    let mut out = vec![0f32; h.len()]; // [Σ n_i, d_model]
    let (mut plain, mut plain_at, mut hs) = (Vec::new(), Vec::new(), Vec::new());
    let mut r0 = 0;
    for ((seq, n), journal) in segs.into_iter().zip(steps) {
        let rows = r0 * d..(r0 + n) * d;
        match journal {
            Some(j) => {
                let o = m.forward_steps(env, &h[rows.clone()], n, seq, j)?;
                out[rows].copy_from_slice(&o);
            }
            None => {
                plain.push((seq, n));
                plain_at.push((r0, n));
                hs.extend_from_slice(&h[rows]);
            }
        }
        r0 += n;
    }
    if !plain.is_empty() {
        let o = m.forward_segments(env, &hs, plain)?;
        let mut at = 0;
        for (r0, n) in plain_at {
            out[r0 * d..(r0 + n) * d].copy_from_slice(&o[at * d..(at + n) * d]);
            at += n;
        }
    }
    Ok(out)
}

impl dyn Mixer {
    /// The mixer's own type (a trainer or converter that needs its weights).
    pub fn downcast_ref<T: Mixer>(&self) -> Option<&T> {
        (self as &dyn Any).downcast_ref()
    }
}
