//! Models from the Hugging Face hub: `hf:ORG/REPO[@REVISION][:SELECTOR]`.
//!
//! Owns: parsing that spelling (`HubSpec`), the hub's settings from the environment
//! (`HubConfig`: `HF_ENDPOINT`, `HF_HOME` / `HF_HUB_CACHE`, `HF_TOKEN` or the token file,
//! `HF_HUB_OFFLINE`), choosing the files a model needs from a repo listing (`select`), the
//! download into the hub's own cache layout with resume, size and hash checks (`pull`), and
//! the cached-model listing for `cortiq pull --list` (`cached_models`).
//!
//! ```no_run
//! use cortiq_cli::hub::{self, HubConfig, HubSpec};
//! let spec = HubSpec::parse("hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m")?;
//! let gguf = hub::pull(&HubConfig::from_env(), &spec)?; // a path inside the hub cache
//! # anyhow::Ok(())
//! ```
//!
//! The cache is the one `huggingface_hub` (Python) writes and reads, so a file fetched by
//! `hf download`, transformers or llama.cpp's `-hf` is reused, and ours are theirs:
//!   `<hub cache>/models--ORG--REPO/blobs/<etag>`          the bytes, named by their hash
//!   `<hub cache>/models--ORG--REPO/snapshots/<commit>/<file>` -> `../../blobs/<etag>`
//!   `<hub cache>/models--ORG--REPO/refs/<revision>`       the commit the revision named
//!   `<hub cache>/.locks/models--ORG--REPO/<etag>.lock`    held while a blob is written
//! A download grows in `blobs/<etag>.incomplete` (Python's name too, so either tool resumes
//! the other's partial file) and is renamed to `blobs/<etag>` only after its size and hash
//! match the listing: the sha256 of the LFS object for weights, the git blob id for small
//! files. What cortiq resolved is remembered in `<cortiq cache>/hub/` (one small JSON per
//! spec) so that the next `-m hf:...` is a few `stat`s, with no request and no re-hash.
//!
//! Why plain HTTP (ureq) and not the `hf-hub` crate, which the field uses: hf-hub 1.0 is
//! async on reqwest and brings the whole xet client (hf-xet) - minutes of build on our
//! machines for a once-per-model step. hf-hub 0.4's blocking API (ureq 2) renames a download
//! into `blobs/` and links it into the snapshot before any hash could be checked (it checks
//! none), resumes from its own `<etag>.part` (Python's partial files are `.incomplete`, so
//! neither resumes the other's), asks the network on every `download` even when the file is
//! cached, keeps its cache-path helpers crate-private, does not read `HF_TOKEN`, and hands
//! HTTP statuses back inside a boxed ureq 2 error; working around all that would leave little
//! of it in use, beside a second HTTP stack and indicatif 0.17. Sizes and hashes come from
//! the listing, so no HEAD per file is needed. What we use of the hub is three routes:
//!   GET  {endpoint}/api/models/{repo}/revision/{rev}?blobs=true  commit, files, sizes, hashes
//!   GET  {endpoint}/{repo}/resolve/{commit}/{file}                 the bytes (Range to resume;
//!                                                                  LFS redirects to a CDN)
//!   401 / 403 / 404 with `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound,
//!   GatedRepo) for the errors.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cortiq_formats::gguf::split_name;
use indicatif::ProgressBar;
use serde_json::{Value, json};
use sha1::Sha1;
use sha2::{Digest, Sha256};

/// The hub a bare `HF_ENDPOINT` falls back to.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Small files a HF folder needs besides config.json and the weights (those present are fetched).
const TOKENIZER_FILES: [&str; 9] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
];

/// 4-bit quants, best first, that the default choice takes from a GGUF repo: the ones our
/// kernels run (no IQ types), Q4_K_M first as llama.cpp and ollama default to it.
const DEFAULT_QUANTS: [&str; 5] = ["q4_k_m", "q4_k_s", "q4_0", "q4_1", "q4_k"];

/// How many requests in a row may bring no new bytes before a download gives up (requests
/// that make progress reset the count, so a long download over a flaky line keeps going).
const MAX_ATTEMPTS: u32 = 5;

/// How long one request may spend receiving its body before it is cut and resumed with a
/// Range request: ureq 3 has no per-read timeout, only a budget per body, so this bounds how
/// long a connection that went silent (no data, no close) can hold a download.
pub const DEFAULT_BODY_BUDGET: Duration = Duration::from_secs(300);

/// Everything that can go wrong talking to the hub; each message is one line that names the
/// repo or file and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0}: not a hub model; the spelling is hf:ORG/REPO[@REVISION][:QUANT_OR_FILE]")]
    BadSpec(String),
    #[error("hub repo {repo} not found at {endpoint} (check the name; a private repo needs HF_TOKEN)")]
    RepoNotFound { repo: String, endpoint: String },
    #[error("hub repo {repo} has no revision '{revision}'")]
    RevisionNotFound { repo: String, revision: String },
    #[error("hub repo {repo} has no file {file} at revision {revision}")]
    EntryNotFound { repo: String, file: String, revision: String },
    #[error(
        "hub repo {repo} is gated or private: accept its terms on the hub page and set HF_TOKEN (or log in with `hf auth login`)"
    )]
    NeedsToken { repo: String },
    #[error("hub repo {repo} refused the token in {token_from} (HTTP {status}): it lacks access to this gated or private repo")]
    TokenRefused { repo: String, token_from: String, status: u16 },
    #[error("cannot reach the hub at {endpoint} ({detail}) and {what} is not in the cache {cache}")]
    Offline { endpoint: String, detail: String, what: String, cache: String },
    #[error("HF_HUB_OFFLINE is set and {what} is not in the cache {cache}")]
    OfflineNotCached { what: String, cache: String },
    #[error("{url}: HTTP {status}{detail}")]
    Http { url: String, status: u16, detail: String },
    #[error("{repo}: {file}: {what}")]
    BadDownload { repo: String, file: String, what: String },
    #[error("{repo}: {what}")]
    NoModel { repo: String, what: String },
    #[error("{repo}: the hub answered something unexpected: {what}")]
    Protocol { repo: String, what: String },
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
}

type Result<T> = std::result::Result<T, HubError>;

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> HubError + '_ {
    move |source| HubError::Io { path: path.display().to_string(), source }
}

// ---------------------------------------------------------------------------------------
// The spelling and the settings
// ---------------------------------------------------------------------------------------

/// `hf:ORG/REPO[@REVISION][:SELECTOR]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubSpec {
    /// `ORG/REPO` (or a bare legacy name such as `gpt2`).
    pub repo: String,
    /// A branch, tag or commit; `main` when not given.
    pub revision: String,
    /// A GGUF quant name (`q4_k_m`) or file name; `None` takes the default.
    pub selector: Option<String>,
}

impl HubSpec {
    /// True for arguments meant for the hub: `hf:...`, and ollama's `hf.co/...` and
    /// `huggingface.co/...` spellings.
    pub fn is_hub(arg: &str) -> bool {
        Self::strip_scheme(arg).is_some()
    }

    fn strip_scheme(arg: &str) -> Option<&str> {
        ["hf:", "hf.co/", "huggingface.co/", "https://huggingface.co/"].iter().find_map(|p| arg.strip_prefix(p))
    }

    pub fn parse(arg: &str) -> Result<HubSpec> {
        let bad = || HubError::BadSpec(arg.to_string());
        let rest = Self::strip_scheme(arg).ok_or_else(bad)?;
        // A selector is a quant name or a file name; only a file name may have a folder.
        let (repo_rev, selector) = match rest.split_once(':') {
            Some((a, s)) if !s.is_empty() && (!s.contains('/') || s.to_ascii_lowercase().ends_with(".gguf")) => {
                (a, Some(s.to_string()))
            }
            Some(_) => return Err(bad()),
            None => (rest, None),
        };
        let (repo, revision) = match repo_rev.split_once('@') {
            Some((r, v)) if !v.is_empty() => (r, v.to_string()),
            Some(_) => return Err(bad()),
            None => (repo_rev, "main".to_string()),
        };
        let name_ok = |s: &str| {
            !s.is_empty()
                && !s.starts_with(['.', '-'])
                && !s.contains("..")
                && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() > 2 || !parts.iter().all(|p| name_ok(p)) {
            return Err(bad());
        }
        if revision.contains("..") || revision.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad());
        }
        if let Some(s) = &selector
            && (s.contains("..") || s.starts_with('/') || s.contains('\\'))
        {
            return Err(bad());
        }
        Ok(HubSpec { repo: repo.to_string(), revision, selector })
    }

    /// The canonical spelling, for messages and `--list`.
    pub fn display(&self) -> String {
        let mut s = format!("hf:{}", self.repo);
        if self.revision != "main" {
            s.push('@');
            s.push_str(&self.revision);
        }
        if let Some(sel) = &self.selector {
            s.push(':');
            s.push_str(sel);
        }
        s
    }
}

/// Where the hub is and where its files go; `from_env` reads the variables Python's
/// `huggingface_hub` reads, with the same defaults.
#[derive(Clone, Debug)]
pub struct HubConfig {
    /// `HF_ENDPOINT`, default https://huggingface.co, no trailing slash.
    pub endpoint: String,
    /// `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub cache: PathBuf,
    /// `HF_TOKEN`, else the file `$HF_HOME/token` (written by `hf auth login`).
    pub token: Option<String>,
    /// Where the token came from, for the refused-token message.
    pub token_from: String,
    /// `HF_HUB_OFFLINE=1`: never touch the network, use the cache only.
    pub offline: bool,
    /// cortiq's memory of resolved specs: `<cortiq cache>/hub`.
    pub records: PathBuf,
    /// `DEFAULT_BODY_BUDGET`; tests shorten it.
    pub body_budget: Duration,
}

impl HubConfig {
    pub fn from_env() -> HubConfig {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let base = var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))
                .unwrap_or_else(std::env::temp_dir);
            base.join("huggingface")
        });
        let cache = var("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| home.join("hub"));
        let (token, token_from) = match var("HF_TOKEN") {
            Some(t) => (Some(t.trim().to_string()), "HF_TOKEN".to_string()),
            None => {
                let file = var("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| home.join("token"));
                let t = fs::read_to_string(&file).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
                (t, file.display().to_string())
            }
        };
        let offline =
            var("HF_HUB_OFFLINE").is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()).trim_end_matches('/').to_string();
        let records = crate::pull::cache_dir().join("hub");
        HubConfig { endpoint, cache, token, token_from, offline, records, body_budget: DEFAULT_BODY_BUDGET }
    }
}

/// `models--ORG--REPO`, the hub cache's folder for a model repo.
pub fn repo_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

// ---------------------------------------------------------------------------------------
// What a model needs from a repo
// ---------------------------------------------------------------------------------------

/// One file of a repo listing at a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteFile {
    /// Path in the repo (`rfilename`).
    pub name: String,
    pub size: u64,
    /// The blob's name in the cache: the LFS sha256, or the git blob id for small files.
    pub blob: String,
    /// True when `blob` is the LFS sha256 (checked with sha256), false for a git blob id (sha1).
    pub lfs: bool,
}

/// A repo at one commit.
#[derive(Clone, Debug)]
pub struct Listing {
    pub commit: String,
    pub files: Vec<RemoteFile>,
}

/// What `select` picked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// One GGUF, or every part of a split one in order; the model is the first.
    Gguf { files: Vec<String> },
    /// A HF folder: config.json and the small files; then the index and its shards, or the
    /// single `model.safetensors`.
    Folder { files: Vec<String>, index: Option<String> },
}

/// A GGUF model in a listing: one file or all parts of a split.
struct GgufGroup {
    /// Lowercased path without `.gguf` and the split suffix, for matching quant names.
    label: String,
    files: Vec<String>,
    /// A split with a part missing from the listing.
    missing: Option<String>,
}

fn gguf_groups<'a>(names: impl Iterator<Item = &'a str>) -> Vec<GgufGroup> {
    let names: Vec<&str> = names.filter(|n| n.to_ascii_lowercase().ends_with(".gguf")).collect();
    let mut groups = Vec::new();
    let mut splits: BTreeMap<(&str, u32), Vec<(u32, &str)>> = BTreeMap::new();
    for &n in &names {
        match split_name(n) {
            Some((prefix, no, count)) => splits.entry((prefix, count)).or_default().push((no, n)),
            None => {
                groups.push(GgufGroup { label: n[..n.len() - 5].to_ascii_lowercase(), files: vec![n.to_string()], missing: None })
            }
        }
    }
    for ((prefix, count), mut parts) in splits {
        parts.sort();
        let missing = (1..=count).find(|k| !parts.iter().any(|(no, _)| no == k)).map(|k| format!("part {k} of {count}"));
        let files = parts.into_iter().map(|(_, n)| n.to_string()).collect();
        groups.push(GgufGroup { label: prefix.to_ascii_lowercase(), files, missing });
    }
    groups.sort_by(|a, b| a.files[0].cmp(&b.files[0]));
    groups
}

fn choices(groups: &[&GgufGroup]) -> String {
    groups
        .iter()
        .map(|g| match g.files.len() {
            1 => g.files[0].clone(),
            n => format!("{} ({n} parts)", g.files[0]),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `label` ends with `q` after a separator (`model-Q4_K_M` for `q4_k_m`), or is `q`.
fn ends_with_quant(label: &str, q: &str) -> bool {
    let base = label.rsplit('/').next().unwrap_or(label);
    base == q || base.strip_suffix(q).is_some_and(|h| h.ends_with(['-', '.', '_']))
}

/// `q` appears in `label` between separators (`model-q4_k_m-imat` for `q4_k_m`).
fn contains_quant(label: &str, q: &str) -> bool {
    let sep = |c: Option<char>| c.is_none_or(|c| matches!(c, '-' | '.' | '_' | '/'));
    label.match_indices(q).any(|(i, _)| sep(label[..i].chars().next_back()) && sep(label[i + q.len()..].chars().next()))
}

/// The files `spec` needs from a repo holding `names` (paths in the repo). A repo with GGUF
/// files is a GGUF repo; otherwise it must be a HF folder (config.json + safetensors).
pub fn select(repo: &str, names: &[&str], selector: Option<&str>) -> Result<Selection> {
    let no_model = |what: String| HubError::NoModel { repo: repo.to_string(), what };
    let all = gguf_groups(names.iter().copied());
    // Vision projectors ride along in many GGUF repos; they are never the language model.
    let models: Vec<&GgufGroup> = all.iter().filter(|g| !g.label.contains("mmproj")).collect();
    let has = |f: &str| names.contains(&f);
    if all.is_empty() {
        if let Some(sel) = selector {
            return Err(no_model(format!("no GGUF files to pick '{sel}' from (a safetensors repo takes no selector)")));
        }
        if !has("config.json") {
            return Err(no_model(format!("neither GGUF files nor config.json + safetensors (files: {})", names.join(", "))));
        }
        let mut files: Vec<String> = ["config.json", "generation_config.json"]
            .into_iter()
            .chain(TOKENIZER_FILES)
            .filter(|f| has(f))
            .map(String::from)
            .collect();
        let index = "model.safetensors.index.json";
        if has(index) {
            return Ok(Selection::Folder { files, index: Some(index.to_string()) });
        }
        if has("model.safetensors") {
            files.push("model.safetensors".to_string());
            return Ok(Selection::Folder { files, index: None });
        }
        return Err(no_model("config.json but neither model.safetensors nor model.safetensors.index.json".to_string()));
    }
    let pick = |g: &GgufGroup| match &g.missing {
        Some(m) => Err(no_model(format!("split GGUF {} lacks {m} on the hub", g.files[0]))),
        None => Ok(Selection::Gguf { files: g.files.clone() }),
    };
    let one_of = |found: Vec<&GgufGroup>, what: &str| -> Result<Option<Selection>> {
        match found.len() {
            0 => Ok(None),
            1 => pick(found[0]).map(Some),
            _ => Err(no_model(format!("{what} matches several GGUF files; pick one by file name: {}", choices(&found)))),
        }
    };
    match selector {
        Some(sel) if sel.to_ascii_lowercase().ends_with(".gguf") => {
            let s = sel.to_ascii_lowercase();
            let by_name =
                |f: &String| f.to_ascii_lowercase() == s || f.rsplit('/').next().is_some_and(|b| b.to_ascii_lowercase() == s);
            let found: Vec<&GgufGroup> = all.iter().filter(|g| g.files.iter().any(by_name)).collect();
            one_of(found, sel)?.ok_or_else(|| no_model(format!("no GGUF file {sel}; choices: {}", choices(&models))))
        }
        Some(sel) => {
            let q = sel.to_ascii_lowercase();
            if let Some(s) = one_of(models.iter().copied().filter(|g| ends_with_quant(&g.label, &q)).collect(), sel)? {
                return Ok(s);
            }
            one_of(models.iter().copied().filter(|g| contains_quant(&g.label, &q)).collect(), sel)?
                .ok_or_else(|| no_model(format!("no GGUF file for '{sel}'; choices: {}", choices(&models))))
        }
        None => {
            for q in DEFAULT_QUANTS {
                if let Some(s) = one_of(models.iter().copied().filter(|g| ends_with_quant(&g.label, q)).collect(), q)? {
                    return Ok(s);
                }
            }
            match models.len() {
                1 => pick(models[0]),
                0 => Err(no_model(format!(
                    "only vision projectors among the GGUF files: {}",
                    choices(&all.iter().collect::<Vec<_>>())
                ))),
                _ => Err(no_model(format!(
                    "no 4-bit GGUF cortiq knows; pick a quant or file with :SELECTOR (choices: {})",
                    choices(&models)
                ))),
            }
        }
    }
}

/// Every shard a `model.safetensors.index.json` names, in first-seen order.
pub fn index_shards(repo: &str, index: &Path) -> Result<Vec<String>> {
    let text = fs::read_to_string(index).map_err(io_err(index))?;
    let bad = |what: &str| HubError::NoModel { repo: repo.to_string(), what: format!("model.safetensors.index.json: {what}") };
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(&format!("invalid JSON: {e}")))?;
    let map = v.get("weight_map").and_then(Value::as_object).ok_or_else(|| bad("no weight_map object"))?;
    let mut shards: Vec<String> = Vec::new();
    for f in map.values() {
        let f = f.as_str().ok_or_else(|| bad("a weight_map value is not a file name"))?;
        if !safe_rel_path(f) {
            return Err(bad(&format!("shard name {f:?} leaves the repo")));
        }
        if !shards.iter().any(|s| s == f) {
            shards.push(f.to_string());
        }
    }
    if shards.is_empty() {
        return Err(bad("weight_map is empty"));
    }
    Ok(shards)
}

/// A relative path with no `..`, no absolute part and no empty component.
fn safe_rel_path(p: &str) -> bool {
    !p.is_empty() && !p.starts_with('/') && !p.contains('\\') && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

// ---------------------------------------------------------------------------------------
// Talking to the hub
// ---------------------------------------------------------------------------------------

struct Client<'a> {
    cfg: &'a HubConfig,
    agent: ureq::Agent,
    repo: &'a str,
}

/// What a failed request was for, to name the right thing in the error.
enum Asked<'a> {
    Listing { revision: &'a str },
    File { file: &'a str, revision: &'a str },
}

impl<'a> Client<'a> {
    fn new(cfg: &'a HubConfig, repo: &'a str) -> Client<'a> {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // The token follows the hub's relative redirects (a renamed repo), never the
            // redirect of an LFS file to its CDN, as in huggingface_hub.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_recv_body(Some(cfg.body_budget))
            .user_agent(concat!("cortiq/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client { cfg, agent, repo }
    }

    fn get(&self, url: &str, range_from: u64) -> std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.cfg.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        if range_from > 0 {
            req = req.header("Range", format!("bytes={range_from}-"));
        }
        req.call()
    }

    /// Transport failures (no route, refused, DNS, timeout) are `Offline`, so the caller can
    /// fall back to the cache; anything else is a plain error.
    fn transport(&self, e: ureq::Error, what: &str) -> HubError {
        HubError::Offline {
            endpoint: self.cfg.endpoint.clone(),
            detail: e.to_string(),
            what: what.to_string(),
            cache: self.cfg.cache.display().to_string(),
        }
    }

    fn status_error(&self, url: &str, resp: &ureq::http::Response<ureq::Body>, asked: Asked) -> HubError {
        let status = resp.status().as_u16();
        let code = resp.headers().get("x-error-code").and_then(|v| v.to_str().ok()).unwrap_or("");
        let repo = self.repo.to_string();
        match (code, status) {
            ("GatedRepo", _) | ("", 401 | 403) => match &self.cfg.token {
                None => HubError::NeedsToken { repo },
                Some(_) => HubError::TokenRefused { repo, token_from: self.cfg.token_from.clone(), status },
            },
            // The hub hides private repos as missing; say what a token would change.
            ("RepoNotFound", _) => HubError::RepoNotFound { repo, endpoint: self.cfg.endpoint.clone() },
            ("RevisionNotFound", _) => HubError::RevisionNotFound {
                repo,
                revision: match asked {
                    Asked::Listing { revision } | Asked::File { revision, .. } => revision.to_string(),
                },
            },
            (_, 404) => match asked {
                Asked::File { file, revision } => {
                    HubError::EntryNotFound { repo, file: file.to_string(), revision: revision.to_string() }
                }
                Asked::Listing { .. } => HubError::RepoNotFound { repo, endpoint: self.cfg.endpoint.clone() },
            },
            _ => HubError::Http {
                url: url.to_string(),
                status,
                detail: if code.is_empty() { String::new() } else { format!(" ({code})") },
            },
        }
    }

    /// The repo at `revision`: its commit and every file with size and blob hash.
    fn listing(&self, spec: &HubSpec) -> Result<Listing> {
        let revision = spec.revision.as_str();
        let url = format!("{}/api/models/{}/revision/{}?blobs=true", self.cfg.endpoint, self.repo, encode(revision));
        let mut resp = self.get(&url, 0).map_err(|e| self.transport(e, &spec.display()))?;
        if !resp.status().is_success() {
            return Err(self.status_error(&url, &resp, Asked::Listing { revision }));
        }
        let proto = |what: String| HubError::Protocol { repo: self.repo.to_string(), what };
        let text =
            resp.body_mut().with_config().limit(64 << 20).read_to_string().map_err(|e| proto(format!("reading {url}: {e}")))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| proto(format!("{url}: invalid JSON: {e}")))?;
        let commit = v
            .get("sha")
            .and_then(Value::as_str)
            .filter(|s| is_commit(s))
            .ok_or_else(|| proto(format!("{url}: no commit 'sha'")))?;
        let siblings = v.get("siblings").and_then(Value::as_array).ok_or_else(|| proto(format!("{url}: no 'siblings'")))?;
        let mut files = Vec::new();
        for s in siblings {
            let name =
                s.get("rfilename").and_then(Value::as_str).ok_or_else(|| proto("a sibling without rfilename".to_string()))?;
            if !safe_rel_path(name) {
                return Err(proto(format!("file name {name:?} leaves the repo")));
            }
            let lfs = s.get("lfs").filter(|l| l.is_object());
            let sha256 = lfs.and_then(|l| l.get("sha256")).and_then(Value::as_str);
            let size = lfs.and_then(|l| l.get("size")).or_else(|| s.get("size")).and_then(Value::as_u64);
            let (blob, is_lfs) = match (sha256, s.get("blobId").and_then(Value::as_str)) {
                (Some(h), _) => (h, true),
                (None, Some(id)) => (id, false),
                (None, None) => return Err(proto(format!("{name}: no blobId or lfs.sha256 (is ?blobs=true supported?)"))),
            };
            let size = size.ok_or_else(|| proto(format!("{name}: no size in the listing")))?;
            if !blob.bytes().all(|b| b.is_ascii_hexdigit()) || blob.len() < 40 {
                return Err(proto(format!("{name}: blob id {blob:?} is not a hash")));
            }
            files.push(RemoteFile { name: name.to_string(), size, blob: blob.to_ascii_lowercase(), lfs: is_lfs });
        }
        Ok(Listing { commit: commit.to_string(), files })
    }

    /// Make `file` present and verified in the snapshot of `commit`; returns its snapshot path.
    fn fetch(&self, commit: &str, file: &RemoteFile) -> Result<PathBuf> {
        let repo_dir = self.cfg.cache.join(repo_folder(self.repo));
        let blobs = repo_dir.join("blobs");
        let blob = blobs.join(&file.blob);
        let pointer = repo_dir.join("snapshots").join(commit).join(&file.name);
        if !blob_ok(&blob, file)? {
            fs::create_dir_all(&blobs).map_err(io_err(&blobs))?;
            let locks = self.cfg.cache.join(".locks").join(repo_folder(self.repo));
            fs::create_dir_all(&locks).map_err(io_err(&locks))?;
            let _lock = FileLock::acquire(&locks.join(format!("{}.lock", file.blob)))?;
            // Another process may have finished it while we waited for the lock.
            if !blob_ok(&blob, file)? {
                self.download(commit, file, &blob)?;
            }
        }
        link(&blob, &pointer, &file.name)?;
        Ok(pointer)
    }

    /// Download into `<blob>.incomplete`, resuming what is there, verify, rename to `blob`.
    fn download(&self, commit: &str, file: &RemoteFile, blob: &Path) -> Result<()> {
        let url = format!("{}/{}/resolve/{}/{}", self.cfg.endpoint, self.repo, commit, encode_path(&file.name));
        let part = blob.with_file_name(format!("{}.incomplete", file.blob));
        let bad = |what: String| HubError::BadDownload { repo: self.repo.to_string(), file: file.name.clone(), what };
        let mut out =
            OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&part).map_err(io_err(&part))?;
        let mut have = out.metadata().map_err(io_err(&part))?.len();
        if have > file.size {
            out.set_len(0).map_err(io_err(&part))?;
            have = 0;
        }
        let resumed_earlier = have > 0;
        let bar = progress_bar(file.size, &file.name);
        // Requests in a row that brought no bytes; the last failure, in words.
        let mut stalled = 0;
        let mut last_error = String::new();
        while have < file.size {
            if !last_error.is_empty() {
                if stalled >= MAX_ATTEMPTS {
                    bar.finish_and_clear();
                    let at = format!("byte {have} of {}", file.size);
                    return Err(bad(format!("gave up after {MAX_ATTEMPTS} attempts without progress at {at}: {last_error}")));
                }
                tracing::warn!(file = %file.name, at = have, "download interrupted ({last_error}), resuming");
                std::thread::sleep(Duration::from_millis(200 << stalled.min(4)));
            }
            let start = have;
            let resp = match self.get(&url, have) {
                Ok(r) => r,
                Err(e) if stalled + 1 < MAX_ATTEMPTS => {
                    stalled += 1;
                    last_error = e.to_string();
                    continue;
                }
                Err(e) => {
                    bar.finish_and_clear();
                    return Err(self.transport(e, &format!("{} from hf:{}", file.name, self.repo)));
                }
            };
            let status = resp.status().as_u16();
            match status {
                206 => {}
                // The server ignored the Range: start over.
                200 => have = 0,
                500..=599 => {
                    stalled += 1;
                    last_error = format!("HTTP {status}");
                    continue;
                }
                _ => {
                    bar.finish_and_clear();
                    return Err(self.status_error(&url, &resp, Asked::File { file: &file.name, revision: commit }));
                }
            }
            out.set_len(have).map_err(io_err(&part))?;
            out.seek(SeekFrom::Start(have)).map_err(io_err(&part))?;
            bar.set_position(have);
            let mut body = resp.into_body().into_reader();
            let mut buf = vec![0u8; 1 << 20];
            // The body's small reads go out in writes ending on 4 MiB boundaries: the page
            // cache then keeps the new file in 2 MiB pages, which the first load maps as such
            // (a file written in small pieces stays cached in 4 KiB pages, which decode reads
            // more slowly: `cortiq_formats::PageShare`).
            let mut w = cortiq_formats::ChunkWriter::new(&mut out, have, cortiq_formats::WRITE_CHUNK);
            last_error.clear();
            loop {
                match body.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if have + n as u64 > file.size {
                            bar.finish_and_clear();
                            let _ = fs::remove_file(&part);
                            return Err(bad(format!("the server sent more than the {} bytes the listing gives", file.size)));
                        }
                        w.write_all(&buf[..n]).map_err(io_err(&part))?;
                        have += n as u64;
                        bar.set_position(have);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        last_error = e.to_string();
                        break;
                    }
                }
            }
            w.flush().map_err(io_err(&part))?;
            drop(w);
            if have < file.size && last_error.is_empty() {
                last_error = "connection closed early".to_string();
            }
            stalled = if have > start { 0 } else { stalled + 1 };
        }
        bar.finish_and_clear();
        out.sync_all().map_err(io_err(&part))?;
        drop(out);
        // Hash the whole file from disk: a resumed prefix written by an earlier run (or by
        // Python) is checked as strictly as the bytes that just arrived.
        if let Err(what) = verify(&part, file) {
            let _ = fs::remove_file(&part);
            if resumed_earlier {
                // The partial file left by an earlier run was not a prefix of this file (an
                // interrupted write, another tool): once more, from the first byte.
                tracing::warn!(file = %file.name, "resumed download fails its check ({what}), downloading it whole");
                return self.download(commit, file, blob);
            }
            return Err(bad(format!("{what}; the download was discarded")));
        }
        fs::rename(&part, blob).map_err(io_err(blob))?;
        tracing::info!(file = %file.name, bytes = file.size, "downloaded and verified");
        Ok(())
    }
}

fn progress_bar(size: u64, name: &str) -> ProgressBar {
    let bar = crate::pull::download_bar(size);
    bar.set_message(format!("downloading {name}"));
    bar
}

/// The blob is in the cache with the listed size and hash. It may have been written by
/// another tool (not every version of huggingface_hub checks what it downloads), so it is
/// hashed here; this runs once per spec, as the record written after the pull makes the next
/// run skip it. A blob that fails is removed (it is the cache's, and only a refetch can mend
/// it), never used.
fn blob_ok(blob: &Path, file: &RemoteFile) -> Result<bool> {
    if !fs::metadata(blob).is_ok_and(|m| m.is_file()) {
        return Ok(false);
    }
    match verify(blob, file) {
        Ok(()) => Ok(true),
        Err(what) => {
            tracing::warn!(path = %blob.display(), "cached blob fails its check ({what}), fetching it again");
            fs::remove_file(blob).map_err(io_err(blob))?;
            Ok(false)
        }
    }
}

/// Size and hash of `path` against the listing; the mismatch, in words, if any.
fn verify(path: &Path, file: &RemoteFile) -> std::result::Result<(), String> {
    // git's blob id is a sha1 over "blob <len>\0" and the bytes; LFS objects are named by
    // their sha256.
    let mut sha256 = Sha256::new();
    let mut sha1 = Sha1::new();
    if !file.lfs {
        sha1.update(format!("blob {}\0", file.size).as_bytes());
    }
    let mut src = File::open(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n_total = 0u64;
    loop {
        let n = src.read(&mut buf).map_err(|e| format!("reading {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        n_total += n as u64;
        if file.lfs { sha256.update(&buf[..n]) } else { sha1.update(&buf[..n]) }
    }
    if n_total != file.size {
        return Err(format!("size mismatch, expected {} bytes, got {n_total}", file.size));
    }
    let (what, got) = if file.lfs {
        ("sha256", crate::pull::hex(&sha256.finalize()))
    } else {
        ("git blob id", crate::pull::hex(&sha1.finalize()))
    };
    if got != file.blob {
        return Err(format!("{what} mismatch, expected {}, got {got}", file.blob));
    }
    Ok(())
}

/// Point `pointer` at `blob` with a relative symlink, as huggingface_hub does (replacing a
/// stale link atomically; where symlinks are impossible, a copy).
fn link(blob: &Path, pointer: &Path, name: &str) -> Result<()> {
    let dir = pointer.parent().expect("a snapshot path has a parent");
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let depth = name.matches('/').count() + 2;
    let target = PathBuf::from("../".repeat(depth)).join("blobs").join(blob.file_name().expect("blob name"));
    if fs::read_link(pointer).is_ok_and(|t| t == target) {
        return Ok(());
    }
    let tmp =
        dir.join(format!(".{}.cortiq-link-{}", pointer.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    let _ = fs::remove_file(&tmp);
    #[cfg(unix)]
    let made = std::os::unix::fs::symlink(&target, &tmp);
    #[cfg(not(unix))]
    let made = fs::copy(blob, &tmp).map(|_| ());
    made.map_err(io_err(&tmp))?;
    fs::rename(&tmp, pointer).map_err(io_err(pointer))
}

/// An exclusive advisory lock on a file in `.locks/`, released on drop (the same lock files
/// huggingface_hub takes, so a Python download and ours never write one blob together).
struct FileLock(#[allow(dead_code)] File);

impl FileLock {
    fn acquire(path: &Path) -> Result<FileLock> {
        let f = OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(io_err(path))?;
        f.lock().map_err(io_err(path))?;
        Ok(FileLock(f))
    }
}

fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Percent-encode a revision as one path segment (`refs/pr/1` -> `refs%2Fpr%2F1`).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Percent-encode a file path, keeping its slashes.
fn encode_path(s: &str) -> String {
    s.split('/').map(encode).collect::<Vec<_>>().join("/")
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().expect("a file path has a parent");
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let tmp = dir.join(format!(".{}.tmp-{}", path.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))
}

// ---------------------------------------------------------------------------------------
// Pull: cache first, then the hub
// ---------------------------------------------------------------------------------------

/// What a resolved spec came to, kept in `<cortiq cache>/hub/` for the next run.
struct Record {
    path: PathBuf,
    /// The hub cache it refers to; a record for another `HF_HOME` is ignored.
    cache: PathBuf,
    commit: String,
    /// The path to load, relative to the snapshot (empty: the snapshot folder itself).
    entry: String,
    /// Every file with its size.
    files: Vec<(String, u64)>,
}

impl Record {
    fn path_for(cfg: &HubConfig, spec: &HubSpec) -> PathBuf {
        let sel = spec.selector.as_deref().unwrap_or("default");
        let key: String = format!("{}@{sel}", spec.revision)
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@') { c } else { '_' })
            .collect();
        cfg.records.join(repo_folder(&spec.repo)).join(format!("{key}.json"))
    }

    fn load(cfg: &HubConfig, spec: &HubSpec) -> Option<Record> {
        let path = Record::path_for(cfg, spec);
        let v: Value = serde_json::from_str(&fs::read_to_string(&path).ok()?).ok()?;
        let files = v["files"]
            .as_array()?
            .iter()
            .map(|f| Some((f["name"].as_str()?.to_string(), f["size"].as_u64()?)))
            .collect::<Option<_>>()?;
        Some(Record {
            path,
            cache: PathBuf::from(v["cache"].as_str()?),
            commit: v["commit"].as_str()?.to_string(),
            entry: v["entry"].as_str()?.to_string(),
            files,
        })
    }

    fn save(&self) -> Result<()> {
        let files: Vec<Value> = self.files.iter().map(|(n, s)| json!({"name": n, "size": s})).collect();
        let v = json!({"cache": self.cache, "commit": self.commit, "entry": self.entry, "files": files});
        write_atomic(&self.path, serde_json::to_string_pretty(&v).unwrap_or_default().as_bytes())
    }

    fn snapshot(&self, spec: &HubSpec) -> PathBuf {
        self.cache.join(repo_folder(&spec.repo)).join("snapshots").join(&self.commit)
    }

    /// The model path if every file is still in the snapshot with its size.
    fn usable(&self, cfg: &HubConfig, spec: &HubSpec) -> Option<PathBuf> {
        if self.cache != cfg.cache {
            return None;
        }
        let snap = self.snapshot(spec);
        let all = self.files.iter().all(|(n, size)| fs::metadata(snap.join(n)).is_ok_and(|m| m.len() == *size));
        all.then(|| if self.entry.is_empty() { snap } else { snap.join(&self.entry) })
    }
}

/// The model `spec` names, as a local path: a GGUF file (the first part of a split one) or a
/// HF folder, inside the hub cache. Served from the cache without a request when a previous
/// pull resolved the same spec; otherwise listed on the hub, downloaded where missing and
/// verified. With no network (or `HF_HUB_OFFLINE`), a complete snapshot already in the cache
/// is used as it is, e.g. one that Python's huggingface_hub downloaded.
pub fn pull(cfg: &HubConfig, spec: &HubSpec) -> Result<PathBuf> {
    pull_with(cfg, spec, false)
}

/// `pull`, but asking the hub what the revision is now even when the spec was resolved
/// before (`cortiq pull --refresh`): a branch that moved is followed, files already in the
/// cache are not fetched again.
pub fn refresh(cfg: &HubConfig, spec: &HubSpec) -> Result<PathBuf> {
    pull_with(cfg, spec, true)
}

fn pull_with(cfg: &HubConfig, spec: &HubSpec, refresh: bool) -> Result<PathBuf> {
    if (!refresh || cfg.offline)
        && let Some(path) = Record::load(cfg, spec).and_then(|r| r.usable(cfg, spec))
    {
        tracing::debug!(path = %path.display(), "hub model from the cache");
        return Ok(path);
    }
    if cfg.offline {
        return from_snapshot(cfg, spec)
            .ok_or_else(|| HubError::OfflineNotCached { what: spec.display(), cache: cfg.cache.display().to_string() });
    }
    let client = Client::new(cfg, &spec.repo);
    let listing = match client.listing(spec) {
        Ok(l) => l,
        Err(e @ HubError::Offline { .. }) => {
            return match from_snapshot(cfg, spec) {
                Some(p) => {
                    tracing::warn!("{e}; using the cached snapshot");
                    Ok(p)
                }
                None => Err(e),
            };
        }
        Err(e) => return Err(e),
    };
    let by_name: BTreeMap<&str, &RemoteFile> = listing.files.iter().map(|f| (f.name.as_str(), f)).collect();
    let names: Vec<&str> = by_name.keys().copied().collect();
    let selection = select(&spec.repo, &names, spec.selector.as_deref())?;
    let get = |name: &str| -> Result<PathBuf> {
        let f = by_name.get(name).ok_or_else(|| HubError::EntryNotFound {
            repo: spec.repo.clone(),
            file: name.to_string(),
            revision: spec.revision.clone(),
        })?;
        client.fetch(&listing.commit, f)
    };
    let (wanted, entry) = match &selection {
        Selection::Gguf { files } => (files.clone(), files[0].clone()),
        Selection::Folder { files, index } => {
            let mut all = files.clone();
            if let Some(index) = index {
                let shards = index_shards(&spec.repo, &get(index)?)?;
                all.push(index.clone());
                all.extend(shards);
            }
            (all, String::new())
        }
    };
    let mut files = Vec::new();
    for name in &wanted {
        get(name)?;
        files.push((name.clone(), by_name[name.as_str()].size));
    }
    let snap = cfg.cache.join(repo_folder(&spec.repo)).join("snapshots").join(&listing.commit);
    if spec.revision != listing.commit {
        let refs = cfg.cache.join(repo_folder(&spec.repo)).join("refs").join(&spec.revision);
        write_atomic(&refs, listing.commit.as_bytes())?;
    }
    let record = Record {
        path: Record::path_for(cfg, spec),
        cache: cfg.cache.clone(),
        commit: listing.commit,
        entry: entry.clone(),
        files,
    };
    if let Err(e) = record.save() {
        // Only the next run's shortcut is lost.
        tracing::warn!("{e}");
    }
    Ok(if entry.is_empty() { snap } else { snap.join(entry) })
}

/// The model from a snapshot already in the cache, without the network: the revision's
/// commit from `refs/`, the files as they lie, the same selection as online. Files are
/// checked by size and, where the blob is named by its sha256, by hash (once: the result is
/// recorded).
fn from_snapshot(cfg: &HubConfig, spec: &HubSpec) -> Option<PathBuf> {
    let repo_dir = cfg.cache.join(repo_folder(&spec.repo));
    let commit = if is_commit(&spec.revision) {
        spec.revision.clone()
    } else {
        fs::read_to_string(repo_dir.join("refs").join(&spec.revision)).ok()?.trim().to_string()
    };
    let snap = repo_dir.join("snapshots").join(&commit);
    let mut names = Vec::new();
    walk(&snap, "", &mut names);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let selection = select(&spec.repo, &refs, spec.selector.as_deref()).ok()?;
    let (wanted, entry) = match selection {
        Selection::Gguf { files } => {
            let e = files[0].clone();
            (files, e)
        }
        Selection::Folder { mut files, index } => {
            if let Some(index) = index {
                files.extend(index_shards(&spec.repo, &snap.join(&index)).ok()?);
                files.push(index);
            }
            (files, String::new())
        }
    };
    let mut files = Vec::new();
    for name in wanted {
        let path = snap.join(&name);
        let size = fs::metadata(&path).ok()?.len();
        // Blobs are named by their hash (sha256 for LFS, the git blob id otherwise): checked.
        if let Ok(target) = fs::read_link(&path)
            && let Some(blob) = target.file_name().and_then(|b| b.to_str())
            && matches!(blob.len(), 40 | 64)
            && blob.bytes().all(|b| b.is_ascii_hexdigit())
        {
            let f = RemoteFile { name: name.clone(), size, blob: blob.to_string(), lfs: blob.len() == 64 };
            if let Err(what) = verify(&path, &f) {
                tracing::warn!(file = %name, "cached file fails its check: {what}");
                return None;
            }
        }
        files.push((name, size));
    }
    let record = Record { path: Record::path_for(cfg, spec), cache: cfg.cache.clone(), commit, entry: entry.clone(), files };
    let _ = record.save();
    Some(if entry.is_empty() { snap } else { snap.join(entry) })
}

/// Every file under `dir`, as paths relative to it.
fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
        let path = e.path();
        if path.is_dir() {
            walk(&path, &rel, out);
        } else if path.is_file() {
            out.push(rel);
        }
    }
}

// ---------------------------------------------------------------------------------------
// `cortiq pull --list`
// ---------------------------------------------------------------------------------------

/// One model found in the hub cache.
#[derive(Clone, Debug)]
pub struct CachedModel {
    /// How to name it: `hf:ORG/REPO:FILE.gguf`, or `hf:ORG/REPO` for a HF folder.
    pub spec: String,
    /// Bytes of the files it uses.
    pub bytes: u64,
    /// Revisions (refs) pointing at its commit.
    pub revisions: Vec<String>,
    /// What to load: the (first) GGUF file, or the HF folder (the snapshot).
    pub path: PathBuf,
}

/// The GGUF files and HF folders in the hub cache, whoever downloaded them.
pub fn cached_models(cfg: &HubConfig) -> Vec<CachedModel> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(&cfg.cache) else { return out };
    let mut repos: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("models--")))
        .collect();
    repos.sort();
    for repo_dir in repos {
        let folder = repo_dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let repo = folder.trim_start_matches("models--").replace("--", "/");
        let mut refs = Vec::new();
        walk(&repo_dir.join("refs"), "", &mut refs);
        let Ok(snaps) = fs::read_dir(repo_dir.join("snapshots")) else { continue };
        for snap in snaps.flatten() {
            let commit = snap.file_name().to_string_lossy().into_owned();
            let revisions: Vec<String> = refs
                .iter()
                .filter(|r| fs::read_to_string(repo_dir.join("refs").join(r)).is_ok_and(|c| c.trim() == commit))
                .cloned()
                .collect();
            let at = match revisions.iter().any(|r| r == "main") {
                true => String::new(),
                false => format!("@{}", revisions.first().cloned().unwrap_or(commit.clone())),
            };
            let mut names = Vec::new();
            walk(&snap.path(), "", &mut names);
            let size = |n: &str| fs::metadata(snap.path().join(n)).map(|m| m.len()).unwrap_or(0);
            for g in gguf_groups(names.iter().map(String::as_str)) {
                let bytes = g.files.iter().map(|f| size(f)).sum();
                out.push(CachedModel {
                    spec: format!("hf:{repo}{at}:{}", g.files[0].rsplit('/').next().unwrap_or(&g.files[0])),
                    bytes,
                    revisions: revisions.clone(),
                    path: snap.path().join(&g.files[0]),
                });
            }
            if names.iter().any(|n| n == "config.json") && names.iter().any(|n| n.ends_with(".safetensors")) {
                let bytes = names.iter().map(|n| size(n)).sum();
                out.push(CachedModel { spec: format!("hf:{repo}{at}"), bytes, revisions, path: snap.path() });
            }
        }
    }
    out
}
