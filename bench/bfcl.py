#!/usr/bin/env python3
"""Function-calling accuracy, cortiq serve vs llama-server --jinja, same GGUF, greedy, on the
Berkeley Function Calling Leaderboard data shipped in the `bfcl-eval` PyPI package (its wheel is
downloaded with pip and read as data; nothing of it is imported).

Categories: simple (simple_python), multiple, parallel, parallel_multiple, irrelevance; the
first --n questions of each (all with --n 0). Each question goes to both servers as an OpenAI
chat request with `tools` (BFCL's functions as OpenAI tools: "." in names becomes "_", BFCL's
"dict"/"float"/"tuple" types become JSON schema's object/number/array, as BFCL's own OpenAI
handler does), temperature 0, tool_choice auto. Scoring is an AST check in the spirit of
BFCL's checker: the calls' names, then each argument against the possible answers (strings
compared without case, spaces and punctuation, ints accepted for floats, optional arguments
may be left out), parallel calls matched in any order; irrelevance is right when no call comes
back. cortiq's answer is also asked for streamed, and the calls rebuilt from the deltas must
equal the non-streamed ones.

usage: bench/bfcl.py --model M.gguf --llama-server PATH [--cortiq target/release/cortiq]
       [--n 40] [--threads 2] [--json FILE]
Prints a markdown table (accuracy per category, both servers) and the stream check.
"""
import argparse
import glob
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_bench import wait_health  # noqa: E402  (the bench scripts share it)

CATEGORIES = {
    "simple": "BFCL_v4_simple_python.json",
    "multiple": "BFCL_v4_multiple.json",
    "parallel": "BFCL_v4_parallel.json",
    "parallel_multiple": "BFCL_v4_parallel_multiple.json",
    "irrelevance": "BFCL_v4_irrelevance.json",
}
BFCL_VERSION = "2026.3.23"


def data_dir():
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cortiq", "bfcl-" + BFCL_VERSION)
    if not os.path.isdir(os.path.join(cache, "bfcl_eval", "data")):
        os.makedirs(cache, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", tmp,
                            "bfcl-eval==" + BFCL_VERSION], check=True)
            whl = glob.glob(os.path.join(tmp, "*.whl"))[0]
            with zipfile.ZipFile(whl) as z:
                z.extractall(cache, [n for n in z.namelist() if n.startswith("bfcl_eval/data/")])
    return os.path.join(cache, "bfcl_eval", "data")


def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def schema(s):
    if isinstance(s, dict):
        out = {}
        for k, v in s.items():
            if k == "type" and isinstance(v, str):
                out[k] = TYPES.get(v, v)
            elif k in ("properties",):
                out[k] = {pk: schema(pv) for pk, pv in v.items()}
            elif k in ("items", "additionalProperties"):
                out[k] = schema(v)
            else:
                out[k] = v
        return out
    return s


def tools_of(functions):
    return [{"type": "function", "function": {"name": f["name"].replace(".", "_"), "description": f.get("description", ""),
                                              "parameters": schema(f.get("parameters", {"type": "object", "properties": {}}))}}
            for f in functions]


def norm(s):
    return re.sub(r"[ ,./\-_*^]", "", s).lower()


def value_ok(got, allowed):
    for a in allowed:
        if a == "":
            continue
        if isinstance(a, str) and isinstance(got, str) and norm(a) == norm(got):
            return True
        if isinstance(a, bool) or isinstance(got, bool):
            if a is got:
                return True
            continue
        if isinstance(a, (int, float)) and isinstance(got, (int, float)) and float(a) == float(got):
            return True
        if isinstance(a, list) and isinstance(got, list) and len(a) == len(got):
            if all(value_ok(g, [x]) for g, x in zip(got, a)):
                return True
        if isinstance(a, dict) and isinstance(got, dict):
            if set(got) <= set(a) and all(value_ok(got[k], a[k] if isinstance(a[k], list) else [a[k]]) for k in got):
                if all(k in got or "" in (a[k] if isinstance(a[k], list) else [a[k]]) for k in a):
                    return True
        if a == got:
            return True
    return False


def call_ok(call, truth):
    """call: (name, args dict); truth: {name: {param: [allowed...]}}."""
    (tname, params), = truth.items()
    name, args = call
    if name != tname.replace(".", "_") or not isinstance(args, dict):
        return False
    for p, v in args.items():
        if p not in params or not value_ok(v, params[p]):
            return False
    for p, allowed in params.items():
        if p not in args and "" not in allowed:
            return False
    return True


def score(calls, truths):
    if len(calls) != len(truths):
        return False
    left = list(truths)
    for c in calls:
        hit = next((t for t in left if call_ok(c, t)), None)
        if hit is None:
            return False
        left.remove(hit)
    return True


def post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, data[:300]))
    return json.loads(data) if not body.get("stream") else data.decode()


def calls_of(msg):
    out = []
    for t in msg.get("tool_calls") or []:
        try:
            out.append((t["function"]["name"], json.loads(t["function"]["arguments"])))
        except (ValueError, KeyError):
            out.append((t.get("function", {}).get("name"), None))
    return out


def streamed_calls(sse):
    calls, content = {}, ""
    for line in sse.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ch = json.loads(line[6:])
        for choice in ch.get("choices", []):
            d = choice.get("delta", {})
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                s = calls.setdefault(tc["index"], {"name": None, "arguments": ""})
                f = tc.get("function") or {}
                s["name"] = f.get("name") or s["name"]
                s["arguments"] += f.get("arguments") or ""
    out = []
    for i in sorted(calls):
        try:
            out.append((calls[i]["name"], json.loads(calls[i]["arguments"])))
        except ValueError:
            out.append((calls[i]["name"], None))
    return out, content


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--cortiq", default="target/release/cortiq")
    ap.add_argument("--n", type=int, default=40, help="questions per category (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--json")
    a = ap.parse_args()
    data = data_dir()
    servers = {
        "cortiq": ([a.cortiq, "serve", "-m", a.model, "--port", "8391", "--ctx", "4096", "-t", str(a.threads)], 8391),
        "llama-server": ([a.llama_server, "-m", a.model, "--port", "8392", "-c", "4096", "-t", str(a.threads), "-np", "1",
                          "--jinja", "--log-disable"], 8392),
    }
    procs = {}
    try:
        for name, (cmd, port) in servers.items():
            procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, (cmd, port) in servers.items():
            wait_health(port, procs[name])
        results = {}
        stream_mismatch = []
        for cat, fname in CATEGORIES.items():
            qs = load(os.path.join(data, fname))
            answers = {}
            if cat != "irrelevance":
                answers = {x["id"]: x["ground_truth"] for x in load(os.path.join(data, "possible_answer", fname))}
            if a.n:
                qs = qs[:a.n]
            for name in servers:
                results.setdefault(name, {})[cat] = 0
            for q in qs:
                body = {"messages": q["question"][0], "tools": tools_of(q["function"]), "temperature": 0,
                        "max_tokens": a.max_tokens}
                # Alternate which server answers first.
                order = list(servers) if len(results["cortiq"]) % 2 else list(reversed(servers))
                for name in order:
                    port = servers[name][1]
                    msg = post(port, body)["choices"][0]["message"]
                    calls = calls_of(msg)
                    ok = (not calls) if cat == "irrelevance" else score(calls, answers[q["id"]])
                    results[name][cat] += ok
                    if name == "cortiq":
                        scalls, scontent = streamed_calls(post(port, dict(body, stream=True)))
                        if scalls != calls or (scontent or None) != (msg.get("content") or None):
                            stream_mismatch.append(q["id"])
            print("%-18s %s" % (cat, "  ".join("%s %d/%d" % (n, results[n][cat], len(qs)) for n in servers)), flush=True)
        n_of = {cat: (len(load(os.path.join(data, f))) if not a.n else min(a.n, len(load(os.path.join(data, f)))))
                for cat, f in CATEGORIES.items()}
        print("\n| category | n | cortiq | llama-server --jinja |\n|---|---|---|---|")
        for cat in CATEGORIES:
            n = n_of[cat]
            print("| %s | %d | %.1f%% | %.1f%% |" % (cat, n, 100.0 * results["cortiq"][cat] / n, 100.0 * results["llama-server"][cat] / n))
        print("\ncortiq streamed == non-streamed: %d of %d questions differ %s" %
              (len(stream_mismatch), sum(n_of.values()), stream_mismatch))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"n": n_of, "results": results, "stream_mismatch": stream_mismatch}, f, indent=1)
    finally:
        for p in procs.values():
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
