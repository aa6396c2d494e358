//! Scaling out on a real reverse proxy: nginx (Debian's nginx-light; scripts/test installs it)
//! with the repo's deploy/nginx/cortiq.conf in front of two `cortiq serve` replicas. A
//! conversation keyed by `X-Session-Id` stays on one replica and its `cached_tokens` grow; with
//! that replica's queue full, its 503 is retried on the other; with a replica killed, requests
//! keep succeeding.

mod common;

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::http::{Response, Server};
use common::{TempDir, fixture};
use serde_json::{Value, json};

struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// deploy/nginx/cortiq.conf with its listen port, upstream servers and paths replaced.
fn nginx(dir: &std::path::Path, port: u16, replicas: &[u16]) -> Nginx {
    let conf = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/nginx/cortiq.conf")).unwrap();
    let mut out = String::new();
    let mut replaced = false;
    for line in conf.lines() {
        if line.contains("# REPLICAS") {
            if !replaced {
                for p in replicas {
                    out.push_str(&format!("        server 127.0.0.1:{p} max_fails=3 fail_timeout=10s;\n"));
                }
                replaced = true;
            }
            continue;
        }
        let line = if line.contains("# LISTEN") { format!("        listen 127.0.0.1:{port};") } else { line.to_string() };
        out.push_str(&line.replace("/tmp/cortiq-nginx", &dir.join("nginx").display().to_string()));
        out.push('\n');
    }
    // One process, so the test's kill stops all of nginx.
    let out = format!("master_process off;\n{out}");
    let path = dir.join("nginx.conf");
    std::fs::write(&path, out).unwrap();
    let nginx =
        ["/usr/sbin/nginx", "nginx"].into_iter().find(|p| Command::new(p).arg("-v").output().is_ok()).unwrap_or_else(|| {
            panic!("nginx is not installed: scripts/test installs Debian's nginx-light (apt-get install nginx-light)")
        });
    let child = Command::new(nginx)
        .args(["-p", dir.to_str().unwrap(), "-c", path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "nginx did not start listening");
        std::thread::sleep(Duration::from_millis(50));
    }
    Nginx(child)
}

fn post(port: u16, session: &str, body: &Value) -> Response {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let b = body.to_string();
    common::http::send(
        &mut c,
        "POST",
        "/v1/completions",
        &[("content-type", "application/json"), ("x-session-id", session)],
        b.as_bytes(),
    )
    .unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    common::http::parse(&raw)
}

#[test]
fn proxy_nginx_affinity_retry_and_failover() {
    let model = fixture("qwen3_5").display().to_string();
    let args = ["--parallel", "1", "--queue", "1", "--ctx", "32000"];
    let a = Server::start(&model, &args);
    let b = Server::start(&model, &args);
    let dir = TempDir::new("nginx");
    let port = free_port();
    let _ng = nginx(&dir.0, port, &[a.port, b.port]);

    // Affinity: three turns of one conversation on one replica, the cache growing.
    let mut prompt = "The first turn of a conversation about caches and proxies.".to_string();
    let mut cached = Vec::new();
    let mut upstreams = Vec::new();
    for turn in 0..3 {
        let r = post(port, "conversation-1", &json!({"prompt": prompt, "max_tokens": 8, "temperature": 0}));
        assert_eq!(r.status, 200, "turn {turn}: {}", r.text());
        upstreams.push(r.header("x-upstream").unwrap_or_default().to_string());
        let j = r.json();
        cached.push(j["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap());
        prompt = format!("{prompt}{} And turn {} goes on.", j["choices"][0]["text"].as_str().unwrap(), turn + 2);
    }
    assert!(upstreams.iter().all(|u| *u == upstreams[0]), "one replica: {upstreams:?}");
    assert!(cached[1] > 0 && cached[2] > cached[1], "cached_tokens grow: {cached:?}");

    // Retry: fill the conversation's replica (its slot and its queue of 1), then the next turn
    // is answered by the other one.
    let home = if upstreams[0].ends_with(&format!(":{}", a.port)) { a.port } else { b.port };
    let other = if home == a.port { b.port } else { a.port };
    let home_server = if home == a.port { &a } else { &b };
    // One request running, one waiting: sent one after the other (two at once could find the
    // first still in the queue and be refused themselves).
    let mut busy = Vec::new();
    for (i, gauge) in ["cortiq_busy_slots", "cortiq_queue_length"].into_iter().enumerate() {
        busy.push(std::thread::spawn(move || {
            let mut c = std::net::TcpStream::connect(("127.0.0.1", home)).unwrap();
            let body =
                json!({"prompt": format!("busy {i}"), "max_tokens": 30000, "ignore_eos": true, "temperature": 0}).to_string();
            common::http::send(&mut c, "POST", "/v1/completions", &[("content-type", "application/json")], body.as_bytes())
                .unwrap();
            let mut raw = Vec::new();
            let _ = c.read_to_end(&mut raw);
        }));
        let t0 = Instant::now();
        while home_server.metric(gauge) < 1.0 {
            assert!(t0.elapsed() < Duration::from_secs(20), "the home replica never filled ({gauge})");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let r = post(port, "conversation-1", &json!({"prompt": prompt, "max_tokens": 4, "temperature": 0}));
    assert_eq!(r.status, 200, "retried: {}", r.text());
    let up = r.header("x-upstream").unwrap_or_default().to_string();
    assert!(up.contains(&format!(":{home}")) && up.ends_with(&format!(":{other}")), "503 from {home}, then {other}: {up}");

    // Failover: the busy replica killed mid-request; every request is served by the other.
    let survivor = other;
    if home == a.port {
        drop(a);
    } else {
        drop(b);
    }
    drop(busy);
    for i in 0..6 {
        let r = post(port, &format!("conversation-{i}"), &json!({"prompt": "still there?", "max_tokens": 2, "temperature": 0}));
        assert_eq!(r.status, 200, "request {i} with a replica down: {}", r.text());
        assert!(r.header("x-upstream").unwrap_or_default().ends_with(&format!(":{survivor}")));
    }
}
