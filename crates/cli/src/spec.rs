//! The speculative-decoding flags (`--spec` and its draft bounds, the draft model), shared by
//! `cortiq run` and `cortiq serve`; [`SpecArgs::params`] turns them into the engine's
//! `SpecParams` and [`SpecArgs::open_draft`] loads and checks the draft model.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use cortiq_engine::Model;
use cortiq_engine::load::Loaded;
use cortiq_engine::spec::{self, SpecMethod as EngineMethod, SpecParams, SpecStats, check_draft_vocab};

use crate::common::{Common, open_model, open_tokenizer};

/// How drafts are proposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SpecMethod {
    /// Plain decoding.
    None,
    /// Prompt lookup: the tokens that followed the last earlier occurrence of the text's most
    /// recent n-gram (prompt and output so far).
    Ngram,
    /// A smaller model with the same vocabulary (--spec-draft) decodes ahead greedily.
    Draft,
    /// The model's own multi-token-prediction block (Qwen3-Next / Qwen3.5 checkpoints that
    /// ship one), chained for longer drafts.
    Mtp,
}

/// The speculative-decoding flags.
#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    /// Speculative decoding: propose tokens and verify them in one forward. The output is the
    /// same as without it, token for token, at any temperature and seed.
    #[arg(long, value_enum, default_value_t = SpecMethod::None)]
    pub spec: SpecMethod,
    /// The draft model of --spec draft (a .gguf, HF folder, .cmf, hf: model or known name) sharing the
    /// target's vocabulary; it runs with the target's numerics and threads.
    #[arg(long, value_name = "MODEL")]
    pub spec_draft: Option<String>,
    /// Tokens per draft at most.
    #[arg(long, default_value_t = spec::DEFAULT_N_MAX)]
    pub spec_draft_n_max: usize,
    /// Drafts shorter than this are not verified (a plain step instead).
    #[arg(long, default_value_t = 0)]
    pub spec_draft_n_min: usize,
    /// --spec draft: stop drafting where the draft model's top token has a probability below P.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub spec_draft_p_min: f32,
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
        if !(0.0..=1.0).contains(&self.spec_draft_p_min) {
            bail!("--spec-draft-p-min must be within [0, 1], got {}", self.spec_draft_p_min);
        }
        match (self.spec, &self.spec_draft) {
            (SpecMethod::Draft, None) => bail!("--spec draft needs a draft model: --spec-draft MODEL"),
            (SpecMethod::None | SpecMethod::Ngram | SpecMethod::Mtp, Some(_)) => bail!("--spec-draft is for --spec draft"),
            _ => Ok(()),
        }
    }

    /// The engine's settings (None without --spec).
    pub fn params(&self) -> Option<SpecParams> {
        let method = match self.spec {
            SpecMethod::None => return None,
            SpecMethod::Ngram => EngineMethod::Ngram { min: self.spec_ngram_min, max: self.spec_ngram_max },
            SpecMethod::Draft => EngineMethod::Draft { p_min: self.spec_draft_p_min },
            SpecMethod::Mtp => EngineMethod::Mtp,
        };
        Some(SpecParams { method, n_max: self.spec_draft_n_max, n_min: self.spec_draft_n_min })
    }

    /// The draft model of --spec draft, loaded with the target's flags and checked to share
    /// its vocabulary (None without one); --spec mtp checks that the target has an MTP block.
    pub fn open_draft(&self, common: &Common, target: &Loaded) -> Result<Option<Arc<Model>>> {
        if self.spec == SpecMethod::Mtp && target.model.mtp.is_empty() {
            bail!(
                "--spec mtp: {} has no multi-token-prediction block (only Qwen3-Next / Qwen3.5 checkpoints that ship their mtp.* tensors do)",
                common.model_arg()?
            );
        }
        let Some(name) = &self.spec_draft else { return Ok(None) };
        let c = Common { model: Some(name.clone()), ..common.clone() };
        let draft = open_model(&c).with_context(|| format!("loading the draft model {name}"))?;
        let (tt, dt) = (open_tokenizer(target)?, open_tokenizer(&draft).with_context(|| format!("the draft model {name}"))?);
        check_draft_vocab(tt.vocab_size(), dt.vocab_size(), &|id| tt.token_bytes(id), &|id| dt.token_bytes(id))
            .with_context(|| format!("--spec-draft {name}"))?;
        Ok(Some(Arc::new(draft.model)))
    }
}

/// The stderr line of a speculative run.
pub fn stats_line(s: &SpecStats) -> String {
    let rate = if s.drafted == 0 { 0.0 } else { 100.0 * s.accepted as f64 / s.drafted as f64 };
    format!("speculation: drafted {} tok, accepted {} ({rate:.1}%), in {} verifies", s.drafted, s.accepted, s.verifies)
}
