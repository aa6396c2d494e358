//! vmf_phase (issue 16): cortiq's own linear-attention core, the mixer that converted attention
//! layers of a dense model run (`cortiq convert --linear-core vmf_phase`). Per layer:
//! ```text
//! x      = conv(h)                          optional causal depthwise conv, identity-initialised
//! θq     = thq·x (+ b)   [n_heads, P]       θk = thk·x (+ b)   [n_k_heads, P]
//! φ(θ)   = [cos θ/(1+mass); sin θ/(1+mass)]  (F = 2P components; mass per state, 0 = off)
//! κ      = σ(k_gate·x + b)   [n_k_heads]     (1 without the gate)
//! S_g    ← λ_g ⊙ S_g + κ_g φk_g ⊗ v_g        S_g: [F, d_v], λ = exp(−exp(A_log)) per component
//! o_h    = φq_hᵀ S_{g(h)}                    query head h reads state g(h) = h / (n_heads / n_k_heads)
//! o_h    ← g_h ⊙ o_h / rms(o_h)             optional output norm (gains g [n_heads·d_v])
//! out    = out_proj · o (+ b_out)           optional output bias
//! ```
//! `n_k_heads = n_heads` is the plain operator of the issue (one state per head); fewer states
//! shared by groups of query heads (as GQA shares keys) is the named option whose off state is
//! that plain operator. The kernel itself (recurrence, chunk-parallel prefill, cos/sin in f64)
//! is `cortiq_kernels::vmf`; this module owns the weights, the state, the projections and the
//! configuration (`config.json`'s `vmf_phase` object or the `cortiq.vmf_phase.*` GGUF keys).
//!
//! Weights by GGUF names (HF `model.layers.N.vmf_attn.*` through formats' name table):
//! `blk.N.vmf_thq.{weight,bias}`, `vmf_thk.{weight,bias}`, `vmf_v.weight`, `vmf_out.weight`,
//! `vmf_a_log`, `vmf_conv.weight`, `vmf_kgate.{weight,bias}`, `vmf_mass`, `vmf_out.bias`,
//! `vmf_onorm.weight`. The output norm is an option by presence (absent: the plain operator,
//! the same code path as before it existed); rms(o_h) = sqrt(mean(o_h²) + 1e-6), the mean in
//! f64. The output bias is optional by presence: a folded layer whose attention had a value
//! bias (Qwen2) carries it as out_proj·b_v, which is what softmax makes of a value bias (the
//! weights sum to one), while the core's own v_proj has none.

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::names::{Bias, LayerRow, Pair};
use cortiq_kernels::conv::causal_conv1d_par;
use cortiq_kernels::vmf::{self, CHUNK};
use serde_json::Value;

use crate::config::{MixerKind, ModelConfig};
use crate::error::{EngineError, Result};
use crate::mixers::{Env, Journal, KvType, LayerState, Mixer, MixerState, Seq, StateBytes};
use crate::par::pool;
use crate::profile::{self, Op};
use crate::qtensor::QTensor;

use crate::weights::TensorSource;

pub use crate::geometry::VmfConfig;

/// vmf_phase's tensors in both spellings (HF `vmf_attn.*`, GGUF `vmf_*`): rows every
/// architecture with convertible attention layers includes.
pub const NAMES: &[LayerRow] = &[
    ("vmf_attn.thq", "vmf_thq", Bias::Yes),
    ("vmf_attn.thk", "vmf_thk", Bias::Yes),
    ("vmf_attn.v_proj", "vmf_v", Bias::No),
    ("vmf_attn.out_proj", "vmf_out", Bias::Yes),
    ("vmf_attn.conv", "vmf_conv", Bias::No),
    ("vmf_attn.k_gate", "vmf_kgate", Bias::Yes),
    ("vmf_attn.o_norm", "vmf_onorm", Bias::No),
    ("vmf_attn.slot", "vmf_slot", Bias::Yes),
];
/// vmf_phase's bare parameters: A_log is stored as A_log by both spellings (the decay is
/// formed at load).
pub const BARE_NAMES: &[Pair] = &[("vmf_attn.A_log", "vmf_a_log"), ("vmf_attn.phase_mass", "vmf_mass")];

/// The `vmf_phase` settings of a model: which layers run the core, with what geometry.
#[derive(Clone, Debug, PartialEq)]
pub struct VmfPlan {
    pub layers: Vec<usize>,
    pub cfg: VmfConfig,
    /// With the window option, each layer's own window (`layers`' order), chosen by the fold
    /// within a total budget; empty: every layer `cfg.window`.
    pub windows: Vec<usize>,
    /// With the window option, each layer's own sinks (`layers`' order), chosen with the
    /// windows; empty: every layer `cfg.sinks`.
    pub layer_sinks: Vec<usize>,
}

impl VmfPlan {
    /// Reads a `vmf_phase` object (config.json; the same keys as GGUF's `cortiq.vmf_phase.*`):
    /// `layers` (required), `nphase` (required), `n_heads`, `n_k_heads`, `head_dim_v`,
    /// `conv_kernel`, `k_gate`, `phase_bias`, `window`, `sinks`, `windows` and `layer_sinks`
    /// (each layer's window and sinks, in `layers`' order). Defaults: the model's heads and
    /// head_dim, one state per head (per KV head with a window), no conv, no gate, no bias, no
    /// window, `window` and `sinks` on every layer. Err names the bad field.
    pub fn from_json(v: &Value, cfg: &ModelConfig) -> std::result::Result<VmfPlan, String> {
        let obj = v.as_object().ok_or("vmf_phase: expected an object")?;
        if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(format!("vmf_phase: unknown key '{k}' (known: {})", KEYS.join(", ")));
        }
        let num = |k: &str| -> std::result::Result<Option<usize>, String> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x.as_u64().map(|x| Some(x as usize)).ok_or(format!("vmf_phase.{k}: expected a non-negative integer")),
            }
        };
        let flag = |k: &str| -> std::result::Result<bool, String> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(false),
                Some(x) => x.as_bool().ok_or(format!("vmf_phase.{k}: expected true or false")),
            }
        };
        let list = |k: &str| -> std::result::Result<Option<Vec<usize>>, String> {
            let Some(v) = obj.get(k).filter(|v| !v.is_null()) else { return Ok(None) };
            v.as_array()
                .ok_or(format!("vmf_phase.{k}: expected an array of non-negative integers"))?
                .iter()
                .map(|x| x.as_u64().map(|x| x as usize).ok_or(format!("vmf_phase.{k}: expected non-negative integers")))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(Some)
        };
        let layers = list("layers")?.ok_or("vmf_phase.layers: expected an array of layer indices")?;
        Raw::read(num, flag, "vmf_phase.nphase")?.plan(layers, list("windows")?, list("layer_sinks")?, cfg)
    }

    /// Reads the `cortiq.vmf_phase.*` keys of a GGUF (or a .cmf built from one); None when
    /// `cortiq.vmf_phase.layers` is absent.
    pub fn from_gguf(g: &dyn GgufMeta, cfg: &ModelConfig) -> std::result::Result<Option<VmfPlan>, String> {
        let key = |k: &str| format!("cortiq.vmf_phase.{k}");
        let list = |k: &str| -> std::result::Result<Option<Vec<usize>>, String> {
            let Some(v) = g.get(&key(k)) else { return Ok(None) };
            v.as_array()
                .ok_or(format!("{}: expected an array", key(k)))?
                .iter()
                .map(|x| {
                    x.as_i64()
                        .filter(|&x| x >= 0)
                        .map(|x| x as usize)
                        .ok_or(format!("{}: expected non-negative integers", key(k)))
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(Some)
        };
        let Some(layers) = list("layers")? else { return Ok(None) };
        let num = |k: &str| g.opt_u64(&key(k)).map(|v| v.map(|v| v as usize)).map_err(|e| e.to_string());
        let flag = |k: &str| num(k).map(|v| v.unwrap_or(0) != 0);
        Raw::read(num, flag, "cortiq.vmf_phase.nphase")?.plan(layers, list("windows")?, list("layer_sinks")?, cfg).map(Some)
    }

    /// The plan as `config.json`'s `vmf_phase` object (every key written).
    pub fn to_json(&self) -> Value {
        let c = &self.cfg;
        let mut v = serde_json::json!({
            "layers": self.layers, "nphase": c.nphase, "n_heads": c.n_heads, "n_k_heads": c.n_k_heads,
            "head_dim_v": c.d_v, "conv_kernel": c.conv_kernel, "k_gate": c.k_gate, "phase_bias": c.phase_bias,
            "window": c.window, "sinks": c.sinks,
        });
        if !self.windows.is_empty() {
            v["windows"] = serde_json::json!(self.windows);
        }
        if !self.layer_sinks.is_empty() {
            v["layer_sinks"] = serde_json::json!(self.layer_sinks);
        }
        v
    }

    /// The configuration of the plan's `i`-th layer (`layers[i]`): `cfg` with its own window
    /// and sinks.
    pub fn layer_config(&self, i: usize) -> VmfConfig {
        VmfConfig {
            window: self.windows.get(i).copied().unwrap_or(self.cfg.window),
            sinks: self.layer_sinks.get(i).copied().unwrap_or(self.cfg.sinks),
            ..self.cfg
        }
    }

    /// The model's layers become vmf_phase layers.
    pub fn apply(&self, cfg: &mut ModelConfig) {
        for (i, &il) in self.layers.iter().enumerate() {
            cfg.layers[il].mixer = MixerKind::VmfPhase(self.layer_config(i));
            cfg.layers[il].sliding_window = None;
        }
    }
}

const KEYS: &[&str] = &[
    "layers",
    "nphase",
    "n_heads",
    "n_k_heads",
    "head_dim_v",
    "conv_kernel",
    "k_gate",
    "phase_bias",
    "window",
    "sinks",
    "windows",
    "layer_sinks",
];

/// The fields as read, before the model's defaults and the checks.
struct Raw {
    nphase: usize,
    n_heads: Option<usize>,
    n_k_heads: Option<usize>,
    head_dim_v: Option<usize>,
    conv_kernel: usize,
    k_gate: bool,
    phase_bias: bool,
    window: usize,
    sinks: usize,
}

type Field<T> = std::result::Result<T, String>;

impl Raw {
    /// The fields through the source's readers (`nphase`: the required key's full name, for
    /// the message).
    fn read(num: impl Fn(&str) -> Field<Option<usize>>, flag: impl Fn(&str) -> Field<bool>, nphase: &str) -> Field<Raw> {
        Ok(Raw {
            nphase: num("nphase")?.ok_or(format!("{nphase} is required"))?,
            n_heads: num("n_heads")?,
            n_k_heads: num("n_k_heads")?,
            head_dim_v: num("head_dim_v")?,
            conv_kernel: num("conv_kernel")?.unwrap_or(0),
            k_gate: flag("k_gate")?,
            phase_bias: flag("phase_bias")?,
            window: num("window")?.unwrap_or(0),
            sinks: num("sinks")?.unwrap_or(0),
        })
    }

    fn plan(
        self,
        layers: Vec<usize>,
        windows: Option<Vec<usize>>,
        layer_sinks: Option<Vec<usize>>,
        cfg: &ModelConfig,
    ) -> std::result::Result<VmfPlan, String> {
        let n_heads = self.n_heads.unwrap_or(cfg.n_heads);
        // With a window the core's states are the attention's KV heads (it writes their keys'
        // values as they leave the window).
        let n_k_heads = self.n_k_heads.unwrap_or(if self.window > 0 { cfg.n_kv_heads } else { n_heads });
        let d_v = self.head_dim_v.unwrap_or(cfg.head_dim);
        if self.nphase == 0 || n_heads == 0 || n_k_heads == 0 || !n_heads.is_multiple_of(n_k_heads) || d_v == 0 {
            return Err(format!(
                "vmf_phase: nphase {}, {n_heads} heads, {n_k_heads} states, head_dim_v {d_v} is not a valid geometry \
                 (all positive, states dividing heads)",
                self.nphase
            ));
        }
        if self.conv_kernel == 1 || self.conv_kernel > 64 {
            return Err(format!("vmf_phase.conv_kernel {} must be 0 (none) or 2..=64", self.conv_kernel));
        }
        if self.window == 0 && self.sinks > 0 {
            return Err(format!("vmf_phase.sinks {} needs a window (vmf_phase.window > 0)", self.sinks));
        }
        if self.window > 0 && (n_heads != cfg.n_heads || n_k_heads != cfg.n_kv_heads || d_v != cfg.head_dim) {
            return Err(format!(
                "vmf_phase with a window keeps the attention's heads: n_heads {n_heads}, n_k_heads {n_k_heads}, \
                 head_dim_v {d_v} must be the model's {}, {} and {}",
                cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
            ));
        }
        if self.window > 0 && (cfg.attn_gate || cfg.attn_logit_softcap.is_some()) {
            return Err("vmf_phase with a window: gated or soft-capped attention is not supported".into());
        }
        if let Some(&il) = layers.iter().find(|&&il| il >= cfg.n_layers) {
            return Err(format!("vmf_phase.layers names layer {il}; the model has {}", cfg.n_layers));
        }
        if !cfg.layers.iter().all(|l| l.mixer == MixerKind::Attention) {
            return Err("vmf_phase layers are for dense models (every layer softmax attention)".into());
        }
        // Each layer with its window and sinks (if given), in layer order.
        let windows = per_layer("windows", windows, &layers, self.window, false)?;
        let layer_sinks = per_layer("layer_sinks", layer_sinks, &layers, self.window, true)?;
        let mut paired: Vec<(usize, Option<usize>, Option<usize>)> =
            layers.iter().enumerate().map(|(i, &il)| (il, windows.get(i).copied(), layer_sinks.get(i).copied())).collect();
        paired.sort_unstable();
        paired.dedup_by_key(|p| p.0);
        if paired.len() != layers.len() {
            return Err("vmf_phase.layers names a layer twice".into());
        }
        let layers: Vec<usize> = paired.iter().map(|p| p.0).collect();
        let windows: Vec<usize> = paired.iter().filter_map(|p| p.1).collect();
        let layer_sinks: Vec<usize> = paired.iter().filter_map(|p| p.2).collect();
        let c = VmfConfig {
            d_model: cfg.d_model,
            n_heads,
            n_k_heads,
            nphase: self.nphase,
            d_v,
            conv_kernel: self.conv_kernel,
            k_gate: self.k_gate,
            phase_bias: self.phase_bias,
            window: self.window,
            sinks: self.sinks,
        };
        Ok(VmfPlan { layers, cfg: c, windows, layer_sinks })
    }
}

/// A per-layer list of the plan (`windows`, `layer_sinks`): absent or empty, or one entry per
/// layer of `layers` (zero allowed only where `zero_ok`), and only with the window option on.
fn per_layer(
    key: &str,
    list: Option<Vec<usize>>,
    layers: &[usize],
    window: usize,
    zero_ok: bool,
) -> std::result::Result<Vec<usize>, String> {
    let list = list.unwrap_or_default();
    if !list.is_empty() && (list.len() != layers.len() || window == 0 || (!zero_ok && list.contains(&0))) {
        let each = if zero_ok { "one per layer" } else { "one window > 0 per layer" };
        return Err(format!(
            "vmf_phase.{key}: {} entries for {} layers; {each}, with the window option on (window > 0)",
            list.len(),
            layers.len()
        ));
    }
    Ok(list)
}

/// Applies the `vmf_phase` object of an HF config (if any) to the model built from it.
pub fn apply_hf(raw: &Value, file: &str, cfg: &mut ModelConfig) -> Result<()> {
    let Some(v) = raw.get("vmf_phase").filter(|v| !v.is_null()) else { return Ok(()) };
    let plan = VmfPlan::from_json(v, cfg).map_err(|what| EngineError::BadConfig { file: file.to_string(), what })?;
    plan.apply(cfg);
    Ok(())
}

/// Applies the `cortiq.vmf_phase.*` keys of a GGUF (if any) to the model built from it.
pub fn apply_gguf(g: &dyn GgufMeta, cfg: &mut ModelConfig) -> Result<()> {
    let file = g.meta_path().display().to_string();
    if let Some(plan) = VmfPlan::from_gguf(g, cfg).map_err(|what| EngineError::BadConfig { file, what })? {
        plan.apply(cfg);
    }
    Ok(())
}

/// The core's own weights: what turns the mixer input into φq, φk and κ, the decays and the
/// output norm's gains. A plain layer adds its v_proj / out_proj ([`VmfWeights`]); a windowed
/// one (`vmf_window`) takes v and out from its attention.
pub struct CoreWeights {
    /// [n_heads·P, d_model]
    pub thq: QTensor,
    /// [n_heads·P] or empty.
    pub thq_b: Vec<f32>,
    /// [n_k_heads·P, d_model]
    pub thk: QTensor,
    /// [n_k_heads·P] or empty.
    pub thk_b: Vec<f32>,
    /// [n_k_heads·F] as stored.
    pub a_log: Vec<f32>,
    /// [n_k_heads·F]: λ = exp(−exp(A_log)) in f64 (the chunked form's powers come from it).
    pub decay64: Vec<f64>,
    /// [n_k_heads·F]: λ rounded to f32 (the recurrence).
    pub decay: Vec<f32>,
    /// [d_model, conv_kernel] depthwise taps, or empty.
    pub conv: Vec<f32>,
    /// The write gate: [n_k_heads, d_model] and [n_k_heads].
    pub k_gate: Option<(QTensor, Vec<f32>)>,
    /// [n_k_heads] phase mass as stored (zeros when the file has none).
    pub mass: Vec<f32>,
    /// [n_k_heads]: 1 / (1 + mass) in f64.
    pub scale: Vec<f64>,
    /// [n_heads·d_v] the output norm's gains, or empty (off).
    pub o_norm: Vec<f32>,
}

impl CoreWeights {
    /// Builds the derived fields (decays, phase scales) from the stored ones.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        thq: QTensor,
        thq_b: Vec<f32>,
        thk: QTensor,
        thk_b: Vec<f32>,
        a_log: Vec<f32>,
        conv: Vec<f32>,
        k_gate: Option<(QTensor, Vec<f32>)>,
        mass: Vec<f32>,
        o_norm: Vec<f32>,
    ) -> CoreWeights {
        let decay64: Vec<f64> = a_log.iter().map(|&a| (-(a as f64).exp()).exp()).collect();
        let decay = decay64.iter().map(|&x| x as f32).collect();
        let scale = mass.iter().map(|&m| 1.0 / (1.0 + m as f64)).collect();
        CoreWeights { thq, thq_b, thk, thk_b, a_log, decay64, decay, conv, k_gate, mass, scale, o_norm }
    }

    /// Layer `il`'s core tensors by GGUF names; shapes checked against `c`.
    pub fn load(src: &dyn TensorSource, c: &VmfConfig, il: usize) -> Result<CoreWeights> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let (d, p, nh, nk) = (c.d_model, c.nphase, c.n_heads, c.n_k_heads);
        let bias =
            |s: &str, len: usize| -> Result<Vec<f32>> { if c.phase_bias { src.vector(&n(s), len) } else { Ok(Vec::new()) } };
        let k_gate = if c.k_gate {
            Some((src.require(&n("vmf_kgate.weight"), nk, d)?, src.vector(&n("vmf_kgate.bias"), nk)?))
        } else {
            None
        };
        let conv = if c.conv_kernel > 0 { src.require(&n("vmf_conv.weight"), d, c.conv_kernel)?.to_f32() } else { Vec::new() };
        let mass = match src.optional(&n("vmf_mass"), 1, nk)? {
            Some(t) => t.to_f32(),
            None => vec![0.0; nk],
        };
        let bad = |what: String| EngineError::BadConfig { file: src.file(), what };
        if let Some(m) = mass.iter().find(|&&m| !(m > -1.0 && m.is_finite())) {
            return Err(bad(format!("blk.{il}.vmf_mass: {m} (a phase mass must be finite and > −1)")));
        }
        let a_log = src.vector(&n("vmf_a_log"), nk * c.f())?;
        if let Some(a) = a_log.iter().find(|a| !a.is_finite()) {
            return Err(bad(format!("blk.{il}.vmf_a_log: {a} is not finite")));
        }
        Ok(CoreWeights::new(
            src.require(&n("vmf_thq.weight"), nh * p, d)?,
            bias("vmf_thq.bias", nh * p)?,
            src.require(&n("vmf_thk.weight"), nk * p, d)?,
            bias("vmf_thk.bias", nk * p)?,
            a_log,
            conv,
            k_gate,
            mass,
            src.optional(&n("vmf_onorm.weight"), 1, nh * c.d_v)?.map(|t| t.to_f32()).unwrap_or_default(),
        ))
    }

    /// The matrices the core itself owns (θq, θk, the gate's).
    pub fn matrices(&self) -> Vec<&QTensor> {
        let mut m = vec![&self.thq, &self.thk];
        m.extend(self.k_gate.as_ref().map(|(g, _)| g));
        m
    }

    pub fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        let mut m = vec![&mut self.thq, &mut self.thk];
        m.extend(self.k_gate.as_mut().map(|(g, _)| g));
        m
    }

    /// The conv over `n` rows of one sequence (`rings` its one conv ring) or one row each of
    /// several (`rows`: a ring per row) -> x [n, d_model] (h itself without a conv).
    pub fn conv(&self, c: &VmfConfig, h: &[f32], rings: &mut [&mut Vec<f32>], rows: bool) -> Vec<f32> {
        let (d, k) = (c.d_model, c.conv_kernel);
        if k == 0 {
            return h.to_vec();
        }
        let n = h.len() / d;
        let mut x = vec![0f32; n * d]; // [n, d_model]
        if rows {
            for (i, ring) in rings.iter_mut().enumerate() {
                let r = i * d..(i + 1) * d;
                causal_conv1d_par(pool(), &h[r.clone()], 1, d, &self.conv, k, &[], ring, false, &mut x[r]);
            }
        } else {
            causal_conv1d_par(pool(), h, n, d, &self.conv, k, &[], rings[0], false, &mut x);
        }
        x
    }
}

/// A plain vmf_phase layer's weights: the core's and its own value and output projections.
pub struct VmfWeights {
    pub core: CoreWeights,
    /// [n_k_heads·d_v, d_model]
    pub v: QTensor,
    /// [d_model, n_heads·d_v]
    pub out: QTensor,
    /// [d_model] or empty.
    pub out_b: Vec<f32>,
}

/// One sequence's vmf_phase state: every state matrix and the conv ring. Constant size.
#[derive(Clone, Debug, PartialEq)]
pub struct VmfState {
    /// [n_k_heads, F, d_v]
    pub s: Vec<f32>,
    /// [conv_kernel − 1, d_model], oldest first (empty without a conv).
    pub conv: Vec<f32>,
}

impl VmfState {
    pub fn new(c: &VmfConfig) -> VmfState {
        let (s, conv) = c.state_floats();
        VmfState { s: vec![0.0; s], conv: vec![0.0; conv] }
    }
}

impl MixerState for VmfState {
    fn is_recurrent(&self) -> bool {
        true
    }
    fn clear(&mut self) {
        self.s.fill(0.0);
        self.conv.fill(0.0);
    }
    fn save(&self, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        crate::codec::put_f32s(out, &self.conv);
        crate::codec::put_f32s(out, &self.s);
        Ok(())
    }
    fn load(&mut self, r: &mut &[u8], _len: usize) -> std::result::Result<(), String> {
        self.conv = crate::codec::get_f32s(r, self.conv.len(), "vmf_phase conv state")?;
        self.s = crate::codec::get_f32s(r, self.s.len(), "vmf_phase recurrent state")?;
        Ok(())
    }
    fn bytes(&self) -> StateBytes {
        StateBytes { recurrent: (self.s.len() + self.conv.len()) * 4, ..StateBytes::default() }
    }
}

/// A vmf_phase layer.
pub struct VmfPhase {
    pub cfg: VmfConfig,
    pub w: VmfWeights,
}

impl VmfPhase {
    /// Layer `il` by GGUF names; shapes checked against `c`.
    pub fn load(src: &dyn TensorSource, c: VmfConfig, il: usize) -> Result<VmfPhase> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let (d, nh, nk) = (c.d_model, c.n_heads, c.n_k_heads);
        let w = VmfWeights {
            core: CoreWeights::load(src, &c, il)?,
            v: src.require(&n("vmf_v.weight"), nk * c.d_v, d)?,
            out: src.require(&n("vmf_out.weight"), d, nh * c.d_v)?,
            out_b: src.optional(&n("vmf_out.bias"), 1, d)?.map(|t| t.to_f32()).unwrap_or_default(),
        };
        Ok(VmfPhase { cfg: c, w })
    }
}

/// The input projections of n rows: θq and θk turned into φ, κ, v.
pub struct Projected {
    /// [n, n_heads, F]
    pub phq: Vec<f32>,
    /// [n, n_k_heads, F]
    pub phk: Vec<f32>,
    /// [n, n_k_heads]
    pub kappa: Vec<f32>,
    /// [n, n_k_heads·d_v]
    pub v: Vec<f32>,
}

/// `x` [n, d_model] (after the conv) -> the projected rows; `rows`: n decode rows of
/// different sequences (each on the decode path) rather than n positions of one.
pub fn project(c: &VmfConfig, w: &VmfWeights, x: &[f32], n: usize, rows: bool) -> Projected {
    let mut p = features(c, &w.core, x, n, rows);
    p.v = w.v.project(x, n, rows); // [n, n_k_heads·d_v]
    p
}

/// [`project`] without the values (`v` left empty): φq, φk and κ of n rows.
pub fn features(c: &VmfConfig, w: &CoreWeights, x: &[f32], n: usize, rows: bool) -> Projected {
    let (p, f, nh, nk) = (c.nphase, c.f(), c.n_heads, c.n_k_heads);
    // The biases are optional (empty when absent).
    let add_bias = |y: &mut [f32], b: &[f32]| {
        if !b.is_empty() {
            crate::mixers::add_bias(y, b);
        }
    };
    let mut thq = w.thq.project(x, n, rows); // [n, n_heads·P]
    add_bias(&mut thq, &w.thq_b);
    let mut thk = w.thk.project(x, n, rows); // [n, n_k_heads·P]
    add_bias(&mut thk, &w.thk_b);
    let kappa = match &w.k_gate {
        Some((gw, gb)) => {
            let mut z = gw.project(x, n, rows); // [n, n_k_heads]
            add_bias(&mut z, gb);
            z.iter_mut().for_each(|z| *z = (1.0 / (1.0 + (-(*z as f64)).exp())) as f32);
            z
        }
        None => vec![1.0; n * nk],
    };
    let span = profile::span(Op::Mixer);
    let mut phq = vec![0f32; n * nh * f]; // [n, n_heads, F]
    let mut phk = vec![0f32; n * nk * f]; // [n, n_k_heads, F]
    let g = c.group();
    pool().for_rows_mut(&mut phq, nh * f, 4, |t0, out| {
        for (i, row) in out.chunks_exact_mut(nh * f).enumerate() {
            let th = &thq[(t0 + i) * nh * p..(t0 + i + 1) * nh * p];
            for h in 0..nh {
                vmf::phase_features(&th[h * p..(h + 1) * p], w.scale[h / g], &mut row[h * f..(h + 1) * f]);
            }
        }
    });
    pool().for_rows_mut(&mut phk, nk * f, 4, |t0, out| {
        for (i, row) in out.chunks_exact_mut(nk * f).enumerate() {
            let th = &thk[(t0 + i) * nk * p..(t0 + i + 1) * nk * p];
            for s in 0..nk {
                vmf::phase_features(&th[s * p..(s + 1) * p], w.scale[s], &mut row[s * f..(s + 1) * f]);
            }
        }
    });
    drop(span);
    Projected { phq, phk, kappa, v: Vec::new() }
}

/// The core over `n` consecutive positions of one sequence from projected rows `p` (rows
/// `r0..r0 + n` of it): o [n, n_heads·d_v]. n = 1 takes the recurrence (decode, and each step
/// of `forward_steps`), longer runs the chunk-parallel form with chunks from the first row.
pub fn core(c: &VmfConfig, w: &CoreWeights, p: &Projected, r0: usize, n: usize, state: &mut VmfState) -> Vec<f32> {
    let _span = profile::span(Op::Mixer);
    let (f, dv, nh, nk, g) = (c.f(), c.d_v, c.n_heads, c.n_k_heads, c.group());
    let mut o = vec![0f32; n * nh * dv]; // [n, n_heads·d_v]
    let (mut phk, mut kappa, mut v, mut phq) = (vec![0f32; n * f], vec![0f32; n], vec![0f32; n * dv], vec![0f32; n * g * f]);
    let mut og = vec![0f32; n * g * dv]; // [n, g, d_v]
    for s in 0..nk {
        // Gather state s's rows (its keys, gate and values; its g query heads, consecutive).
        for t in 0..n {
            let r = r0 + t;
            phk[t * f..(t + 1) * f].copy_from_slice(&p.phk[(r * nk + s) * f..(r * nk + s + 1) * f]);
            kappa[t] = p.kappa[r * nk + s];
            v[t * dv..(t + 1) * dv].copy_from_slice(&p.v[(r * nk + s) * dv..(r * nk + s + 1) * dv]);
            phq[t * g * f..(t + 1) * g * f].copy_from_slice(&p.phq[(r * nh + s * g) * f..(r * nh + (s + 1) * g) * f]);
        }
        let st = &mut state.s[s * f * dv..(s + 1) * f * dv];
        let dec = &w.decay[s * f..(s + 1) * f];
        if n == 1 {
            vmf::recurrent(&phk, &kappa, &v, &phq, g, dec, n, dv, st, &mut og);
        } else {
            vmf::chunked(&phk, &kappa, &v, &phq, g, &w.decay64[s * f..(s + 1) * f], n, dv, st, &mut og);
        }
        for t in 0..n {
            o[(t * nh + s * g) * dv..(t * nh + (s + 1) * g) * dv].copy_from_slice(&og[t * g * dv..(t + 1) * g * dv]);
        }
    }
    o
}

impl Mixer for VmfPhase {
    fn name(&self) -> &'static str {
        "a vmf_phase linear core"
    }
    fn matrices(&self) -> Vec<&QTensor> {
        let w = &self.w;
        let mut m = vec![&w.v, &w.out];
        m.extend(w.core.matrices());
        m
    }
    fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        let w = &mut self.w;
        let mut m = vec![&mut w.v, &mut w.out];
        m.extend(w.core.matrices_mut());
        m
    }
    fn new_state(&self, _kv: KvType) -> LayerState {
        LayerState::new(VmfState::new(&self.cfg))
    }
    /// The chunk-parallel form chunks from a call's start.
    fn cut_grid(&self) -> usize {
        CHUNK
    }
    fn forward(&self, _env: &Env, h: &[f32], n: usize, seq: Seq<'_>, trace: &mut dyn FnMut(&str, &[f32])) -> Result<Vec<f32>> {
        let state: &mut VmfState = seq.state.of();
        let x = self.w.core.conv(&self.cfg, h, &mut [&mut state.conv], false);
        let p = project(&self.cfg, &self.w, &x, n, false);
        let o = core(&self.cfg, &self.w.core, &p, 0, n, state);
        trace("vmf_o", &o);
        Ok(self.output(&o, n, false)) // [n, d_model]
    }
    /// The projections over all rows at once (each on the decode path); conv ring and state
    /// per sequence.
    fn forward_rows(&self, _env: &Env, h: &[f32], rows: Vec<Seq<'_>>) -> Result<Vec<f32>> {
        let kb = rows.len();
        let mut states: Vec<&mut VmfState> = rows.into_iter().map(|s| s.state.of()).collect();
        let x = self.w.core.conv(&self.cfg, h, &mut states.iter_mut().map(|s| &mut s.conv).collect::<Vec<_>>(), true);
        let p = project(&self.cfg, &self.w, &x, kb, true);
        let mut o = Vec::with_capacity(kb * self.cfg.n_heads * self.cfg.d_v); // [kb, n_heads·d_v]
        for (i, st) in states.into_iter().enumerate() {
            o.extend(core(&self.cfg, &self.w.core, &p, i, 1, st));
        }
        Ok(self.output(&o, kb, true))
    }
    /// The projections over all n rows at once (each on the decode path), then the conv and
    /// the recurrence one position at a time; journaled as the state's snapshot and the input
    /// rows (a rewind steps the kept rows again).
    fn forward_steps(&self, _env: &Env, h: &[f32], n: usize, seq: Seq<'_>, journal: &mut Journal) -> Result<Vec<f32>> {
        journal.begin(seq.state, n);
        journal.record = Some(Box::new(h.to_vec()));
        let o = self.steps(h, n, seq.state.of());
        Ok(self.output(&o, n, true))
    }
    fn rewind(&self, env: &Env, seq: Seq<'_>, journal: &mut Journal, keep: usize) -> Result<()> {
        assert!(journal.restore(seq.state), "a vmf_phase state is recurrent: forward_steps snapshotted it");
        let h: &Vec<f32> = journal.record();
        self.steps(&h[..keep * env.cfg.d_model], keep, seq.state.of());
        Ok(())
    }
}

impl VmfPhase {
    /// (the output norm, when on) out_proj · o (+ the output bias) -> [n, d_model].
    fn output(&self, o: &[f32], n: usize, rows: bool) -> Vec<f32> {
        let normed;
        let o = if self.w.core.o_norm.is_empty() {
            o
        } else {
            normed = vmf::out_norm(o, &self.w.core.o_norm, self.cfg.d_v);
            &normed
        };
        let mut y = self.w.out.project(o, n, rows);
        if !self.w.out_b.is_empty() {
            crate::mixers::add_bias(&mut y, &self.w.out_b);
        }
        y
    }

    /// `n` positions each as its own decode step: the conv row by row (as n = 1 calls run it),
    /// the projections of all rows on the decode path, the recurrence per row -> o [n, n_heads·d_v].
    fn steps(&self, h: &[f32], n: usize, state: &mut VmfState) -> Vec<f32> {
        let d = self.cfg.d_model;
        let mut x = Vec::with_capacity(n * d); // [n, d_model]
        for hr in h.chunks_exact(d).take(n) {
            x.extend(self.w.core.conv(&self.cfg, hr, &mut [&mut state.conv], false));
        }
        let p = project(&self.cfg, &self.w, &x, n, true);
        let mut o = Vec::with_capacity(n * self.cfg.n_heads * self.cfg.d_v);
        for i in 0..n {
            o.extend(core(&self.cfg, &self.w.core, &p, i, 1, state));
        }
        o
    }
}
