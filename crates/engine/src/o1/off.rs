//! The engine built without the `o1` feature: the names the core threads through its forward
//! passes and states, as types that cannot be constructed (or plain data), so that every O(1)
//! path is statically unreachable and none of the research code (o1/mod.rs, nystrom, evict,
//! farfield) is compiled.

#[path = "basic.rs"]
mod basic;
pub use self::basic::{AttnO1, O1Stats, Serve};

/// A plan (none can be made without the feature: `Model::new_state_o1` is never reached).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum O1Plan {}

impl O1Plan {
    pub fn with_prompt(self, _tp: usize) -> O1Plan {
        match self {}
    }
    pub fn tp(&self) -> usize {
        match *self {}
    }
    pub fn checks(&self) -> bool {
        match *self {}
    }
}

/// A per-layer window split of a polished model (never loaded without the feature).
#[derive(Clone, Debug, PartialEq)]
pub enum O1Split {}

/// A sequence's O(1) bookkeeping: `SeqState::o1` is always `None` without the feature.
#[derive(Clone, Debug)]
pub enum O1Run {}

impl O1Run {
    pub fn plain_prompt(&self) -> bool {
        match *self {}
    }
    pub fn pending(&self, _len: usize) -> bool {
        match *self {}
    }
    pub(crate) fn split(&self, _len: usize, _n: usize) -> Option<usize> {
        match *self {}
    }
    pub(crate) fn hook(&mut self, _il: usize) -> AttnO1<'_> {
        match *self {}
    }
    pub(crate) fn seals_after(&self, _il: usize, _end: usize) -> bool {
        match *self {}
    }
    pub(crate) fn seals(&self, _il: usize) -> bool {
        match *self {}
    }
    pub(crate) fn sealed(
        &mut self,
        _il: usize,
        _k: &[f32],
        _v: &[f32],
    ) -> Result<(nystrom::O1Layer, bool), nystrom::NystromError> {
        match *self {}
    }
    pub(crate) fn reset(&mut self) -> bool {
        match *self {}
    }
    pub(crate) fn snapshot(&self) -> O1Run {
        match *self {}
    }
    pub(crate) fn restore(&mut self, _snap: O1Run, _len: usize) {
        match *self {}
    }
    pub fn window(&self, _il: usize) -> usize {
        match *self {}
    }
    pub fn bytes(&self) -> usize {
        match *self {}
    }
    pub fn stats(&self) -> O1Stats {
        match *self {}
    }
    pub fn checks(&self) -> bool {
        match *self {}
    }
    pub(crate) fn set_stats(&mut self, _stats: O1Stats) {
        match *self {}
    }
}

pub mod nystrom {
    //! Stand-ins for the sealed O(1) state.

    /// A sealed layer (none exists without the feature).
    #[derive(Clone, Debug)]
    pub enum O1Layer {}

    impl O1Layer {
        pub fn step(&mut self, _q: &[f32], _k: &[f32], _v: &[f32], _o: &mut [f32]) -> usize {
            match *self {}
        }
        pub fn bytes(&self) -> usize {
            match *self {}
        }
    }

    /// The prompt's query segment sums (never kept without the feature).
    #[derive(Clone, Debug)]
    pub enum QuerySegments {}

    impl QuerySegments {
        pub fn add(&mut self, _pos0: usize, _q: &[f32]) {
            match *self {}
        }
    }

    /// Why a plan cannot seal (never raised without the feature).
    #[derive(Clone, Debug, PartialEq)]
    pub enum NystromError {}

    impl std::fmt::Display for NystromError {
        fn fmt(&self, _f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match *self {}
        }
    }
}

pub mod evict {
    //! Stand-ins for score eviction's prompt bookkeeping.

    /// The prompt's last queries (never kept without the feature).
    #[derive(Clone, Debug)]
    pub enum RecentQueries {}

    impl RecentQueries {
        pub fn add(&mut self, _pos0: usize, _q: &[f32]) {
            match *self {}
        }
    }
}

pub mod farfield {
    //! Stand-ins for the learned far field.

    /// A layer's far-field weights (never loaded without the feature).
    #[derive(Debug)]
    pub enum FarWeights {}

    impl FarWeights {
        pub fn state_bytes(&self) -> usize {
            match *self {}
        }
    }
}
