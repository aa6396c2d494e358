//! `hf:ORG/REPO[:QUANT]` against a local hub: a small HTTP/1.1 server on a loopback port,
//! started by each test, that answers the routes the client uses (the revision listing with
//! `?blobs=true`, `resolve/` with the LFS redirect to a CDN route, Range requests, the
//! `X-Error-Code` errors) from repos assembled out of the committed engine fixtures:
//!
//! - `tiny/llama-GGUF`: `llama-tiny-Q4_K_M.gguf` (the llama fixture), `llama-tiny-Q8_0.gguf`
//!   (the qwen2 fixture), the llama fixture split in two llama.cpp-style parts
//!   (`llama-tiny-F16-0000k-of-00002.gguf`, written here by `split_gguf`), a vision projector
//!   and a README that a model pull must not fetch;
//! - `tiny/qwen2-HF`: the qwen2 fixture's config, generation config, index and two shards, a
//!   byte-level tokenizer.json, and files a pull must not fetch (a .bin, a subfolder, README);
//! - `tiny/broken-HF`: an index naming a shard the repo lacks;
//! - `tiny/gated`: the llama GGUF behind a token (401 `GatedRepo` without it).
//!
//! The server counts requests and can drop a connection mid-file once, or serve a file with
//! one byte flipped. Nothing leaves the loopback interface.

mod common;

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use common::{TempDir, byte_tokenizer_json, fixture};
use cortiq_cli::hub::{self, HubConfig, HubError, HubSpec, Selection};
use cortiq_formats::gguf::{Gguf, MetaValue};
use serde_json::{Value, json};
use sha1::Sha1;
use sha2::{Digest, Sha256};

const TOKEN: &str = "hf_test_token";

// ---------------------------------------------------------------------------------------
// The fixture repos
// ---------------------------------------------------------------------------------------

struct RepoFile {
    name: String,
    bytes: Vec<u8>,
    lfs: bool,
}

struct Repo {
    id: String,
    commit: String,
    files: Vec<RepoFile>,
    gated: bool,
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

/// git's blob id: what the hub lists (and sends as ETag) for a file not in LFS.
fn git_blob_id(b: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", b.len()).as_bytes());
    h.update(b);
    hex(&h.finalize())
}

impl RepoFile {
    fn new(name: &str, bytes: Vec<u8>) -> RepoFile {
        // As on the hub: weights go through LFS, small text files are plain git blobs.
        let lfs = name.ends_with(".gguf") || name.ends_with(".safetensors") || name.ends_with(".bin");
        RepoFile { name: name.to_string(), bytes, lfs }
    }
    fn blob(&self) -> String {
        if self.lfs { sha256(&self.bytes) } else { git_blob_id(&self.bytes) }
    }
}

fn read(p: PathBuf) -> Vec<u8> {
    fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Write one GGUF value (type id, then payload) as the GGUF v3 spec lays it out.
fn put_value(out: &mut Vec<u8>, v: &MetaValue, with_type: bool) {
    let ty: u32 = match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::Str(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    };
    if with_type {
        out.extend(ty.to_le_bytes());
    }
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend(x.to_le_bytes()),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::Str(s) => {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }
        MetaValue::Array(items) => {
            let mut elem = Vec::new();
            put_value(&mut elem, items.first().unwrap_or(&MetaValue::U8(0)), true);
            out.extend(&elem[..4]);
            out.extend((items.len() as u64).to_le_bytes());
            for it in items {
                put_value(out, it, false);
            }
        }
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

/// Split a GGUF into `n` parts the way llama.cpp's gguf-split does: every part a GGUF with
/// `split.no` / `split.count` / `split.tensors.count`, all other metadata in the first part
/// only, the tensors dealt out in order, each part's data aligned as the file says.
fn split_gguf(path: &Path, n: usize) -> Vec<Vec<u8>> {
    let g = Gguf::open(path).expect("open fixture gguf");
    let align = g.alignment as usize;
    let per = g.tensors.len().div_ceil(n);
    (0..n)
        .map(|k| {
            let tensors = &g.tensors[(k * per).min(g.tensors.len())..((k + 1) * per).min(g.tensors.len())];
            let mut kv: Vec<(String, MetaValue)> = vec![
                ("split.no".into(), MetaValue::U16(k as u16)),
                ("split.count".into(), MetaValue::U16(n as u16)),
                ("split.tensors.count".into(), MetaValue::I32(g.tensors.len() as i32)),
            ];
            if k == 0 {
                kv.extend(g.metadata.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            let mut out = b"GGUF".to_vec();
            out.extend(3u32.to_le_bytes());
            out.extend((tensors.len() as u64).to_le_bytes());
            out.extend((kv.len() as u64).to_le_bytes());
            for (key, v) in &kv {
                put_value(&mut out, &MetaValue::Str(key.clone()), false);
                put_value(&mut out, v, true);
            }
            let mut offset = 0usize;
            let mut offsets = Vec::new();
            for t in tensors {
                put_value(&mut out, &MetaValue::Str(t.name.clone()), false);
                out.extend((t.dims.len() as u32).to_le_bytes());
                for d in &t.dims {
                    out.extend(d.to_le_bytes());
                }
                out.extend(t.dtype.ggml_id().to_le_bytes());
                out.extend((offset as u64).to_le_bytes());
                offsets.push(offset);
                offset = (offset + t.n_bytes as usize).div_ceil(align) * align;
            }
            let data_start = out.len().div_ceil(align) * align;
            out.resize(data_start, 0);
            for (t, off) in tensors.iter().zip(offsets) {
                out.resize(data_start + off, 0);
                out.extend(g.tensor_data(t));
            }
            out
        })
        .collect()
}

fn repos() -> Vec<Repo> {
    let llama = read(fixture("llama").join("model.gguf"));
    let qwen2 = read(fixture("qwen2").join("model.gguf"));
    let parts = split_gguf(&fixture("llama").join("model.gguf"), 2);
    let mut gguf = vec![
        RepoFile::new("README.md", b"# tiny llama GGUF\n".to_vec()),
        RepoFile::new("llama-tiny-Q4_K_M.gguf", llama.clone()),
        RepoFile::new("llama-tiny-Q8_0.gguf", qwen2),
        RepoFile::new("mmproj-llama-tiny-F16.gguf", b"GGUF not a real projector".to_vec()),
    ];
    for (k, p) in parts.into_iter().enumerate() {
        gguf.push(RepoFile::new(&format!("llama-tiny-F16-{:05}-of-00002.gguf", k + 1), p));
    }
    let q = fixture("qwen2");
    let hf = vec![
        RepoFile::new("config.json", read(q.join("config.json"))),
        RepoFile::new("generation_config.json", read(q.join("generation_config.json"))),
        RepoFile::new("model.safetensors.index.json", read(q.join("model.safetensors.index.json"))),
        RepoFile::new("model-00001-of-00002.safetensors", read(q.join("model-00001-of-00002.safetensors"))),
        RepoFile::new("model-00002-of-00002.safetensors", read(q.join("model-00002-of-00002.safetensors"))),
        RepoFile::new("tokenizer.json", byte_tokenizer_json().into_bytes()),
        RepoFile::new("pytorch_model.bin", vec![7u8; 1000]),
        RepoFile::new("original/params.json", b"{}".to_vec()),
        RepoFile::new("README.md", b"# tiny qwen2\n".to_vec()),
    ];
    let broken_index =
        json!({"metadata": {}, "weight_map": {"a": "model-00001-of-00003.safetensors", "b": "model-00003-of-00003.safetensors"}});
    let broken = vec![
        RepoFile::new("config.json", read(q.join("config.json"))),
        RepoFile::new("model.safetensors.index.json", broken_index.to_string().into_bytes()),
        RepoFile::new("model-00001-of-00003.safetensors", read(q.join("model-00001-of-00002.safetensors"))),
    ];
    let gated = vec![RepoFile::new("llama-tiny-Q4_K_M.gguf", llama)];
    let repo = |id: &str, c: char, files, gated| Repo { id: id.into(), commit: c.to_string().repeat(40), files, gated };
    vec![
        repo("tiny/llama-GGUF", 'a', gguf, false),
        repo("tiny/qwen2-HF", 'b', hf, false),
        repo("tiny/broken-HF", 'c', broken, false),
        repo("tiny/gated", 'd', gated, true),
    ]
}

// ---------------------------------------------------------------------------------------
// The local hub
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct Faults {
    /// Drop the connection after this many body bytes of the next GET of this file.
    drop_once: Option<(String, usize)>,
    /// Serve this file with one byte flipped (same size).
    corrupt: Option<String>,
    /// Send this many body bytes of the next GET of this file, then go silent (no data, no
    /// close) for a while: a stalled connection.
    stall_once: Option<(String, usize)>,
}

struct Hub {
    port: u16,
    repos: Arc<Vec<Repo>>,
    /// One line per request: `METHOD PATH [Range]`.
    log: Arc<Mutex<Vec<String>>>,
    faults: Arc<Mutex<Faults>>,
}

impl Hub {
    fn start() -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().unwrap().port();
        let hub = Hub { port, repos: Arc::new(repos()), log: Arc::default(), faults: Arc::default() };
        let (repos, log, faults) = (hub.repos.clone(), hub.log.clone(), hub.faults.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (repos, log, faults) = (repos.clone(), log.clone(), faults.clone());
                std::thread::spawn(move || {
                    let _ = serve(stream, &repos, &log, &faults);
                });
            }
        });
        hub
    }
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
    fn repo(&self, id: &str) -> &Repo {
        self.repos.iter().find(|r| r.id == id).unwrap()
    }
    fn file(&self, repo: &str, name: &str) -> &RepoFile {
        self.repo(repo).files.iter().find(|f| f.name == name).unwrap()
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn reply(status: u16, headers: &[(&str, &str)], body: Vec<u8>) -> Reply {
    Reply { status, headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), body }
}

fn error(status: u16, code: &str) -> Reply {
    reply(
        status,
        &[("X-Error-Code", code), ("Content-Type", "application/json")],
        format!(r#"{{"error":"{code}"}}"#).into_bytes(),
    )
}

/// One request per connection (`Connection: close`), as simple as HTTP/1.1 allows.
fn serve(mut stream: TcpStream, repos: &[Repo], log: &Mutex<Vec<String>>, faults: &Mutex<Faults>) -> std::io::Result<()> {
    let mut r = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let range = headers.get("range").cloned();
    log.lock().unwrap().push(format!("{method} {target}{}", range.as_ref().map(|r| format!(" {r}")).unwrap_or_default()));
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let authorized = headers.get("authorization").is_some_and(|a| a == &format!("Bearer {TOKEN}"));
    let (rep, file) = route(repos, path, query, authorized);
    let mut body = rep.body;
    let mut status = rep.status;
    let mut extra: Vec<(String, String)> = rep.headers;
    let mut drop_at = None;
    let mut stall_at = None;
    if let Some(name) = file.filter(|_| status == 200) {
        let mut f = faults.lock().unwrap();
        if f.corrupt.as_deref() == Some(name) {
            let mid = body.len() / 2;
            body[mid] ^= 0x20;
        }
        let total = body.len();
        if let Some(from) = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|r| r.parse::<usize>().ok())
        {
            if from >= total {
                status = 416;
                body.clear();
                extra.push(("Content-Range".into(), format!("bytes */{total}")));
            } else {
                status = 206;
                body.drain(..from);
                extra.push(("Content-Range".into(), format!("bytes {from}-{}/{total}", total - 1)));
            }
        }
        if method == "GET" && f.drop_once.as_ref().is_some_and(|(n, _)| n == name) {
            drop_at = f.drop_once.take().map(|(_, at)| at.min(body.len()));
        }
        if method == "GET" && f.stall_once.as_ref().is_some_and(|(n, _)| n == name) {
            stall_at = f.stall_once.take().map(|(_, at)| at.min(body.len()));
        }
    }
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Other",
    };
    let mut head = format!("HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in &extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if method != "HEAD" {
        // A dropped connection: the headers promised every byte, a part of them arrives.
        stream.write_all(&body[..drop_at.or(stall_at).unwrap_or(body.len())])?;
        if stall_at.is_some() {
            stream.flush()?;
            std::thread::sleep(std::time::Duration::from_secs(4));
        }
    }
    stream.flush()?;
    let _ = stream.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// The reply, and the file name when the body is a file's bytes (for the faults).
fn route<'a>(repos: &'a [Repo], path: &str, query: &str, authorized: bool) -> (Reply, Option<&'a str>) {
    if let Some(sha) = path.strip_prefix("/cdn/") {
        // The LFS storage the hub redirects to.
        return match repos.iter().flat_map(|r| &r.files).find(|f| f.lfs && f.blob() == sha) {
            Some(f) => (reply(200, &[("ETag", &format!("\"{sha}\""))], f.bytes.clone()), Some(&f.name)),
            None => (error(404, "EntryNotFound"), None),
        };
    }
    let (api, rest) = match path.strip_prefix("/api/models/") {
        Some(rest) => (true, rest),
        None => (false, path.trim_start_matches('/')),
    };
    let seg: Vec<&str> = rest.splitn(5, '/').collect();
    if seg.len() < 4 {
        return (error(404, "RepoNotFound"), None);
    }
    let id = format!("{}/{}", seg[0], seg[1]);
    let Some(repo) = repos.iter().find(|r| r.id == id) else { return (error(404, "RepoNotFound"), None) };
    // As on the hub, a gated repo's listing is public; its files need the token.
    if repo.gated && !authorized && !api {
        return (error(401, "GatedRepo"), None);
    }
    let rev = seg[3];
    if rev != "main" && rev != repo.commit {
        return (error(404, "RevisionNotFound"), None);
    }
    if api && seg[2] == "revision" {
        let blobs = query.contains("blobs=true");
        let siblings: Vec<Value> = repo
            .files
            .iter()
            .map(|f| {
                let mut s = json!({"rfilename": f.name});
                if blobs {
                    s["size"] = json!(f.bytes.len());
                    s["blobId"] = json!(git_blob_id(&f.bytes));
                    if f.lfs {
                        s["lfs"] = json!({"sha256": sha256(&f.bytes), "size": f.bytes.len(), "pointerSize": 134});
                    }
                }
                s
            })
            .collect();
        let body = json!({"id": repo.id, "sha": repo.commit, "private": false, "gated": repo.gated, "siblings": siblings});
        return (reply(200, &[("Content-Type", "application/json")], body.to_string().into_bytes()), None);
    }
    if api || seg[2] != "resolve" || seg.len() < 5 {
        return (error(404, "RepoNotFound"), None);
    }
    let Some(f) = repo.files.iter().find(|f| f.name == seg[4]) else { return (error(404, "EntryNotFound"), None) };
    let commit = repo.commit.as_str();
    if f.lfs {
        let blob = f.blob();
        let size = f.bytes.len().to_string();
        let etag = format!("\"{blob}\"");
        let to = format!("/cdn/{blob}");
        let h = [("Location", to.as_str()), ("X-Repo-Commit", commit), ("X-Linked-Etag", &etag), ("X-Linked-Size", &size)];
        return (reply(302, &h, Vec::new()), None);
    }
    let etag = format!("\"{}\"", f.blob());
    (reply(200, &[("X-Repo-Commit", commit), ("ETag", &etag)], f.bytes.clone()), Some(&f.name))
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

struct Env {
    home: TempDir,
    cfg: HubConfig,
}

/// A fresh HF_HOME and cortiq cache, pointed at `hub`.
fn env(hub: &Hub, tag: &str) -> Env {
    let home = TempDir::new(&format!("hub-{tag}"));
    let cfg = HubConfig {
        endpoint: hub.endpoint(),
        cache: home.0.join("hf").join("hub"),
        token: None,
        token_from: "HF_TOKEN".into(),
        offline: false,
        records: home.0.join("cortiq").join("hub"),
        body_budget: hub::DEFAULT_BODY_BUDGET,
    };
    Env { home, cfg }
}

fn pull(cfg: &HubConfig, spec: &str) -> Result<PathBuf, HubError> {
    hub::pull(cfg, &HubSpec::parse(spec).expect("spec parses"))
}

fn one_line(e: &HubError) -> String {
    let msg = e.to_string();
    println!("error: {msg}");
    assert!(!msg.contains('\n'), "error is not one line: {msg}");
    msg
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(d: &Path, pre: &str, out: &mut Vec<String>) {
        for e in fs::read_dir(d).into_iter().flatten().flatten() {
            let n = format!("{pre}{}", e.file_name().to_string_lossy());
            if e.path().is_dir() { walk(&e.path(), &format!("{n}/"), out) } else { out.push(n) }
        }
    }
    walk(dir, "", &mut out);
    out.sort();
    out
}

fn file_gets(hub: &Hub) -> Vec<String> {
    hub.requests().into_iter().filter(|r| !r.contains("/api/")).collect()
}

// ---------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------

#[test]
fn gguf_pull_takes_the_4bit_file_into_the_hf_cache_layout() {
    let hub = Hub::start();
    let e = env(&hub, "layout");
    let path = pull(&e.cfg, "hf:tiny/llama-GGUF").expect("pull");
    let want = hub.file("tiny/llama-GGUF", "llama-tiny-Q4_K_M.gguf");
    let repo_dir = e.cfg.cache.join("models--tiny--llama-GGUF");
    let commit = "a".repeat(40);
    assert_eq!(path, repo_dir.join("snapshots").join(&commit).join("llama-tiny-Q4_K_M.gguf"));
    assert_eq!(
        fs::read_link(&path).unwrap(),
        Path::new("../../blobs").join(want.blob()),
        "snapshot entry is not the relative blob link"
    );
    assert!(read(path.clone()) == want.bytes, "pulled bytes differ from the repo's");
    assert_eq!(fs::read_to_string(repo_dir.join("refs/main")).unwrap(), commit);
    // Exactly the one file: not the other quants, the split, the projector or the README.
    assert_eq!(files_under(&repo_dir.join("snapshots")), [format!("{commit}/llama-tiny-Q4_K_M.gguf")]);
    assert_eq!(files_under(&repo_dir.join("blobs")), [want.blob()], "no partial file may stay behind");
    println!("requests: {:#?}", hub.requests());
    assert!(
        hub.requests().iter().any(|r| r.starts_with(&format!("GET /cdn/{}", want.blob()))),
        "the LFS redirect was not followed"
    );
}

#[test]
fn quant_and_file_selectors_pick_their_file() {
    let hub = Hub::start();
    let e = env(&hub, "select");
    let q8 = &hub.file("tiny/llama-GGUF", "llama-tiny-Q8_0.gguf").bytes;
    for spec in [
        "hf:tiny/llama-GGUF:q8_0",
        "hf:tiny/llama-GGUF:Q8_0",
        "hf:tiny/llama-GGUF:llama-tiny-Q8_0.gguf",
        "hf:tiny/llama-GGUF@main:q8_0",
    ] {
        let p = pull(&e.cfg, spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert!(p.ends_with("llama-tiny-Q8_0.gguf") && read(p.clone()) == *q8, "{spec} gave {}", p.display());
    }
    let commit = "a".repeat(40);
    let p = pull(&e.cfg, &format!("hf:tiny/llama-GGUF@{commit}:q4_k_m")).expect("pull by commit");
    assert!(p.ends_with("llama-tiny-Q4_K_M.gguf"));
}

#[test]
fn split_gguf_is_fetched_whole_and_loads_like_the_single_file() {
    let hub = Hub::start();
    let e = env(&hub, "split");
    let p = pull(&e.cfg, "hf:tiny/llama-GGUF:f16").expect("pull split");
    assert!(p.ends_with("llama-tiny-F16-00001-of-00002.gguf"), "the model path is the first part: {}", p.display());
    let second = p.with_file_name("llama-tiny-F16-00002-of-00002.gguf");
    assert!(
        read(second) == hub.file("tiny/llama-GGUF", "llama-tiny-F16-00002-of-00002.gguf").bytes,
        "second part missing or wrong"
    );
    // The two parts open as one file holding every tensor of the original, byte for byte.
    let split = Gguf::open(&p).expect("open split gguf");
    let whole = Gguf::open(fixture("llama").join("model.gguf")).unwrap();
    assert_eq!(split.tensors.len(), whole.tensors.len());
    assert!(split.tensors.iter().any(|t| t.shard == 1), "no tensor came from the second part");
    for t in &whole.tensors {
        let s = split.tensor(&t.name).unwrap_or_else(|| panic!("tensor {} missing from the split", t.name));
        assert!(split.tensor_data(s) == whole.tensor_data(t), "tensor {} differs in the split", t.name);
    }
    assert_eq!(split.get("general.architecture"), whole.get("general.architecture"));
    // Opening the second part names the first.
    let msg = Gguf::open(p.with_file_name("llama-tiny-F16-00002-of-00002.gguf")).err().expect("second part alone").to_string();
    assert!(msg.contains("llama-tiny-F16-00001-of-00002.gguf"), "{msg}");
}

#[test]
fn selection_rules() {
    let names = [
        "a-Q4_K_M.gguf",
        "a-Q4_K_S.gguf",
        "a-Q8_0.gguf",
        "mmproj-a-f16.gguf",
        "b/c-Q6_K-00001-of-00002.gguf",
        "b/c-Q6_K-00002-of-00002.gguf",
    ];
    let pick = |sel: Option<&str>, names: &[&str]| hub::select("o/r", names, sel);
    assert_eq!(pick(None, &names).unwrap(), Selection::Gguf { files: vec!["a-Q4_K_M.gguf".into()] });
    assert_eq!(
        pick(Some("q6_k"), &names).unwrap(),
        Selection::Gguf { files: vec!["b/c-Q6_K-00001-of-00002.gguf".into(), "b/c-Q6_K-00002-of-00002.gguf".into()] }
    );
    let amb = pick(Some("q4_k"), &names).unwrap_err();
    let msg = one_line(&amb);
    assert!(msg.contains("a-Q4_K_M.gguf") && msg.contains("a-Q4_K_S.gguf") && !msg.contains("a-Q8_0"), "{msg}");
    let none = one_line(&pick(Some("q5_k_m"), &names).unwrap_err());
    assert!(
        none.contains("choices") && none.contains("a-Q8_0.gguf") && none.contains("2 parts") && !none.contains("mmproj"),
        "{none}"
    );
    // No 4-bit file and several others: the choices, not a guess.
    let msg = one_line(&pick(None, &["x-Q8_0.gguf", "x-F16.gguf"]).unwrap_err());
    assert!(msg.contains("x-Q8_0.gguf") && msg.contains("x-F16.gguf"), "{msg}");
    // A split with a part missing on the hub is refused.
    let msg = one_line(&pick(Some("q6_k"), &["c-Q6_K-00001-of-00003.gguf", "c-Q6_K-00002-of-00003.gguf"]).unwrap_err());
    assert!(msg.contains("part 3 of 3"), "{msg}");
    // Spelling.
    assert_eq!(
        HubSpec::parse("hf:Qwen/Qwen3-0.6B-GGUF@v1:Q8_0").unwrap(),
        HubSpec { repo: "Qwen/Qwen3-0.6B-GGUF".into(), revision: "v1".into(), selector: Some("Q8_0".into()) }
    );
    assert_eq!(HubSpec::parse("hf.co/o/r:q4_k_m").unwrap().selector.as_deref(), Some("q4_k_m"));
    for bad in ["hf:", "hf:a/b/c", "hf:../x", "hf:o/r@", "hf:o/r:", "hf:o/r:../../x.gguf", "o/r"] {
        assert!(HubSpec::parse(bad).is_err(), "{bad} should not parse");
    }
}

#[test]
fn safetensors_repo_fetches_config_tokenizer_index_and_shards_only() {
    let hub = Hub::start();
    let e = env(&hub, "hf");
    let dir = pull(&e.cfg, "hf:tiny/qwen2-HF").expect("pull");
    assert_eq!(dir, e.cfg.cache.join("models--tiny--qwen2-HF/snapshots").join("b".repeat(40)));
    let want = [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ];
    assert_eq!(files_under(&dir), want);
    for f in want {
        assert!(read(dir.join(f)) == hub.file("tiny/qwen2-HF", f).bytes, "{f} differs");
    }
    let gets = file_gets(&hub);
    assert!(
        !gets.iter().any(|r| r.contains("pytorch_model") || r.contains("original/") || r.contains("README")),
        "fetched more than the model: {gets:#?}"
    );
    // The folder loads as the fixture does.
    let loaded = cortiq_engine::load::load(&dir).expect("load the pulled folder");
    let fix = cortiq_engine::load::load(&fixture("qwen2")).unwrap();
    assert_eq!(loaded.model.cfg.n_layers, fix.model.cfg.n_layers);
}

#[test]
fn a_dropped_connection_is_resumed_with_a_range_request() {
    let hub = Hub::start();
    let e = env(&hub, "resume");
    let f = hub.file("tiny/llama-GGUF", "llama-tiny-Q4_K_M.gguf");
    hub.faults.lock().unwrap().drop_once = Some((f.name.clone(), 100_000));
    let p = pull(&e.cfg, "hf:tiny/llama-GGUF").expect("pull resumes after the drop");
    assert!(read(p) == f.bytes, "resumed file differs");
    let gets: Vec<String> = hub.requests().into_iter().filter(|r| r.starts_with("GET /cdn/")).collect();
    println!("{gets:#?}");
    assert_eq!(gets.len(), 2, "one drop, one resume");
    assert!(gets[1].ends_with("bytes=100000-"), "the second request does not resume at the drop: {}", gets[1]);

    // A connection that goes silent is cut when its body budget runs out, and resumed.
    let es = env(&hub, "stall");
    let quick = HubConfig { body_budget: std::time::Duration::from_millis(1500), ..es.cfg.clone() };
    let q8 = hub.file("tiny/llama-GGUF", "llama-tiny-Q8_0.gguf");
    hub.faults.lock().unwrap().stall_once = Some((q8.name.clone(), 50_000));
    let n0 = hub.requests().len();
    let t0 = std::time::Instant::now();
    let p = pull(&quick, "hf:tiny/llama-GGUF:q8_0").expect("pull resumes after the stall");
    assert!(read(p) == q8.bytes, "resumed file differs");
    let gets: Vec<String> = hub.requests()[n0..].iter().filter(|r| r.starts_with("GET /cdn/")).cloned().collect();
    println!("after {:?}: {gets:#?}", t0.elapsed());
    // (More than two only if this machine is too loaded to move 0.6 MB over loopback within
    // the budget; each further request still resumes where the last one stopped.)
    assert!(gets.len() >= 2, "one stall, one resume");
    assert!(gets[1].ends_with("bytes=50000-"), "the second request does not resume at the stall: {}", gets[1]);

    // A partial file from an earlier run (ours or Python's `.incomplete`) is resumed too.
    let e2 = env(&hub, "resume2");
    let blobs = e2.cfg.cache.join("models--tiny--llama-GGUF/blobs");
    fs::create_dir_all(&blobs).unwrap();
    fs::write(blobs.join(format!("{}.incomplete", f.blob())), &f.bytes[..4096]).unwrap();
    let n0 = hub.requests().len();
    let p = pull(&e2.cfg, "hf:tiny/llama-GGUF").expect("pull resumes the partial file");
    assert!(read(p) == f.bytes);
    let gets: Vec<String> = hub.requests()[n0..].iter().filter(|r| r.starts_with("GET /cdn/")).cloned().collect();
    assert_eq!(gets.len(), 1);
    assert!(gets[0].ends_with("bytes=4096-"), "{}", gets[0]);

    // A partial file that is not a prefix of the real one fails the hash after the resume;
    // the download is then made whole once more, and the right bytes are used.
    let e3 = env(&hub, "resume3");
    let blobs = e3.cfg.cache.join("models--tiny--llama-GGUF/blobs");
    fs::create_dir_all(&blobs).unwrap();
    fs::write(blobs.join(format!("{}.incomplete", f.blob())), vec![0xAB; 4096]).unwrap();
    let n0 = hub.requests().len();
    let p = pull(&e3.cfg, "hf:tiny/llama-GGUF").expect("pull over a foreign partial file");
    assert!(read(p) == f.bytes);
    let gets: Vec<String> = hub.requests()[n0..].iter().filter(|r| r.starts_with("GET /cdn/")).cloned().collect();
    assert_eq!(gets.len(), 2, "{gets:#?}");
    assert!(gets[0].ends_with("bytes=4096-") && gets[1].ends_with(&f.blob()), "{gets:#?}");
}

#[test]
fn a_corrupted_file_is_refused_by_its_hash() {
    let hub = Hub::start();
    let e = env(&hub, "corrupt");
    hub.faults.lock().unwrap().corrupt = Some("llama-tiny-Q8_0.gguf".into());
    let msg = one_line(&pull(&e.cfg, "hf:tiny/llama-GGUF:q8_0").expect_err("a corrupted file must be refused"));
    let want = hub.file("tiny/llama-GGUF", "llama-tiny-Q8_0.gguf").blob();
    assert!(msg.contains("sha256 mismatch") && msg.contains(&want) && msg.contains("llama-tiny-Q8_0.gguf"), "{msg}");
    let repo_dir = e.cfg.cache.join("models--tiny--llama-GGUF");
    assert_eq!(files_under(&repo_dir.join("blobs")), Vec::<String>::new(), "the bad bytes stayed in the cache");
    assert!(!repo_dir.join("snapshots").join("a".repeat(40)).join("llama-tiny-Q8_0.gguf").exists());
    // Once the hub serves the right bytes, the same pull succeeds.
    hub.faults.lock().unwrap().corrupt = None;
    pull(&e.cfg, "hf:tiny/llama-GGUF:q8_0").expect("clean pull");
}

#[test]
fn a_second_pull_is_served_from_the_cache_without_a_request() {
    let hub = Hub::start();
    let e = env(&hub, "cache");
    let first = pull(&e.cfg, "hf:tiny/qwen2-HF").expect("first pull");
    let first_gguf = pull(&e.cfg, "hf:tiny/llama-GGUF:q8_0").expect("first pull");
    let n = hub.requests().len();
    assert_eq!(pull(&e.cfg, "hf:tiny/qwen2-HF").expect("second pull"), first);
    assert_eq!(pull(&e.cfg, "hf:tiny/llama-GGUF:q8_0").expect("second pull"), first_gguf);
    assert_eq!(hub.requests().len(), n, "the second pulls asked the hub: {:#?}", &hub.requests()[n..]);
    // Offline (HF_HUB_OFFLINE) works for what is cached and says so for what is not.
    let offline = HubConfig { offline: true, ..e.cfg.clone() };
    assert_eq!(pull(&offline, "hf:tiny/llama-GGUF:q8_0").expect("offline, cached"), first_gguf);
    let msg = one_line(&pull(&offline, "hf:tiny/llama-GGUF:f16").unwrap_err());
    assert!(msg.contains("HF_HUB_OFFLINE") && msg.contains("hf:tiny/llama-GGUF:f16"), "{msg}");
    assert_eq!(hub.requests().len(), n);
    // --refresh asks the hub again, and fetches nothing that is cached.
    let n_files = file_gets(&hub).len();
    assert_eq!(hub::refresh(&e.cfg, &HubSpec::parse("hf:tiny/qwen2-HF").unwrap()).expect("refresh"), first);
    assert_eq!(hub.requests().len(), n + 1, "a refresh is one listing request: {:#?}", &hub.requests()[n..]);
    assert_eq!(file_gets(&hub).len(), n_files);
    let n = n + 1;
    // A file that lost its bytes is fetched again rather than used.
    let blob = fs::canonicalize(&first_gguf).unwrap();
    fs::write(&blob, b"truncated").unwrap();
    let again = pull(&e.cfg, "hf:tiny/llama-GGUF:q8_0").expect("refetch");
    assert!(read(again) == hub.file("tiny/llama-GGUF", "llama-tiny-Q8_0.gguf").bytes);
    assert!(hub.requests().len() > n);
}

#[test]
fn files_downloaded_by_python_are_reused() {
    let hub = Hub::start();
    let e = env(&hub, "python");
    // The layout huggingface_hub writes: blob named by its hash, relative link, ref.
    let f = hub.file("tiny/llama-GGUF", "llama-tiny-Q4_K_M.gguf");
    let repo_dir = e.cfg.cache.join("models--tiny--llama-GGUF");
    let snap = repo_dir.join("snapshots").join("a".repeat(40));
    fs::create_dir_all(repo_dir.join("blobs")).unwrap();
    fs::create_dir_all(&snap).unwrap();
    fs::create_dir_all(repo_dir.join("refs")).unwrap();
    fs::write(repo_dir.join("blobs").join(f.blob()), &f.bytes).unwrap();
    std::os::unix::fs::symlink(Path::new("../../blobs").join(f.blob()), snap.join(&f.name)).unwrap();
    fs::write(repo_dir.join("refs/main"), "a".repeat(40)).unwrap();
    // Online: the listing is asked for, the file is not downloaded.
    let p = pull(&e.cfg, "hf:tiny/llama-GGUF").expect("pull");
    assert_eq!(p, snap.join(&f.name));
    assert_eq!(file_gets(&hub), Vec::<String>::new(), "a cached file was downloaded again");
    // A cached blob whose bytes do not match its hash (same size) is fetched again, not used.
    let q8 = hub.file("tiny/llama-GGUF", "llama-tiny-Q8_0.gguf");
    let mut bad = q8.bytes.clone();
    bad[100] ^= 1;
    fs::write(repo_dir.join("blobs").join(q8.blob()), &bad).unwrap();
    std::os::unix::fs::symlink(Path::new("../../blobs").join(q8.blob()), snap.join(&q8.name)).unwrap();
    let p8 = pull(&e.cfg, "hf:tiny/llama-GGUF:q8_0").expect("pull over a corrupt cached blob");
    assert!(read(p8) == q8.bytes, "the corrupt cached blob was used");
    assert_eq!(file_gets(&hub).iter().filter(|r| r.starts_with("GET /cdn/")).count(), 1, "{:#?}", file_gets(&hub));
    // Offline, with no memory of a previous cortiq pull: the snapshot alone is enough.
    let fresh = HubConfig { offline: true, records: e.home.0.join("other-records"), ..e.cfg.clone() };
    assert_eq!(pull(&fresh, "hf:tiny/llama-GGUF").expect("offline from the snapshot"), p);
}

#[test]
fn hub_errors_are_one_line_each() {
    let hub = Hub::start();
    let e = env(&hub, "errors");
    let cases: [(&str, &[&str]); 6] = [
        ("hf:tiny/nope", &["tiny/nope", "not found"]),
        ("hf:tiny/llama-GGUF@v9", &["no revision", "v9"]),
        ("hf:tiny/llama-GGUF:nope.gguf", &["no GGUF file nope.gguf", "llama-tiny-Q8_0.gguf"]),
        ("hf:tiny/broken-HF", &["no file model-00003-of-00003.safetensors"]),
        ("hf:tiny/gated", &["gated", "HF_TOKEN"]),
        ("hf:tiny/qwen2-HF:q4_k_m", &["no GGUF files"]),
    ];
    for (spec, want) in cases {
        let msg = one_line(&pull(&e.cfg, spec).expect_err(spec));
        assert!(want.iter().all(|w| msg.contains(w)), "{spec}: {msg} lacks {want:?}");
    }
    // The token: a wrong one is named as refused, the right one opens the repo.
    let wrong = HubConfig { token: Some("hf_wrong".into()), ..e.cfg.clone() };
    let msg = one_line(&pull(&wrong, "hf:tiny/gated").unwrap_err());
    assert!(msg.contains("refused the token in HF_TOKEN"), "{msg}");
    let right = HubConfig { token: Some(TOKEN.into()), ..e.cfg.clone() };
    let p = pull(&right, "hf:tiny/gated").expect("gated repo with its token");
    assert!(read(p) == hub.file("tiny/gated", "llama-tiny-Q4_K_M.gguf").bytes);
    // No network: a port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let down = HubConfig { endpoint: format!("http://127.0.0.1:{port}"), ..e.cfg.clone() };
    let msg = one_line(&pull(&down, "hf:tiny/llama-GGUF:q8_0").unwrap_err());
    assert!(msg.contains("cannot reach the hub") && msg.contains("hf:tiny/llama-GGUF:q8_0 is not in the cache"), "{msg}");
}

/// `cortiq` with the hub's environment pointed at `hub` and a private cache; `vars` on top.
fn cortiq_with(hub: &Hub, home: &Path, args: &[&str], vars: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cortiq"));
    cmd.args(args)
        .env("HF_ENDPOINT", hub.endpoint())
        .env("HF_HOME", home.join("hf"))
        .env("CORTIQ_CACHE", home.join("cortiq"))
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE");
    cmd.envs(vars.iter().copied()).output().expect("run cortiq")
}

fn cortiq(hub: &Hub, home: &Path, args: &[&str]) -> std::process::Output {
    cortiq_with(hub, home, args, &[])
}

#[test]
fn cortiq_run_and_pull_take_hub_models() {
    let hub = Hub::start();
    let home = TempDir::new("hub-cli");
    let gen_args = ["-p", "hello", "-n", "8", "--temp", "0", "--ignore-eos", "-t", "1"];
    let run = |model: &str| {
        let mut args = vec!["run", "-m", model];
        args.extend(gen_args);
        let out = cortiq(&hub, &home.0, &args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "cortiq run -m {model}: {err}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let local = run(fixture("llama").join("model.gguf").to_str().unwrap());
    let from_hub = run("hf:tiny/llama-GGUF");
    println!("local: {local:?}\nhub:   {from_hub:?}");
    assert!(!local.is_empty());
    assert_eq!(from_hub, local, "the hub's Q4_K_M file (the llama fixture) generates differently");
    // The split file runs too, and gives the same text as the single file.
    assert_eq!(run("hf:tiny/llama-GGUF:f16"), local, "the split GGUF generates differently");

    // The safetensors repo runs as the fixture folder (with the same tokenizer) does.
    let folder = common::copy_fixture("qwen2", "hub-cli-qwen2");
    fs::write(folder.0.join("tokenizer.json"), byte_tokenizer_json()).unwrap();
    assert_eq!(run("hf:tiny/qwen2-HF"), run(folder.0.to_str().unwrap()), "the pulled HF folder generates differently");

    let out = cortiq(&hub, &home.0, &["pull", "hf:tiny/llama-GGUF:q8_0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).trim().ends_with("llama-tiny-Q8_0.gguf"));
    let out = cortiq(&hub, &home.0, &["pull", "--list"]);
    let list = String::from_utf8_lossy(&out.stdout);
    println!("{list}");
    for want in [
        "smollm2-135m",
        "hf:tiny/llama-GGUF:llama-tiny-Q4_K_M.gguf",
        "hf:tiny/llama-GGUF:llama-tiny-Q8_0.gguf",
        "hf:tiny/llama-GGUF:llama-tiny-F16-00001-of-00002.gguf",
    ] {
        assert!(list.contains(want), "--list lacks {want}");
    }
    // Errors reach the user as one line and a non-zero exit.
    let out = cortiq(&hub, &home.0, &["run", "-m", "hf:tiny/gated", "-p", "x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("gated") && err.contains("HF_TOKEN"), "{err}");
    // HF_TOKEN opens it; HF_HUB_OFFLINE runs what is cached without asking the hub.
    let out = cortiq_with(&hub, &home.0, &["pull", "hf:tiny/gated"], &[("HF_TOKEN", TOKEN)]);
    assert!(out.status.success(), "HF_TOKEN was not used: {}", String::from_utf8_lossy(&out.stderr));
    let n = hub.requests().len();
    let mut args = vec!["run", "-m", "hf:tiny/llama-GGUF"];
    args.extend(gen_args);
    let out = cortiq_with(&hub, &home.0, &args, &[("HF_HUB_OFFLINE", "1")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), local);
    assert_eq!(hub.requests().len(), n, "an offline run asked the hub");
    let out = cortiq(&hub, &home.0, &["run", "-m", "tiny/llama-GGUF", "-p", "x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("hf:tiny/llama-GGUF"), "the ORG/REPO hint is missing: {err}");
}
