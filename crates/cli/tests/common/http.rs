//! A running `cortiq serve` for tests and a raw HTTP/1.1 client over std's TcpStream (the wire
//! format itself is under test, so no client library sits in between).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub port: u16,
    /// Everything the server printed on stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// Start `cortiq serve -m MODEL --port 0 ARGS...`, wait until /health says ready.
    pub fn start(model: &str, args: &[&str]) -> Server {
        Server::start_serve(&[&["-m", model][..], args].concat())
    }

    /// Start `cortiq serve --port 0 ARGS...` (the models given in ARGS), wait until /health
    /// says ready.
    pub fn start_serve(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cortiq"))
            .args(["serve", "--port", "0", "-t", "2"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cortiq serve");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let log_w = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
                let mut l = log_w.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no listening line; log:\n{}", log.lock().unwrap()));
        let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
        let s = Server { child, port, log };
        let t0 = Instant::now();
        loop {
            if let Ok(r) = s.try_request("GET", "/health", &[], b"") {
                if r.status == 200 {
                    break;
                }
                assert_eq!(r.status, 503, "health while loading: {}", r.text());
            }
            assert!(t0.elapsed() < Duration::from_secs(300), "server not ready; log:\n{}", s.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn try_request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> std::io::Result<Response> {
        let mut s = self.connect()?;
        send(&mut s, method, path, headers, body)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        Ok(parse(&raw))
    }

    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        self.try_request(method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path}: {e}; log:\n{}", self.log()))
    }

    pub fn post(&self, path: &str, json: &serde_json::Value) -> Response {
        self.request("POST", path, &[("content-type", "application/json")], json.to_string().as_bytes())
    }

    pub fn get(&self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }

    pub fn connect(&self) -> std::io::Result<TcpStream> {
        let s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(300)))?;
        Ok(s)
    }

    /// A Prometheus metric's value (no labels).
    pub fn metric(&self, name: &str) -> f64 {
        let m = self.get("/metrics").text();
        m.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")).map(|v| v.trim().parse::<f64>().unwrap()))
            .unwrap_or_else(|| panic!("metric {name} missing:\n{m}"))
    }
}

impl Server {
    /// Wait (at most 5 s) for a gauge to reach `want`: gauges are updated once per scheduler
    /// step, so a response can arrive before the step that sent it has finished.
    pub fn wait_metric(&self, name: &str, want: f64) {
        let t0 = Instant::now();
        loop {
            let v = self.metric(name);
            if v == want {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "{name} is {v}, expected {want}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status once the process ends (None if it runs past `timeout`).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn send(s: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> std::io::Result<()> {
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    /// The SSE `data:` payloads in order, and the comment lines seen.
    pub fn sse(&self) -> (Vec<String>, usize) {
        let text = self.text();
        let mut data = Vec::new();
        let mut comments = 0;
        for ev in text.split("\n\n") {
            for line in ev.lines() {
                if let Some(d) = line.strip_prefix("data: ").or_else(|| line.strip_prefix("data:")) {
                    data.push(d.to_string());
                } else if line.starts_with(':') {
                    comments += 1;
                }
            }
        }
        (data, comments)
    }
}

/// Status line, headers, and the body with chunked transfer coding undone.
pub fn parse(raw: &[u8]) -> Response {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))).collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Response { status, headers, body }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else { break };
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).split(';').next().unwrap().trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

/// An OpenAI error body with this status, type and (when given) code / param.
pub fn assert_error(r: &Response, status: u16, kind: &str, code: Option<&str>, param: Option<&str>) {
    assert_eq!(r.status, status, "status; body: {}", r.text());
    assert!(r.header("content-type").unwrap_or("").starts_with("application/json"), "error content-type: {:?}", r.headers);
    let j = r.json();
    let e = &j["error"];
    assert_eq!(e["type"], kind, "{j}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{j}");
    if let Some(c) = code {
        assert_eq!(e["code"], c, "{j}");
    }
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{j}");
    }
}
