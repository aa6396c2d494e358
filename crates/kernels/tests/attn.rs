//! The attention scores (`attn::dot_rows`): bit-identical to `dot` per pair and within a
//! tolerance of the scalar twin.

use cortiq_kernels::attn::{dot_rows, dot_rows_scalar};
use cortiq_kernels::dot::dot;
use cortiq_testkit::XorShift;

struct Rng(XorShift);
impl Rng {
    /// A spread of magnitudes, so that the summation order shows in the low bits.
    fn f(&mut self) -> f32 {
        let scale = (1 << (self.0.next() % 7)) as f32;
        self.0.f() * scale
    }
    fn v(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

const SHAPES: [(usize, usize, usize, usize); 9] = [
    // (heads, head_dim, extra stride, positions)
    (1, 64, 0, 1),
    (1, 64, 64, 15),
    (7, 64, 64, 16),
    (7, 64, 64, 100),
    (2, 128, 0, 33),
    (4, 256, 256, 47),
    (3, 80, 16, 17),
    (1, 7, 3, 40),
    (2, 200, 8, 0),
];

#[test]
fn scores_equal_dot_per_pair_and_the_scalar_twin_within_rounding() {
    let mut rng = Rng(XorShift(0xA77E_0001));
    for (g, hd, extra, n) in SHAPES {
        let stride = hd + extra;
        let q = rng.v(g * hd);
        let keys = rng.v(n.saturating_sub(1) * stride + hd);
        let (mut fast, mut slow) = (vec![0f32; g * n], vec![0f32; g * n]);
        dot_rows(&q, hd, &keys, stride, n, &mut fast);
        dot_rows_scalar(&q, hd, &keys, stride, n, &mut slow);
        for h in 0..g {
            for t in 0..n {
                let (qh, kt) = (&q[h * hd..(h + 1) * hd], &keys[t * stride..t * stride + hd]);
                let one = dot(qh, kt);
                let v = fast[h * n + t];
                assert!(v.to_bits() == one.to_bits(), "g {g} hd {hd} n {n}: head {h} pos {t}: {v} batched, {one} by dot");
                let mag: f32 = qh.iter().zip(kt).map(|(a, b)| (a * b).abs()).sum();
                let s = slow[h * n + t];
                assert!((v - s).abs() <= 1e-5 * mag.max(1e-30), "g {g} hd {hd}: head {h} pos {t}: simd {v} scalar {s}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "rows of stride")]
fn short_key_rows_are_refused() {
    let q = vec![0f32; 64];
    let keys = vec![0f32; 64 * 3];
    let mut out = vec![0f32; 4];
    dot_rows(&q, 64, &keys, 64, 4, &mut out);
}
