//! Multi-head latent attention as Kimi Linear uses it (DeepSeek-V2's MLA with no RoPE): q from
//! q_proj (per head [nope | rope] dims, no rotation), a compressed latent kv_a·x = [c (kv_lora) |
//! k_rot (shared by all heads)], c RMS-normalized, expanded by kv_b into per-head [k_nope | v];
//! keys are [k_nope | k_rot], scores scaled by 1/√(nope + rope).
//!
//! The cache keeps the latent, not the expansion: one row [c | k_rot] per position
//! (kv_lora + rope values, padded to a multiple of 16 with zeros) shared by every head, where
//! the expanded keys and values take n_heads · (nope + rope + v_dim) (Kimi-Linear-48B: 576
//! against 10,240 values per position and layer). Attention runs in the absorbed form:
//! k_nope_h · q_nope_h = c · (W_kb,hᵀ q_nope_h), so head h's query becomes
//! [W_kb,hᵀ q_nope_h | q_rope_h] against the latent rows, the values are the same rows (their c
//! part), and W_vb,h maps the weighted sum of c to the head's output. That is multi-query
//! attention with one kv head of the latent's width: decode attention's kernel (`kvattn` via
//! `attention::attend_latent`) runs it, split over the keys. The absorption and W_vb run in f32 on
//! kv_b widened once (kept until the weights change), the same arithmetic for a prompt chunk, a
//! decode row or a verified draft, so each position's value does not depend on how many came
//! with it. The latent stays f32 whatever `--kv-type` asks (c is normed and small; an f16 or
//! 8-bit latent is a later saving, as before this layout).

use std::ops::Range;
use std::sync::OnceLock;

use cortiq_kernels::dot::{axpy, dot};

use crate::compat::Numerics;
use crate::error::Result;
pub use crate::geometry::MlaConfig;
use crate::mixers::attention::attend_latent;
use crate::mixers::{Env, Journal, KvType, LayerState, Mixer, MixerState, Seq, StateBytes};
use crate::qtensor::QTensor;
use crate::weights::TensorSource;

pub struct MlaWeights {
    /// [n_heads·(nope + rope), d_model]
    pub q: QTensor,
    /// [kv_lora + rope, d_model]
    pub kv_a: QTensor,
    /// [kv_lora]
    pub kv_a_norm: Vec<f32>,
    /// [n_heads·(nope + v_dim), kv_lora]
    pub kv_b: QTensor,
    /// [d_model, n_heads·v_dim]
    pub o: QTensor,
}

/// The latent cache [len, width]: per position the normed c, k_rot and zeros up to `width`.
#[derive(Debug, PartialEq)]
pub struct MlaState {
    pub lat: Vec<f32>,
    /// Values per position (`MlaConfig::latent_width`).
    width: usize,
}

impl Clone for MlaState {
    fn clone(&self) -> MlaState {
        MlaState { lat: self.lat.clone(), width: self.width }
    }

    /// Into this state's own buffer (a serving slot restored from the prompt cache).
    fn clone_from(&mut self, src: &MlaState) {
        self.lat.clone_from(&src.lat);
        self.width = src.width;
    }
}

impl MlaState {
    pub fn new(c: &MlaConfig) -> MlaState {
        MlaState { lat: Vec::new(), width: c.latent_width() }
    }

    /// Cached positions.
    fn len(&self) -> usize {
        self.lat.len() / self.width
    }
}

impl MixerState for MlaState {
    fn is_recurrent(&self) -> bool {
        false
    }
    fn truncate(&mut self, len: usize) {
        self.lat.truncate(len * self.width);
    }
    fn reserve(&mut self, extra: usize) {
        self.lat.reserve(extra * self.width);
    }
    fn clear(&mut self) {
        self.lat.clear();
    }
    fn save(&self, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        crate::codec::put_f32s(out, &self.lat);
        Ok(())
    }
    fn load(&mut self, r: &mut &[u8], len: usize) -> std::result::Result<(), String> {
        self.lat = crate::codec::get_f32s(r, len * self.width, "MLA latent cache")?;
        Ok(())
    }
    fn bytes(&self) -> StateBytes {
        StateBytes { kv: self.lat.len() * 4, ..StateBytes::default() }
    }
}

/// An MLA layer: its geometry and weights.
pub struct Mla {
    pub cfg: MlaConfig,
    pub w: MlaWeights,
    /// kv_b widened to f32 [n_heads, nope + v_dim, kv_lora] for the absorbed form, made on first
    /// use and dropped whenever the weights may change (`matrices_mut`).
    kvb32: OnceLock<Vec<f32>>,
}

impl Mla {
    pub fn load(src: &dyn TensorSource, c: MlaConfig, il: usize) -> Result<Mla> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let d = c.d_model;
        let w = MlaWeights {
            q: src.require(&n("attn_q.weight"), c.n_heads * c.qk_dim(), d)?,
            kv_a: src.require(&n("attn_kv_a_mqa.weight"), c.kv_lora + c.rope, d)?,
            kv_a_norm: src.vector(&n("attn_kv_a_norm.weight"), c.kv_lora)?,
            kv_b: mla_kv_b(src, &c, il)?,
            o: src.require(&n("attn_output.weight"), d, c.n_heads * c.v_dim)?,
        };
        Ok(Mla { cfg: c, w, kvb32: OnceLock::new() })
    }

    fn kvb32(&self) -> &[f32] {
        self.kvb32.get_or_init(|| self.w.kv_b.to_f32())
    }

    /// The projections of n rows (`independent` as in `QTensor::project`), then the latent cache
    /// and the attention, n positions from the cache's end -> o [n, n_heads, v_dim]; one
    /// sequence's rows (`seqs` of one) or one row per sequence.
    fn attend(&self, env: &Env, h: &[f32], n: usize, independent: bool, seqs: &mut [&mut MlaState]) -> Vec<f32> {
        let p = project(&self.cfg, &self.w, h, n, independent);
        let fast = env.num == Numerics::Fast;
        if let [st] = seqs {
            return core(&self.cfg, self.kvb32(), &p, 0..n, fast, st);
        }
        let mut o = Vec::with_capacity(n * self.cfg.n_heads * self.cfg.v_dim);
        for (i, st) in seqs.iter_mut().enumerate() {
            o.extend(core(&self.cfg, self.kvb32(), &p, i..i + 1, fast, st));
        }
        o
    }
}

impl Mixer for Mla {
    fn name(&self) -> &'static str {
        "multi-head latent attention"
    }
    fn matrices(&self) -> Vec<&QTensor> {
        vec![&self.w.q, &self.w.kv_a, &self.w.kv_b, &self.w.o]
    }
    fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        self.kvb32 = OnceLock::new();
        vec![&mut self.w.q, &mut self.w.kv_a, &mut self.w.kv_b, &mut self.w.o]
    }
    fn new_state(&self, _kv: KvType) -> LayerState {
        LayerState::new(MlaState::new(&self.cfg))
    }
    fn forward(&self, env: &Env, h: &[f32], n: usize, seq: Seq<'_>, _trace: &mut dyn FnMut(&str, &[f32])) -> Result<Vec<f32>> {
        let o = self.attend(env, h, n, false, &mut [seq.state.of()]);
        Ok(self.w.o.project(&o, n, false)) // [n, d_model]
    }
    /// The projections (q, kv_a, o) over all rows at once (each row on the decode path,
    /// `QTensor::matvec_rows`); the latent cache and the attention per sequence.
    fn forward_rows(&self, env: &Env, h: &[f32], rows: Vec<Seq<'_>>) -> Result<Vec<f32>> {
        let kb = rows.len();
        let mut states: Vec<&mut MlaState> = rows.into_iter().map(|s| s.state.of()).collect();
        let o = self.attend(env, h, kb, true, &mut states);
        Ok(self.w.o.project(&o, kb, true)) // [kb, d_model]
    }
    /// Decode rows and verifies together (a step with no prompt chunk): the projections over
    /// every row at once, then per sequence the latent cache and the attention of its row or
    /// of its verified positions (as `forward_steps`).
    fn forward_rows_verifies(
        &self,
        env: &Env,
        h: &[f32],
        segs: Vec<(Seq<'_>, usize)>,
        verifies: Vec<Option<&mut Journal>>,
    ) -> Result<Vec<f32>> {
        let total: usize = segs.iter().map(|(_, n)| n).sum();
        let p = project(&self.cfg, &self.w, h, total, true);
        let fast = env.num == Numerics::Fast;
        let mut o = Vec::with_capacity(total * self.cfg.n_heads * self.cfg.v_dim);
        let mut r0 = 0;
        for ((seq, n), journal) in segs.into_iter().zip(verifies) {
            if let Some(j) = journal {
                j.begin(seq.state, n);
            }
            o.extend(core(&self.cfg, self.kvb32(), &p, r0..r0 + n, fast, seq.state.of()));
            r0 += n;
        }
        Ok(self.w.o.project(&o, total, true)) // [total, d_model]
    }
    /// The projections over all n rows at once (each on the decode path), then the latent
    /// cache and the attention of the n positions (each position's value as alone; the cache
    /// truncates on rewind).
    fn forward_steps(&self, env: &Env, h: &[f32], n: usize, seq: Seq<'_>, journal: &mut Journal) -> Result<Vec<f32>> {
        journal.begin(seq.state, n);
        let o = self.attend(env, h, n, true, &mut [seq.state.of()]);
        Ok(self.w.o.project(&o, n, true)) // [n, d_model]
    }
}

/// MLA's kv_b [n_heads·(nope + v_dim), kv_lora]: whole (HF), or rejoined from llama.cpp's
/// per-head k_b (stored transposed, [n_heads, kv_lora, nope]) and v_b ([n_heads, v_dim,
/// kv_lora]), widened to f32.
fn mla_kv_b(src: &dyn TensorSource, c: &MlaConfig, il: usize) -> Result<QTensor> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let (nh, nope, vd, lora) = (c.n_heads, c.nope, c.v_dim, c.kv_lora);
    if let Some(t) = src.optional(&n("attn_kv_b.weight"), nh * (nope + vd), lora)? {
        return Ok(t);
    }
    let kb = src.require(&n("attn_k_b.weight"), nh * lora, nope)?.to_f32(); // [nh, lora, nope]
    let vb = src.require(&n("attn_v_b.weight"), nh * vd, lora)?.to_f32(); // [nh, v_dim, lora]
    let mut out = vec![0f32; nh * (nope + vd) * lora]; // [nh, nope + v_dim, lora]
    for h in 0..nh {
        for i in 0..nope {
            for j in 0..lora {
                out[(h * (nope + vd) + i) * lora + j] = kb[(h * lora + j) * nope + i];
            }
        }
        for i in 0..vd {
            out[(h * (nope + vd) + nope + i) * lora..][..lora].copy_from_slice(&vb[(h * vd + i) * lora..][..lora]);
        }
    }
    Ok(QTensor::from_f32(n("attn_kv_b.weight"), nh * (nope + vd), lora, out))
}

/// The projections of `n` rows: q [n, n_heads, nope + rope], the raw latent [n, kv_lora + rope]
/// and its normed c [n, kv_lora].
struct Projected {
    q: Vec<f32>,
    lat: Vec<f32>,
    cn: Vec<f32>,
}

/// h [n, d_model] through q, kv_a and the latent norm; `independent`: n decode rows of
/// different sequences (`matvec_rows`) rather than n positions of one (`QTensor::project`).
fn project(c: &MlaConfig, w: &MlaWeights, h: &[f32], n: usize, independent: bool) -> Projected {
    let lora = c.kv_lora;
    let q = w.q.project(h, n, independent);
    let lat = w.kv_a.project(h, n, independent);
    let mut cn = vec![0f32; n * lora]; // [n, kv_lora]: the normed latent
    for t in 0..n {
        let src = &lat[t * (lora + c.rope)..t * (lora + c.rope) + lora];
        let inv = 1.0 / (src.iter().map(|x| x * x).sum::<f32>() / lora as f32 + c.norm_eps).sqrt();
        for (j, o) in cn[t * lora..(t + 1) * lora].iter_mut().enumerate() {
            *o = src[j] * inv * w.kv_a_norm[j];
        }
    }
    Projected { q, lat, cn }
}

/// Rows `rows` of `p` (consecutive positions of one sequence): append their latents to the
/// cache, attend in the absorbed form -> o [rows, n_heads, v_dim]. kvb: kv_b as f32
/// [n_heads, nope + v_dim, kv_lora].
fn core(c: &MlaConfig, kvb: &[f32], p: &Projected, rows: Range<usize>, fast: bool, state: &mut MlaState) -> Vec<f32> {
    let (nh, qk, vd, lora, rope, w) = (c.n_heads, c.qk_dim(), c.v_dim, c.kv_lora, c.rope, c.latent_width());
    let n = rows.len();
    let pos0 = state.len();
    for t in rows.clone() {
        state.lat.extend_from_slice(&p.cn[t * lora..(t + 1) * lora]);
        state.lat.extend_from_slice(&p.lat[t * (lora + rope) + lora..(t + 1) * (lora + rope)]);
        state.lat.resize(state.lat.len() + w - lora - rope, 0.0);
    }
    // Head h's query against the latent: [W_kb,hᵀ q_nope | q_rope | 0].
    let mut qa = vec![0f32; n * nh * w]; // [n, n_heads, w]
    for (i, t) in rows.enumerate() {
        for h in 0..nh {
            let qh = &p.q[(t * nh + h) * qk..(t * nh + h + 1) * qk];
            let dst = &mut qa[(i * nh + h) * w..(i * nh + h + 1) * w];
            let kb = &kvb[h * (c.nope + vd) * lora..];
            for (r, &x) in qh[..c.nope].iter().enumerate() {
                axpy(x, &kb[r * lora..(r + 1) * lora], &mut dst[..lora]);
            }
            dst[lora..lora + rope].copy_from_slice(&qh[c.nope..]);
        }
    }
    let positions: Vec<usize> = (pos0..pos0 + n).collect();
    let mut u = vec![0f32; n * nh * w]; // [n, n_heads, w]: Σ_t p_t · latent row t
    attend_latent(&state.lat, w, nh, 1.0 / (qk as f32).sqrt(), fast, &qa, &positions, &mut u);
    let mut o = vec![0f32; n * nh * vd]; // [n, n_heads, v_dim]
    for (i, oi) in o.chunks_exact_mut(nh * vd).enumerate() {
        for (h, oh) in oi.chunks_exact_mut(vd).enumerate() {
            let uh = &u[(i * nh + h) * w..][..lora];
            let vb = &kvb[(h * (c.nope + vd) + c.nope) * lora..];
            for (r, ov) in oh.iter_mut().enumerate() {
                *ov = dot(&vb[r * lora..(r + 1) * lora], uh);
            }
        }
    }
    o
}
