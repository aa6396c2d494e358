//! Test support for the tokenizer tests: source packages fetched from PyPI into the user cache
//! (`cortiq_testkit::cache_dir`, the one `cortiq pull` uses) once, verified by sha256, with only
//! the needed files extracted.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

pub fn sha256_file(p: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A PyPI source package: file name, download URL, sha256 and `pip download` requirement.
pub struct Sdist {
    pub file: &'static str,
    pub url: &'static str,
    pub sha256: &'static str,
    pub requirement: &'static str,
}

/// Serializes fetching and extraction among the tests of one process (they share temp names);
/// across processes every step writes a private temp name and renames it into place.
static LOCK: Mutex<()> = Mutex::new(());

/// The package file in `<cache>/testdata`, downloaded (curl, else pip) and verified if needed.
pub fn fetch(s: &Sdist) -> Result<PathBuf, String> {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    fetch_locked(s)
}

fn fetch_locked(s: &Sdist) -> Result<PathBuf, String> {
    let dir = cortiq_testkit::cache_dir().join("testdata");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(s.file);
    if !path.exists() {
        let tmp = dir.join(format!("{}.part{}", s.file, std::process::id()));
        let curl = Command::new("curl").args(["-fsSL", "--retry", "3", "-o"]).arg(&tmp).arg(s.url).status();
        if matches!(curl, Ok(st) if st.success()) {
            std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        } else {
            let _ = std::fs::remove_file(&tmp);
            // Fall back to pip, which knows this machine's index configuration.
            let pip = Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "--no-binary", ":all:", s.requirement, "-d"])
                .arg(&dir)
                .status();
            if !matches!(pip, Ok(st) if st.success()) || !path.exists() {
                return Err(format!("could not download {} (curl and pip both failed)", s.url));
            }
        }
    }
    let sum = sha256_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if sum != s.sha256 {
        let _ = std::fs::remove_file(&path);
        return Err(format!("{}: sha256 {sum}, expected {} (removed; rerun to refetch)", path.display(), s.sha256));
    }
    Ok(path)
}

/// Extract the members under `prefix` matching `pattern` (a tar wildcard relative to the prefix)
/// into `<cache>/testdata/<name>/`, once; returns that folder.
pub fn extract(s: &Sdist, prefix: &str, pattern: &str, name: &str) -> Result<PathBuf, String> {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let root = cortiq_testkit::cache_dir().join("testdata");
    let out = root.join(name);
    if out.join(".complete").exists() {
        return Ok(out);
    }
    let tgz = fetch_locked(s)?;
    let tmp = root.join(format!("extract.{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let st = Command::new("tar")
        .arg("xzf")
        .arg(&tgz)
        .arg("-C")
        .arg(&tmp)
        .arg("--wildcards")
        .arg(format!("{prefix}{pattern}"))
        .status()
        .map_err(|e| format!("tar: {e}"))?;
    if !st.success() {
        return Err(format!("tar failed extracting {prefix}{pattern} from {}", tgz.display()));
    }
    if out.join(".complete").exists() {
        // Another process finished first.
        let _ = std::fs::remove_dir_all(&tmp);
        return Ok(out);
    }
    let _ = std::fs::remove_dir_all(&out);
    std::fs::rename(tmp.join(prefix), &out).map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::write(out.join(".complete"), s.sha256).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out)
}

/// llama-cpp-python 0.3.36, which vendors llama.cpp (its ggml-vocab test files).
pub const LLAMA_CPP_PYTHON: Sdist = Sdist {
    file: "llama_cpp_python-0.3.36.tar.gz",
    url: "https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz",
    sha256: "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    requirement: "llama-cpp-python==0.3.36",
};

/// Ids as the fixtures hash them: sha256 of the decimal ids joined by single spaces.
pub fn ids_digest(ids: &[u32]) -> String {
    let s = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(" ");
    Sha256::digest(s.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}
