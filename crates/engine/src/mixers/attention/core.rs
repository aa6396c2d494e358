//! The attention block's own code (the attention mixer's, `super`, and the layers built on it:
//! MLA's latent attention, vmf_phase's window option): projections, QK-norm, RoPE, KV append,
//! causal/sliding softmax attention over f32 / f16 / 8-bit caches (blocked for prefill, split
//! over the keys for decode), or the O(1) plan's streaming step / matrix form, and the output
//! projection.

use cortiq_kernels::act::exp_minus_max;
use cortiq_kernels::dot::gemm_nn;
use cortiq_kernels::kvattn::{Exp, KvRows, ScoreRule, Split, attend_split, merge, part_len};
use cortiq_kernels::ops::{RopeStyle, rope, softmax_inplace};

use crate::blocks::rmsnorm_segments_in;
use crate::compat::{
    FA_TILE_Q, LlamaCppCtx, Numerics, flash_attn_ggml, flash_attn_ggml_tiled, llamacpp_n_kv, rope_ggml, rope_tables_ggml,
    round_f16,
};
use crate::config::{ModelConfig, Rope};
use crate::error::Result;
use crate::mixers::add_bias;
use crate::mixers::attention::{Cache, KeyForm};
use crate::o1::AttnO1;
#[cfg(feature = "o1")]
use crate::o1::nystrom::matrix_form;
use crate::par::pool;
use crate::profile::{self, Op};
use crate::qtensor::QTensor;

/// Positions from which RoPE rotates over the pool (a prefill chunk; decode rotates in place).
const ROPE_SPLIT_MIN: usize = 32;

#[derive(Clone)]
pub struct AttentionWeights {
    pub wq: QTensor,
    pub wk: QTensor,
    pub wv: QTensor,
    pub wo: QTensor,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// The output projection's bias (gpt-oss).
    pub bo: Option<Vec<f32>>,
    /// [n_heads]: each head's sink logit (gpt-oss; `ModelConfig::attn_sinks`).
    pub sinks: Option<Vec<f32>>,
}

/// Attention over a chunk of `n` new positions starting at `pos0`.
/// h: [n, d_model] normed input; k_cache/v_cache grow by n rows of kv_dim; returns [n, d_model].
/// `o1` is the sequence's O(1) plan for this layer: a sealed state (`attention::Cache::O1`) takes one
/// streaming step per position; before the seal the queries are summed per landmark; the check
/// mode replaces the softmax by the matrix form. Errors only from the matrix form's solve.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    cfg: &ModelConfig,
    w: &AttentionWeights,
    rope_cfg: &Rope,
    window: Option<usize>,
    h: &[f32],
    n: usize,
    pos0: usize,
    kv: &mut Cache,
    num: Numerics,
    lc: LlamaCppCtx,
    o1: AttnO1,
    trace: &mut dyn FnMut(&str, &[f32]),
) -> Result<Vec<f32>> {
    let (q, k, v) = attn_project(w, h, n, false);
    let (o, gate) = attention_core(cfg, w, rope_cfg, window, q, k, v, n, pos0, kv, num, lc, o1, trace)?;
    Ok(attn_output(cfg, w, o, gate.as_deref(), n, false, trace))
}

/// The three input projections of attention over h [n, d_model] -> (q [n, wq.rows], k, v [n,
/// kv_dim]). `independent`: the rows are decode rows of n different sequences (the decode
/// batch), each on the decode path as if alone (`QTensor::matvec_rows`); else n positions of
/// one sequence.
pub fn attn_project(w: &AttentionWeights, h: &[f32], n: usize, independent: bool) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (q_rows, kv_dim) = (w.wq.rows, w.wk.rows);
    if n == 1 {
        // Decode: one input quantization and one dispatch for the three projections.
        let mut qkv = vec![0f32; q_rows + 2 * kv_dim]; // [q_rows | kv_dim | kv_dim]
        QTensor::matmul_many(&[&w.wq, &w.wk, &w.wv], h, 1, &mut qkv);
        let v = qkv.split_off(q_rows + kv_dim);
        let k = qkv.split_off(q_rows);
        return (qkv, k, v);
    }
    if independent {
        // The decode batch: the same, over every row at once.
        let all = q_rows + 2 * kv_dim;
        let mut qkv = vec![0f32; n * all]; // [n, q_rows | kv_dim | kv_dim]
        QTensor::matvec_rows_many(&[&w.wq, &w.wk, &w.wv], h, n, &mut qkv);
        let (mut q, mut k, mut v) =
            (Vec::with_capacity(n * q_rows), Vec::with_capacity(n * kv_dim), Vec::with_capacity(n * kv_dim));
        for row in qkv.chunks_exact(all) {
            q.extend_from_slice(&row[..q_rows]);
            k.extend_from_slice(&row[q_rows..q_rows + kv_dim]);
            v.extend_from_slice(&row[q_rows + kv_dim..]);
        }
        return (q, k, v);
    }
    // A gated q_proj (Qwen3-Next/3.5) yields [q | gate] per head: twice q_dim.
    // q [n, n_heads, head_dim] (or [n, n_heads, 2, head_dim] gated), k and v [n, n_kv_heads, head_dim]
    (w.wq.project(h, n, independent), w.wk.project(h, n, independent), w.wv.project(h, n, independent))
}

/// The attention after its input projections: q [n, wq.rows], k, v [n, kv_dim] of n positions
/// from `pos0` of one sequence -> (o [n, n_heads, head_dim] before the output projection, the
/// gate of a gated q_proj). Appends k, v to the sequence's cache (or steps its O(1) state).
#[allow(clippy::too_many_arguments)]
pub fn attention_core(
    cfg: &ModelConfig,
    w: &AttentionWeights,
    rope_cfg: &Rope,
    window: Option<usize>,
    mut q: Vec<f32>,
    mut k: Vec<f32>,
    mut v: Vec<f32>,
    n: usize,
    pos0: usize,
    kv: &mut Cache,
    num: Numerics,
    lc: LlamaCppCtx,
    o1: AttnO1,
    trace: &mut dyn FnMut(&str, &[f32]),
) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
    let (hd, nh, nkv) = (cfg.head_dim, cfg.n_heads, cfg.n_kv_heads);
    let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());
    if w.sinks.is_some()
        && (num == Numerics::LlamaCpp || matches!(kv, Cache::O1(_)) || !matches!(o1, AttnO1::Off | AttnO1::Stats(_)))
    {
        return Err(crate::EngineError::Unsupported(
            "attention sinks (gpt-oss) run under fast or exact numerics with exact attention only (not --numerics llamacpp, --o1 or --kv-window)"
                .into(),
        ));
    }
    let gate = attn_prep(cfg, w, rope_cfg, &mut q, &mut k, &mut v, n, pos0, num);
    trace("q", &q);
    trace("k", &k);
    trace("v", &v);
    let mut o = vec![0f32; n * q_dim]; // [n, n_heads, head_dim]
    if let Cache::O1(st) = kv {
        // Sealed: one streaming step per position (projections above were batched).
        let _s = profile::span(Op::Attention);
        let mut dropped = 0;
        for i in 0..n {
            let (kv_rows, q_rows) = (i * kv_dim..(i + 1) * kv_dim, i * q_dim..(i + 1) * q_dim);
            dropped += st.step(&q[q_rows.clone()], &k[kv_rows.clone()], &v[kv_rows], &mut o[q_rows]);
        }
        if let AttnO1::Stats(s) = o1 {
            s.rows += n * nh;
            s.dropped += dropped;
        }
        return Ok((o, gate));
    }
    kv.append(&k, &v);
    match o1 {
        AttnO1::Segments(s) => s.add(pos0, &q),
        AttnO1::Recent(r) => r.add(pos0, &q),
        AttnO1::Matrix { plan, q_hist, stats } => {
            q_hist.extend_from_slice(&q);
            let _s = profile::span(Op::Attention);
            o_matrix_form(cfg, &plan, q_hist, kv, pos0, &mut o, stats)?;
            return Ok((o, gate));
        }
        AttnO1::Off | AttnO1::Stats(_) => {}
    }

    // One work item per (position, head): scores over the visible keys, softmax, weighted sum.
    let group = nh / nkv;
    let softcap = cfg.attn_logit_softcap;
    let visible = |p: usize| match window {
        Some(wn) => (p + 1).saturating_sub(wn),
        None => 0,
    };
    let attn_span = profile::span(Op::Attention);
    if num == Numerics::LlamaCpp {
        // Same value either way, different rounding (`ModelConfig::llamacpp_scales_q`).
        let mut scale = cfg.attn_scale;
        if cfg.llamacpp_scales_q {
            q.iter_mut().for_each(|x| *x *= scale);
            scale = 1.0;
        }
        // The cache widened to f32 once (exact for f16 values; an f32 cache is rounded first).
        let (kc, vc): (Vec<f32>, Vec<f32>) = match kv {
            Cache::KvF16 { k, v } => (k.iter().map(|x| x.to_f32()).collect(), v.iter().map(|x| x.to_f32()).collect()),
            Cache::Kv { k, v } => (k.iter().map(|&x| round_f16(x)).collect(), v.iter().map(|&x| round_f16(x)).collect()),
            // ggml dots an 8-bit cache with 8-bit queries; here its values, as f32.
            c @ Cache::KvQ8 { .. } => {
                let (k, v) = c.f32_from(0, kv_dim);
                (k.into_owned(), v.into_owned())
            }
            Cache::O1(_) => unreachable!("a sealed state took its streaming step above"),
        };
        // A single query over >= 512 cache cells: ggml splits the cells over its threads.
        let n_kv = llamacpp_n_kv(pos0 + n, lc.cache_cells);
        let split = (n == 1 && n_kv >= 512).then_some((n_kv, lc.threads.max(1)));
        pool().for_rows_mut_dynamic(&mut o, hd, 1, |idx, out| {
            let (i, head) = (idx / nh, idx % nh);
            let p = pos0 + i;
            let qv = &q[idx * hd..(idx + 1) * hd];
            let off = (head / group) * hd;
            if n >= FA_TILE_Q {
                flash_attn_ggml_tiled(qv, &kc, &vc, kv_dim, off, visible(p), p, scale, softcap, out);
            } else {
                flash_attn_ggml(qv, &kc, &vc, kv_dim, off, visible(p), p, scale, softcap, split, lc.fp16_build, out);
            }
        });
    } else {
        let scale = cfg.attn_scale;
        let lo = visible(pos0);
        let sinks = w.sinks.as_deref();
        let at = AttnCtx { hd, nh, group, kv_dim, q_dim, pos0, lo, scale, softcap, window, fast: num == Numerics::Fast, sinks };
        if n >= ATTN_GEMM_MIN {
            // Positions lo.. are the only ones any query of this chunk sees: an f16 or 8-bit
            // cache is read over that span alone (a sliding layer's window, not the whole
            // context), once per chunk.
            let (keys, vals, form) = kv.rows();
            attend_blocked(&at, &q, n, keys, vals, form, &mut o);
        } else {
            decode_attend(&at, &q, &[(pos0, 0)], &[&*kv], &mut o);
        }
    }
    drop(attn_span);
    Ok((o, gate))
}

/// Attention's per-position preprocessing of projected q, k, v (n positions from `pos0`): a
/// gated q_proj's [q | gate] split (the gate returned), the biases, the QK-norms and RoPE, in
/// place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attn_prep(
    cfg: &ModelConfig,
    w: &AttentionWeights,
    rope_cfg: &Rope,
    q: &mut Vec<f32>,
    k: &mut [f32],
    v: &mut [f32],
    n: usize,
    pos0: usize,
    num: Numerics,
) -> Option<Vec<f32>> {
    let hd = cfg.head_dim;
    let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());
    let gate = if cfg.attn_gate {
        let mut qs = vec![0f32; n * q_dim]; // [n, n_heads, head_dim]
        let mut g = vec![0f32; n * q_dim]; // [n, n_heads, head_dim]
        for (src, (qd, gd)) in q.chunks(2 * hd).zip(qs.chunks_mut(hd).zip(g.chunks_mut(hd))) {
            qd.copy_from_slice(&src[..hd]);
            gd.copy_from_slice(&src[hd..]);
        }
        *q = qs;
        Some(g)
    } else {
        None
    };
    if let Some(b) = &w.bq {
        add_bias(q, b);
    }
    if let Some(b) = &w.bk {
        add_bias(k, b);
    }
    if let Some(b) = &w.bv {
        add_bias(v, b);
    }
    if let Some(g) = &w.q_norm {
        rmsnorm_segments_in(num, q, g, cfg.norm_eps);
    }
    if let Some(g) = &w.k_norm {
        rmsnorm_segments_in(num, k, g, cfg.norm_eps);
    }
    let rope_span = profile::span(Op::Rope);
    let ggml_tables = if num == Numerics::LlamaCpp { rope_tables_ggml(rope_cfg, pos0, n) } else { None };
    let tables = ggml_tables.map_or_else(|| rope_cfg.tables(pos0, n), std::rc::Rc::new); // [n, rot_dim/2] each
    let (cos, sin) = (&tables.0, &tables.1);
    let half = rope_cfg.rot_dim / 2;
    let rot: fn(&mut [f32], &[f32], &[f32], RopeStyle) = if num == Numerics::LlamaCpp { rope_ggml } else { rope };
    // Position i of rows (row_len values, heads of hd), the first at position i0.
    let rotate = |i0: usize, rows: &mut [f32], row_len: usize| {
        for (j, row) in rows.chunks_mut(row_len).enumerate() {
            let i = i0 + j;
            let (c, s) = (&cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half]);
            for head in row.chunks_mut(hd) {
                rot(head, c, s, rope_cfg.style);
            }
        }
    };
    if n >= ROPE_SPLIT_MIN {
        // A prefill chunk: positions over the pool (each row rotates alone: the same values).
        pool().for_rows_mut(&mut q[..n * q_dim], q_dim, ROPE_SPLIT_MIN / 2, |i0, rows| rotate(i0, rows, q_dim));
        pool().for_rows_mut(&mut k[..n * kv_dim], kv_dim, ROPE_SPLIT_MIN / 2, |i0, rows| rotate(i0, rows, kv_dim));
    } else {
        rotate(0, &mut q[..n * q_dim], q_dim);
        rotate(0, &mut k[..n * kv_dim], kv_dim);
    }
    if rope_cfg.q_temperature.is_some() {
        // Llama 4's query temperature after RoPE, per position (1 below the original context).
        for (j, row) in q[..n * q_dim].chunks_mut(q_dim).enumerate() {
            let s = rope_cfg.query_scale(pos0 + j).expect("q_temperature is set");
            if s != 1.0 {
                row.iter_mut().for_each(|v| *v *= s);
            }
        }
    }
    drop(rope_span);
    gate
}

/// One sequence of `attention_rows`: `n` consecutive positions from `pos0` (one for a decode
/// row; the verify of speculative decoding checks several), its cache and its O(1) hook.
pub struct DecodeSeq<'a, 'b> {
    pub pos0: usize,
    pub n: usize,
    pub kv: &'a mut Cache,
    pub o1: &'a AttnO1<'b>,
}

/// Decode positions of several sequences (the serving batch; the verify's positions of one):
/// q [Σ n_i, wq.rows], k, v [Σ n_i, kv_dim] projected, the rows of `seqs[0]` first -> (o
/// [Σ n_i, n_heads, head_dim], the gate of a gated q_proj), each row bit-identical to its own
/// `attention_core(.., n = 1, ..)` step on that sequence alone, in order: the same
/// preprocessing and cache append position by position, then every row's heads in one pool
/// dispatch (`decode_attend`: work items per split of the keys and kv group, which give each
/// head the value it has alone) instead of one dispatch per step. A row sees its sequence's keys up to its
/// own position only, so the later rows' keys already in the cache change nothing. None, with
/// nothing touched, where a sequence needs another path (a sealed O(1) state or a planned O(1)
/// layer, llama.cpp numerics): the caller then runs `attention_core` per step.
#[allow(clippy::too_many_arguments)]
pub fn attention_rows(
    cfg: &ModelConfig,
    w: &AttentionWeights,
    rope_cfg: &Rope,
    window: Option<usize>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    num: Numerics,
    seqs: &mut [DecodeSeq<'_, '_>],
) -> Option<(Vec<f32>, Option<Vec<f32>>)> {
    let plain = |s: &DecodeSeq| !matches!(s.kv, Cache::O1(_)) && matches!(s.o1, AttnO1::Off | AttnO1::Stats(_));
    if num == Numerics::LlamaCpp || !seqs.iter().all(plain) {
        return None;
    }
    let (hd, nh, nkv) = (cfg.head_dim, cfg.n_heads, cfg.n_kv_heads);
    let (q_dim, kv_dim, qr) = (cfg.q_dim(), cfg.kv_dim(), w.wq.rows);
    let group = nh / nkv;
    // Per row: its position and its sequence.
    let mut rows: Vec<(usize, usize)> = Vec::new();
    let mut qs = Vec::with_capacity(q.len() / qr * q_dim); // [Σ n_i, n_heads, head_dim]
    let mut gates = Vec::new(); // [Σ n_i, n_heads, head_dim] when gated
    for (i, s) in seqs.iter_mut().enumerate() {
        for t in 0..s.n {
            let (r, p) = (rows.len(), s.pos0 + t);
            let (mut qi, mut ki, mut vi) = (
                q[r * qr..(r + 1) * qr].to_vec(),
                k[r * kv_dim..(r + 1) * kv_dim].to_vec(),
                v[r * kv_dim..(r + 1) * kv_dim].to_vec(),
            );
            let g = attn_prep(cfg, w, rope_cfg, &mut qi, &mut ki, &mut vi, 1, p, num);
            s.kv.append(&ki, &vi);
            qs.extend_from_slice(&qi);
            gates.extend(g.unwrap_or_default());
            rows.push((p, i));
        }
    }
    let _s = profile::span(Op::Attention);
    let at = AttnCtx {
        hd,
        nh,
        group,
        kv_dim,
        q_dim,
        pos0: 0,
        lo: 0,
        scale: cfg.attn_scale,
        softcap: cfg.attn_logit_softcap,
        window,
        fast: num == Numerics::Fast,
        sinks: w.sinks.as_deref(),
    };
    let caches: Vec<&Cache> = seqs.iter().map(|s| &*s.kv).collect();
    let mut o = vec![0f32; rows.len() * q_dim]; // [Σ n_i, n_heads, head_dim]
    decode_attend(&at, &qs, &rows, &caches, &mut o);
    Some((o, (!gates.is_empty()).then_some(gates)))
}

/// The attention block's tail: the gate (gated attention), then the output projection.
/// o: [n, n_heads, head_dim] -> [n, d_model]
/// Gate (if any) and output projection: o [n, n_heads, head_dim] -> [n, d_model]; `independent`
/// as in `attn_project`.
pub fn attn_output(
    cfg: &ModelConfig,
    w: &AttentionWeights,
    mut o: Vec<f32>,
    gate: Option<&[f32]>,
    n: usize,
    independent: bool,
    trace: &mut dyn FnMut(&str, &[f32]),
) -> Vec<f32> {
    if let Some(g) = gate {
        // Gated attention: o ← o ⊙ σ(gate) before the output projection.
        o.iter_mut().zip(g).for_each(|(x, &gv)| *x /= 1.0 + (-gv).exp());
    }
    trace("attn_out", &o);
    debug_assert_eq!(w.wo.rows, cfg.d_model);
    let mut y = w.wo.project(&o, n, independent); // [n, d_model]
    if let Some(b) = &w.bo {
        crate::mixers::add_bias(&mut y, b);
    }
    y
}

/// The O(1) plan's checking path: the teacher-forced matrix form (f64) over every position so
/// far — q_hist [len, n_heads, hd] and the cache's keys/values — with the plan's tp; the rows of
/// this chunk (from pos0) go to o [n, n_heads, hd]. Recomputes the whole window per call: meant
/// for one call per window.
fn o_matrix_form(
    cfg: &ModelConfig,
    plan: &crate::o1::O1Plan,
    q_hist: &[f32],
    kv: &Cache,
    pos0: usize,
    o: &mut [f32],
    stats: &mut crate::o1::O1Stats,
) -> Result<()> {
    #[cfg(not(feature = "o1"))]
    {
        let _ = (cfg, q_hist, kv, pos0, o, stats);
        match *plan {}
    }
    #[cfg(feature = "o1")]
    {
        let (nh, q_dim) = (cfg.n_heads, cfg.q_dim());
        let wide = |x: &[f32]| x.iter().map(|&y| y as f64).collect::<Vec<f64>>();
        let (k, v) = match kv {
            Cache::Kv { k, v } => (wide(k), wide(v)),
            Cache::KvF16 { k, v } => (k.iter().map(|x| x.to_f64()).collect(), v.iter().map(|x| x.to_f64()).collect()),
            c @ Cache::KvQ8 { .. } => {
                let (k, v) = c.f32_from(0, cfg.kv_dim());
                (wide(&k), wide(&v))
            }
            Cache::O1(_) => unreachable!("the check mode never seals"),
        };
        let t_len = q_hist.len() / q_dim;
        // A window shorter than the prompt is exact throughout, as with tp = T.
        let tp = plan.tp.min(t_len);
        let guard = plan.check.expect("matrix form only in check mode");
        let mo = matrix_form(
            &plan.settings,
            plan.far,
            guard,
            cfg.attn_scale as f64,
            nh,
            cfg.n_kv_heads,
            cfg.head_dim,
            tp,
            &wide(q_hist),
            &k,
            &v,
        )
        .map_err(|e| crate::error::EngineError::BadConfig { file: "o(1) matrix form".into(), what: e.to_string() })?;
        o.iter_mut().zip(&mo.o[pos0 * q_dim..]).for_each(|(y, &x)| *y = x as f32);
        for t in pos0.max(tp)..t_len {
            stats.rows += nh;
            stats.dropped += mo.dropped[t * nh..(t + 1) * nh].iter().filter(|&&d| d).count();
        }
        Ok(())
    }
}

/// From this many queries on, a chunk attends in blocks of queries through the f32 GEMM
/// (scores and the weighted sum), which prefill needs: at 512 tokens the per-query loop was a
/// fifth of Gemma3's prefill. A single query (decode) attends alone. Every chunk of two or more
/// takes the blocked form, whose value per query does not depend on the chunk's length or
/// start: a prompt's values are then the same however its prefill is cut (`prefix`, the
/// prompt-state cache, relies on it; with 8 here a call of 2-7 positions gave other bits).
const ATTN_GEMM_MIN: usize = 2;
/// Queries per block of the GEMM form: a [QB, keys] score tile stays in L2.
const ATTN_QB: usize = 32;

thread_local! {
    /// attend_blocked's per-item buffers: [q block, scores, 1/Σ per query].
    static ATTN_SCRATCH: std::cell::RefCell<[Vec<f32>; 3]> = const { std::cell::RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// What the exact/fast attention loops need to know about a chunk.
struct AttnCtx<'a> {
    hd: usize,
    nh: usize,
    group: usize,
    kv_dim: usize,
    q_dim: usize,
    /// Absolute position of the chunk's first query.
    pos0: usize,
    /// First cache position present in the K/V slices handed in.
    lo: usize,
    scale: f32,
    softcap: Option<f32>,
    window: Option<usize>,
    /// `Numerics::Fast`: the vector-exp softmax (a few ulp from libm's; exact mode keeps libm).
    fast: bool,
    /// [nh]: each head's sink logit (gpt-oss), one more term of every softmax's denominator.
    sinks: Option<&'a [f32]>,
}

impl AttnCtx<'_> {
    /// The softmax weights of scores, returning what the P·V row is to be multiplied by: fast
    /// numerics leave them unnormalised (`exp_minus_max`) and return 1/Σ (one product per
    /// output value instead of one per key); exact numerics normalise them (libm's softmax)
    /// and return 1, a product that changes nothing.
    fn weights(&self, x: &mut [f32], head: usize) -> f32 {
        if let Some(sinks) = self.sinks {
            return weights_with_sink(x, sinks[head], Exp::for_fast(self.fast));
        }
        if self.fast {
            1.0 / exp_minus_max(x)
        } else {
            softmax_inplace(x);
            1.0
        }
    }

    /// First key position query position `p` sees.
    fn first(&self, p: usize) -> usize {
        match self.window {
            Some(wn) => (p + 1).saturating_sub(wn),
            None => 0,
        }
    }

    fn score(&self, dot: f32) -> f32 {
        let s = dot * self.scale;
        match self.softcap {
            Some(c) => (s / c).tanh() * c,
            None => s,
        }
    }
}

/// Softmax weights of scores x with a sink logit s in the denominator (gpt-oss's learned sinks):
/// x ← e^{x − M}, M = max(max x, s), returning 1 / (Σ e^{x − M} + e^{s − M}) — what the P·V row
/// is multiplied by.
fn weights_with_sink(x: &mut [f32], sink: f32, exp: Exp) -> f32 {
    let m = x.iter().copied().fold(sink, f32::max);
    let mut z = exp.of(sink - m);
    for v in x.iter_mut() {
        *v = exp.of(*v - m);
        z += *v;
    }
    1.0 / z
}

/// A sink as one more partial of a head's decode splits (`kvattn::merge`): maximum s, sum 1,
/// no value.
fn sink_partial(sink: f32, hd: usize) -> Vec<f32> {
    let mut p = vec![0f32; part_len(hd)];
    (p[0], p[1]) = (sink, 1.0);
    p
}

/// Decode attention cuts each query's visible keys at the multiples of this many positions
/// (flash-decoding): the splits of every (row, kv group) are the pool's work items, so one
/// sequence's long context uses every core, and the cut depends on positions alone (a head's
/// value is the same whatever the thread count, the batch or the grouping of its heads).
const KV_SPLIT: usize = 256;

thread_local! {
    /// `kvattn::attend_split`'s scratch (scores and a converted tile), per pool thread.
    static SPLIT_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Decode attention of rows (position p, index into `caches`) with queries qs [rows, nh, hd]
/// over every key each row sees, reading each cache in its stored type (`kvattn`): per split
/// of `KV_SPLIT` positions and kv group, the group's heads load each key and value row once
/// (GQA); the splits of a head merge exactly in position order. o: [rows, nh, hd]
fn decode_attend(at: &AttnCtx, qs: &[f32], rows: &[(usize, usize)], caches: &[&Cache], o: &mut [f32]) {
    let sources: Vec<(KvRows, KvRows, Option<&KeyForm>)> = caches.iter().map(|c| c.rows()).collect();
    decode_attend_from(at, qs, rows, &sources, o);
}

/// Multi-query attention of n queries over one f32 cache whose rows are both the keys and the
/// values (MLA's latent cache, `mixers::mla`): row t of `lat` [len, width] is key t, and the
/// same row, whole, value t. qs [n, nh, width] at positions `positions` (each sees rows
/// 0..=p) -> o [n, nh, width]. The same kernel, splits and merge as decode attention, so a
/// query's value does not depend on the others beside it.
pub(crate) fn attend_latent(
    lat: &[f32],
    width: usize,
    nh: usize,
    scale: f32,
    fast: bool,
    qs: &[f32],
    positions: &[usize],
    o: &mut [f32],
) {
    let at = AttnCtx {
        hd: width,
        nh,
        group: nh,
        kv_dim: width,
        q_dim: nh * width,
        pos0: 0,
        lo: 0,
        scale,
        softcap: None,
        window: None,
        fast,
        sinks: None,
    };
    let rows: Vec<(usize, usize)> = positions.iter().map(|&p| (p, 0)).collect();
    decode_attend_from(&at, qs, &rows, &[(KvRows::F32(lat), KvRows::F32(lat), None)], o);
}

/// `decode_attend` over the rows of `sources` (keys, values, the keys' stored form), indexed by the
/// rows' second member.
fn decode_attend_from(
    at: &AttnCtx,
    qs: &[f32],
    rows: &[(usize, usize)],
    sources: &[(KvRows, KvRows, Option<&KeyForm>)],
    o: &mut [f32],
) {
    let (g, nh) = (at.group, at.nh);
    let sj = SplitJobs::new(at, rows);
    // A work item takes every head of a split (each row read whole, once) where the splits
    // alone fill the pool; otherwise a kv group, or half of one (short contexts, one kv head):
    // the same values, more items.
    let n_splits = sj.jobs.len();
    let threads = pool().n_threads();
    let hpi = if n_splits >= 2 * threads {
        nh
    } else if n_splits * (nh / g) < 2 * threads && g % 2 == 0 {
        g / 2
    } else {
        g
    };
    attend_jobs(at, qs, rows, &sj, sources, hpi, o);
}

/// One job of `SplitJobs`: positions a..b of source `src`, read for `rows` (slot order).
struct Job {
    src: usize,
    a: usize,
    b: usize,
    rows: Vec<usize>,
}

/// The splits of a set of decode rows, as jobs: rows that read the same cache over the same
/// positions (a sequence's speculative verification rows, which share every split but their
/// last) are one job, so the keys and values are read once for all of them. A row's value
/// does not depend on which rows share its job: the kernel's arithmetic is per head.
struct SplitJobs {
    jobs: Vec<Job>,
    /// Per row, its (job, slot) in position order.
    of_row: Vec<Vec<(usize, usize)>>,
}

impl SplitJobs {
    fn new(at: &AttnCtx, rows: &[(usize, usize)]) -> SplitJobs {
        let mut jobs: Vec<Job> = Vec::new();
        // Only a call of several rows can share a split (a decode step's one row skips the map).
        let mut index = std::collections::HashMap::new();
        let mut of_row = Vec::with_capacity(rows.len());
        for (r, &(p, src)) in rows.iter().enumerate() {
            let mut mine = Vec::new();
            let mut a = at.first(p);
            while a <= p {
                let b = ((a / KV_SPLIT + 1) * KV_SPLIT).min(p + 1);
                let shared = if rows.len() > 1 { index.get(&(src, a, b)).copied() } else { None };
                let j = shared.unwrap_or_else(|| {
                    jobs.push(Job { src, a, b, rows: Vec::new() });
                    if rows.len() > 1 {
                        index.insert((src, a, b), jobs.len() - 1);
                    }
                    jobs.len() - 1
                });
                mine.push((j, jobs[j].rows.len()));
                jobs[j].rows.push(r);
                a = b;
            }
            of_row.push(mine);
        }
        SplitJobs { jobs, of_row }
    }
}

thread_local! {
    /// attend_jobs's gathered queries of a job's rows, per pool thread.
    static JOB_Q: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `decode_attend` with `hpi` heads per work item (the tests' way to cut the work by hand).
#[cfg(test)]
fn decode_attend_in(
    at: &AttnCtx,
    qs: &[f32],
    rows: &[(usize, usize)],
    sources: &[(KvRows, KvRows, Option<&KeyForm>)],
    hpi: usize,
    o: &mut [f32],
) {
    attend_jobs(at, qs, rows, &SplitJobs::new(at, rows), sources, hpi, o);
}

/// `decode_attend` of the rows' jobs `sj` with `hpi` heads per work item: a divisor of the group
/// size, or a multiple of it that divides the head count.
#[allow(clippy::too_many_arguments)]
fn attend_jobs(
    at: &AttnCtx,
    qs: &[f32],
    rows: &[(usize, usize)],
    sj: &SplitJobs,
    sources: &[(KvRows, KvRows, Option<&KeyForm>)],
    hpi: usize,
    o: &mut [f32],
) {
    let (hd, nh, g) = (at.hd, at.nh, at.group);
    assert!(
        hpi > 0 && (g % hpi == 0 || (hpi % g == 0 && nh % hpi == 0)),
        "decode attention: {hpi} heads per item in groups of {g} of {nh}"
    );
    let group = hpi.min(g);
    let pl = part_len(hd);
    let rule = ScoreRule { scale: at.scale, softcap: at.softcap, exp: Exp::for_fast(at.fast) };
    // An 8-bit cache holds its keys scaled and transformed (`KeyForm`): q is taken into the
    // same form (the scores are unchanged).
    let rotated: Vec<f32>;
    let qs = if rows.iter().any(|&(_, c)| sources[c].2.is_some()) {
        let mut q = qs.to_vec();
        for (r, &(_, c)) in rows.iter().enumerate() {
            if let Some(form) = sources[c].2 {
                form.query(&mut q[r * at.q_dim..(r + 1) * at.q_dim], hd, g);
            }
        }
        rotated = q;
        &rotated[..]
    } else {
        qs
    };
    // Per (job, block of hpi heads): the partials of its rows' heads, kv head major, then row
    // slot, then head in the group (the kernel's order for a group of R · group heads), in a
    // chunk sized for the largest job.
    let r_max = sj.jobs.iter().map(|j| j.rows.len()).max().unwrap_or(1);
    let n_hb = nh / hpi;
    let chunk = r_max * hpi * pl;
    let mut parts = vec![0f32; sj.jobs.len() * n_hb * chunk];
    pool().for_rows_mut_dynamic(&mut parts, chunk, 1, |item, out| {
        let (job, h0) = (&sj.jobs[item / n_hb], (item % n_hb) * hpi);
        let (keys, vals, _) = sources[job.src];
        let split = Split { keys, vals, stride: at.kv_dim, off: (h0 / g) * hd, row0: job.a, n: job.b - job.a };
        let jr = &job.rows;
        let out = &mut out[..jr.len() * hpi * pl];
        if jr.len() == 1 {
            let q = &qs[jr[0] * at.q_dim + h0 * hd..][..hpi * hd];
            SPLIT_SCRATCH.with(|sc| attend_split(q, hd, group, &split, &rule, &mut sc.borrow_mut(), out));
        } else {
            JOB_Q.with(|jq| {
                let mut jq = jq.borrow_mut();
                jq.clear();
                for kv0 in (0..hpi).step_by(group) {
                    for &r in jr {
                        jq.extend_from_slice(&qs[r * at.q_dim + (h0 + kv0) * hd..][..group * hd]);
                    }
                }
                SPLIT_SCRATCH.with(|sc| attend_split(&jq, hd, jr.len() * group, &split, &rule, &mut sc.borrow_mut(), out));
            });
        }
    });
    let sinks: Vec<Vec<f32>> = at.sinks.map_or_else(Vec::new, |s| s.iter().map(|&x| sink_partial(x, hd)).collect());
    for (r, mine) in sj.of_row.iter().enumerate() {
        for h in 0..nh {
            let (hb, rel) = (h / hpi, h % hpi);
            let heads = mine.iter().map(|&(j, slot)| {
                let nr = sj.jobs[j].rows.len();
                let at_head = (rel / group) * (nr * group) + slot * group + rel % group;
                &parts[(j * n_hb + hb) * chunk + at_head * pl..][..pl]
            });
            let out = &mut o[r * at.q_dim + h * hd..][..hd];
            match sinks.get(h) {
                Some(sink) => merge(heads.chain(std::iter::once(&sink[..])), rule.exp, out),
                None => merge(heads, rule.exp, out),
            }
        }
    }
}

/// Keys per panel of the transposed keys `attend_blocked` builds: a panel [head_dim, KP] is
/// contiguous (8 KB at head size 64, 32 KB at 256), so the score GEMM's column block reads one
/// run of memory instead of head_dim rows a whole context apart (a TLB miss each).
const KP: usize = 32;

thread_local! {
    /// attend_blocked's per-call buffers on the calling thread: [Kᵀ panels, V widened to f32,
    /// outputs by head]. Reused across calls: fresh allocations of this size (megabytes at
    /// depth) are fresh mmaps, page faults and zeroing on one thread while the others wait.
    static BLOCKED_BUFS: std::cell::RefCell<[Vec<f32>; 3]> = const { std::cell::RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// Row t's values off..off + out.len() of a cache in its stored type, as f32 (`KvRows::widen`),
/// 8-bit keys taken back from their `form`, as `Cache::f32_from`.
fn widen_row(rows: KvRows, t: usize, stride: usize, off: usize, form: Option<&KeyForm>, out: &mut [f32]) {
    rows.widen(t * stride + off, out);
    if let Some(form) = form {
        form.decode(out, off);
    }
}

/// Attention for a chunk of n >= ATTN_GEMM_MIN queries, by (head, block of ATTN_QB queries):
/// S = Q_blk·K_spanᵀ and O_blk = P·V_span with the f32 GEMM (`gemm_nn`: no horizontal sums)
/// over the span of keys any query of the block sees, from the panel holding its first key;
/// keys a query must not see (causal future, outside its window, the panel's lead) get weight
/// 0, and a zero weight leaves the weighted sum's FMA chain as it was. Under fast numerics P
/// is left unnormalised and each row of O is multiplied by 1/Σ afterwards
/// (`AttnCtx::weights`). Same values as `attend_one` up to summation order and that one
/// rounding; a query's values depend on its position and the keys only, not on where the
/// chunk starts. The cache is read in its stored type (keys and values of every position
/// `lo..pos0 + n`, `form` as `Cache::rows`): the keys go once into transposed panels, the
/// values of an f16 or 8-bit cache once into f32 rows, both split over the pool; an f32
/// cache's values are read in place. q: [n, nh, hd] -> o: [n, nh, hd]
fn attend_blocked(at: &AttnCtx, q: &[f32], n: usize, keys: KvRows, vals: KvRows, form: Option<&KeyForm>, o: &mut [f32]) {
    let (hd, nh, kv_dim, q_dim) = (at.hd, at.nh, at.kv_dim, at.q_dim);
    let nkv = nh / at.group;
    let end = at.pos0 + n; // one past the last cached position any query sees
    let pa = at.lo / KP; // the first panel
    let np = end.div_ceil(KP) - pa;
    let base = pa * KP; // the first position held in the panels and in widened values
    BLOCKED_BUFS.with(|bufs| {
        let mut bufs = bufs.borrow_mut();
        let [kt, vw, ot] = &mut *bufs;
        // Kᵀ panels [nkv, np, hd, KP]: panel j of kv head h holds positions base + j·KP.. as
        // columns (zeros past the end).
        kt.resize(nkv * np * hd * KP, 0.0);
        pool().for_rows_mut(&mut kt[..nkv * np * hd * KP], hd * KP, 1, |r0, chunk| {
            let mut row = vec![0f32; hd];
            for (i, panel) in chunk.chunks_mut(hd * KP).enumerate() {
                let (h, j) = ((r0 + i) / np, (r0 + i) % np);
                let p0 = base + j * KP;
                for c in 0..KP {
                    if p0 + c < end {
                        widen_row(keys, p0 + c, kv_dim, h * hd, form, &mut row);
                        for (d, &x) in row.iter().enumerate() {
                            panel[d * KP + c] = x;
                        }
                    } else {
                        for d in 0..hd {
                            panel[d * KP + c] = 0.0;
                        }
                    }
                }
            }
        });
        // Values as f32 rows [position, kv_dim] from `vbase`: an f32 cache in place.
        let (vrows, vbase): (&[f32], usize) = match vals {
            KvRows::F32(x) => (x, 0),
            _ => {
                vw.resize((end - base) * kv_dim, 0.0);
                pool().for_rows_mut(&mut vw[..(end - base) * kv_dim], kv_dim, 64, |r0, chunk| {
                    for (i, row) in chunk.chunks_mut(kv_dim).enumerate() {
                        widen_row(vals, base + r0 + i, kv_dim, 0, None, row);
                    }
                });
                (&vw[..], base)
            }
        };
        let n_qb = n.div_ceil(ATTN_QB);
        ot.resize(nh * n_qb * ATTN_QB * hd, 0.0); // [nh, n_qb * ATTN_QB, hd], padded
        pool().for_rows_mut_dynamic(&mut ot[..], ATTN_QB * hd, 1, |item, out| {
            let (head, qb) = (item / n_qb, item % n_qb);
            let kvh = head / at.group;
            let (i0, i1) = (qb * ATTN_QB, ((qb + 1) * ATTN_QB).min(n));
            let nq = i1 - i0;
            // Keys [k0, k1) (cache positions) cover every query of the block; the scores start
            // at the panel holding k0.
            let (k0, k1) = (at.first(at.pos0 + i0) / KP * KP, at.pos0 + i1);
            let nkb = k1 - k0;
            // Per-thread scratch, reused across items and calls: fresh allocations of this size
            // are fresh mmaps and page faults.
            ATTN_SCRATCH.with(|sc| {
                let mut sc = sc.borrow_mut();
                let [qblk, s, inv] = &mut *sc;
                qblk.resize(nq * hd, 0.0); // [nq, hd]
                s.resize(nq * nkb, 0.0); // [nq, nkb]
                inv.resize(nq, 0.0); // what each output row is multiplied by
                for (r, row) in qblk.chunks_mut(hd).enumerate() {
                    row.copy_from_slice(&q[(i0 + r) * q_dim + head * hd..][..hd]);
                }
                // S = Q_blk · Kᵀ[:, k0..k1], a panel at a time
                for off in (0..nkb).step_by(KP) {
                    let j = (k0 + off) / KP - pa;
                    let panel = &kt[(kvh * np + j) * hd * KP..][..hd * KP];
                    gemm_nn(qblk, nq, panel, KP, hd, KP.min(nkb - off), &mut s[off..], nkb);
                }
                for (r, (row, inv)) in s.chunks_mut(nkb).zip(inv.iter_mut()).enumerate() {
                    let p = at.pos0 + i0 + r;
                    let (a, b) = (at.first(p) - k0, p + 1 - k0); // visible keys of this query
                    row[..a].fill(0.0);
                    row[b..].fill(0.0);
                    let vis = &mut row[a..b];
                    vis.iter_mut().for_each(|x| *x = at.score(*x));
                    *inv = at.weights(vis, head);
                }
                // O = P · V[k0..k1], each row then times its 1/Σ
                let v_h = &vrows[(k0 - vbase) * kv_dim + kvh * hd..];
                gemm_nn(s, nq, v_h, kv_dim, nkb, hd, &mut out[..nq * hd], hd);
                for (row, &inv) in out.chunks_mut(hd).zip(inv.iter()) {
                    row.iter_mut().for_each(|v| *v *= inv);
                }
            });
        });
        for i in 0..n {
            for head in 0..nh {
                let src = (head * n_qb * ATTN_QB + i) * hd;
                o[i * q_dim + head * hd..][..hd].copy_from_slice(&ot[src..src + hd]);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mixers::KvType;
    use crate::mixers::attention::KvState;

    /// A cache of `kind` holding k, v; an 8-bit one with key scales of 1/2, 1 or 2 per channel
    /// (its keys stored scaled, as a model's are).
    fn filled(kv_dim: usize, hd: usize, kind: KvType, k: &[f32], v: &[f32], seed: &mut u64) -> KvState {
        let mut st = KvState::with_head(kv_dim, hd, kind);
        if kind == KvType::Q8 {
            let scale: Vec<f32> = rnd(kv_dim, seed).iter().map(|&x| ((x * 1.5).round()).exp2()).collect();
            st = st.with_key_scale(scale.into());
        }
        st.cache.append(k, v);
        st
    }

    fn rnd(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The blocked GEMM form equals the per-query loop: several query blocks, a chunk that
    /// starts mid-cache, GQA, sliding windows narrower and wider than a block, a softcap.
    #[test]
    fn blocked_attention_matches_per_query() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        for (nh, nkv, hd, n, pos0, window, softcap) in [
            (4, 1, 32, 70, 0, None, None),
            (6, 2, 16, 33, 19, None, Some(20.0)),
            (2, 2, 8, 65, 40, Some(10), None),
            (4, 2, 24, 40, 5, Some(50), None),
            (3, 3, 64, 8, 3, None, None),
            // Deep chunks: windows that start inside a panel of keys, several panels.
            (2, 1, 64, 40, 301, Some(100), None),
            (4, 2, 32, 50, 203, None, None),
        ] {
            let (q_dim, kv_dim) = (nh * hd, nkv * hd);
            let total = pos0 + n;
            let q = rnd(n * q_dim, &mut seed);
            let k = rnd(total * kv_dim, &mut seed);
            let v = rnd(total * kv_dim, &mut seed);
            let first = |p: usize| window.map_or(0, |w: usize| (p + 1).saturating_sub(w));
            let lo = first(pos0);
            let at = AttnCtx {
                hd,
                nh,
                group: nh / nkv,
                kv_dim,
                q_dim,
                pos0,
                lo,
                scale: 0.3,
                softcap,
                window,
                fast: false,
                sinks: None,
            };
            // Each cache type: the blocked form reads it as the decode kernel does (f16 and
            // 8-bit widened into panels and rows, the 8-bit keys transformed back).
            for kind in [KvType::F32, KvType::F16, KvType::Q8] {
                if kind == KvType::Q8 && hd % cortiq_kernels::kvattn::Q8_BLOCK != 0 {
                    continue; // 8-bit heads are whole blocks of 32 values
                }
                let st = filled(kv_dim, hd, kind, &k, &v, &mut seed);
                let (keys, vals, form) = st.cache.rows();
                let mut blocked = vec![0f32; n * q_dim];
                attend_blocked(&at, &q, n, keys, vals, form, &mut blocked);
                let mut max = (0f32, 0);
                for i in 0..n {
                    let mut one = vec![0f32; q_dim];
                    let at1 = AttnCtx { pos0: 0, lo: 0, ..at };
                    decode_attend(&at1, &q[i * q_dim..(i + 1) * q_dim], &[(pos0 + i, 0)], &[&st.cache], &mut one);
                    // NaN-propagating (cortiq-testkit); a NaN stays (nothing compares greater).
                    let (diff, d) = cortiq_testkit::max_abs_diff(&one, &blocked[i * q_dim..(i + 1) * q_dim]);
                    if (diff > max.0 || diff.is_nan()) && !max.0.is_nan() {
                        max = (diff, i * q_dim + d);
                    }
                }
                println!(
                    "{kind:?} nh {nh} nkv {nkv} hd {hd} n {n} pos0 {pos0} window {window:?}: max diff {:.2e} at {}",
                    max.0, max.1
                );
                assert!(max.0 <= 2e-6, "{kind:?}: blocked attention differs by {} at {}", max.0, max.1);
            }
        }
    }

    /// Decode attention's value does not depend on how its work is cut: heads one by one or a
    /// whole kv group per item, a row alone or batched with others (bit for bit); an f16 and an
    /// 8-bit cache stay close to the f32 one. GQA groups of 1-4, a window, positions off the
    /// splits.
    #[test]
    fn decode_attention_is_the_same_however_it_is_cut() {
        let mut seed = 0x0DEC_0DE0_1234_5678u64;
        for (nh, nkv, hd, p, window) in [
            (8usize, 2usize, 32usize, 700usize, None),
            (9, 3, 64, 530, Some(300usize)),
            (4, 4, 32, 600, None),
            (6, 1, 64, 513, None),
            (4, 1, 64, 40, None),
        ] {
            let (q_dim, kv_dim) = (nh * hd, nkv * hd);
            let q = rnd(2 * q_dim, &mut seed);
            let k = rnd((p + 1) * kv_dim, &mut seed);
            let v = rnd((p + 1) * kv_dim, &mut seed);
            let group = nh / nkv;
            let at = AttnCtx {
                hd,
                nh,
                group,
                kv_dim,
                q_dim,
                pos0: 0,
                lo: 0,
                scale: 0.2,
                softcap: None,
                window,
                fast: true,
                sinks: None,
            };
            let cache = Cache::Kv { k: k.clone(), v: v.clone() };
            let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            let run = |rows: &[(usize, usize)], qs: &[f32], hpi: usize| {
                let mut o = vec![0f32; rows.len() * q_dim];
                decode_attend_in(&at, qs, rows, &[cache.rows()], hpi, &mut o);
                o
            };
            let whole = run(&[(p, 0)], &q[..q_dim], group);
            let one = run(&[(p, 0)], &q[..q_dim], 1);
            let all = run(&[(p, 0)], &q[..q_dim], nh);
            assert!(same(&whole, &all), "nh {nh} nkv {nkv} hd {hd} p {p}: all heads per item differ from per group");
            let batch = run(&[(p - 1, 0), (p, 0)], &[&q[q_dim..], &q[..q_dim]].concat(), group);
            assert!(same(&whole, &one), "nh {nh} nkv {nkv} hd {hd} p {p}: per head differs from per group");
            assert!(same(&whole, &batch[q_dim..]), "nh {nh} nkv {nkv} hd {hd} p {p}: batched differs from alone");
            for kind in [KvType::F16, KvType::Q8] {
                let st = filled(kv_dim, hd, kind, &k, &v, &mut seed);
                let mut o = vec![0f32; q_dim];
                decode_attend_in(&at, &q[..q_dim], &[(p, 0)], &[st.cache.rows()], group, &mut o);
                let (d, _) = cortiq_testkit::max_abs_diff(&o, &whole);
                let tol = if kind == KvType::F16 { 2e-3 } else { 2e-2 };
                assert!(d <= tol, "{kind:?} cache: {d} from f32");
                // The prefill path reads the same cache widened (an 8-bit cache's keys
                // transformed back): the same values to f32 rounding.
                if window.is_none() {
                    let (kc, vc) = st.cache.f32_from(0, kv_dim);
                    let wide = Cache::Kv { k: kc.into_owned(), v: vc.into_owned() };
                    let mut ow = vec![0f32; q_dim];
                    decode_attend_in(&at, &q[..q_dim], &[(p, 0)], &[wide.rows()], group, &mut ow);
                    let (d, _) = cortiq_testkit::max_abs_diff(&o, &ow);
                    assert!(d <= 2e-6, "{kind:?} cache read in place vs widened: {d}");
                }
            }
        }
    }
}
