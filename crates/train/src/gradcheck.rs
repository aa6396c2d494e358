//! The f64 gradient check: central finite differences of a scalar loss against the analytic
//! gradient, one input element at a time, reporting the worst relative error and where.
//!
//! Relative error of element i: |a_i − n_i| / max(|a_i|, |n_i|, FLOOR·max_k |n_k|), a = analytic,
//! n = numeric. The floor (a fraction of the tensor's largest gradient) keeps elements whose
//! gradient is zero or nearly so (masked keys, far-off positions) from dividing rounding noise
//! by nothing; every other element is held to a plain relative error.

/// Fraction of a tensor's largest |gradient| below which errors are measured against it.
pub const FLOOR: f64 = 1e-3;

/// One tensor's check.
#[derive(Debug, Clone)]
pub struct Report {
    pub op: String,
    pub tensor: String,
    /// Elements checked.
    pub n: usize,
    pub max_rel: f64,
    /// Element index of the worst error, with both values there.
    pub at: usize,
    pub analytic: f64,
    pub numeric: f64,
    /// Largest |numeric gradient| of the tensor (its scale).
    pub scale: f64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "gradcheck {:<22} {:<8} n={:<5} max rel err {:.3e} at {:<5} (analytic {:+.6e}, numeric {:+.6e}; scale {:.3e})",
            self.op, self.tensor, self.n, self.max_rel, self.at, self.analytic, self.numeric, self.scale
        )
    }
}

/// Checks `analytic` = ∂loss/∂x by the fourth-order central difference
/// `(8·(L(x+h) − L(x−h)) − (L(x+2h) − L(x−2h))) / 12h`, h_i = eps·max(|x_i|, 1).
/// Why fourth order: with the plain two-point difference the truncation error (h²·L'''/6) and
/// the rounding error (~1e-16·|L|/h) meet near 1e-9 of the gradient's scale for attention-like
/// ops, too close to the 1e-6 bar on the small elements; the five-point stencil cancels the h²
/// term, so a larger h (1e-4) brings both errors near 1e-12.
/// `loss` is evaluated at x with one element moved (restored afterwards).
pub fn check(op: &str, tensor: &str, x: &mut [f64], analytic: &[f64], eps: f64, mut loss: impl FnMut(&[f64]) -> f64) -> Report {
    assert_eq!(x.len(), analytic.len(), "gradcheck {op} {tensor}: analytic gradient length");
    let mut numeric = vec![0.0; x.len()];
    for i in 0..x.len() {
        let x0 = x[i];
        // h a power of two: x0 ± h and x0 ± 2h are then exact for |x0| < 2^53·h·ulp, so the steps
        // taken are the steps assumed.
        let h = (eps * x0.abs().max(1.0)).log2().round().exp2();
        let mut at = |d: f64| {
            x[i] = x0 + d;
            loss(x)
        };
        let (p1, m1, p2, m2) = (at(h), at(-h), at(2.0 * h), at(-2.0 * h));
        x[i] = x0;
        numeric[i] = (8.0 * (p1 - m1) - (p2 - m2)) / (12.0 * h);
    }
    compare(op, tensor, analytic, &numeric)
}

/// The error table entry of analytic vs numeric.
pub fn compare(op: &str, tensor: &str, analytic: &[f64], numeric: &[f64]) -> Report {
    let scale = numeric.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let floor = (FLOOR * scale).max(f64::MIN_POSITIVE);
    let mut r = Report {
        op: op.to_string(),
        tensor: tensor.to_string(),
        n: analytic.len(),
        max_rel: 0.0,
        at: 0,
        analytic: analytic.first().copied().unwrap_or(0.0),
        numeric: numeric.first().copied().unwrap_or(0.0),
        scale,
    };
    for (i, (&a, &n)) in analytic.iter().zip(numeric).enumerate() {
        let e = (a - n).abs() / a.abs().max(n.abs()).max(floor);
        if e > r.max_rel || e.is_nan() {
            (r.max_rel, r.at, r.analytic, r.numeric) = (if e.is_nan() { f64::INFINITY } else { e }, i, a, n);
        }
    }
    r
}

/// splitmix64 with Box–Muller normals: reproducible test data without a dependency.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// n normals times `std`.
    pub fn vec(&mut self, n: usize, std: f64) -> Vec<f64> {
        (0..n).map(|_| self.normal() * std).collect()
    }
}
