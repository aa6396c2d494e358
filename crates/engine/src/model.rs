//! The decoder-only model: weights laid out per layer (norms, the layer's token mixer behind
//! `mixers::Mixer`, the FFN or mixture of experts), the forward pass over a chunk of positions
//! (prefill and decode are the same code with n = chunk or 1), the decode batch and the
//! speculative verify, and a trace hook that names every intermediate so a run can be diffed
//! against the HF reference layer by layer. Nothing here matches on a mixer kind: each layer's
//! mixer is called once per step (`mixers` owns their weights, states and forwards).

use cortiq_formats::PageShare;
use cortiq_kernels::quant::QuantType;

use crate::blocks::{FfnWeights, ffn, ffn_rows, rmsnorm_rows_in, rmsnorm_segments_in};
use crate::config::{LayerSpec, MixerKind, ModelConfig};
use crate::error::{EngineError, Result};
use crate::mixers::{self, Env, Journal, Mixer, Seq};
use crate::moe::{ExpertBias, MoeConfig, MoeWeights, moe, moe_rows};
use crate::numerics::{LlamaCppCtx, Numerics};
#[cfg(feature = "o1")]
use crate::o1::Geom;
use crate::o1::{AttnO1, O1Plan, O1Run, O1Stats, Serve};
use crate::par::pool;
use crate::profile::{self, Op};
use crate::qtensor::QTensor;
use crate::state::{Checkpoint, KvType, LayerState, SeqState};
use crate::weights::TensorSource;

/// A layer's feed-forward block: one gated FFN, or a mixture of experts.
pub enum Ffn {
    Dense(FfnWeights),
    Moe(MoeWeights),
    /// The layer has none (`LayerSpec::ffn` false).
    None,
}

impl Ffn {
    /// The matrices a forward reads (`FfnWeights::read`), split: those every token reads, then
    /// a mixture's routed experts.
    fn matrices_mut_split(&mut self) -> (Vec<&mut QTensor>, Vec<&mut QTensor>) {
        match self {
            Ffn::Dense(f) => (f.read_mut(), Vec::new()),
            Ffn::Moe(m) => m.matrices_mut_split(),
            Ffn::None => (Vec::new(), Vec::new()),
        }
    }

    pub fn matrices(&self) -> Vec<&QTensor> {
        match self {
            Ffn::Dense(f) => vec![&f.gate, &f.up, &f.down],
            Ffn::Moe(m) => m.matrices(),
            Ffn::None => Vec::new(),
        }
    }

    /// Weight bytes one token's pass reads: every matrix of a dense FFN; of a mixture, the
    /// router, the shared expert and `top_k` experts of the mean expert size (the active
    /// parameters).
    pub fn active_bytes(&self, top_k: usize) -> usize {
        match self {
            Ffn::Moe(m) => {
                let bytes = |f: &FfnWeights| f.read().iter().map(|t| t.n_bytes()).sum::<usize>();
                let all: usize = m.experts.iter().map(bytes).sum();
                let rest: usize =
                    m.router.n_bytes() + m.shared.as_ref().map_or(0, bytes) + m.shared_gate.as_ref().map_or(0, |t| t.n_bytes());
                rest + all * top_k.min(m.experts.len()) / m.experts.len().max(1)
            }
            Ffn::Dense(f) => f.read().iter().map(|t| t.n_bytes()).sum(),
            _ => self.matrices().iter().map(|t| t.n_bytes()).sum(),
        }
    }
}

impl LayerWeights {
    /// The layer's matrices (mixer then FFN), in a fixed order.
    pub fn matrices(&self) -> Vec<&QTensor> {
        self.mixer.matrices().into_iter().chain(self.ffn.matrices()).collect()
    }
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// The token mixer (`mixers`): its weights, state and forward behind one interface.
    pub mixer: Box<dyn Mixer>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// One multi-token-prediction block (Qwen3-Next / Qwen3.5): it predicts the token after next
/// from the last hidden state and the next token's embedding,
/// h' = layer(eh_proj · [enorm(embed(next)) | hnorm(hidden)]), logits = output(shared_head_norm(h')).
/// Loaded and addressable for speculative decoding; the ordinary forward pass does not run it.
pub struct MtpWeights {
    /// [d_model, 2·d_model]: the concatenated (embedding, hidden) pair down to d_model.
    pub eh_proj: QTensor,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    pub shared_head_norm: Vec<f32>,
    /// A full-attention decoder layer (MoE when the model's layers are).
    pub layer: LayerWeights,
    /// Its layout (the same attention and FFN kind as the model's attention layers).
    pub spec: LayerSpec,
}

pub struct Model {
    pub cfg: ModelConfig,
    pub tok_embd: QTensor,
    pub layers: Vec<LayerWeights>,
    /// MTP blocks found in the file (GGUF blocks past `n_layers` with `nextn.*` tensors, HF
    /// `mtp.*`), in order; empty for models without them.
    pub mtp: Vec<MtpWeights>,
    pub output_norm: Vec<f32>,
    /// The LM head; the embedding itself when tied.
    pub output: QTensor,
    /// Whose arithmetic the forward pass follows (`set_numerics`).
    pub numerics: Numerics,
    /// How new states store K/V (`set_kv_type`).
    pub kv_type: KvType,
    /// Whether `output` shares the embedding's bytes (llama.cpp then never repacks it).
    tied: bool,
    /// llama.cpp's thread count, which its decode attention past 256 positions depends on.
    llamacpp_threads: usize,
    /// Per layer: the learned far field of the O(1) mode (`Far::Linear`), from a polished
    /// .cmf's `blk.N.attn_far_*` tensors (empty when the file has none).
    pub o1_far: Vec<Option<std::sync::Arc<crate::o1::farfield::FarWeights>>>,
    /// The O(1) mode's calibrated window split (`O1Plan::split`), from a polished .cmf's header.
    pub o1_split: Option<std::sync::Arc<crate::o1::O1Split>>,
    /// The planned layers that evict by score when the plan's rule says `model_layers`
    /// (`ScoreRule::model_layers`), from a polished .cmf's header; None: all of them.
    pub o1_score_layers: Option<std::sync::Arc<[usize]>>,
    /// The llama.cpp build to reproduce has AVX512-FP16 f16 arithmetic (`set_llamacpp_fp16`).
    llamacpp_fp16: bool,
}

/// One entry of `Model::forward_batch`: `tokens` (at least one) at positions `state.len..` of
/// the entry's own sequence, and the positions to produce logits for.
pub struct BatchEntry<'a> {
    pub tokens: &'a [u32],
    pub state: &'a mut SeqState,
    pub want: Logits,
    /// A verify (speculative decoding): every position as its own decode step, journaled here
    /// for `verify_keep`, logits for all of them (`want` is then ignored) — what
    /// `forward_verify` gives alone.
    pub verify: Option<&'a mut VerifyJournal>,
    /// The entry's final-normed hidden rows [n, d_model] (what an MTP head reads), written
    /// here (replaced) for every position; a verify's are in its journal instead.
    pub hidden: Option<&'a mut Vec<f32>>,
}

/// One vector of a text's final-normed rows [n, d] (`Model::embed_pooled`): the pooled row (a
/// mean summed in f64, position by position), scaled to unit length when `normalize`.
pub(crate) fn pool_rows(rows: &[f32], d: usize, pooling: Pooling, normalize: bool) -> Vec<f32> {
    let n = rows.len() / d;
    let rows = match pooling {
        Pooling::Last => &rows[(n - 1) * d..],
        Pooling::First => &rows[..d],
        Pooling::Mean => rows,
    };
    let k = (rows.len() / d) as f64;
    let mut e: Vec<f32> = (0..d).map(|j| (rows.chunks_exact(d).map(|r| f64::from(r[j])).sum::<f64>() / k) as f32).collect();
    if normalize {
        let norm = e.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>().sqrt();
        if norm > 0.0 {
            e.iter_mut().for_each(|v| *v = (f64::from(*v) / norm) as f32);
        }
    }
    e
}

/// How `Model::embed_pooled` makes one vector of a text's positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the positions (sentence-transformers' default).
    Mean,
    /// The last position (decoder embedding models: Qwen3-Embedding).
    Last,
    /// The first position (BERT's [CLS]).
    First,
}

impl Pooling {
    /// From llama.cpp's GGUF `pooling_type` (1 mean, 2 cls, 3 last) or a name.
    pub fn from_name(s: &str) -> Option<Pooling> {
        match s {
            "mean" | "1" => Some(Pooling::Mean),
            "last" | "3" => Some(Pooling::Last),
            "cls" | "first" | "2" => Some(Pooling::First),
            _ => None,
        }
    }
}

/// Which positions of a chunk to produce logits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    /// Positions from this index of the chunk to its end.
    From(usize),
}

/// What `Model::verify_keep` needs of the last `forward_verify` on a sequence: per layer its
/// mixer's journal, the O(1) counters before the chunk, or (before an O(1) seal) an ordinary
/// checkpoint and the tokens. One per sequence, kept from verify to verify.
#[derive(Default)]
pub struct VerifyJournal {
    pos0: usize,
    n: usize,
    layers: Vec<Journal>,
    o1_stats: Option<O1Stats>,
    fallback: Option<(Checkpoint, Vec<u32>)>,
    /// The verified positions' final-normed hidden rows [n, d_model] (what MTP heads read).
    hidden: Vec<f32>,
}

impl VerifyJournal {
    /// A verify of `n` positions of `state` starts (the stepped path's journal; the fallback's
    /// sets `fallback` after).
    fn begin(&mut self, state: &SeqState, n: usize, n_layers: usize) {
        self.pos0 = state.len;
        self.n = n;
        self.fallback = None;
        self.layers.resize_with(n_layers, Journal::default);
        self.o1_stats = state.o1.as_ref().map(O1Run::stats);
    }

    /// The final-normed hidden rows of the last verify's positions still kept, [n, d_model].
    pub fn hidden(&self, d_model: usize) -> &[f32] {
        &self.hidden[..(self.n * d_model).min(self.hidden.len())]
    }
}

/// A trace callback: (intermediate name, layer index or usize::MAX for model-level, values).
pub type Trace<'a> = &'a mut dyn FnMut(&str, usize, &[f32]);

impl Model {
    /// Load the dense layout by GGUF tensor names; `cfg` says which optional parts exist.
    pub fn load_dense(src: &dyn TensorSource, cfg: ModelConfig) -> Result<Model> {
        let d = cfg.d_model;
        let tok_embd = src.require("token_embd.weight", cfg.vocab, d)?;
        let output = src.optional("output.weight", cfg.vocab, d)?;
        let tied = output.is_none();
        let output = output.unwrap_or_else(|| tok_embd.clone());
        let output_norm = src.vector(cfg.output_norm, d)?;
        let layers = (0..cfg.n_layers).map(|il| load_layer(src, &cfg, il, &cfg.layers[il])).collect::<Result<Vec<_>>>()?;
        let mtp = load_mtp(src, &cfg)?;
        Ok(Model {
            cfg,
            tok_embd,
            layers,
            mtp,
            output_norm,
            output,
            numerics: Numerics::Exact,
            kv_type: KvType::F32,
            tied,
            llamacpp_threads: 4,
            o1_far: Vec::new(),
            o1_split: None,
            o1_score_layers: None,
            llamacpp_fp16: cortiq_kernels::ggml::cpu_has_avx512fp16(),
        })
    }

    /// `Numerics::Fast`: quantized weights multiply 8-bit activations with integer dot
    /// products in our own order (the CLI's default; llama.cpp's arithmetic class).
    /// `Numerics::LlamaCpp`: reproduce llama.cpp's CPU arithmetic (8-bit activations in its
    /// kernel orders, f16 KV cache, its flash attention, norms, RoPE and activations), to follow
    /// its greedy text; prefill in chunks of its micro-batch (512) for its prompt orders.
    /// `Numerics::Exact` (the library default): transformers' f32 numerics. Also sets the KV
    /// format of new states (unless `set_kv_type` follows): f32 for Exact, f16 for Fast and
    /// LlamaCpp, as llama.cpp's default cache — half the bytes, faster decode at depth, and
    /// perplexity within 0.1% of the f32 cache's (BENCHMARKS.md, issue 18).
    pub fn set_numerics(&mut self, num: Numerics) {
        self.numerics = num;
        self.kv_type = if num == Numerics::Exact { KvType::F32 } else { KvType::F16 };
        let tied = self.tied;
        // Fast decode reads the multiplied matrices in the interleaved layout (the embedding
        // is only read by row and keeps its bytes; a tied output gets its own interleaved copy).
        let il = num == Numerics::Fast;
        self.tok_embd.set_numerics(num, false);
        self.output.set_numerics(num, !tied);
        self.output.set_interleaved(il);
        for l in self.layers.iter_mut().chain(self.mtp.iter_mut().map(|m| &mut m.layer)) {
            // On AVX-512 CPUs a mixture's experts stay in the file's layout, memory-mapped: a
            // decode step reads only the routed ones (a 30B-A3B file is ~18 GB on a 24 GiB
            // machine: an interleaved copy of every expert would be as large again, and cost its
            // load time; decode reads a GGUF's row-major experts at 57-79% of the active-parameter
            // roofline as the machine's state varies, a .cmf's interleaved ones ~1.1x faster,
            // BENCHMARKS.md, the full-size MoE file).
            let (ffn, experts) = l.ffn.matrices_mut_split();
            for t in l.mixer.matrices_mut().into_iter().chain(ffn) {
                t.set_numerics(num, true);
                t.set_interleaved(il);
            }
            for t in experts {
                t.set_numerics(num, true);
                // A .cmf's interleaved experts stay as stored (read in place by the fast
                // kernels; un-interleaved row by row under the other numerics).
                if t.interleaved() {
                    continue;
                }
                // Except where the row-major kernels are slow (no AVX-512; BENCHMARKS.md).
                let copy = t.expert_interleaved();
                t.set_interleaved(il && copy);
            }
        }
    }

    /// Copy a mixture's routed experts out of the file map into the interleaved layout in
    /// anonymous memory (`--no-mmap`), after `set_numerics` (fast numerics; the types with the
    /// layout): decode then reads them with the interleaved kernels, ~1.2x faster on an
    /// AVX-512 CPU than the row-major ones over the map (BENCHMARKS.md, the full-size MoE file),
    /// at the price of their size in memory and the copy's time. `progress(done, total)` after
    /// each matrix. Values: each expert's products then run the interleaved kernels, whose float
    /// order is the dense matrices' (fast numerics either way).
    pub fn copy_experts(&mut self, progress: &dyn Fn(usize, usize)) {
        let il = self.numerics == Numerics::Fast;
        let mut experts: Vec<&mut QTensor> = Vec::new();
        for l in self.layers.iter_mut().chain(self.mtp.iter_mut().map(|m| &mut m.layer)) {
            experts.extend(l.ffn.matrices_mut_split().1);
        }
        let total = experts.len();
        for (i, t) in experts.into_iter().enumerate() {
            t.set_interleaved(il);
            // a .cmf's interleaved experts: the same layout, moved out of the map
            t.copy_interleaved_to_memory();
            progress(i + 1, total);
        }
    }

    /// Pin every weight matrix the model reads from its file map in memory (`--mlock`), after
    /// `set_numerics` (whose interleaved copies no longer need their map pages). Pages are read
    /// in as they are locked: a cold file is read whole here.
    pub fn lock_resident(&self) -> std::io::Result<()> {
        let mut all = vec![&self.tok_embd, &self.output];
        for l in self.layers.iter().chain(self.mtp.iter().map(|m| &m.layer)) {
            all.extend(l.mixer.matrices());
            all.extend(l.ffn.matrices());
        }
        all.into_iter().try_for_each(|t| t.lock_resident())
    }

    /// The routed experts' matrices a forward reads (`FfnWeights::read`), every layer's.
    fn routed_experts(&self) -> Vec<&QTensor> {
        self.layers
            .iter()
            .filter_map(|l| match &l.ffn {
                Ffn::Moe(m) => Some(m.experts.iter().flat_map(|e| e.read())),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// How the page cache holds the routed experts a decode reads from the file map, from up to
    /// `max_windows` sampled 2 MiB windows (`QTensor::page_share`); `None` without mapped
    /// experts (a dense model, `copy_experts`, interleaved experts) or where it cannot be told.
    pub fn expert_page_share(&self, max_windows: usize) -> Option<PageShare> {
        QTensor::page_share(&self.routed_experts(), max_windows)
    }

    /// Bytes of the mapped routed experts outside the page cache: what `populate_experts`
    /// would read from the file.
    pub fn expert_missing_bytes(&self) -> usize {
        QTensor::missing_bytes(&self.routed_experts())
    }

    /// Bytes of the routed experts read from the file map.
    pub fn expert_mapped_bytes(&self) -> usize {
        QTensor::mapped_bytes(&self.routed_experts())
    }

    /// Bring the mapped routed experts into memory now (`QTensor::populate`): a decode then
    /// never waits on the file for an expert routed to for the first time, and a file not yet
    /// in the page cache comes in as 2 MiB pages (the map's advice), which decode streams faster
    /// than the 4 KiB pages of a file cached by small reads or writes (`PageShare`).
    /// `progress(bytes done, bytes in all)`.
    pub fn populate_experts(&self, progress: &dyn Fn(usize, usize)) -> std::io::Result<()> {
        QTensor::populate(&self.routed_experts(), 256 << 20, progress)
    }

    /// Every weight matrix once: the token embedding, each layer's (mixer, FFN or experts), and
    /// the output head unless it is the embedding itself (tied).
    fn all_matrices(&self) -> Vec<&QTensor> {
        let mut all = vec![&self.tok_embd];
        if !self.tied && !self.output.shares_bytes(&self.tok_embd) {
            all.push(&self.output);
        }
        for l in self.layers.iter().chain(self.mtp.iter().map(|m| &m.layer)) {
            all.extend(l.matrices());
        }
        all
    }

    /// Parameters in the weight matrices (norms and biases, a few thousandths, left out).
    pub fn param_count(&self) -> u64 {
        self.all_matrices().iter().map(|t| (t.rows * t.cols) as u64).sum()
    }

    /// The weight type holding the most of the layers' parameters ("Q4_K", "Q8_0", "F16";
    /// the embedding and output head, often of another type, left out): what a model listing
    /// names as its quantization.
    pub fn main_weight_type(&self) -> String {
        let mut by: Vec<(QuantType, usize)> = Vec::new();
        for t in self.layers.iter().flat_map(|l| l.matrices()) {
            match by.iter_mut().find(|(d, _)| *d == t.dtype) {
                Some((_, n)) => *n += t.rows * t.cols,
                None => by.push((t.dtype, t.rows * t.cols)),
            }
        }
        by.iter().max_by_key(|(_, n)| *n).map_or_else(String::new, |(d, _)| d.name().to_uppercase())
    }

    /// Weight bytes one decode step streams: every layer matrix (of a mixture of experts, the
    /// router, the shared expert and top-k experts: the active parameters), the output head and
    /// one embedding row (the numerator of the bandwidth roofline; norms and the KV cache are
    /// small beside them at bench lengths).
    pub fn decode_weight_bytes(&self) -> usize {
        let top_k = self.cfg.moe.as_ref().map_or(0, |m| m.top_k);
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.mixer.matrices().iter().map(|t| t.n_bytes()).sum::<usize>() + l.ffn.active_bytes(top_k))
            .sum();
        layers + self.output.n_bytes() + self.tok_embd.n_bytes() / self.tok_embd.rows.max(1)
    }

    /// Bytes one decode step reads from sequence state `st`: each attention layer's visible
    /// K/V rows in their stored type (a sliding layer's window, not its whole cache), every
    /// recurrent or sealed state once. With `decode_weight_bytes`, the roofline's numerator at
    /// depth.
    pub fn decode_state_bytes(&self, st: &SeqState) -> usize {
        st.layers
            .iter()
            .zip(&self.cfg.layers)
            .map(|(ls, spec)| {
                let b = ls.bytes();
                let kv = match spec.sliding_window {
                    Some(w) if st.len > w => b.kv / st.len * w,
                    _ => b.kv,
                };
                kv + b.recurrent + b.o1
            })
            .sum()
    }

    /// The thread count of the llama.cpp run to reproduce (default 4, llama.cpp's library
    /// default; llama-cli uses the physical cores or -t): with `Numerics::LlamaCpp`, decode past
    /// 256 positions splits the cache over that many chunks as ggml does. The state's n_ctx
    /// stands for llama.cpp's cache size.
    pub fn set_llamacpp_threads(&mut self, n: usize) {
        self.llamacpp_threads = n.max(1);
    }

    /// Whether the llama.cpp build to reproduce computes f16 rows in native AVX512-FP16
    /// arithmetic (a `GGML_NATIVE` build on a CPU that has it; default: what a native build on
    /// this machine would do). Both are emulated on any CPU: a reference made on another
    /// machine is reproduced by saying what that machine's build did.
    pub fn set_llamacpp_fp16(&mut self, on: bool) {
        self.llamacpp_fp16 = on;
    }

    /// Keep K/V of new states as f16 (half the memory; values rounded to nearest) or f32.
    pub fn set_kv_f16(&mut self, on: bool) {
        self.kv_type = if on { KvType::F16 } else { KvType::F32 };
    }

    /// How new states store K/V. 8-bit rows are blocks of 32 values: refused for a head size
    /// that is not a multiple of 32.
    pub fn set_kv_type(&mut self, kind: KvType) -> Result<()> {
        if kind == KvType::Q8 && self.cfg.head_dim % cortiq_kernels::kvattn::Q8_BLOCK != 0 {
            return Err(EngineError::Unsupported(format!(
                "an 8-bit KV cache needs a head size in blocks of {}; this model's is {}",
                cortiq_kernels::kvattn::Q8_BLOCK,
                self.cfg.head_dim
            )));
        }
        self.kv_type = kind;
        Ok(())
    }

    /// A fresh sequence state holding up to `n_ctx` positions.
    pub fn new_state(&self, n_ctx: usize) -> SeqState {
        let layers = self.layers.iter().map(|l| l.mixer.new_state(self.kv_type)).collect();
        let mut st = SeqState::from_layers(layers, n_ctx);
        st.grid = self.cut_grid();
        st
    }

    /// Where a prefill call may start without changing the prompt's values (`prefix`): the
    /// delta-rule chunk (16) with GatedDeltaNet or KDA layers, else any position.
    pub fn cut_grid(&self) -> usize {
        self.layers.iter().map(|l| l.mixer.cut_grid()).max().unwrap_or(1)
    }

    /// A fresh sequence state whose global softmax-attention layers follow `plan` (O(1)-memory
    /// decode, issue 5): exact attention for the first `plan.tp` positions, then each such layer
    /// seals its cache into an `O1` state and decodes in constant memory (or, in check mode,
    /// computes the matrix form). Sliding-window layers compute what they did, their caches
    /// bounded to their window from the seal on; recurrent mixers and MLA are unchanged.
    /// Errors: bad settings (naming their CLI flag), a model with attention logit soft-capping
    /// (the operator has no softcap), or no global softmax-attention layer to plan.
    /// The layers an O(1) plan serves (global softmax attention), in order.
    pub fn o1_planned_layers(&self) -> Vec<usize> {
        (0..self.layers.len()).filter(|&il| self.layers[il].mixer.o1_serve() == Serve::Planned).collect()
    }

    pub fn new_state_o1(&self, n_ctx: usize, plan: O1Plan) -> Result<SeqState> {
        #[cfg(not(feature = "o1"))]
        {
            let _ = n_ctx;
            match plan {}
        }
        #[cfg(feature = "o1")]
        self.new_state_planned(n_ctx, plan)
    }

    #[cfg(feature = "o1")]
    fn new_state_planned(&self, n_ctx: usize, plan: O1Plan) -> Result<SeqState> {
        let bad = |what: String| EngineError::BadConfig { file: "o(1) decode".into(), what };
        plan.validate().map_err(|e| bad(e.to_string()))?;
        if self.cfg.attn_logit_softcap.is_some() {
            return Err(bad(format!("{}: attention logit soft-capping is not supported by the O(1) operator", self.cfg.arch)));
        }
        let serve: Vec<Serve> = self.layers.iter().map(|l| l.mixer.o1_serve()).collect();
        if !serve.contains(&Serve::Planned) {
            return Err(bad(format!(
                "{}: no global softmax-attention layer to serve in O(1) memory (sliding, recurrent and MLA layers are not planned)",
                self.cfg.arch
            )));
        }
        let geom = Geom {
            scale: self.cfg.attn_scale,
            n_heads: self.cfg.n_heads,
            n_kv: self.cfg.n_kv_heads,
            head_dim: self.cfg.head_dim,
        };
        let mut st = self.new_state(n_ctx);
        if matches!(plan.far, crate::o1::nystrom::Far::Linear(_)) {
            // Layers the polish left without a far field keep their eviction rule; a model with
            // none at all has nothing to serve.
            if !(0..serve.len()).any(|il| serve[il] == Serve::Planned && self.o1_far.get(il).is_some_and(Option::is_some)) {
                return Err(bad(crate::o1::nystrom::NystromError::NoFarWeights.to_string()));
            }
        }
        let mut run =
            O1Run::new(plan, serve, geom, self.o1_far.clone(), self.o1_split.as_deref(), self.o1_score_layers.as_deref());
        if plan.check.is_none() && plan.tp == 0 {
            crate::state::seal_all(&mut run, &mut st.layers).map_err(|e| bad(e.to_string()))?;
        }
        st.o1 = Some(run);
        Ok(st)
    }

    /// Run `tokens` at positions state.len.. and append them to the state. Returns logits
    /// [n_out, vocab] for the positions `want` selects.
    pub fn forward(&self, tokens: &[u32], state: &mut SeqState, want: Logits) -> Result<Vec<f32>> {
        self.forward_traced(tokens, state, want, &mut |_, _, _| {})
    }

    pub fn forward_traced(&self, tokens: &[u32], state: &mut SeqState, want: Logits, trace: Trace) -> Result<Vec<f32>> {
        self.check_tokens(tokens, state)?;
        // An O(1) plan seals between two calls: a chunk across the end of the prompt is cut
        // there, and the logits asked for are those of the two parts, in order.
        if let Some(cut) = state.o1.as_ref().and_then(|r| r.split(state.len, tokens.len())) {
            let (a, b) = tokens.split_at(cut);
            let (wa, wb) = match want {
                Logits::None => (Logits::None, Logits::None),
                Logits::Last => (Logits::None, Logits::Last),
                Logits::From(i) if i < cut => (Logits::From(i), Logits::From(0)),
                Logits::From(i) => (Logits::None, Logits::From(i - cut)),
            };
            let mut out = self.forward_chunk(a, state, wa, trace)?;
            out.extend(self.forward_chunk(b, state, wb, trace)?);
            return Ok(out);
        }
        self.forward_chunk(tokens, state, want, trace)
    }

    /// `forward_traced` of a chunk that does not cross an O(1) seal (checked tokens).
    fn forward_chunk(&self, tokens: &[u32], state: &mut SeqState, want: Logits, trace: Trace) -> Result<Vec<f32>> {
        // Denormals are zero on the threads that compute (see kernels::simd::flush_denormals).
        cortiq_kernels::simd::flush_denormals();
        let cfg = &self.cfg;
        let n = tokens.len();
        let pos0 = state.len;
        let d = cfg.d_model;
        let mut x = self.embed(tokens); // [n, d_model]
        trace("embd", usize::MAX, &x);

        for il in 0..self.layers.len() {
            self.layer_forward(il, &mut x, n, pos0, state, trace)?;
        }
        state.len = pos0 + n;

        let from = match want {
            Logits::None => return Ok(Vec::new()),
            Logits::Last => n - 1,
            Logits::From(i) => i.min(n),
        };
        Ok(self.head(&x[from * d..], trace))
    }

    /// One text's embedding (the embeddings routes): `tokens` run as one chunk from an empty
    /// sequence, the final norm's output (what the LM head would read) pooled over the
    /// positions, then scaled to unit length when `normalize`. -> [d_model]
    ///
    /// Pooling as the model's layout has it (`Pooling`): a decoder embedding model
    /// (Qwen3-Embedding) takes the last position, whose causal attention has seen every token.
    pub fn embed_pooled(&self, tokens: &[u32], pooling: Pooling, normalize: bool) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyEntry);
        }
        let mut state = self.new_state(tokens.len());
        self.check_tokens(tokens, &state)?;
        cortiq_kernels::simd::flush_denormals();
        let (n, d) = (tokens.len(), self.cfg.d_model);
        let mut x = self.embed(tokens); // [n, d_model]
        for il in 0..self.layers.len() {
            self.layer_forward(il, &mut x, n, 0, &mut state, &mut |_, _, _| {})?;
        }
        let mut normed = vec![0f32; x.len()]; // [n, d_model]
        rmsnorm_rows_in(self.numerics, &x, &self.output_norm, self.cfg.norm_eps, &mut normed);
        Ok(pool_rows(&normed, d, pooling, normalize))
    }

    /// `embed_pooled` of several inputs in one forward (`forward_batch`, each input its own
    /// sequence, the final-normed rows kept, no LM head): one read of the weights for the
    /// whole list, each row the value `embed_pooled` gives the input alone. Inputs are taken
    /// in groups of at most `max_tokens` positions (one forward each; an input longer than
    /// that runs alone). -> a row [d_model] per input
    pub fn embed_batch(
        &self,
        inputs: &[Vec<u32>],
        pooling: Pooling,
        normalize: bool,
        max_tokens: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let d = self.cfg.d_model;
        let mut out = Vec::with_capacity(inputs.len());
        let mut i = 0;
        while i < inputs.len() {
            let (mut j, mut n) = (i, 0);
            while j < inputs.len() && (j == i || n + inputs[j].len() <= max_tokens) {
                n += inputs[j].len();
                j += 1;
            }
            let group = &inputs[i..j];
            let mut states: Vec<SeqState> = group.iter().map(|t| self.new_state(t.len().max(1))).collect();
            let mut hidden: Vec<Vec<f32>> = vec![Vec::new(); group.len()];
            let mut batch: Vec<BatchEntry<'_>> = group
                .iter()
                .zip(states.iter_mut())
                .zip(hidden.iter_mut())
                .map(|((t, state), h)| BatchEntry { tokens: t, state, want: Logits::None, verify: None, hidden: Some(h) })
                .collect();
            self.forward_batch(&mut batch).map_err(|e| match e {
                EngineError::Batch { entry, source } => EngineError::Batch { entry: entry + i, source },
                e => e,
            })?;
            drop(batch);
            for h in &hidden {
                out.push(pool_rows(h, d, pooling, normalize));
            }
            i = j;
        }
        Ok(out)
    }

    /// Errors for a chunk that would overflow the context or holds an unknown token id.
    fn check_tokens(&self, tokens: &[u32], state: &SeqState) -> Result<()> {
        let n = tokens.len();
        if state.len + n > state.n_ctx {
            return Err(EngineError::ContextOverflow { what: "forward".into(), n_tokens: state.len + n, n_ctx: state.n_ctx });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(EngineError::BadToken { id, vocab: self.cfg.vocab });
        }
        Ok(())
    }

    /// The residual stream's start: embedding rows (scaled where the model says so).
    /// -> [n, d_model]
    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        let d = self.cfg.d_model;
        let mut x = vec![0f32; tokens.len() * d]; // [n, d_model]
        let _s = profile::span(Op::Embedding);
        pool().for_rows_mut(&mut x, d, 16, |t0, rows| {
            for (i, row) in rows.chunks_mut(d).enumerate() {
                self.tok_embd.row_f32(tokens[t0 + i] as usize, row);
                if let Some(s) = self.cfg.embed_scale {
                    row.iter_mut().for_each(|v| *v *= s);
                }
            }
        });
        x
    }

    /// Final norm and LM head over the rows of x [n_out, d_model] -> logits [n_out, vocab].
    fn head(&self, x: &[f32], trace: Trace) -> Vec<f32> {
        let cfg = &self.cfg;
        let n_out = x.len() / cfg.d_model;
        let mut normed = vec![0f32; x.len()]; // [n_out, d_model]
        rmsnorm_rows_in(self.numerics, x, &self.output_norm, cfg.norm_eps, &mut normed);
        trace("result_norm", usize::MAX, &normed);
        let mut logits = vec![0f32; n_out * cfg.vocab]; // [n_out, vocab]
        self.output.matmul(&normed, n_out, &mut logits);
        self.finish_logits(&mut logits);
        logits
    }

    /// The logits' last touches: Granite's scaling, then Gemma's soft cap.
    fn finish_logits(&self, logits: &mut [f32]) {
        if let Some(s) = self.cfg.logit_scale {
            pool().for_rows_mut(logits, 4096, 1, |_, ls| ls.iter_mut().for_each(|l| *l /= s));
        }
        if let Some(c) = self.cfg.final_logit_softcap {
            pool().for_rows_mut(logits, 4096, 1, |_, ls| ls.iter_mut().for_each(|l| *l = (*l / c).tanh() * c));
        }
    }

    /// One decode step for each of several sequences (the serving core's decode batch):
    /// `tokens[j]` at position `states[j].len` of sequence j. Logits [k, vocab], row j
    /// **bit-identical to `forward(&[tokens[j]], states[j], Logits::Last)`** run alone, whatever
    /// else is in the batch (`forward_batch` with one position per entry).

    /// One step of the serving core over several sequences, each with its own chunk (a decode
    /// position, a prompt chunk): entry j runs `tokens` at positions `state.len..` of its own
    /// sequence. Returns the logits every entry's `want` selects, [Σ rows_j, vocab] in entry
    /// order, each entry's rows and state **bit-identical to `forward(tokens, state, want)`**
    /// run alone, whatever else is in the batch. Every layer runs the sequences' mixers (their
    /// attention, their recurrent state) one by one and the projections, FFNs and the LM head
    /// over the rows of every entry at once where each row's value does not depend on the rows
    /// beside it (`QTensor::rowwise`: the decode path, which a chunk on interleaved weights
    /// also takes), so one read of each weight serves the whole step; where it would (another
    /// weight layout, MoE routing over a chunk) that part runs per entry. A verify entry
    /// (`BatchEntry::verify`) joins the step as `forward_verify` would run it alone, its rows
    /// each a decode row of the projections, FFN and head: with k streams speculating, the
    /// weights are still read once a step. An entry whose O(1) plan is before its seal (or
    /// checks) takes its own `forward` (or `forward_verify`), same result. Every token and
    /// context is checked before any state moves; an error names the batch entry.
    pub fn forward_batch(&self, batch: &mut [BatchEntry<'_>]) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.forward_batch_into(batch, &mut out)?;
        Ok(out)
    }

    /// `forward_batch` into `out` (replaced): a buffer kept from step to step, so that the LM
    /// head's rows (megabytes at a 150k vocabulary) are not zeroed again before every step's
    /// product overwrites them.
    pub fn forward_batch_into(&self, batch: &mut [BatchEntry<'_>], out: &mut Vec<f32>) -> Result<()> {
        cortiq_kernels::simd::flush_denormals();
        let entry_err = |j: usize, e: EngineError| EngineError::Batch { entry: j, source: Box::new(e) };
        for (j, e) in batch.iter().enumerate() {
            if e.tokens.is_empty() {
                return Err(entry_err(j, EngineError::EmptyEntry));
            }
            self.check_tokens(e.tokens, e.state).map_err(|err| entry_err(j, err))?;
        }
        let (d, vocab) = (self.cfg.d_model, self.cfg.vocab);
        let own = |e: &BatchEntry<'_>| e.state.o1.as_ref().is_some_and(|r| r.checks() || r.pending(e.state.len));
        let alone: Vec<bool> = batch.iter().map(own).collect();
        let merged: Vec<usize> = (0..batch.len()).filter(|&j| !alone[j]).collect();
        let mut outs: Vec<Option<Vec<f32>>> = vec![None; batch.len()];
        for j in (0..batch.len()).filter(|&j| alone[j] || merged.len() == 1) {
            let e = &mut batch[j];
            let o = match (e.verify.as_deref_mut(), e.hidden.as_deref_mut()) {
                (Some(journal), _) => self.forward_verify(e.tokens, e.state, journal),
                (None, Some(hidden)) => self.forward_hidden(e.tokens, e.state, e.want).map(|(l, h)| {
                    *hidden = h;
                    l
                }),
                (None, None) => self.forward(e.tokens, e.state, e.want),
            };
            outs[j] = Some(o.map_err(|err| entry_err(j, err))?);
        }
        if merged.len() > 1 {
            let ns: Vec<usize> = merged.iter().map(|&j| batch[j].tokens.len()).collect();
            let all: Vec<u32> = merged.iter().flat_map(|&j| batch[j].tokens.iter().copied()).collect();
            let wants: Vec<Logits> =
                merged.iter().map(|&j| if batch[j].verify.is_some() { Logits::From(0) } else { batch[j].want }).collect();
            // The FFN's segments: a verify's rows are decode rows, one position each.
            let ffn_segs: Vec<usize> = merged
                .iter()
                .zip(&ns)
                .flat_map(|(&j, &n)| if batch[j].verify.is_some() { vec![1; n] } else { vec![n] })
                .collect();
            let (mut sts, mut journals): (Vec<&mut SeqState>, Vec<Option<&mut VerifyJournal>>) =
                batch.iter_mut().zip(&alone).filter(|(_, a)| !**a).map(|(e, _)| (&mut *e.state, e.verify.as_deref_mut())).unzip();
            for (st, (journal, &n)) in sts.iter().zip(journals.iter_mut().zip(&ns)) {
                if let Some(jn) = journal {
                    jn.begin(st, n, self.layers.len());
                }
            }
            let mut x = self.embed(&all); // [Σ n, d_model], row by row as alone
            for il in 0..self.layers.len() {
                self.layer_mixer_segments(il, &mut x, &mut sts, &ns, &mut journals)?;
                self.layer_ffn(il, &mut x, &ffn_segs, &mut |_, _, _| {});
            }
            for (st, n) in sts.iter_mut().zip(&ns) {
                st.len += n;
            }
            // The final-normed rows of the entries an MTP drafter reads: a verify's into its
            // journal, another entry's where it asked for them (`BatchEntry::hidden`).
            let mut r0 = 0;
            for (&j, &n) in merged.iter().zip(&ns) {
                let e = &mut batch[j];
                let out = match (e.verify.as_deref_mut(), e.hidden.as_deref_mut()) {
                    (Some(jn), _) => Some(&mut jn.hidden),
                    (None, h) => h,
                };
                if let Some(h) = out {
                    h.resize(n * d, 0.0); // [n, d_model]
                    rmsnorm_rows_in(self.numerics, &x[r0 * d..(r0 + n) * d], &self.output_norm, self.cfg.norm_eps, h);
                }
                r0 += n;
            }
            // The rows each entry wants, gathered for one LM head pass.
            let (mut rows, mut n_out) = (Vec::new(), Vec::with_capacity(ns.len())); // [Σ n_out, d_model]
            let mut r0 = 0;
            for (&n, want) in ns.iter().zip(&wants) {
                let from = match want {
                    Logits::None => n,
                    Logits::Last => n - 1,
                    Logits::From(i) => (*i).min(n),
                };
                rows.extend_from_slice(&x[(r0 + from) * d..(r0 + n) * d]);
                n_out.push(n - from);
                r0 += n;
            }
            let head_rowwise = n_out.iter().all(|&m| m <= 1 || self.output.rowwise(m));
            if head_rowwise {
                self.head_rows(&rows, out); // [Σ n_out, vocab]
                if merged.len() == batch.len() {
                    return Ok(()); // every entry merged, in order
                }
                let logits = std::mem::take(out);
                let mut at = 0;
                for (&j, &m) in merged.iter().zip(&n_out) {
                    outs[j] = Some(logits[at * vocab..(at + m) * vocab].to_vec());
                    at += m;
                }
            } else {
                let mut at = 0;
                for (&j, &m) in merged.iter().zip(&n_out) {
                    let r = &rows[at * d..(at + m) * d];
                    outs[j] = Some(match m {
                        0 => Vec::new(),
                        // A verify's rows are decode rows, as `forward_verify` heads them.
                        _ if batch[j].verify.is_some() => {
                            let mut v = Vec::new();
                            self.head_rows(r, &mut v);
                            v
                        }
                        _ => self.head(r, &mut |_, _, _| {}),
                    });
                    at += m;
                }
            }
        }
        let mut outs = outs.into_iter().map(|o| o.expect("every entry ran"));
        if batch.len() == 1 {
            *out = outs.next().expect("one entry"); // a lone entry's own logits, no copy
            return Ok(());
        }
        out.clear();
        for o in outs {
            out.extend_from_slice(&o);
        }
        Ok(())
    }

    /// The LM head over independent rows x [k, d_model] (each one position's) -> out [k, vocab],
    /// every row as `head` gives it alone: one weight pass for all rows (`matvec_rows`).
    fn head_rows(&self, x: &[f32], out: &mut Vec<f32>) {
        let (d, k) = (self.cfg.d_model, x.len() / self.cfg.d_model);
        if k <= 1 {
            *out = if k == 0 { Vec::new() } else { self.head(x, &mut |_, _, _| {}) };
            return;
        }
        let mut normed = vec![0f32; k * d]; // [k, d_model]
        rmsnorm_rows_in(self.numerics, x, &self.output_norm, self.cfg.norm_eps, &mut normed);
        self.head_normed_rows(&normed, out);
    }

    /// The LM head's product over final-normed independent rows [k, d_model] -> out [k, vocab],
    /// each row as `head` gives it alone (k = 1: the decode path itself).
    fn head_normed_rows(&self, normed: &[f32], out: &mut Vec<f32>) {
        let (d, vocab) = (self.cfg.d_model, self.cfg.vocab);
        let k = normed.len() / d;
        // Every value is overwritten by the product: what the buffer held does not matter.
        out.resize(k * vocab, 0.0); // [k, vocab]
        if k == 1 {
            self.output.matmul(normed, 1, out);
        } else {
            self.output.matvec_rows(normed, k, out);
        }
        self.finish_logits(out);
    }

    /// The verify of speculative decoding: `tokens` (the last accepted token, then a draft)
    /// at positions state.len.., every position computed as its own decode step, with one
    /// read of each weight for all of them (the projections, FFNs and LM head take the
    /// serving batch's row-wise path; attention and recurrent mixers step position by position,
    /// `Mixer::forward_steps`). Returns logits [n, vocab], row i **bit-identical to the i-th of
    /// n single `forward` steps**; the state holds all n positions, and `verify_keep` then
    /// keeps any prefix of them, leaving the state bit for bit as having decoded exactly that
    /// prefix. `journal` (one per sequence, kept from verify to verify) records what that
    /// needs: nothing for KV caches (they truncate), for recurrent layers their state before
    /// the chunk and the rows that step it again, never a copy of the whole sequence state.
    /// Before an O(1) plan's seal (or in its check mode) the positions run as single steps
    /// after an ordinary checkpoint.
    pub fn forward_verify(&self, tokens: &[u32], state: &mut SeqState, journal: &mut VerifyJournal) -> Result<Vec<f32>> {
        cortiq_kernels::simd::flush_denormals();
        if tokens.is_empty() {
            return Err(EngineError::EmptyEntry);
        }
        self.check_tokens(tokens, state)?;
        let (n, pos0) = (tokens.len(), state.len);
        journal.begin(state, n, self.layers.len());
        if state.o1.as_ref().is_some_and(|r| r.checks() || r.pending(pos0)) {
            let cp = state.checkpoint();
            let mut logits = Vec::with_capacity(n * self.cfg.vocab); // [n, vocab]
            journal.hidden.clear();
            for &t in tokens {
                let (l, h) = self.forward_hidden(&[t], state, Logits::Last)?;
                logits.extend(l);
                journal.hidden.extend(h);
            }
            journal.fallback = Some((cp, tokens.to_vec()));
            return Ok(logits);
        }
        let (cfg, env) = (&self.cfg, self.env());
        let ones = vec![1usize; n];
        let mut x = self.embed(tokens); // [n, d_model], row by row as alone
        for il in 0..self.layers.len() {
            let lw = &self.layers[il];
            let mut h = vec![0f32; x.len()]; // [n, d_model]
            rmsnorm_rows_in(self.numerics, &x, &lw.attn_norm, cfg.norm_eps, &mut h);
            let a = lw.mixer.forward_steps(&env, &h, n, self.seq(il, state, pos0), &mut journal.layers[il])?;
            self.mixer_residual(il, &mut x, a, &mut |_, _, _| {});
            self.layer_ffn(il, &mut x, &ones, &mut |_, _, _| {});
        }
        state.len = pos0 + n;
        // The final-normed rows, kept for a drafter that reads them (MTP), then the LM head.
        journal.hidden.resize(x.len(), 0.0); // [n, d_model]
        rmsnorm_rows_in(self.numerics, &x, &self.output_norm, cfg.norm_eps, &mut journal.hidden);
        let mut logits = Vec::new();
        self.head_normed_rows(&journal.hidden, &mut logits); // [n, vocab]
        Ok(logits)
    }

    /// Keep the first `keep` positions of the last `forward_verify` on `state` (0 ≤ keep ≤ its
    /// n; the state must not have moved since): KV caches are truncated, recurrent layers
    /// restored and stepped again over the kept rows (`Mixer::rewind`), the O(1) counters put
    /// back. The state is then bit for bit what decoding exactly those tokens leaves.
    pub fn verify_keep(&self, state: &mut SeqState, journal: &mut VerifyJournal, keep: usize) -> Result<()> {
        assert!(keep <= journal.n && state.len == journal.pos0 + journal.n, "verify_keep: the state moved since its verify");
        if keep == journal.n {
            return Ok(());
        }
        if let Some((cp, tokens)) = journal.fallback.take() {
            state.rollback(cp);
            for &t in &tokens[..keep] {
                self.forward(&[t], state, Logits::None)?;
            }
            journal.n = keep;
            return Ok(());
        }
        if let (Some(run), Some(stats)) = (state.o1.as_mut(), journal.o1_stats) {
            run.set_stats(stats);
        }
        let (env, pos0) = (self.env(), journal.pos0);
        for il in 0..self.layers.len() {
            self.layers[il].mixer.rewind(&env, self.seq(il, state, pos0), &mut journal.layers[il], keep)?;
        }
        state.len = pos0 + keep;
        journal.n = keep;
        Ok(())
    }

    /// One decoder layer over `n` positions from `pos0`: x [n, d_model] is updated in place
    /// (residual stream), the layer's state grows by n positions. `state.len` is not touched.
    /// A planned O(1) layer seals when the chunk ends at the plan's tp.
    fn layer_forward(&self, il: usize, x: &mut [f32], n: usize, pos0: usize, state: &mut SeqState, trace: Trace) -> Result<()> {
        self.layer_mixer(il, x, n, pos0, state, trace)?;
        self.layer_ffn(il, x, &[n], trace);
        Ok(())
    }

    /// A layer's mixer half (norm, attention or recurrent mixer, post-norm, residual) over x
    /// [n, d_model] in place; the layer's state grows by n positions.
    fn layer_mixer(&self, il: usize, x: &mut [f32], n: usize, pos0: usize, state: &mut SeqState, trace: Trace) -> Result<()> {
        let cfg = &self.cfg;
        let lw = &self.layers[il];
        let mut h = vec![0f32; n * cfg.d_model]; // [n, d_model]
        rmsnorm_rows_in(self.numerics, x, &lw.attn_norm, cfg.norm_eps, &mut h);
        trace("attn_norm", il, &h);
        let mut tr = |name: &str, vals: &[f32]| trace(name, il, vals);
        let a = lw.mixer.forward(&self.env(), &h, n, self.seq(il, state, pos0), &mut tr)?;
        seal_if_due(&mut state.o1, il, pos0 + n, &mut state.layers[il])?;
        self.mixer_residual(il, x, a, trace);
        Ok(())
    }

    /// The mixer half for the serving batch: x [Σ n_i, d_model], the rows of `batch[0]`'s
    /// chunk (`ns[0]` positions from its `len`) first; `Mixer::forward_segments`, each
    /// segment the same as `layer_mixer` over it alone.
    fn layer_mixer_segments(
        &self,
        il: usize,
        x: &mut [f32],
        batch: &mut [&mut SeqState],
        ns: &[usize],
        verifies: &mut [Option<&mut VerifyJournal>],
    ) -> Result<()> {
        let cfg = &self.cfg;
        let lw = &self.layers[il];
        let mut h = vec![0f32; x.len()]; // [Σ n_i, d_model]
        rmsnorm_rows_in(self.numerics, x, &lw.attn_norm, cfg.norm_eps, &mut h);
        let segs: Vec<(Seq, usize)> = batch
            .iter_mut()
            .zip(ns)
            .map(|(st, &n)| {
                let pos0 = st.len;
                (self.seq(il, st, pos0), n)
            })
            .collect();
        let steps: Vec<Option<&mut Journal>> = verifies.iter_mut().map(|v| v.as_deref_mut().map(|j| &mut j.layers[il])).collect();
        let a = lw.mixer.forward_segments_steps(&self.env(), &h, segs, steps)?;
        for ((st, &n), v) in batch.iter_mut().zip(ns).zip(verifies.iter()) {
            if v.is_none() {
                let end = st.len + n;
                seal_if_due(&mut st.o1, il, end, &mut st.layers[il])?;
            }
        }
        self.mixer_residual(il, x, a, &mut |_, _, _| {});
        Ok(())
    }

    /// The mixer half's tail: post-norm (Gemma 3), trace, residual add of a [n, d_model].
    fn mixer_residual(&self, il: usize, x: &mut [f32], mut a: Vec<f32>, trace: Trace) {
        if let Some(g) = &self.layers[il].post_attn_norm {
            rmsnorm_segments_in(self.numerics, &mut a, g, self.cfg.norm_eps);
        }
        trace("attn_proj", il, &a);
        residual_add(x, &a, self.cfg.residual_scale);
    }

    /// What every mixer's forward reads of the model.
    fn env(&self) -> Env<'_> {
        Env { cfg: &self.cfg, num: self.numerics }
    }

    /// Sequence `st`'s side of a step of layer `il` from position `pos0`.
    fn seq<'a>(&self, il: usize, st: &'a mut SeqState, pos0: usize) -> Seq<'a> {
        let lc = LlamaCppCtx { cache_cells: st.n_ctx, threads: self.llamacpp_threads, fp16_build: self.llamacpp_fp16 };
        let o1 = st.o1.as_mut().map_or(AttnO1::Off, |r| r.hook(il));
        Seq { state: &mut st.layers[il], pos0, lc, o1 }
    }

    /// A layer's FFN half over x [Σ n_i, d_model] in place (norm, FFN, post-norm, residual):
    /// `segs` = [n] for n positions of one sequence; several entries for the serving batch
    /// (`forward_batch`: segment i is n_i positions of its own sequence), each segment's rows
    /// bit-identical to its FFN alone — one pass over all rows when the matrices are row-wise
    /// for every segment, else segment by segment.
    fn layer_ffn(&self, il: usize, x: &mut [f32], segs: &[usize], trace: Trace) {
        let cfg = &self.cfg;
        let (lw, num) = (&self.layers[il], self.numerics);
        if matches!(lw.ffn, Ffn::None) {
            trace("l_out", il, x);
            return;
        }
        let d = cfg.d_model;
        let mut h = vec![0f32; x.len()]; // [Σ n_i, d_model]
        rmsnorm_rows_in(num, x, &lw.ffn_norm, cfg.norm_eps, &mut h);
        trace("ffn_norm", il, &h);
        let one = |h: &[f32], n: usize| match &lw.ffn {
            Ffn::Dense(f) => ffn(cfg, f, h, n, num),
            Ffn::Moe(mw) => moe(cfg, cfg.moe.as_ref().expect("checked at load"), mw, h, n, num),
            Ffn::None => unreachable!("returned above"),
        };
        let n_max = segs.iter().copied().max().unwrap_or(0);
        let mut m = match &lw.ffn {
            _ if segs.len() == 1 => one(&h, segs[0]),
            Ffn::Dense(f) if f.read().iter().all(|w| w.rowwise(n_max)) => ffn_rows(cfg, f, &h, h.len() / d, num),
            // Decode rows (and verify positions): each selected expert read once for all.
            Ffn::Moe(mw) if n_max == 1 => moe_rows(cfg, cfg.moe.as_ref().expect("checked at load"), mw, &h, h.len() / d, num),
            _ => {
                let mut out = Vec::with_capacity(h.len());
                let mut r0 = 0;
                for &n in segs {
                    out.extend(one(&h[r0 * d..(r0 + n) * d], n));
                    r0 += n;
                }
                out
            }
        };
        if let Some(g) = &lw.post_ffn_norm {
            rmsnorm_segments_in(num, &mut m, g, cfg.norm_eps);
        }
        trace("ffn_out", il, &m);
        residual_add(x, &m, cfg.residual_scale);
        trace("l_out", il, x);
    }

    /// `forward`, also returning every position's final-normed hidden row [n, d_model] (what
    /// an MTP head reads: the rows the LM head multiplies); the logits are the same.
    pub(crate) fn forward_hidden(&self, tokens: &[u32], state: &mut SeqState, want: Logits) -> Result<(Vec<f32>, Vec<f32>)> {
        let mut rows = Vec::new();
        let last_layer = self.layers.len() - 1;
        let logits = self.forward_traced(tokens, state, want, &mut |name, il, v| {
            if name == "l_out" && il == last_layer {
                rows.extend_from_slice(v);
            }
        })?;
        let mut normed = vec![0f32; rows.len()];
        rmsnorm_rows_in(self.numerics, &rows, &self.output_norm, self.cfg.norm_eps, &mut normed);
        Ok((logits, normed))
    }

    /// `prefill` with `forward_hidden`: the last position's logits and every position's
    /// final-normed hidden row.
    pub(crate) fn prefill_hidden(&self, tokens: &[u32], state: &mut SeqState, chunk: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let (mut last, mut hidden) = (Vec::new(), Vec::with_capacity(tokens.len() * self.cfg.d_model));
        let (base, len) = (state.len, state.len + tokens.len());
        let mut done = base;
        while done < len {
            let end = crate::prefix::next_cut(done, len, chunk, None, false, self.cut_grid()).end;
            let want = if end == len { Logits::Last } else { Logits::None };
            let (l, h) = self.forward_hidden(&tokens[done - base..end - base], state, want)?;
            last = l;
            hidden.extend(h);
            done = end;
        }
        Ok((last, hidden))
    }

    /// A fresh state for MTP block `block`'s attention layer.
    pub fn new_mtp_state(&self, block: usize) -> LayerState {
        self.mtp[block].layer.mixer.new_state(self.kv_type)
    }

    /// MTP block `block` over `n` positions from `pos0` (Qwen3-Next / Qwen3.5, as llama.cpp's
    /// draft graph): position p takes the target's final-normed hidden row h_p and the next
    /// token x_{p+1}, x = eh_proj · [enorm(embed(x_{p+1})) | hnorm(h_p)], then the block's
    /// attention (its own cache, `state`) and FFN, then shared_head_norm. Returns those normed
    /// rows [n, d_model] (the next chained step's h) and the LM head's logits of the last.
    pub(crate) fn mtp_forward(
        &self,
        block: usize,
        tokens: &[u32],
        hidden: &[f32],
        pos0: usize,
        state: &mut LayerState,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (cfg, num) = (&self.cfg, self.numerics);
        let (d, n) = (cfg.d_model, tokens.len());
        let m = &self.mtp[block];
        assert_eq!(hidden.len(), n * d, "mtp_forward: one hidden row per token");
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
            return Err(EngineError::BadToken { id, vocab: cfg.vocab });
        }
        let e = self.embed(tokens); // [n, d_model]
        let mut cat = vec![0f32; n * 2 * d]; // [n, 2·d_model]: enorm(e) | hnorm(h)
        let (mut en, mut hn) = (vec![0f32; n * d], vec![0f32; n * d]);
        rmsnorm_rows_in(num, &e, &m.enorm, cfg.norm_eps, &mut en);
        rmsnorm_rows_in(num, hidden, &m.hnorm, cfg.norm_eps, &mut hn);
        for (row, (a, b)) in cat.chunks_mut(2 * d).zip(en.chunks(d).zip(hn.chunks(d))) {
            row[..d].copy_from_slice(a);
            row[d..].copy_from_slice(b);
        }
        let mut x = m.eh_proj.project(&cat, n, false); // [n, d_model]
        let lw = &m.layer;
        let mut h = vec![0f32; x.len()];
        rmsnorm_rows_in(num, &x, &lw.attn_norm, cfg.norm_eps, &mut h);
        let lc = LlamaCppCtx { cache_cells: pos0 + n, threads: self.llamacpp_threads, fp16_build: self.llamacpp_fp16 };
        let mut a = lw.mixer.forward(&self.env(), &h, n, Seq { state, pos0, lc, o1: AttnO1::Off }, &mut |_, _| {})?;
        if let Some(g) = &lw.post_attn_norm {
            rmsnorm_segments_in(num, &mut a, g, cfg.norm_eps);
        }
        x.iter_mut().zip(&a).for_each(|(xi, ai)| *xi += ai);
        rmsnorm_rows_in(num, &x, &lw.ffn_norm, cfg.norm_eps, &mut h);
        let mut f = match &lw.ffn {
            Ffn::Dense(fw) => ffn(cfg, fw, &h, n, num),
            Ffn::Moe(mw) => moe(cfg, cfg.moe.as_ref().expect("checked at load"), mw, &h, n, num),
            Ffn::None => vec![0.0; h.len()],
        };
        if let Some(g) = &lw.post_ffn_norm {
            rmsnorm_segments_in(num, &mut f, g, cfg.norm_eps);
        }
        x.iter_mut().zip(&f).for_each(|(xi, fi)| *xi += fi);
        let mut out = vec![0f32; x.len()];
        rmsnorm_rows_in(num, &x, &m.shared_head_norm, cfg.norm_eps, &mut out);
        let mut logits = Vec::new();
        self.head_normed_rows(&out[(n - 1) * d..], &mut logits); // [vocab]
        Ok((out, logits))
    }

    /// Prefill a prompt (on top of what the state holds) in calls of about `chunk` positions,
    /// cut as the prompt cache cuts (`prefix::next_cut`: absolute multiples of the chunk on
    /// the grid, two to `prefix::MAX_CALL` positions each), so its values are the same as the
    /// scheduler's, cached or cold; returns the last position's logits.
    pub fn prefill(&self, tokens: &[u32], state: &mut SeqState, chunk: usize) -> Result<Vec<f32>> {
        let mut last = Vec::new();
        let (base, len) = (state.len, state.len + tokens.len());
        let mut done = base;
        while done < len {
            let end = crate::prefix::next_cut(done, len, chunk, None, false, self.cut_grid()).end;
            let want = if end == len { Logits::Last } else { Logits::None };
            last = self.forward(&tokens[done - base..end - base], state, want)?;
            done = end;
        }
        Ok(last)
    }
}

/// x += y (× `scale`: Granite's residual multiplier); a prompt chunk's rows over the pool (each
/// value the same whoever adds it: the main thread's serial adds were ~0.7% of a 128-token
/// prefill of Granite-4.0-H-Tiny, the other thread idle).
fn residual_add(x: &mut [f32], y: &[f32], scale: Option<f32>) {
    assert_eq!(x.len(), y.len(), "residual_add: {} values plus {}", x.len(), y.len());
    let add = |x: &mut [f32], y: &[f32]| match scale {
        Some(s) => x.iter_mut().zip(y).for_each(|(xi, yi)| *xi += yi * s),
        None => x.iter_mut().zip(y).for_each(|(xi, yi)| *xi += yi),
    };
    if x.len() < RESIDUAL_SPLIT {
        add(x, y);
    } else {
        pool().for_rows_mut(x, 1, RESIDUAL_SPLIT / 2, |i0, xs| {
            let n = xs.len();
            add(xs, &y[i0..i0 + n]);
        });
    }
}

/// Values from which `residual_add` splits over the pool (a decode row stays on one thread).
const RESIDUAL_SPLIT: usize = 1 << 16;

/// A MoE layer's weights by GGUF names: the router `ffn_gate_inp`, the experts either one
/// tensor each (`ffn_gate_exps.E.weight`, how HF folders arrive through the name table) or
/// stacked `[experts × rows, cols]` as llama.cpp writes them (split into views, no copy), the
/// optional shared expert (`*_shexp`) and its gate (`ffn_gate_inp_shexp`), and the optional
/// selection bias (`exp_probs_b.bias`).
fn load_moe(src: &dyn TensorSource, mc: &MoeConfig, il: usize, d: usize) -> Result<MoeWeights> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let (ne, ff) = (mc.n_experts, mc.d_ff_expert);
    let router = src.require(&n("ffn_gate_inp.weight"), ne, d)?;
    let stacked = |kind: &str, rows: usize, cols: usize| -> Result<Option<QTensor>> {
        src.optional(&n(&format!("ffn_{kind}_exps.weight")), ne * rows, cols)
    };
    let (sg, su, sd) = (stacked("gate", ff, d)?, stacked("up", ff, d)?, stacked("down", d, ff)?);
    // Granite's checkpoints fuse gate and up per expert: [experts × (gate ff | up ff), d].
    let fused = match (&sg, &su) {
        (None, None) => src.optional(&n("ffn_gate_up_exps.weight"), ne * 2 * ff, d)?,
        _ => None,
    };
    // An ungated expert (Nemotron-H: relu² of up) reads its up projection as the gate too.
    let gate_is_up = mc.ungated && sg.is_none() && fused.is_none();
    let sg = match (sg, &su) {
        (None, Some(u)) if mc.ungated => Some(u.rows_view(u.name.clone(), 0, u.rows).expect("its own rows")),
        (sg, _) => sg,
    };
    let view = |t: &QTensor, e: usize, r0: usize, rows: usize| {
        t.rows_view(format!("{}[{e}]", t.name), r0, rows).expect("stacked shape checked")
    };
    let mut experts = Vec::with_capacity(ne);
    for e in 0..ne {
        let one = |kind: &str, st: &Option<QTensor>, rows: usize, cols: usize| -> Result<QTensor> {
            match st {
                Some(t) => Ok(view(t, e, e * rows, rows)),
                None => src.require(&n(&format!("ffn_{kind}_exps.{e}.weight")), rows, cols),
            }
        };
        let (gate, up) = match &fused {
            Some(t) => (view(t, e, 2 * e * ff, ff), view(t, e, (2 * e + 1) * ff, ff)),
            // Ungated experts stored one by one: the up projection is the gate too.
            None if mc.ungated && sg.is_none() => {
                let up = one("up", &su, ff, d)?;
                (up.rows_view(up.name.clone(), 0, ff).expect("its own rows"), up)
            }
            None => (one("gate", &sg, ff, d)?, one("up", &su, ff, d)?),
        };
        experts.push(FfnWeights { gate, up, down: one("down", &sd, d, ff)?, gate_is_up });
    }
    let shared = match mc.d_ff_shared {
        Some(sf) => {
            let (gate, up, gate_is_up) = gate_up(
                src,
                &n("ffn_gate_shexp.weight"),
                &n("ffn_up_shexp.weight"),
                &n("ffn_gate_up_shexp.weight"),
                sf,
                d,
                mc.ungated,
            )?;
            Some(FfnWeights { gate, up, down: src.require(&n("ffn_down_shexp.weight"), d, sf)?, gate_is_up })
        }
        None => None,
    };
    let shared_gate = if mc.shared_gate { Some(src.require(&n("ffn_gate_inp_shexp.weight"), 1, d)?) } else { None };
    let select_bias = src.optional(&n("exp_probs_b.bias"), 1, ne)?.map(|t| t.to_f32());
    let router_bias = src.optional(&n("ffn_gate_inp.bias"), 1, ne)?.map(|t| t.to_f32());
    // gpt-oss's expert biases, stacked [experts × width].
    let expert_biases = match src.optional(&n("ffn_gate_exps.bias"), ne, ff)? {
        Some(gb) => {
            let (gb, ub, db) = (
                gb.to_f32(),
                src.require(&n("ffn_up_exps.bias"), ne, ff)?.to_f32(),
                src.require(&n("ffn_down_exps.bias"), ne, d)?.to_f32(),
            );
            Some(
                (0..ne)
                    .map(|e| ExpertBias {
                        gate: gb[e * ff..(e + 1) * ff].to_vec(),
                        up: ub[e * ff..(e + 1) * ff].to_vec(),
                        down: db[e * d..(e + 1) * d].to_vec(),
                    })
                    .collect(),
            )
        }
        None => None,
    };
    if matches!(mc.act, crate::moe::ExpertAct::ClampedSwiGlu { .. }) && expert_biases.is_none() {
        return Err(EngineError::MissingTensor { file: src.file(), tensor: n("ffn_gate_exps.bias") });
    }
    Ok(MoeWeights { router, router_bias, select_bias, experts, expert_biases, shared, shared_gate })
}

/// A gate and an up projection [ff, d] each: two tensors, or one fused [gate ff | up ff, d]
/// (Granite's `input_linear`) split into views; `ungated` (`Activation::Relu2`): up alone,
/// standing in for the gate too.
fn gate_up(
    src: &dyn TensorSource,
    gate: &str,
    up: &str,
    fused: &str,
    ff: usize,
    d: usize,
    ungated: bool,
) -> Result<(QTensor, QTensor, bool)> {
    if src.get(gate)?.is_none() {
        if let Some(t) = src.optional(fused, 2 * ff, d)? {
            let half = |r0: usize| t.rows_view(t.name.clone(), r0, ff).expect("fused shape checked");
            return Ok((half(0), half(ff), false));
        }
        if ungated {
            let u = src.require(up, ff, d)?;
            let g = u.rows_view(u.name.clone(), 0, ff).expect("its own rows");
            return Ok((g, u, true));
        }
    }
    Ok((src.require(gate, ff, d)?, src.require(up, ff, d)?, false))
}

/// The MTP blocks that follow the ordinary layers: block `n_layers + i` while it has an
/// `nextn.eh_proj` tensor.
fn load_mtp(src: &dyn TensorSource, cfg: &ModelConfig) -> Result<Vec<MtpWeights>> {
    let d = cfg.d_model;
    let mut out = Vec::new();
    // The MTP layer is a full-attention layer shaped like the model's own attention layers.
    let Some(attn) = cfg.layers.iter().find(|l| l.mixer == MixerKind::Attention) else { return Ok(out) };
    loop {
        let il = cfg.n_layers + out.len();
        let n = |s: &str| format!("blk.{il}.{s}");
        let Some(eh_proj) = src.optional(&n("nextn.eh_proj.weight"), d, 2 * d)? else { return Ok(out) };
        let spec = attn.clone();
        out.push(MtpWeights {
            eh_proj,
            enorm: src.vector(&n("nextn.enorm.weight"), d)?,
            hnorm: src.vector(&n("nextn.hnorm.weight"), d)?,
            shared_head_norm: src.vector(&n("nextn.shared_head_norm.weight"), d)?,
            layer: load_layer(src, cfg, il, &spec)?,
            spec,
        });
    }
}

/// One decoder layer's weights at block `il`, laid out as `spec` says.
fn load_layer(src: &dyn TensorSource, cfg: &ModelConfig, il: usize, spec: &LayerSpec) -> Result<LayerWeights> {
    let (d, ff) = (cfg.d_model, cfg.d_ff);
    let n = |s: &str| format!("blk.{il}.{s}");
    let post = |s: &str| -> Result<Option<Vec<f32>>> { if cfg.post_norms { Ok(Some(src.vector(&n(s), d)?)) } else { Ok(None) } };
    let mixer = mixers::registry::load(src, cfg, il, spec)?;
    // A layer without a mixer normalizes its FFN input with the block's one norm (`attn_norm`);
    // a layer without an FFN has no pre-FFN norm.
    let no_mixer = spec.mixer == MixerKind::Identity;
    let (attn_norm, ffn_norm) = match (no_mixer, spec.ffn) {
        (true, _) => (vec![1.0; d], src.vector(&n("attn_norm.weight"), d)?),
        (false, true) => (src.vector(&n("attn_norm.weight"), d)?, src.vector(&n(cfg.ffn_norm), d)?),
        (false, false) => (src.vector(&n("attn_norm.weight"), d)?, Vec::new()),
    };
    let ungated = cfg.act == crate::config::Activation::Relu2;
    Ok(LayerWeights {
        attn_norm,
        mixer,
        post_attn_norm: post("post_attention_norm.weight")?,
        ffn_norm,
        ffn: if !spec.ffn {
            Ffn::None
        } else if spec.moe {
            let mc = cfg.moe.as_ref().ok_or_else(|| EngineError::BadConfig {
                file: src.file(),
                what: format!("layer {il} is a mixture of experts but the model has no expert configuration"),
            })?;
            Ffn::Moe(load_moe(src, mc, il, d)?)
        } else {
            let (gate, up, gate_is_up) =
                gate_up(src, &n("ffn_gate.weight"), &n("ffn_up.weight"), &n("ffn_gate_up.weight"), ff, d, ungated)?;
            Ffn::Dense(FfnWeights { gate, up, down: src.require(&n("ffn_down.weight"), d, ff)?, gate_is_up })
        },
        post_ffn_norm: post("post_ffw_norm.weight")?,
    })
}

/// A planned O(1) layer seals its cache into the constant-size state when a chunk ends at the
/// plan's tp (`end` = the position after the chunk).
fn seal_if_due(o1: &mut Option<O1Run>, il: usize, end: usize, ls: &mut LayerState) -> Result<()> {
    if let Some(run) = o1.as_mut().filter(|r| r.seals_after(il, end)) {
        crate::state::seal_layer(run, il, ls)
            .map_err(|e| EngineError::BadConfig { file: "o(1) seal".into(), what: e.to_string() })?;
    }
    Ok(())
}
