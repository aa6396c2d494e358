//! The speculative-decoding flags (`--spec` and its draft bounds), shared by `cortiq run` and
//! any front end that wants the same flags and defaults; [`SpecArgs::speculator`] turns them
//! into the engine's `Speculator`.

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use cortiq_engine::spec::{self, SpecMethod as EngineMethod, SpecParams, SpecStats, Speculator};

/// How drafts are proposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SpecMethod {
    /// Plain decoding.
    None,
    /// Prompt lookup: the tokens that followed the last earlier occurrence of the text's most
    /// recent n-gram (prompt and output so far).
    Ngram,
}

/// The speculative-decoding flags.
#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    /// Speculative decoding: propose tokens and verify them in one forward. The output is the
    /// same as without it, token for token, at any temperature and seed.
    #[arg(long, value_enum, default_value_t = SpecMethod::None)]
    pub spec: SpecMethod,
    /// Tokens per draft at most.
    #[arg(long, default_value_t = spec::DEFAULT_N_MAX)]
    pub spec_draft_n_max: usize,
    /// Drafts shorter than this are not verified (a plain step instead).
    #[arg(long, default_value_t = 0)]
    pub spec_draft_n_min: usize,
    /// N-gram drafts: the shortest match that proposes a draft, in tokens.
    #[arg(long, default_value_t = spec::DEFAULT_NGRAM_MIN)]
    pub spec_ngram_min: usize,
    /// N-gram drafts: the longest match tried first, in tokens.
    #[arg(long, default_value_t = spec::DEFAULT_NGRAM_MAX)]
    pub spec_ngram_max: usize,
}

impl SpecArgs {
    /// The bounds clap does not check.
    pub fn validate(&self) -> Result<()> {
        if self.spec != SpecMethod::None && self.spec_draft_n_max == 0 {
            bail!("--spec-draft-n-max must be at least 1 with --spec {:?}", self.spec);
        }
        if self.spec_draft_n_min > self.spec_draft_n_max {
            bail!("--spec-draft-n-min ({}) is above --spec-draft-n-max ({})", self.spec_draft_n_min, self.spec_draft_n_max);
        }
        if self.spec_ngram_min == 0 || self.spec_ngram_min > self.spec_ngram_max {
            bail!(
                "--spec-ngram-min must be within 1..=--spec-ngram-max, got {} and {}",
                self.spec_ngram_min,
                self.spec_ngram_max
            );
        }
        Ok(())
    }

    /// The engine's settings (None without --spec).
    pub fn params(&self) -> Option<SpecParams> {
        let method = match self.spec {
            SpecMethod::None => return None,
            SpecMethod::Ngram => EngineMethod::Ngram { min: self.spec_ngram_min, max: self.spec_ngram_max },
        };
        Some(SpecParams { method, n_max: self.spec_draft_n_max, n_min: self.spec_draft_n_min })
    }

    /// A fresh speculator for one sequence (None without --spec).
    pub fn speculator(&self) -> Option<Speculator> {
        self.params().map(|p| p.speculator())
    }
}

/// The stderr line of a speculative run.
pub fn stats_line(s: &SpecStats) -> String {
    let rate = if s.drafted == 0 { 0.0 } else { 100.0 * s.accepted as f64 / s.drafted as f64 };
    format!("speculation: drafted {} tok, accepted {} ({rate:.1}%), in {} verifies", s.drafted, s.accepted, s.verifies)
}
