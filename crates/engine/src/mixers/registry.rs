//! The mixer registry: which mixer type runs a layer, by its `MixerKind`. Apart from
//! `mod.rs` (the interface every mixer implements), so that the interface does not depend on
//! the mixers.

use super::{Mixer, attention, gdn, identity, kda, mamba2, mla, parallel, shortconv, vmf, vmf_window};
use crate::config::{LayerSpec, MixerKind, ModelConfig};
use crate::error::Result;
use crate::weights::TensorSource;

/// Layer `il`'s mixer by GGUF tensor names, as `spec` says.
pub fn load(src: &dyn TensorSource, cfg: &ModelConfig, il: usize, spec: &LayerSpec) -> Result<Box<dyn Mixer>> {
    Ok(match spec.mixer {
        MixerKind::Attention => Box::new(attention::Attention::load(src, cfg, il, spec)?),
        MixerKind::ShortConv { kernel, bias } => Box::new(shortconv::ShortConv::load(src, cfg.d_model, il, kernel, bias)?),
        MixerKind::GatedDeltaNet(c) => Box::new(gdn::GatedDeltaNet::load(src, c, il)?),
        MixerKind::Kda(c) => Box::new(kda::Kda::load(src, c, il)?),
        MixerKind::Mamba2(c) => Box::new(mamba2::Mamba2::load(src, c, il)?),
        MixerKind::Identity => Box::new(identity::Identity),
        MixerKind::AttnMamba2(c) => Box::new(parallel::Parallel::load(src, cfg, c, il, spec)?),
        MixerKind::Mla(c) => Box::new(mla::Mla::load(src, c, il)?),
        MixerKind::VmfPhase(c) if c.windowed() => Box::new(vmf_window::VmfWindow::load(src, cfg, c, il, spec)?),
        MixerKind::VmfPhase(c) => Box::new(vmf::VmfPhase::load(src, c, il)?),
    })
}
