//! The O(1) flags of a cortiq built without the `o1` feature: none. Run, ppl, bench and serve
//! take exact (and sliding-window) attention only; a polished model's O(1) settings are not
//! served.

use anyhow::Result;
use clap::Args;
use cortiq_engine::load::Loaded;
use cortiq_engine::o1::O1Plan;

/// No O(1) flags in this build.
#[derive(Args, Clone, Debug, Default)]
pub struct O1Args {
    /// Never set: there is no --o1 flag in this build.
    #[arg(skip)]
    pub o1: bool,
}

impl O1Args {
    /// Whether a plan was asked for: never.
    pub fn any(&self) -> bool {
        false
    }

    /// Nothing to fit to the model.
    pub fn apply_budget(&mut self, _model: &cortiq_engine::Model, _served: Option<Served>, _o1_implied: bool) -> Result<()> {
        Ok(())
    }

    /// No plan.
    pub fn plan(&self, _tp: usize, _check: Option<()>, _o1_implied: bool, _served: Option<Served>) -> Result<Option<O1Plan>> {
        Ok(None)
    }
}

/// A polished model's O(1) settings: never read in this build.
#[derive(Clone, Copy, Debug)]
pub enum Served {}

/// Never served in this build.
pub fn served_o1(_l: &Loaded) -> Option<Served> {
    None
}

/// Nothing to say: no plan exists.
pub fn note_served(_plan: &Option<O1Plan>, _served: Option<Served>, _o1_flag: bool) {}

/// No plan exists in this build.
pub fn bench_mode(p: &O1Plan) -> String {
    match *p {}
}

/// No plan exists in this build.
pub fn describe_plan(p: &O1Plan) -> String {
    match *p {}
}
