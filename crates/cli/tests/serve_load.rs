//! The hostile-client case that measures latency: heavy requests against admission with
//! `/health` probed throughout (< 50 ms). In a test binary of its own, so that the other
//! server tests' processes (which the serve binary runs in parallel) do not share the 2 cores
//! with the probe.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::fixture;
use common::http::{Server, assert_error};
use serde_json::json;

fn qwen35() -> String {
    fixture("qwen3_5").display().to_string()
}

/// Work bounded before admission, and the HTTP threads kept free: a request of 2,000 prompts x
/// n 16 is refused (503) before any prompt is tokenized; while two 4 MB prompts are tokenized,
/// `/health` still answers within 50 ms.
#[test]
fn serve_hostile_heavy_requests_admission_and_health() {
    let s = Server::start(&qwen35(), &["--queue", "16", "--ctx", "64", "--max-body-mb", "16"]);
    let prompts: Vec<String> = (0..2000).map(|i| format!("prompt number {i} with a few words")).collect();
    let t0 = Instant::now();
    let r = s.post("/v1/completions", &json!({"prompt": prompts, "n": 16, "max_tokens": 1}));
    let dt = t0.elapsed();
    assert_error(&r, 503, "unavailable_error", Some("server_busy"), None);
    assert!(dt < Duration::from_millis(500), "refused after {dt:?}");

    let port = s.port;
    let big = "lorem ipsum ".repeat(350_000);
    let heavy: Vec<_> = (0..2)
        .map(|_| {
            let body = json!({"prompt": big, "max_tokens": 1}).to_string();
            std::thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                common::http::send(&mut c, "POST", "/v1/completions", &[("content-type", "application/json")], body.as_bytes())
                    .unwrap();
                let mut raw = Vec::new();
                c.read_to_end(&mut raw).unwrap();
                common::http::parse(&raw).status
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut lat = Vec::new();
    while !heavy.iter().all(|h| h.is_finished()) && lat.len() < 20 {
        let t0 = Instant::now();
        assert_eq!(s.get("/health").status, 200);
        lat.push(t0.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    for h in heavy {
        assert_eq!(h.join().unwrap(), 400, "a 4 MB prompt is past the context: 400 after tokenizing");
    }
    lat.sort();
    eprintln!(
        "/health during the heavy requests: {} probes, median {:?}, max {:?}",
        lat.len(),
        lat.get(lat.len() / 2),
        lat.last()
    );
    assert!(lat.len() >= 3, "the heavy requests ended too soon to probe ({} probes)", lat.len());
    assert!(*lat.last().unwrap() < Duration::from_millis(50), "/health took {:?}", lat.last());
}
