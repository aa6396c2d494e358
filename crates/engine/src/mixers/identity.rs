//! No token mixer (`MixerKind::Identity`): a layer that is its feed-forward block alone
//! (Nemotron-H's MLP and MoE blocks). Its output is zero, so the mixer half's residual add
//! leaves the stream as it was, bit for bit; its state holds nothing.

use crate::error::Result;
use crate::mixers::{Env, KvType, LayerState, Mixer, MixerState, Seq, StateBytes};
use crate::qtensor::QTensor;

pub struct Identity;

/// The state of a layer without a mixer: nothing.
#[derive(Clone, Debug, Default)]
pub struct NoState;

impl MixerState for NoState {
    fn is_recurrent(&self) -> bool {
        false
    }
    fn truncate(&mut self, _len: usize) {}
    fn clear(&mut self) {}
    fn bytes(&self) -> StateBytes {
        StateBytes::default()
    }
    fn save(&self, _out: &mut Vec<u8>) -> std::result::Result<(), String> {
        Ok(())
    }
    fn load(&mut self, _r: &mut &[u8], _len: usize) -> std::result::Result<(), String> {
        Ok(())
    }
}

impl Mixer for Identity {
    fn name(&self) -> &'static str {
        "no mixer"
    }
    fn matrices(&self) -> Vec<&QTensor> {
        Vec::new()
    }
    fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        Vec::new()
    }
    fn new_state(&self, _kv: KvType) -> LayerState {
        LayerState::new(NoState)
    }
    fn forward(&self, env: &Env, _h: &[f32], n: usize, _seq: Seq<'_>, _trace: &mut dyn FnMut(&str, &[f32])) -> Result<Vec<f32>> {
        Ok(vec![0.0; n * env.cfg.d_model])
    }
}
