#!/usr/bin/env python3
"""Hostile bodies against a running `cortiq serve`: a 5 MB completions body of a million prompts
x n 16, and one of a million-token prompt x n 16, each sent over a raw socket; prints the time
from the first byte sent to the end of the answer, the status line, and the server's RSS before
and after (from /proc, so run it on the server's machine).

usage: bench/huge_body.py PORT SERVER_PID [--rounds 3]
"""
import argparse
import json
import socket
import time


def rss_mb(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return -1


def send(port, body):
    s = socket.create_connection(("127.0.0.1", port))
    head = ("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)).encode()
    t0 = time.perf_counter()
    s.sendall(head + body)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return time.perf_counter() - t0, data.split(b"\r\n")[0].decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("pid", type=int)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    bodies = [
        ("1,000,000 prompts x n 16", json.dumps({"prompt": ["a"] * 1_000_000, "n": 16, "max_tokens": 1}).encode()),
        ("a 1,000,000-token prompt x n 16", json.dumps({"prompt": [100] * 1_000_000, "n": 16, "max_tokens": 1}).encode()),
    ]
    for _ in range(a.rounds):
        for name, body in bodies:
            before = rss_mb(a.pid)
            dt, status = send(a.port, body)
            print("%s: %.1f MB body, %s in %.1f ms, RSS %d -> %d MB" % (name, len(body) / 1e6, status, dt * 1e3, before, rss_mb(a.pid)))


if __name__ == "__main__":
    main()
