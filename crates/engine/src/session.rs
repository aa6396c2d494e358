//! Session files: a prompt-cache entry (a token sequence, its state and its checkpoints) on
//! disk, so that a conversation survives a restart (`cortiq run --prompt-cache FILE`, the
//! server's `POST /slots/{id}?action=save|restore`). Written atomically (a temporary file
//! beside the target, then a rename); read back only into the model that wrote it, with the
//! same numerics and KV format (the state's values are that model's), and a truncated,
//! corrupted, foreign or other-version file is refused with an error naming which.
//!
//! Layout (little-endian), version 2 (version 1 is the same but for an 8-bit cache's keys, stored
//! without the per-channel scales of `attention::KeyForm`: it is read for f32 and f16 caches. A
//! version-1 file saved under the fast numerics' old f32 default restores with `--kv-type f32`;
//! the identity check refuses it under today's f16 default, naming the KV format):
//!
//! ```text
//! "CORTIQSS"  u32 version  u64 model identity  u64 n_layers
//! u64 n_tokens  u32 × n_tokens
//! u64 len  layer states (each mixer's `MixerState::save`)
//! u64 n_checkpoints  { u64 len  per layer: u8 snapshot? + its state }
//! u64 FNV-1a of every byte before
//! ```
//!
//! By hand rather than through a serialization crate: the body is a few length-prefixed f32 /
//! f16 arrays per layer, written and read in place of copies, and the checks (sizes against
//! the loading model's own fresh state) belong to the state types.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use crate::codec::{get_u64, put_u64};
use crate::model::Model;
use crate::numerics::Numerics;
use crate::state::{Checkpoint, KvType, SeqState};

const MAGIC: &[u8; 8] = b"CORTIQSS";
pub const VERSION: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{0}: not a cortiq session file")]
    NotASession(String),
    #[error(
        "{path}: session format version {found}; this build reads version {VERSION} (and version 1 for f32 and f16 caches: an 8-bit cache's keys are stored differently since)"
    )]
    Version { path: String, found: u32 },
    #[error("{0}: saved by another model (or other numerics / KV format); a session restores only into the model that saved it")]
    OtherModel(String),
    #[error("{0}: truncated or corrupted (checksum mismatch)")]
    Corrupt(String),
    #[error("{path}: {what}")]
    Bad { path: String, what: String },
    #[error("this state cannot be saved: {0}")]
    Unsaveable(String),
}

/// A session's content: the tokens, the state after them, the checkpoints before.
pub struct Session {
    pub tokens: Vec<u32>,
    pub state: SeqState,
    pub checkpoints: Vec<Arc<Checkpoint>>,
}

/// A hash of what makes a state's values: the architecture and geometry, the numerics and KV
/// format, the norms, and every matrix's type, shape, first and last rows.
pub fn model_identity(model: &Model) -> u64 {
    let mut h = Fnv::new();
    h.add(format!("{:?}", model.cfg).as_bytes());
    h.add(&[model.numerics as u8, model.kv_type as u8]);
    h.add(&model.tok_embd.sample());
    h.add(&model.output.sample());
    for l in &model.layers {
        for v in [&l.attn_norm, &l.ffn_norm] {
            v.iter().for_each(|x| h.add(&x.to_le_bytes()));
        }
        l.matrices().iter().for_each(|m| h.add(&m.sample()));
    }
    h.0
}

/// Write `tokens`, `state` and `checkpoints` to `path` for `model`, atomically.
pub fn save(
    path: &Path,
    model: &Model,
    tokens: &[u32],
    state: &SeqState,
    checkpoints: &[Arc<Checkpoint>],
) -> Result<(), SessionError> {
    write_file(path, &encode(model, tokens, state, checkpoints)?)
}

/// A session file's bytes (memory only: the server makes them on the engine thread and writes
/// them from another, `write_file`).
pub fn encode(model: &Model, tokens: &[u32], state: &SeqState, checkpoints: &[Arc<Checkpoint>]) -> Result<Vec<u8>, SessionError> {
    let mut out = Vec::with_capacity(state.bytes() + 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&model_identity(model).to_le_bytes());
    put_u64(&mut out, state.layers.len() as u64);
    put_u64(&mut out, tokens.len() as u64);
    tokens.iter().for_each(|t| out.extend_from_slice(&t.to_le_bytes()));
    state.save(&mut out).map_err(SessionError::Unsaveable)?;
    put_u64(&mut out, checkpoints.len() as u64);
    for c in checkpoints {
        c.save(&mut out).map_err(SessionError::Unsaveable)?;
    }
    let sum = Fnv::of(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// Write a session's bytes to `path` atomically: a fresh temp name beside it, then a rename.
pub fn write_file(path: &Path, out: &[u8]) -> Result<(), SessionError> {
    let io = |source| SessionError::Io { path: path.display().to_string(), source };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // A fresh name nobody could have planted: created exclusively (an existing file or a
    // symlink there is an error, never followed), readable by the owner only.
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let tmp = dir.join(format!(".{name}.tmp{}-{nonce:x}", std::process::id()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let written = opts.open(&tmp).and_then(|mut f| {
        f.write_all(out)?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|_| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    Ok(())
}

/// Read a session `save` wrote for this model, its state sized for `n_ctx` positions. A file
/// larger than `max_bytes` (what the prompt cache could hold) is refused before it is read, and
/// a symlink is not followed.
pub fn load(path: &Path, model: &Model, n_ctx: usize, max_bytes: u64) -> Result<Session, SessionError> {
    let bytes = read_file(path, max_bytes)?;
    decode(&path.display().to_string(), &bytes, model, n_ctx)
}

/// A session file's bytes, refused past `max_bytes` before it is read, a symlink not followed
/// (I/O only: the server reads off the engine thread, then `decode`s on it).
pub fn read_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, SessionError> {
    let p = path.display().to_string();
    let io = |source| SessionError::Io { path: p.clone(), source };
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts, libc::O_NOFOLLOW);
    let mut f = opts.open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    if len > max_bytes {
        return Err(SessionError::Bad { path: p, what: format!("{len} bytes, more than the prompt cache holds ({max_bytes})") });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // `take`: a file that grows after the size check still stops at the cap.
    std::io::Read::read_to_end(&mut std::io::Read::take(&mut f, max_bytes.saturating_add(1)), &mut bytes).map_err(io)?;
    if bytes.len() as u64 > max_bytes {
        return Err(SessionError::Bad { path: p, what: format!("more than the prompt cache holds ({max_bytes} bytes)") });
    }
    Ok(bytes)
}

/// A session's bytes (`path` names them in errors) read for this model, its state sized for
/// `n_ctx` positions.
pub fn decode(path: &str, bytes: &[u8], model: &Model, n_ctx: usize) -> Result<Session, SessionError> {
    let p = path.to_string();
    if model.numerics == Numerics::LlamaCpp {
        let what = "sessions are not restored under llama.cpp numerics (the prompt cache is off there)".into();
        return Err(SessionError::Bad { path: p, what });
    }
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        return Err(SessionError::NotASession(p));
    }
    if bytes.len() < 12 + 8 + 8 {
        return Err(SessionError::Corrupt(p));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != VERSION && !(version == 1 && model.kv_type != KvType::Q8) {
        return Err(SessionError::Version { path: p, found: version });
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if Fnv::of(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err(SessionError::Corrupt(p));
    }
    let mut r = &body[12..];
    let bad = |what: String| SessionError::Bad { path: p.clone(), what };
    if get_u64(&mut r).map_err(bad)? != model_identity(model) {
        return Err(SessionError::OtherModel(p));
    }
    let n_layers = get_u64(&mut r).map_err(bad)?;
    if n_layers != model.layers.len() as u64 {
        return Err(bad(format!("{n_layers} layers; the model has {}", model.layers.len())));
    }
    let n = get_u64(&mut r).map_err(bad)? as usize;
    if n > r.len() / 4 || n >= n_ctx {
        return Err(bad(format!("{n} tokens do not fit (the context is {n_ctx})")));
    }
    let tokens: Vec<u32> = r[..4 * n].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
    r = &r[4 * n..];
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= model.cfg.vocab) {
        return Err(bad(format!("token {t} is outside the vocabulary ({})", model.cfg.vocab)));
    }
    let mut state = model.new_state(n_ctx);
    state.load(&mut r).map_err(bad)?;
    if state.len != n {
        return Err(bad(format!("the state holds {} positions for {n} tokens", state.len)));
    }
    let n_cp = get_u64(&mut r).map_err(bad)? as usize;
    let mut checkpoints = Vec::new();
    for _ in 0..n_cp.min(n + 1) {
        checkpoints.push(Arc::new(Checkpoint::load(&mut r, &state).map_err(bad)?));
    }
    if checkpoints.len() != n_cp || !r.is_empty() {
        return Err(bad("trailing or missing checkpoint data".into()));
    }
    if checkpoints.windows(2).any(|w| w[0].len() >= w[1].len()) || checkpoints.last().is_some_and(|c| c.len() >= n) {
        return Err(bad("checkpoints out of order".into()));
    }
    Ok(Session { tokens, state, checkpoints })
}

/// 64-bit FNV-1a over words: the file's checksum and the model identity's hash (not cryptographic: it
/// catches truncation and corruption, and tells models apart).
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    /// Eight bytes a step (the body is hundreds of megabytes), the tail byte by byte: every
    /// step is a bijection of the running hash, so any single changed word changes the result.
    fn add(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.0 = (self.0 ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(0x100_0000_01b3);
        }
        for &b in words.remainder() {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn of(bytes: &[u8]) -> u64 {
        let mut h = Fnv::new();
        h.add(bytes);
        h.0
    }
}
