//! The O(1) names the core uses in either build (`o1` feature or not): plain data.

/// What the guard did: (position, query head) rows past the prompt, and those whose far field
/// the aggregate guard dropped (Σ_far a < 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct O1Stats {
    pub rows: usize,
    pub dropped: usize,
}

impl std::ops::AddAssign for O1Stats {
    fn add_assign(&mut self, o: O1Stats) {
        self.rows += o.rows;
        self.dropped += o.dropped;
    }
}

/// How the plan serves one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serve {
    /// Not attention (or MLA): untouched.
    Untouched,
    /// Global softmax attention: follows the plan.
    Planned,
    /// Sliding-window attention over this many keys: exact throughout, its cache bounded from
    /// the seal on (a sink-less StreamingLLM state of that window, which is the same operator).
    Sliding(usize),
}

/// The attention block's view of the plan for one layer and chunk.
pub enum AttnO1<'a> {
    /// Not planned: ordinary attention.
    Off,
    /// Prompt phase: exact attention, and the chunk's queries (post-RoPE) summed per landmark.
    Segments(&'a mut super::nystrom::QuerySegments),
    /// Prompt phase of a voted score plan: exact attention, and the last queries kept.
    Recent(&'a mut super::evict::RecentQueries),
    /// Exact before the seal (a StreamingLLM plan keeps no segments); after it the layer's state
    /// is sealed (`attention::Cache::O1`) and steps count into these statistics.
    Stats(&'a mut O1Stats),
    /// The matrix-form check: append this chunk's queries, output from `matrix_form`.
    Matrix { plan: super::O1Plan, q_hist: &'a mut Vec<f32>, stats: &'a mut O1Stats },
}

impl AttnO1<'_> {
    /// The same hook for one more call (the verify's per-position steps share it).
    pub(crate) fn reborrow(&mut self) -> AttnO1<'_> {
        match self {
            AttnO1::Off => AttnO1::Off,
            AttnO1::Segments(s) => AttnO1::Segments(s),
            AttnO1::Recent(r) => AttnO1::Recent(r),
            AttnO1::Stats(s) => AttnO1::Stats(s),
            AttnO1::Matrix { plan, q_hist, stats } => AttnO1::Matrix { plan: *plan, q_hist, stats },
        }
    }
}
