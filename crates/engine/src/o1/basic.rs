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
