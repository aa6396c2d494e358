//! Attention and Mamba2 side by side on the same normed input, their outputs added (Falcon-H1's
//! layer: `mamba(h) + attention(h)`; the per-branch multipliers are folded into the weights at
//! load, as llama.cpp's converter folds them). The state is the pair of the branches' states;
//! with a recurrent branch inside it is checkpointed whole, and a verify is stepped position by
//! position and rewound from its snapshot (the `Mixer` defaults).

use crate::config::{LayerSpec, ModelConfig};
use crate::error::Result;
use crate::geometry::Mamba2Config;
use crate::mixers::attention::Attention;
use crate::mixers::mamba2::Mamba2;
use crate::mixers::{Env, KvType, LayerState, Mixer, MixerState, Seq, StateBytes};
use crate::o1::AttnO1;
use crate::qtensor::QTensor;
use crate::weights::TensorSource;

pub struct Parallel {
    attn: Attention,
    ssm: Mamba2,
}

/// The two branches' states.
#[derive(Clone)]
pub struct PairState {
    attn: LayerState,
    ssm: LayerState,
}

impl MixerState for PairState {
    fn is_recurrent(&self) -> bool {
        true
    }
    fn clear(&mut self) {
        self.attn.0.clear();
        self.ssm.0.clear();
    }
    fn reserve(&mut self, extra: usize) {
        self.attn.0.reserve(extra);
    }
    fn bytes(&self) -> StateBytes {
        self.attn.bytes() + self.ssm.bytes()
    }
    fn save(&self, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        self.attn.0.save(out)?;
        self.ssm.0.save(out)
    }
    fn load(&mut self, r: &mut &[u8], len: usize) -> std::result::Result<(), String> {
        self.attn.0.load(r, len)?;
        self.ssm.0.load(r, len)
    }
}

impl Parallel {
    /// Layer `il`'s attention (GGUF `attn_*`) and Mamba2 (`ssm_*`).
    pub fn load(src: &dyn TensorSource, cfg: &ModelConfig, m: Mamba2Config, il: usize, spec: &LayerSpec) -> Result<Parallel> {
        Ok(Parallel { attn: Attention::load(src, cfg, il, spec)?, ssm: Mamba2::load(src, m, il)? })
    }
}

impl Mixer for Parallel {
    fn name(&self) -> &'static str {
        "attention beside a Mamba2 layer"
    }
    fn matrices(&self) -> Vec<&QTensor> {
        self.attn.matrices().into_iter().chain(self.ssm.matrices()).collect()
    }
    fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        let Parallel { attn, ssm } = self;
        attn.matrices_mut().into_iter().chain(ssm.matrices_mut()).collect()
    }
    fn new_state(&self, kv: KvType) -> LayerState {
        LayerState::new(PairState { attn: self.attn.new_state(kv), ssm: self.ssm.new_state(kv) })
    }
    fn forward(&self, env: &Env, h: &[f32], n: usize, seq: Seq<'_>, trace: &mut dyn FnMut(&str, &[f32])) -> Result<Vec<f32>> {
        let st: &mut PairState = seq.state.of();
        let (pos0, lc) = (seq.pos0, seq.lc);
        let m = self.ssm.forward(env, h, n, Seq { state: &mut st.ssm, pos0, lc, o1: AttnO1::Off }, trace)?;
        let mut a = self.attn.forward(env, h, n, Seq { state: &mut st.attn, pos0, lc, o1: AttnO1::Off }, trace)?;
        // Falcon-H1: mamba + attention.
        a.iter_mut().zip(&m).for_each(|(av, mv)| *av = mv + *av);
        Ok(a)
    }
}
