#!/usr/bin/env python3
"""Serving throughput, cortiq serve vs llama-server, same model, threads and requests, in one run.

Loopback only; stdlib only (http.client + threads). For each tool in turn (alternating over
--rounds): start the server, wait for /health, warm up, then
  - C concurrent streams for each C in --streams: /v1/completions, stream, temperature 0 (or
    --temperature T, seed 1, each server's other sampling defaults),
    ignore_eos, --tokens tokens each, distinct short prompts. Aggregate decode tok/s =
    (tokens after each stream's first) / (last token time - first "first token" time).
  - the long-prompt probe: a ~--long-prompt token prompt alone (idle TTFT), then the same
    prompt arriving while 3 streams decode: its TTFT and the longest gap between two tokens of
    the running streams.
llama-server gets -np equal to the concurrency (restarted per C), cortiq serve --parallel max(C).

--closed-loop SECS measures each concurrency as a server under steady load instead of one burst:
each of the C clients sends its next request as soon as its last one ends, for SECS seconds;
aggregate = tokens received / SECS (a stream that finishes early, say by speculating, makes
room for more work, as in serving; the burst's figure is bound by its slowest stream).

--spec-streams K adds a row "cortiq spec K": the same cortiq server and requests with the first
K streams of each concurrency asking for n-gram speculation (`"speculative": {"type": "ngram"}`),
alternated with the plain rows; --cortiq-old PATH adds a row (and a spec row) for another
cortiq binary, alternated too (a before/after of one change in one run).

usage: bench/serve_bench.py --model M.gguf --llama-server PATH [--cortiq target/release/cortiq]
       [--threads 2] [--tokens 128] [--streams 1,4,8] [--rounds 2] [--long-prompt 1000]
       [--spec-streams K] [--cortiq-old PATH]
Prints a markdown table; --json FILE writes the raw figures.
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
         "tau upsilon phi chi psi omega").split()


def prompt_of(i, n_words=12):
    return "Story %d: " % i + " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n_words))


def wait_health(port, proc, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit("server exited with %s" % proc.returncode)
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("server not healthy after %ds" % timeout)


TEMPERATURE = 0  # --temperature; 0 is greedy


def stream(port, prompt, tokens, out, key, spec=False):
    """One streamed completion; appends (t_send, [token arrival times]) to out[key]. `spec`:
    the request asks for n-gram speculation."""
    req = {"prompt": prompt, "max_tokens": tokens, "temperature": TEMPERATURE, "seed": 1, "stream": True,
           "ignore_eos": True, "cache_prompt": False}
    if spec:
        req["speculative"] = {"type": "ngram"}
    body = json.dumps(req)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t_send = time.time()
    c.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out.setdefault("errors", []).append(r.status)
        return
    times = []
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                d = line[5:].strip()
                if d == b"[DONE]":
                    continue
                j = json.loads(d)
                for ch in j.get("choices", []):
                    if ch.get("text"):
                        times.append(time.time())
    out.setdefault(key, []).append((t_send, times))


def concurrent(port, c, tokens, base, n_spec=0):
    out = {}
    th = [threading.Thread(target=stream, args=(port, prompt_of(base + i), tokens, out, "s", i < n_spec)) for i in range(c)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    runs = out.get("s", [])
    firsts = [ts[0] for _, ts in runs if ts]
    lasts = [ts[-1] for _, ts in runs if ts]
    n = sum(max(len(ts) - 1, 0) for _, ts in runs)
    agg = n / (max(lasts) - min(firsts)) if runs and max(lasts) > min(firsts) else 0.0
    return {"agg_tps": agg, "errors": len(out.get("errors", [])), "tokens": [len(ts) for _, ts in runs]}


def closed_loop(port, c, tokens, base, n_spec, secs):
    """C clients, each sending requests back to back for `secs`; tokens received per second
    (the tokens of requests still running at the end count up to then)."""
    out = {}
    t_end = time.time() + secs

    def client(i):
        k = 0
        while time.time() < t_end:
            stream(port, prompt_of(base + 1000 * i + k), tokens, out, "c%d" % i, i < n_spec)
            k += 1

    th = [threading.Thread(target=client, args=(i,)) for i in range(c)]
    t0 = time.time()
    for t in th:
        t.start()
    for t in th:
        t.join()
    n = sum(1 for i in range(c) for _, ts in out.get("c%d" % i, []) for x in ts if t0 <= x <= t0 + secs)
    return {"agg_tps": n / secs, "errors": len(out.get("errors", [])), "requests": [len(out.get("c%d" % i, [])) for i in range(c)]}


def long_prompt_probe(port, tokens, n_long):
    long_text = " ".join(WORDS[(k * 5) % len(WORDS)] for k in range(int(n_long * 0.95)))
    out = {}
    stream(port, long_text, 4, out, "idle")
    idle_ttft = out["idle"][0][1][0] - out["idle"][0][0]
    out = {}
    bg = [threading.Thread(target=stream, args=(port, prompt_of(900 + i), tokens, out, "bg")) for i in range(3)]
    for t in bg:
        t.start()
    time.sleep(1.0)
    stream(port, long_text, 4, out, "long")
    for t in bg:
        t.join()
    busy_ttft = out["long"][0][1][0] - out["long"][0][0]
    gaps = [b - a for _, ts in out.get("bg", []) for a, b in zip(ts, ts[1:])]
    return {"idle_ttft": idle_ttft, "busy_ttft": busy_ttft, "max_gap": max(gaps) if gaps else None}


def start(tool, args, port, np_):
    if tool.startswith("cortiq"):
        binary = args.cortiq_old if tool.startswith("cortiq-old") else args.cortiq
        cmd = [binary, "serve", "-m", args.model, "-t", str(args.threads), "--port", str(port),
               "--parallel", str(np_), "--ctx", str(args.ctx)] + args.cortiq_args.split()
    else:
        cmd = [args.llama_server, "-m", args.model, "-t", str(args.threads), "--port", str(port), "-np", str(np_),
               "-c", str(args.ctx * np_), "-fa", "on", "--no-webui"]
    env = dict(os.environ)
    if args.llama_server:
        env["LD_LIBRARY_PATH"] = os.path.dirname(args.llama_server) + ":" + env.get("LD_LIBRARY_PATH", "")
    try:  # a server left on the port would answer for the one we start: refuse to measure it
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        sys.exit("port %d is already in use (a server left running?)" % port)
    except OSError:
        pass
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    RUNNING.append(p)
    wait_health(port, p)
    return p


RUNNING = []


def stop_all():
    for p in RUNNING:
        if p.poll() is None:
            p.terminate()
            p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--cortiq", default="target/release/cortiq")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--streams", default="1,4,8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--long-prompt", type=int, default=1000, help="words of the long-prompt probe; 0 skips it")
    ap.add_argument("--port", type=int, default=18431)
    ap.add_argument("--json", default=None)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature of every request (0: greedy, the default; the other "
                         "settings stay each server's defaults)")
    ap.add_argument("--cortiq-args", default="", help="extra flags for cortiq serve, e.g. '--prefill-chunk 32'")
    ap.add_argument("--spec-streams", type=int, default=0, help="a row with this many streams speculating (n-gram)")
    ap.add_argument("--cortiq-old", default=None, help="another cortiq binary, measured alternately")
    ap.add_argument("--closed-loop", type=float, default=0, help="seconds of steady load per concurrency instead of one burst")
    args = ap.parse_args()
    global TEMPERATURE
    TEMPERATURE = args.temperature
    streams = [int(x) for x in args.streams.split(",")]
    tools = ["cortiq"]
    if args.spec_streams:
        tools.append("cortiq spec %d" % args.spec_streams)
    if args.cortiq_old:
        tools.append("cortiq-old")
        if args.spec_streams:
            tools.append("cortiq-old spec %d" % args.spec_streams)
    tools += ["llama-server"] if args.llama_server else []
    res = {t: {c: [] for c in streams} for t in tools}
    probe = {t: [] for t in tools}
    for rnd in range(args.rounds):
        for tool in tools:
            if tool.startswith("cortiq"):
                n_spec = args.spec_streams if " spec " in tool else 0
                p = start(tool, args, args.port, max(streams))
                concurrent(args.port, 1, 16, 10_000)  # warm-up
                for c in streams:
                    if args.closed_loop:
                        res[tool][c].append(closed_loop(args.port, c, args.tokens, 100 * rnd + 10 * c, n_spec, args.closed_loop))
                    else:
                        res[tool][c].append(concurrent(args.port, c, args.tokens, 100 * rnd + 10 * c, n_spec))
                if args.long_prompt > 0 and not n_spec:
                    probe[tool].append(long_prompt_probe(args.port, args.tokens, args.long_prompt))
                p.terminate()
                p.wait()
            else:
                for c in streams:
                    p = start(tool, args, args.port, c)
                    concurrent(args.port, 1, 16, 10_000)
                    res[tool][c].append(concurrent(args.port, c, args.tokens, 100 * rnd + 10 * c))
                    if c == max(streams) and args.long_prompt > 0:
                        probe[tool].append(long_prompt_probe(args.port, args.tokens, args.long_prompt))
                    p.terminate()
                    p.wait()
    print("| tool | " + " | ".join("%d streams tok/s" % c for c in streams) + " | x of own 1 stream at max | errors |")
    print("|---|" + "---|" * (len(streams) + 2))
    for tool in tools:
        med = {c: statistics.median(r["agg_tps"] for r in res[tool][c]) for c in streams}
        errs = sum(r["errors"] for c in streams for r in res[tool][c])
        one = med.get(1) or float("nan")
        print("| %s | %s | %.2f | %d |" % (tool, " | ".join("%.1f" % med[c] for c in streams), med[max(streams)] / one, errs))
    for tool in tools:
        for pr in probe[tool]:
            print("%s long prompt: idle TTFT %.2fs, TTFT beside 3 streams %.2fs (%.2fx), max gap of running streams %s" % (
                tool, pr["idle_ttft"], pr["busy_ttft"], pr["busy_ttft"] / pr["idle_ttft"],
                "%.0f ms" % (pr["max_gap"] * 1e3) if pr["max_gap"] is not None else "n/a"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"streams": res, "probe": probe}, f, indent=1)


if __name__ == "__main__":
    try:
        main()
    finally:  # never leave a server behind (it would load the machine and hold the port)
        stop_all()
