//! Multi-head latent attention as Kimi Linear uses it (DeepSeek-V2's MLA with no RoPE): q from
//! q_proj (per head [nope | rope] dims, no rotation), a compressed latent kv_a·x = [c (kv_lora) |
//! k_rot (shared by all heads)], c RMS-normalized, expanded by kv_b into per-head [k_nope | v];
//! keys are [k_nope | k_rot], scores scaled by 1/√(nope + rope). The cache keeps the expanded
//! keys and values (simple and exact; caching the latent instead is a later memory saving).

use crate::error::Result;
use crate::mixers::{Env, Journal, Mixer, MixerState, Seq};
use crate::qtensor::QTensor;
use crate::state::{KvType, LayerState, StateBytes};
use crate::weights::TensorSource;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaConfig {
    pub d_model: usize,
    pub n_heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_dim: usize,
    pub kv_lora: usize,
    pub norm_eps: f32,
}

impl MlaConfig {
    pub fn qk_dim(&self) -> usize {
        self.nope + self.rope
    }
}

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

/// The expanded keys [len, n_heads, nope + rope] and values [len, n_heads, v_dim].
#[derive(Debug, PartialEq)]
pub struct MlaState {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Values per position in `k` (n_heads · (nope + rope)) and in `v` (n_heads · v_dim).
    k_width: usize,
    v_width: usize,
}

impl Clone for MlaState {
    fn clone(&self) -> MlaState {
        MlaState { k: self.k.clone(), v: self.v.clone(), k_width: self.k_width, v_width: self.v_width }
    }

    /// Into this state's own buffers (a serving slot restored from the prompt cache).
    fn clone_from(&mut self, src: &MlaState) {
        self.k.clone_from(&src.k);
        self.v.clone_from(&src.v);
        (self.k_width, self.v_width) = (src.k_width, src.v_width);
    }
}

impl MlaState {
    pub fn new(c: &MlaConfig) -> MlaState {
        MlaState { k: Vec::new(), v: Vec::new(), k_width: c.n_heads * c.qk_dim(), v_width: c.n_heads * c.v_dim }
    }
}

impl MixerState for MlaState {
    fn is_recurrent(&self) -> bool {
        false
    }
    fn truncate(&mut self, len: usize) {
        self.k.truncate(len * self.k_width);
        self.v.truncate(len * self.v_width);
    }
    fn reserve(&mut self, extra: usize) {
        self.k.reserve(extra * self.k_width);
        self.v.reserve(extra * self.v_width);
    }
    fn clear(&mut self) {
        self.k.clear();
        self.v.clear();
    }
    fn save(&self, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        crate::session::put_f32s(out, &self.k);
        crate::session::put_f32s(out, &self.v);
        Ok(())
    }
    fn load(&mut self, r: &mut &[u8], len: usize) -> std::result::Result<(), String> {
        self.k = crate::session::get_f32s(r, len * self.k_width, "MLA keys")?;
        self.v = crate::session::get_f32s(r, len * self.v_width, "MLA values")?;
        Ok(())
    }
    fn bytes(&self) -> StateBytes {
        StateBytes { kv: (self.k.len() + self.v.len()) * 4, ..StateBytes::default() }
    }
}

/// An MLA layer: its geometry and weights.
pub struct Mla {
    pub cfg: MlaConfig,
    pub w: MlaWeights,
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
        Ok(Mla { cfg: c, w })
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
        vec![&mut self.w.q, &mut self.w.kv_a, &mut self.w.kv_b, &mut self.w.o]
    }
    fn new_state(&self, _kv: KvType) -> LayerState {
        LayerState::new(MlaState::new(&self.cfg))
    }
    fn forward(&self, _env: &Env, h: &[f32], n: usize, seq: Seq<'_>, _trace: &mut dyn FnMut(&str, &[f32])) -> Result<Vec<f32>> {
        Ok(mla(&self.cfg, &self.w, h, n, seq.state.of()))
    }
    /// The projections (q, kv_a, kv_b, o) over all rows at once (each row on the decode path,
    /// `QTensor::matvec_rows`); the latent cache and the attention per sequence.
    fn forward_rows(&self, _env: &Env, h: &[f32], rows: Vec<Seq<'_>>) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let kb = rows.len();
        let p = project(c, &self.w, h, kb, true);
        let mut o = Vec::with_capacity(kb * c.n_heads * c.v_dim); // [kb, n_heads, v_dim]
        for (i, seq) in rows.into_iter().enumerate() {
            o.extend(core(c, &p.row(c, i), 1, seq.state.of()));
        }
        Ok(self.w.o.project(&o, kb, true)) // [kb, d_model]
    }
    /// The projections over all n rows at once (each on the decode path), then the latent
    /// cache and the attention one position at a time (the cache truncates on rewind).
    fn forward_steps(&self, _env: &Env, h: &[f32], n: usize, seq: Seq<'_>, journal: &mut Journal) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let p = project(c, &self.w, h, n, true);
        journal.begin(seq.state, n);
        let st = seq.state.of();
        let mut o = Vec::with_capacity(n * c.n_heads * c.v_dim); // [n, n_heads, v_dim]
        for i in 0..n {
            o.extend(core(c, &p.row(c, i), 1, st));
        }
        Ok(self.w.o.project(&o, n, true)) // [n, d_model]
    }
}

impl Projected {
    /// Row i alone.
    fn row(&self, c: &MlaConfig, i: usize) -> Projected {
        let (nh, qk, vd) = (c.n_heads, c.qk_dim(), c.v_dim);
        let (lw, bw) = (c.kv_lora + c.rope, nh * (c.nope + vd));
        Projected {
            q: self.q[i * nh * qk..(i + 1) * nh * qk].to_vec(),
            lat: self.lat[i * lw..(i + 1) * lw].to_vec(),
            kvb: self.kvb[i * bw..(i + 1) * bw].to_vec(),
        }
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

/// Attention over `n` new tokens at positions pos0.. (causal). h: [n, d_model] -> [n, d_model].
pub fn mla(c: &MlaConfig, w: &MlaWeights, h: &[f32], n: usize, state: &mut MlaState) -> Vec<f32> {
    let p = project(c, w, h, n, false);
    let o = core(c, &p, n, state);
    w.o.project(&o, n, false) // [n, d_model]
}

/// The projections of `n` rows.
struct Projected {
    q: Vec<f32>,   // [n, n_heads, qk]
    lat: Vec<f32>, // [n, kv_lora + rope]
    kvb: Vec<f32>, // [n, n_heads, nope + v_dim]
}

/// h [n, d_model] through q, kv_a, the latent norm and kv_b; `rows`: n independent decode rows
/// (`matvec_rows`, each row as its own n = 1 step) rather than n positions of one sequence.
fn project(c: &MlaConfig, w: &MlaWeights, h: &[f32], n: usize, rows: bool) -> Projected {
    let lora = c.kv_lora;
    let mm = |t: &QTensor, x: &[f32]| t.project(x, n, rows);
    let q = mm(&w.q, h);
    let lat = mm(&w.kv_a, h);
    let mut cn = vec![0f32; n * lora]; // [n, kv_lora]: the normed latent
    for t in 0..n {
        let src = &lat[t * (lora + c.rope)..t * (lora + c.rope) + lora];
        let inv = 1.0 / (src.iter().map(|x| x * x).sum::<f32>() / lora as f32 + c.norm_eps).sqrt();
        for (j, o) in cn[t * lora..(t + 1) * lora].iter_mut().enumerate() {
            *o = src[j] * inv * w.kv_a_norm[j];
        }
    }
    let kvb = mm(&w.kv_b, &cn);
    Projected { q, lat, kvb }
}

/// Append `n` positions to the latent cache and attend -> o [n, n_heads, v_dim].
fn core(c: &MlaConfig, p: &Projected, n: usize, state: &mut MlaState) -> Vec<f32> {
    let (nh, qk, vd, lora) = (c.n_heads, c.qk_dim(), c.v_dim, c.kv_lora);
    let (q, lat, kvb) = (&p.q, &p.lat, &p.kvb);
    for t in 0..n {
        let k_rot = &lat[t * (lora + c.rope) + lora..(t + 1) * (lora + c.rope)];
        for hh in 0..nh {
            let src = &kvb[(t * nh + hh) * (c.nope + vd)..(t * nh + hh + 1) * (c.nope + vd)];
            state.k.extend_from_slice(&src[..c.nope]);
            state.k.extend_from_slice(k_rot);
            state.v.extend_from_slice(&src[c.nope..]);
        }
    }
    let len = state.k.len() / (nh * qk);
    let pos0 = len - n;
    let scale = 1.0 / (qk as f32).sqrt();
    let mut o = vec![0f32; n * nh * vd]; // [n, n_heads, v_dim]
    for t in 0..n {
        let p = pos0 + t;
        for hh in 0..nh {
            let qv = &q[(t * nh + hh) * qk..(t * nh + hh + 1) * qk];
            let mut sc: Vec<f32> = (0..=p)
                .map(|j| {
                    qv.iter().zip(&state.k[(j * nh + hh) * qk..(j * nh + hh + 1) * qk]).map(|(a, b)| a * b).sum::<f32>() * scale
                })
                .collect();
            cortiq_kernels::ops::softmax_inplace(&mut sc);
            let out = &mut o[(t * nh + hh) * vd..(t * nh + hh + 1) * vd];
            for (j, &pj) in sc.iter().enumerate() {
                for (ov, &vv) in out.iter_mut().zip(&state.v[(j * nh + hh) * vd..(j * nh + hh + 1) * vd]) {
                    *ov += pj * vv;
                }
            }
        }
    }
    o
}
