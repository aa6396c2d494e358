#!/usr/bin/env python3
"""A bounded load test of a running `cortiq serve` (loopback only; stdlib only).

N clients for T seconds, each in a loop: a /v1/completions request (streamed or not, 8-64
tokens, random seed), now and then one it abandons mid-stream (a client that disconnects).
Reports requests, errors, latency and time-to-first-token percentiles; then waits for the
server to go idle and checks /metrics: no busy slot and no queued request left (no leaks).
Exits non-zero on any error or leak.

usage: bench/serve_load.py [--port 8080] [--clients 16] [--seconds 60] [--api-key KEY]
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def metrics(port, headers):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics", headers=headers)
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.split()
            out[k] = float(v)
    return out


def client(port, headers, deadline, seed, stats, lock):
    rng = random.Random(seed)
    while time.time() < deadline:
        stream = rng.random() < 0.6
        abandon = stream and rng.random() < 0.1
        body = {"prompt": "Request %d: tell me about %s" % (rng.randrange(10**6), rng.choice(["cats", "rivers", "stars", "code"])),
                "max_tokens": rng.randint(8, 64), "temperature": 0.8, "seed": rng.randrange(2**31), "stream": stream}
        t0 = time.time()
        ttft = None
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            c.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json", **headers})
            r = c.getresponse()
            if r.status != 200:
                with lock:
                    stats["errors"].append("HTTP %d: %s" % (r.status, r.read()[:200]))
                continue
            if stream:
                done = False
                while True:
                    line = r.readline()
                    if not line:
                        break
                    if line.startswith(b"data:") and ttft is None:
                        ttft = time.time() - t0
                    if abandon and ttft is not None:
                        c.close()
                        break
                    if line.strip() == b"data: [DONE]":
                        done = True
                if not done and not abandon:
                    with lock:
                        stats["errors"].append("stream ended without [DONE]")
                    continue
            else:
                j = json.loads(r.read())
                if "choices" not in j:
                    with lock:
                        stats["errors"].append("no choices: %s" % j)
                    continue
            with lock:
                stats["lat"].append(time.time() - t0)
                if ttft is not None:
                    stats["ttft"].append(ttft)
                stats["abandoned" if abandon else "ok"] += 1
        except Exception as e:  # a transport error is a failure of the server under test
            with lock:
                stats["errors"].append(repr(e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--api-key", default=None)
    a = ap.parse_args()
    headers = {"authorization": "Bearer " + a.api_key} if a.api_key else {}
    stats = {"lat": [], "ttft": [], "errors": [], "ok": 0, "abandoned": 0}
    lock = threading.Lock()
    deadline = time.time() + a.seconds
    th = [threading.Thread(target=client, args=(a.port, headers, deadline, i, stats, lock)) for i in range(a.clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    # Idle within a few steps once the clients are gone: nothing leaked.
    t0 = time.time()
    while True:
        m = metrics(a.port, headers)
        if m.get("cortiq_busy_slots", 0) == 0 and m.get("cortiq_queue_length", 0) == 0:
            break
        if time.time() - t0 > 30:
            break
        time.sleep(0.2)
    leaked = m.get("cortiq_busy_slots", 0) + m.get("cortiq_queue_length", 0)
    lat, ttft = stats["lat"], stats["ttft"]
    print("clients %d, %.0f s: %d requests completed, %d abandoned on purpose, %d errors" % (
        a.clients, a.seconds, stats["ok"], stats["abandoned"], len(stats["errors"])))
    print("latency  p50 %.2fs  p90 %.2fs  p99 %.2fs  max %.2fs" % (pct(lat, 50), pct(lat, 90), pct(lat, 99), max(lat or [0])))
    print("TTFT     p50 %.2fs  p90 %.2fs  p99 %.2fs" % (pct(ttft, 50), pct(ttft, 90), pct(ttft, 99)))
    print("after the run: busy slots %d, queued %d, cancelled %d, generated %d tokens" % (
        m.get("cortiq_busy_slots", -1), m.get("cortiq_queue_length", -1), m.get("cortiq_requests_cancelled_total", -1),
        m.get("cortiq_generated_tokens_total", -1)))
    for e in stats["errors"][:10]:
        print("error:", e)
    sys.exit(1 if stats["errors"] or leaked else 0)


if __name__ == "__main__":
    main()
