//! GGUF tensors of the 4-bit lookup-table types (IQ4_NL, IQ4_XS, MXFP4) and of the 2-/3-bit
//! grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) load and multiply through every kernel
//! path the engine's QTensor takes for them.
//!
//! tests/fixtures/lut_types.gguf and grid_types.gguf are written by gguf-py's GGUFWriter
//! (tools/fixtures/quant/gen_lut_gguf.py, gguf==0.19.0): per type a 3-row weight `w.<type>`, an
//! input `x.<type>` and `y.<type>` = gguf-py's dequantization times x, in f64, rounded to f32.
//!
//! Checked per type:
//! - the reader names the type and the GGUF dims [cols, 3], and the bytes are the row bytes;
//! - the exact path (`Numerics::Exact`: dequantize, f32 products) is within a few f32 roundings of
//!   Σ|w·x| from y;
//! - the quantized-activation decode paths (`matvec_fast`, a decode batch `matvec_fast_multi`,
//!   llama.cpp's order `matvec_q_order`) give the same bits as `vec_dot` per row, within
//!   1e-6 · Σ|w·x̃| of the exact product with the 8-bit activations x̃, which is itself within
//!   Σ|w|·|x - x̃| (the activation rounding) of y;
//! - prefill's `matmat_q` (its integer kernel, in its own float order: quant::matmat's header)
//!   is within 1e-5 · Σ|w·x̃| of `vec_dot`, the contract every type with a kernel meets.

use std::path::PathBuf;

use cortiq_formats::gguf::Gguf;
use cortiq_kernels::quant::{
    Order, QuantType, act_type, dequantize_act, dequantize_rows, matmat_q, matvec_fast, matvec_fast_multi, matvec_q_order,
    quantize_act, vec_dot,
};

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn lut_type_tensors_load_and_multiply() {
    load_and_multiply(
        "lut_types.gguf",
        &[(QuantType::IQ4NL, "iq4_nl"), (QuantType::IQ4XS, "iq4_xs"), (QuantType::MXFP4, "mxfp4")],
    );
}

#[test]
fn grid_type_tensors_load_and_multiply() {
    load_and_multiply(
        "grid_types.gguf",
        &[
            (QuantType::IQ2XXS, "iq2_xxs"),
            (QuantType::IQ2XS, "iq2_xs"),
            (QuantType::IQ2S, "iq2_s"),
            (QuantType::IQ3XXS, "iq3_xxs"),
            (QuantType::IQ3S, "iq3_s"),
        ],
    );
}

/// The checks of the module header on every `(type, name)` of fixture `file`.
fn load_and_multiply(file: &str, types: &[(QuantType, &str)]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(file);
    let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let rows = 3;
    println!("{:>7} {:>5} {:>12} {:>12} {:>12} {:>12}", "type", "cols", "exact/bound", "max bound", "quant rel", "act rel");
    for &(ty, name) in types {
        let info = g.tensor(&format!("w.{name}")).unwrap_or_else(|| panic!("w.{name} missing"));
        assert_eq!(info.dtype, ty, "w.{name}: type");
        assert_eq!(info.dims.len(), 2, "w.{name}: dims {:?}", info.dims);
        assert_eq!(info.dims[1], rows as u64, "w.{name}: rows");
        let cols = info.dims[0] as usize;
        let w = g.tensor_data(info);
        let rb = ty.row_bytes(cols).expect("whole blocks");
        assert_eq!(w.len(), rows * rb, "w.{name}: bytes");
        let x = f32s(g.tensor_data(g.tensor(&format!("x.{name}")).unwrap()));
        let y = f32s(g.tensor_data(g.tensor(&format!("y.{name}")).unwrap()));
        assert_eq!((x.len(), y.len()), (cols, rows));

        // exact: the dequantized rows times x in f32, as QTensor's exact path
        let mut wf = vec![0f32; rows * cols];
        dequantize_rows(ty, w, cols, &mut wf);
        let (mut exact_err, mut exact_bound) = (0f64, 0f64);
        for (r, wr) in wf.chunks_exact(cols).enumerate() {
            let got: f32 = wr.iter().zip(&x).map(|(a, b)| a * b).sum();
            let mag: f64 = wr.iter().zip(&x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            let bound = mag * f32::EPSILON as f64 * (cols as f64).sqrt() * 2.0 + y[r].abs() as f64 * f32::EPSILON as f64;
            let err = (got as f64 - y[r] as f64).abs();
            assert!(err <= bound, "{ty} row {r}: exact product {got:e}, gguf-py {:e}, |err| {err:e} > {bound:e}", y[r]);
            exact_err = exact_err.max(err / bound);
            exact_bound = exact_bound.max(bound);
        }

        // quantized activations: every kernel path against vec_dot, and vec_dot against f64
        let at = act_type(ty).expect("an activation format");
        let mut q = Vec::new();
        quantize_act(at, &x, &mut q);
        let mut xq = vec![0f64; cols];
        dequantize_act(at, &q, &mut xq);
        let mut fast = vec![0f32; rows];
        matvec_fast(ty, w, rows, cols, &q, &mut fast);
        let mut ggml = vec![0f32; rows];
        matvec_q_order(ty, Order::VecDot, w, rows, cols, &q, &mut ggml);
        // a decode batch of two sequences, and a two-token prefill, both with x in column 1
        let mut q2 = Vec::new();
        quantize_act(at, &x.iter().map(|v| -0.5 * v).collect::<Vec<_>>(), &mut q2);
        q2.extend_from_slice(&q);
        let mut multi = vec![0f32; rows * 2];
        matvec_fast_multi(ty, w, rows, cols, &q2, 2, &mut multi);
        let mut mm = vec![0f32; rows * 2];
        matmat_q(ty, w, rows, cols, &q2, 2, &mut mm);
        let (mut quant_err, mut act_err) = (0f64, 0f64);
        for r in 0..rows {
            let wr = &wf[r * cols..(r + 1) * cols];
            let v = vec_dot(ty, &w[r * rb..(r + 1) * rb], &q, cols);
            for (what, got) in [("matvec_fast", fast[r]), ("matvec_q_order", ggml[r]), ("multi", multi[2 * r + 1])] {
                assert_eq!(got.to_bits(), v.to_bits(), "{ty} row {r}: {what} {got:e}, vec_dot {v:e}");
            }
            let exact_q: f64 = wr.iter().zip(&xq).map(|(&a, &b)| a as f64 * b).sum();
            let mag_q: f64 = wr.iter().zip(&xq).map(|(&a, &b)| (a as f64 * b).abs()).sum();
            let mm_err = (mm[2 * r + 1] as f64 - v as f64).abs();
            assert!(mm_err <= 1e-5 * mag_q, "{ty} row {r}: matmat {:e}, vec_dot {v:e}, Σ|w·x̃| {mag_q:e}", mm[2 * r + 1]);
            let err = (v as f64 - exact_q).abs();
            assert!(err <= 1e-6 * mag_q, "{ty} row {r}: vec_dot {v:e}, exact with 8-bit activations {exact_q:e}");
            quant_err = quant_err.max(err / mag_q);
            // the 8-bit activations move the product by at most Σ|w|·|x - x̃|
            let rounding: f64 =
                wr.iter().zip(x.iter().zip(&xq)).map(|(&a, (&b, &c))| (a as f64).abs() * (b as f64 - c).abs()).sum();
            let moved = (exact_q - y[r] as f64).abs();
            assert!(
                moved <= rounding * (1.0 + 1e-6) + 1e-6 * mag_q,
                "{ty} row {r}: {moved:e} from y, activation rounding {rounding:e}"
            );
            act_err = act_err.max(moved / mag_q);
        }
        println!("{name:>7} {cols:>5} {exact_err:>12.3e} {exact_bound:>12.3e} {quant_err:>12.3e} {act_err:>12.3e}");
    }
}
