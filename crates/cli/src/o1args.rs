//! The O(1)-memory decode flags (`--o1`, `--kv-window`, `--o1-budget`, ...) shared by run, ppl,
//! bench and serve, their plan, and a polished model's recorded settings. Built with the `o1`
//! feature; `o1args_off.rs` stands in without it.

use anyhow::{Result, bail};
use clap::Args;
use cortiq_engine::o1::O1Plan;
pub use cortiq_engine::o1::Served;
use cortiq_engine::o1::evict::ScoreRule;
use cortiq_engine::o1::nystrom::skeleton_bytes;
use cortiq_engine::o1::nystrom::{DEFAULT_RIDGE, Far, Guard, O1Settings, StatePrecision};

/// O(1)-memory decode (issue 5) and the StreamingLLM baseline, shared by run, ppl and bench.
#[derive(Args, Clone)]
pub struct O1Args {
    /// Constant-memory decode with the best measured policy (BENCHMARKS.md, issue 15): after
    /// the prompt (run with exact attention) each global softmax-attention layer keeps S sinks
    /// and W positions of keys. On a model carrying a learned far field (`cortiq polish --o1-far
    /// linear`) the evicted keys feed it, with the window split and eviction rules the model
    /// records; on any other model the kept keys are chosen by score (`--kv-evict score`;
    /// `--kv-evict window` keeps the last W). `--o1-far nystrom` serves the Nyström landmark
    /// skeleton instead. Sliding-window layers (Gemma 3 local) stay exact, keeping only their
    /// window from the seal on; recurrent mixers and MLA layers are unchanged.
    #[arg(long)]
    pub o1: bool,
    /// --o1 exact window W: keys fewer than W positions back, or W score slots [default: 512,
    /// or what a polished model records].
    #[arg(long, value_name = "W")]
    pub o1_window: Option<usize>,
    /// --o1 sink keys: the first S positions stay exact; S <= W [default: 4].
    #[arg(long, value_name = "S")]
    pub o1_sinks: Option<usize>,
    /// --o1-far nystrom: landmark cap m, 4..=256 [default: 64]. A prompt of tp tokens gets
    /// m_eff = clamp(tp/8, 4, m) landmarks (a cap above tp/8 is clamped, not an error); a prompt
    /// of at most W + S + 8 tokens seals no skeleton (every key stays exact).
    #[arg(long, value_name = "M")]
    pub o1_landmarks: Option<usize>,
    /// --o1-far nystrom: ridge factor of the landmark inverse: λ = ridge · tr(AᵀA) / m
    /// [default: 1e-3].
    #[arg(long, value_name = "R")]
    pub o1_ridge: Option<f64>,
    /// --o1-far nystrom: storage of the landmark skeleton and its accumulators: f32 (half the
    /// bytes) or pair (f32 hi/lo pairs, ~48-bit mantissa: the matrix form's agreement to ~1e-7,
    /// for checking) [default: f32].
    #[arg(long, value_name = "KIND", value_parser = ["f32", "pair"])]
    pub o1_state: Option<String>,
    /// StreamingLLM baseline: after the prompt keep only the sink keys and the last W keys
    /// (the middle is evicted). Positions are kept: keys are stored already rotated at their
    /// own positions and never re-rotated (StreamingLLM's no-shift variant). Not with --o1.
    #[arg(long, value_name = "W")]
    pub kv_window: Option<usize>,
    /// Size the constant-memory state to a fixed budget instead of a window: each planned layer
    /// holds at most the bytes of `--kv-window N` (plain sink+window, with --kv-sinks S or
    /// --o1-sinks S, default 4), and the policy the other flags choose spends them its own way:
    /// score eviction's per-slot scores, the learned far field's state, the window split, or
    /// (--o1-far nystrom) the Nyström skeleton of --o1-landmarks M (default: the most landmarks, at
    /// least 4, whose skeleton takes at most a quarter of the budget) all come out of the same
    /// bytes, the window takes the rest. The sealed state is f32 in every policy (an f16 cache
    /// is widened at the seal), so the budget is the same with any --kv-type. Not with --kv-window
    /// or --o1-window.
    #[arg(long, value_name = "N")]
    pub o1_budget: Option<usize>,
    /// The window --o1-budget comes to on the open model (`apply_budget`).
    #[arg(skip)]
    budget_window: Option<usize>,
    /// With --o1: the landmark cap it comes to.
    #[arg(skip)]
    budget_landmarks: Option<usize>,
    /// --kv-window sink keys, S <= W [default: 4].
    #[arg(long, value_name = "S")]
    pub kv_sinks: Option<usize>,
    /// Which keys the --kv-window budget keeps after the prompt: `window` (StreamingLLM: the
    /// sinks and the last W) or `score` (the same bytes, sinks + W slots; each step the key
    /// with the lowest attention from the current query, summed over the layer's heads,
    /// leaves: TOVA's layer-shared rule) [default: window].
    #[arg(long, value_name = "RULE", value_parser = ["window", "score"])]
    pub kv_evict: Option<String>,
    /// --kv-evict score: weight of a key's previous score in its new one, in [0, 1) (0: the
    /// current query alone, TOVA's rule) [default: 0.7].
    #[arg(long, value_name = "D")]
    pub kv_evict_decay: Option<f32>,
    /// --kv-evict score: keys this many positions old or younger are never evicted
    /// [default: 16].
    #[arg(long, value_name = "R")]
    pub kv_evict_recent: Option<usize>,
    /// --kv-evict score: at the end of the prompt the last N prompt queries vote for the
    /// prompt keys kept (SnapKV); 0 keeps the sinks and the last W, as sink+window does
    /// [default: 0].
    #[arg(long, value_name = "N")]
    pub kv_evict_obs: Option<usize>,
    /// What the --kv-window / --o1 budget does with the keys it evicts (by recency, or by
    /// --kv-evict score): `none` (dropped), `linear` (absorbed into a learned linear-attention
    /// state per KV head, read under the kept keys' softmax normalizer; the model must carry
    /// one: `cortiq polish --o1-far linear`) or `nystrom` (the Nyström landmark skeleton of every
    /// key outside sinks + --o1-window, folded into fixed-size accumulators; not with
    /// --kv-window) [default: none, or linear for a model that carries one].
    #[arg(long, value_name = "KIND", value_parser = ["none", "linear", "nystrom"])]
    pub o1_far: Option<String>,
    /// --kv-window on a polished model that carries window curves (`cortiq polish`): `on`
    /// splits the planned layers' windows by them (the same total of positions as W on every
    /// layer, more where a layer loses more to a short window), `off` gives every layer W
    /// [default: on].
    #[arg(long, value_name = "ON", value_parser = ["on", "off"])]
    pub o1_split: Option<String>,
    /// A polished model (`cortiq polish`) is served in O(1) mode with the settings recorded in
    /// its .cmf; --exact serves it with exact attention instead (as any other model). With
    /// --o1, the recorded settings are the defaults of the --o1-* flags.
    #[arg(long)]
    pub exact: bool,
}

impl O1Args {
    /// Whether an O(1) or StreamingLLM plan is asked for.
    pub fn any(&self) -> bool {
        self.o1 || self.kv_window.is_some() || self.o1_budget.is_some()
    }

    /// Turns --o1-budget into the --kv-window that the chosen policy can afford on this model
    /// (call once the model is open, before [`O1Args::plan`]). Per planned layer the budget is
    /// (N + S) positions of f32 keys and values; a score slot costs a position plus 12 bytes
    /// (its position and score), the far field its state (the largest layer's).
    /// `o1_implied` as for [`O1Args::plan`].
    pub fn apply_budget(&mut self, model: &cortiq_engine::Model, served: Option<Served>, o1_implied: bool) -> Result<()> {
        let Some(n) = self.o1_budget else { return Ok(()) };
        self.budget_checks()?;
        let served = served.filter(|_| !self.exact);
        let d = O1Settings::default();
        let sinks = self.kv_sinks.or(self.o1_sinks).unwrap_or(served.map_or(d.sinks, |s| s.settings.sinks));
        let cfg = &model.cfg;
        let per_pos = 2 * cfg.n_kv_heads * cfg.head_dim * 4;
        let budget = (n + sinks) * per_pos;
        if self.skeleton(served, o1_implied) {
            // The skeleton first (its bytes do not depend on the window), the window the rest.
            let skel = |m: usize| skeleton_bytes(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, m);
            let m = match self.o1_landmarks {
                Some(m) => m,
                None => (4..=256).rev().find(|&m| 4 * skel(m) <= budget).unwrap_or(4),
            };
            let slots = budget.saturating_sub(skel(m)) / per_pos;
            if slots <= sinks {
                bail!(
                    "--o1-budget {n}: {budget} bytes per layer hold no window beside {sinks} sinks and a skeleton of {m} landmarks ({} bytes); give fewer --o1-landmarks",
                    skel(m)
                );
            }
            self.budget_window = Some(slots - sinks);
            self.budget_landmarks = Some(m);
            return Ok(());
        }
        let (linear, score) = self.far_and_score(served, o1_implied);
        let far = if linear { model.o1_far.iter().flatten().map(|w| w.state_bytes()).max().unwrap_or(0) } else { 0 };
        let slot = per_pos + if score { SCORE_SLOT_BYTES } else { 0 };
        let slots = budget.saturating_sub(far) / slot;
        if slots <= sinks {
            bail!(
                "--o1-budget {n}: {budget} bytes per layer hold {slots} slots of {slot} bytes after the far state's {far}, no more than the {sinks} sinks"
            );
        }
        self.budget_window = Some(slots - sinks);
        Ok(())
    }

    /// Whether the Nyström skeleton serves: `--o1-far nystrom`; --o1-check (`o1_implied`),
    /// which checks it, unless --kv-window or --o1-budget alone asks for sink+window; or a model
    /// polished for it (`cortiq polish`, no far field) served by its own settings.
    fn skeleton(&self, served: Option<Served>, o1_implied: bool) -> bool {
        let served_nystrom = served.is_some_and(|s| !s.linear);
        let own = self.kv_window.is_none() && self.o1_far.is_none() && (self.o1 || self.o1_budget.is_none());
        self.o1_far.as_deref() == Some("nystrom") || ((o1_implied || served_nystrom) && own)
    }

    /// Whether the eviction cache (--kv-window, or --o1 without the skeleton) has a learned far
    /// field and whether it evicts by score: the flags, else what a polished model records (its
    /// far field, and the rule it was fitted beside), else for --o1 score eviction (the better
    /// rule without training on five of six measured cells). `served` already filtered by
    /// --exact.
    fn far_and_score(&self, served: Option<Served>, o1_implied: bool) -> (bool, bool) {
        let skeleton = self.skeleton(served, o1_implied);
        let served_linear = served.is_some_and(|s| s.linear) && !skeleton;
        let linear = self.o1_far.as_deref() == Some("linear") || (served_linear && self.o1_far.is_none());
        let score = match self.kv_evict.as_deref() {
            Some(rule) => rule == "score",
            None if linear => served.is_some_and(|s| s.linear && s.score),
            None => self.o1 && !skeleton,
        };
        (linear, score)
    }

    /// --o1-budget's own checks (before and after the model opens).
    fn budget_checks(&self) -> Result<()> {
        let Some(n) = self.o1_budget else { return Ok(()) };
        if self.kv_window.is_some() {
            bail!("--o1-budget and --kv-window are exclusive (the budget sets the window)");
        }
        if self.o1_window.is_some() {
            bail!("--o1-budget and --o1-window are exclusive (the budget sets the window)");
        }
        for (flag, s) in [("--kv-sinks", self.kv_sinks), ("--o1-sinks", self.o1_sinks)] {
            if let Some(s) = s.filter(|&s| s > n) {
                bail!("{flag}: {s} exceeds --o1-budget {n}");
            }
        }
        Ok(())
    }

    /// The plan for a prompt of `tp` tokens (None without --o1 / --kv-window), `check` for the
    /// matrix form. `o1_implied`: --o1-check given, which means --o1 unless --kv-window is.
    /// `served`: the O(1) settings a polished model records (see [`served_o1`]): its plan
    /// unless --exact or --kv-window is given, and the --o1-* defaults.
    pub fn plan(&self, tp: usize, check: Option<Guard>, o1_implied: bool, served: Option<Served>) -> Result<Option<O1Plan>> {
        if self.exact && (self.o1 || o1_implied || self.kv_window.is_some()) {
            bail!("--exact turns O(1) serving off; it does not go with --o1, --o1-check or --kv-window");
        }
        let served = served.filter(|_| !self.exact);
        self.budget_checks()?;
        if self.o1 && self.kv_window.is_some() {
            bail!("--o1 and --kv-window are exclusive (--kv-window is the StreamingLLM baseline)");
        }
        if self.o1_far.as_deref() == Some("nystrom") && self.kv_window.is_some() {
            bail!("--o1-far nystrom and --kv-window are exclusive (the skeleton keeps --o1-window exact)");
        }
        // A model with a learned far field is served as sink+window (or its score layers) with
        // it, at its recorded window unless --kv-window, --o1-window or --o1-budget says
        // otherwise (--o1-far none drops it); --o1-far nystrom serves the skeleton.
        let skeleton = self.skeleton(served, o1_implied);
        let served_linear = served.is_some_and(|s| s.linear) && !skeleton;
        // --o1 without the skeleton: the eviction cache, sized as --kv-window would be.
        let o1_cache = self.o1 && !skeleton;
        // Before `apply_budget` the budget stands in for the window (the flags' checks only).
        let budget = if skeleton { None } else { self.budget_window.or(self.o1_budget) };
        let kv_window = match skeleton {
            true => None,
            false => self
                .kv_window
                .or(budget)
                .or(self.o1_window.filter(|_| o1_cache))
                .or(served.filter(|_| served_linear).map(|s| s.settings.window))
                .or(o1_cache.then_some(O1Settings::default().window)),
        };
        let (linear, score) = self.far_and_score(served, o1_implied);
        let served = served.map(|s| s.settings);
        if !skeleton && !self.o1 {
            for (flag, given) in [("--o1-window", self.o1_window.is_some()), ("--o1-sinks", self.o1_sinks.is_some())] {
                if given {
                    bail!("{flag} needs --o1");
                }
            }
        }
        if !skeleton {
            for (flag, given) in [
                ("--o1-landmarks", self.o1_landmarks.is_some()),
                ("--o1-ridge", self.o1_ridge.is_some()),
                ("--o1-state", self.o1_state.is_some()),
            ] {
                if given {
                    bail!("{flag} sets the Nyström skeleton: it needs --o1 --o1-far nystrom");
                }
            }
        }
        let cache_flags = [
            ("--kv-sinks", self.kv_sinks.is_some()),
            ("--kv-evict", self.kv_evict.is_some()),
            ("--o1-far", self.o1_far.as_deref().is_some_and(|f| f != "nystrom")),
            ("--o1-split", self.o1_split.is_some()),
        ];
        for (flag, given) in cache_flags {
            if given && skeleton {
                bail!("{flag} does not go with the Nyström skeleton");
            }
            if given && kv_window.is_none() {
                bail!("{flag} needs --kv-window or --o1");
            }
        }
        if linear && check.is_some() {
            bail!("--o1-check covers the Nyström skeleton and sink+window, not --o1-far linear");
        }
        for (flag, given) in
            [("--kv-evict-decay", self.kv_evict_decay.is_some()), ("--kv-evict-recent", self.kv_evict_recent.is_some())]
        {
            if given && !score {
                bail!("{flag} needs --kv-evict score");
            }
        }
        let d = served.unwrap_or(O1Settings { ridge: DEFAULT_RIDGE, ..O1Settings::default() });
        let (settings, far) = if skeleton {
            // Before `apply_budget` the budget stands in for the window (the flags' checks only).
            let st = O1Settings {
                window: self.o1_window.or(self.budget_window).or(self.o1_budget).unwrap_or(d.window),
                sinks: self.o1_sinks.unwrap_or(d.sinks),
                landmarks: self.o1_landmarks.or(self.budget_landmarks).unwrap_or(d.landmarks),
                ridge: self.o1_ridge.unwrap_or(d.ridge),
                state: match self.o1_state.as_deref() {
                    Some("pair") => StatePrecision::Pair,
                    _ => d.state,
                },
            };
            st.validate()?;
            (st, Far::Skeleton)
        } else if let Some(w) = kv_window {
            let sinks = self.kv_sinks.or(self.o1_sinks.filter(|_| o1_cache)).unwrap_or(d.sinks);
            if w == 0 {
                bail!("{}: must be at least 1, got 0", if o1_cache { "--o1-window" } else { "--kv-window" });
            }
            if sinks > w {
                match o1_cache && self.kv_sinks.is_none() {
                    true => bail!("--o1-sinks: {sinks} exceeds --o1-window {w}"),
                    false => bail!("--kv-sinks: {sinks} exceeds --kv-window {w}"),
                }
            }
            // Landmarks are unused when far keys are dropped.
            let rule = if score {
                let d = ScoreRule::default();
                let decay = self.kv_evict_decay.unwrap_or(d.decay);
                if !(0.0..1.0).contains(&decay) {
                    bail!("--kv-evict-decay: must be in [0, 1), got {decay}");
                }
                Some(ScoreRule {
                    decay,
                    recent: self.kv_evict_recent.unwrap_or(d.recent),
                    obs: self.kv_evict_obs.unwrap_or(d.obs),
                    // The rule a polished model records (no --kv-evict): its own layers.
                    model_layers: self.kv_evict.is_none(),
                })
            } else {
                None
            };
            let far = match (rule, linear) {
                (_, true) => Far::Linear(rule),
                (Some(r), false) => Far::Score(r),
                (None, false) => Far::Drop,
            };
            if score && check.is_some() {
                bail!("--o1-check covers the Nyström skeleton and sink+window, not --kv-evict score");
            }
            (O1Settings { window: w, sinks, landmarks: 4, ridge: DEFAULT_RIDGE, state: d.state }, far)
        } else {
            return Ok(None);
        };
        let split = self.o1_split.as_deref() != Some("off") && check.is_none();
        Ok(Some(O1Plan { tp, settings, far, check, split }))
    }
}

/// Bytes a score-eviction slot adds to its keys and values: its position (u32) and score (f64).
pub const SCORE_SLOT_BYTES: usize = 12;

/// Says on stderr that a polished model is served in O(1) mode by its own settings.
pub fn note_served(plan: &Option<O1Plan>, served: Option<Served>, o1_flag: bool) {
    let Some(p) = plan else { return };
    match served {
        Some(s) if s.linear && matches!(p.far, Far::Linear(_)) => eprintln!(
            "polished model: serving {} (window {}, sinks {}) with its learned far field; --exact turns it off",
            match p.far {
                Far::Linear(Some(r)) if r.model_layers && s.score_layers =>
                    "score eviction on the layers it chose, sink+window on the rest",
                Far::Linear(Some(_)) => "score eviction",
                _ => "sink+window",
            },
            p.settings.window,
            p.settings.sinks
        ),
        Some(_) if !o1_flag && p.far == Far::Skeleton => eprintln!(
            "polished model: serving in O(1) mode (window {}, sinks {}, landmarks {}, ridge {:e}); --exact turns it off",
            p.settings.window, p.settings.sinks, p.settings.landmarks, p.settings.ridge
        ),
        _ => {}
    }
}

/// The plan in `cortiq bench`'s test names (` o1 W512 S4 m64`, ` kv-window W512 S4`).
pub fn bench_mode(p: &O1Plan) -> String {
    match p.far {
        Far::Skeleton => format!(" o1 W{} S{} m{}", p.settings.window, p.settings.sinks, p.settings.landmarks),
        _ => format!(" kv-window W{} S{}", p.settings.window, p.settings.sinks),
    }
}

/// The policy a plan serves, in words (the server's startup line).
pub fn describe_plan(p: &O1Plan) -> String {
    let (w, sn) = (p.settings.window, p.settings.sinks);
    match p.far {
        Far::Skeleton => format!("Nyström skeleton, window {w}, sinks {sn}, landmarks {}", p.settings.landmarks),
        Far::Drop => format!("sink+window (StreamingLLM), window {w}, sinks {sn}"),
        Far::Score(_) => format!("score eviction, {w} slots, sinks {sn}"),
        Far::Linear(None) => format!("sink+window with the learned far field, window {w}, sinks {sn}"),
        Far::Linear(Some(_)) => format!("score eviction with the learned far field, {w} slots, sinks {sn}"),
    }
}

/// The O(1) settings a polished .cmf records, served by default.
pub fn served_o1(l: &cortiq_engine::load::Loaded) -> Option<Served> {
    l.served_o1()
}
