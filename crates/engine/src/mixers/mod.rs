//! Token mixers, one module each (STYLE principle 9): softmax attention and its variants
//! (`attention`: exact or sliding, f32 or f16 cache, the sealed O(1) state), GatedDeltaNet
//! (`gdn`), Kimi Delta Attention (`kda`), multi-head latent attention (`mla`) and LFM2's short
//! convolution (`shortconv`); `nystrom` is the O(1) operator a sealed attention state runs.
//! Each module owns its per-sequence state type and that state's operations behind
//! `MixerState`; `SeqState` (checkpoint, rollback, truncate, clear, reserve, bytes) dispatches
//! through it once per layer and never looks inside.

use std::any::Any;

use crate::state::StateBytes;

pub mod attention;
pub mod gdn;
pub mod kda;
pub mod mla;
pub mod nystrom;
pub mod shortconv;

/// One layer's per-sequence state, whatever its mixer. A checkpoint snapshots a recurrent state
/// whole (a clone) and restores it by replacement; any other state is truncated instead.
pub trait MixerState: StateAny + Send + Sync {
    /// Whether the state only goes forward (constant-size recurrent states, sealed O(1)
    /// attention): `truncate` cannot take it back, a checkpoint snapshots it.
    fn is_recurrent(&self) -> bool;

    /// Keep the first `len` positions. Called only on a state that is not recurrent (the
    /// default, for recurrent states, says so).
    fn truncate(&mut self, _len: usize) {
        unreachable!("a recurrent state is restored from its snapshot, never truncated");
    }

    /// Room for `extra` more positions without reallocating (constant-size states: nothing).
    fn reserve(&mut self, _extra: usize) {}

    /// Back to an empty sequence (recurrent states zeroed).
    fn clear(&mut self);

    /// Bytes held, by kind.
    fn bytes(&self) -> StateBytes;
}

/// The object plumbing every `MixerState` gets for free: a boxed clone (checkpoints) and the
/// downcast to its mixer's own type (the mixer's forward, the O(1) seal).
pub trait StateAny {
    fn box_clone(&self) -> Box<dyn MixerState>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: MixerState + Clone + 'static> StateAny for T {
    fn box_clone(&self) -> Box<dyn MixerState> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
