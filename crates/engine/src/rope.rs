//! RoPE recipes: the frequency scaling a model was trained with and one table's rotated dims and
//! inverse frequencies (`Rope::tables`). A leaf of the engine (no model, no dtype): the config,
//! the shared blocks and llama.cpp's table twin (`compat::rope_tables_ggml`) all read it, so it
//! sits below them (and below QTensor) and no import cycle runs through it.

use cortiq_kernels::ops::RopeStyle;

/// RoPE frequency scaling as the model was trained with.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Linear { factor: f64 },
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position: f64 },
}

/// One RoPE table's recipe: rotated dims and per-pair inverse frequencies.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub style: RopeStyle,
    /// Rotated dimensions (≤ head_dim, even).
    pub rot_dim: usize,
    /// rot_dim/2 inverse frequencies, f64 so long positions keep their precision.
    pub inv_freq: Vec<f64>,
    /// The frequency base and scaling `inv_freq` was built from (llama.cpp numerics recompute
    /// the angles from them the way ggml does).
    pub base: f64,
    pub scaling: RopeScaling,
}

impl Rope {
    /// HF's default / linear / llama3 inverse frequencies (modeling_rope_utils).
    pub fn new(style: RopeStyle, rot_dim: usize, theta: f64, scaling: &RopeScaling) -> Rope {
        let half = rot_dim / 2;
        let mut inv: Vec<f64> = (0..half).map(|i| 1.0 / theta.powf((2 * i) as f64 / rot_dim as f64)).collect();
        match *scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                let low_wavelen = original_max_position / low_freq_factor;
                let high_wavelen = original_max_position / high_freq_factor;
                for f in inv.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
        }
        Rope { style, rot_dim, inv_freq: inv, base: theta, scaling: scaling.clone() }
    }

    /// cos and sin for `n` consecutive positions from `pos0`: each [n, rot_dim/2].
    pub fn tables(&self, pos0: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in pos0..pos0 + n {
            for &f in &self.inv_freq {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        (cos, sin)
    }
}
