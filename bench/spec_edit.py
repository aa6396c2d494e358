#!/usr/bin/env python3
"""Speculative decoding on code edits: cortiq `run --spec ngram` against cortiq plain and
llama-server's `--spec-type ngram-simple` and `ngram-mod`, same model, threads and prompts, the
four alternated prompt by prompt in one run.

Each prompt is a function from a package that ships on PyPI (downloaded at the pinned version,
cut out with `ast`) and an edit instruction; the answer is the whole updated function. Also an
open-ended prompt (a story, sampled at temperature 0.8 with a fixed seed: few repeats) where
speculation must cost next to nothing (cortiq only).

Prints per prompt the decode tok/s of each, the drafts accepted, and whether cortiq's
speculative output equals its plain output byte for byte; then the sums (tokens ÷ seconds over
all edit prompts) and the ratios.

usage: bench/spec_edit.py MODEL.gguf [--cortiq target/release/cortiq] [--llama-bin DIR]
       [--threads 2] [--n 768] [--rounds 1] [--skip-llama] [--story-rounds 3] [--only-story]
"""

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

# (package==version, file in the wheel, function, instruction)
EDITS = [
    ("h11==0.16.0", "h11/_connection.py", "_body_framing",
     "Rename the parameter `request_method` to `method` everywhere in this function."),
    ("h11==0.16.0", "h11/_headers.py", "get_comma_header",
     "Rename the variable `found_split_value` to `value` everywhere in this function."),
    ("h11==0.16.0", "h11/_receivebuffer.py", "maybe_extract_lines",
     "Rename the variable `lines` to `chunks` everywhere in this function."),
    ("idna==3.20", "idna/core.py", "ulabel",
     "Rename the variable `label_bytes` to `raw` everywhere in this function."),
    ("idna==3.20", "idna/core.py", "valid_contextj",
     "Rename the variable `joining_type` to `jt` everywhere in this function."),
    ("typing_extensions==4.16.0", "typing_extensions.py", "_collect_parameters",
     "Rename the variable `parameters` to `params` everywhere in this function."),
]
STORY = "Write a short story about a lighthouse keeper who finds a map in a bottle."
TAIL = "Reply with the whole updated function only, in one Python code block."


def fetch_function(cache: Path, pin: str, member: str, func: str) -> str:
    name, version = pin.split("==")
    d = cache / pin
    if not d.exists():
        d.mkdir(parents=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        pin, "-d", str(d)], check=True)
    wheel = next(d.glob("*.whl"))
    src = zipfile.ZipFile(wheel).read(member).decode()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func:
            lines = src.splitlines()[node.lineno - 1 - len(node.decorator_list):node.end_lineno]
            indent = min(len(l) - len(l.lstrip()) for l in lines if l.strip())
            return "\n".join(l[indent:] for l in lines)
    raise SystemExit(f"{func} not found in {pin}:{member}")


def cortiq_run(cortiq: str, model: str, prompt: str, n: int, threads: int, spec: bool, temp: float):
    cmd = [cortiq, "run", "-m", model, "--chat", "-p", prompt, "-n", str(n), "--temp", str(temp), "--seed", "1",
           "-t", str(threads)]
    if spec:
        cmd += ["--spec", "ngram"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"generated (\d+) tok in ([0-9.]+)s", r.stderr)
    acc = re.search(r"drafted (\d+) tok, accepted (\d+)", r.stderr)
    n_gen, secs = int(m.group(1)), float(m.group(2))
    # decode tok/s as cortiq reports it: the tokens after the first over the decode time
    return {"text": r.stdout, "n": n_gen - 1, "s": secs,
            "drafted": int(acc.group(1)) if acc else 0, "accepted": int(acc.group(2)) if acc else 0}


def llama_request(port: int, prompt: str, n: int):
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"content-type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=600))
    t = r["timings"]
    return {"text": r["choices"][0]["message"]["content"], "n": t["predicted_n"], "s": t["predicted_ms"] / 1000,
            "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0)}


def start_llama(bin_dir: str, model: str, threads: int, port: int, spec_type: str):
    env = dict(os.environ, LD_LIBRARY_PATH=bin_dir)
    p = subprocess.Popen([f"{bin_dir}/llama-server", "-m", model, "-t", str(threads), "-c", "4096", "-np", "1",
                          "--port", str(port), "--spec-type", spec_type, "--jinja"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p
        except Exception:
            time.sleep(0.2)
    p.kill()
    raise SystemExit(f"llama-server --spec-type {spec_type} did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--cortiq", default="target/release/cortiq")
    ap.add_argument("--llama-bin", default="/tmp/lcpp-src/build/bin")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--story-rounds", type=int, default=3)
    ap.add_argument("--only-story", action="store_true")
    a = ap.parse_args()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cortiq" / "bench-spec"
    prompts = []
    for pin, member, func, instr in EDITS:
        code = fetch_function(cache, pin, member, func)
        prompts.append((f"{pin.split('==')[0]}.{func}",
                        f"Here is a Python function from the {pin.split('==')[0]} package:\n\n```python\n{code}\n```\n\n{instr} {TAIL}"))
    servers = {}
    if not a.skip_llama and not a.only_story:
        servers = {"ngram-simple": (start_llama(a.llama_bin, a.model, a.threads, 18711, "ngram-simple"), 18711),
                   "ngram-mod": (start_llama(a.llama_bin, a.model, a.threads, 18712, "ngram-mod"), 18712)}
    tools = ["cortiq plain", "cortiq ngram"] + list(servers)
    sums = {t: [0, 0.0] for t in tools}
    same = True
    story = [0.0, 0.0]  # decode seconds of the story: plain, ngram
    try:
        for rnd in range(a.rounds):
            for name, prompt in ([] if a.only_story else prompts) + [("story", STORY)]:
                res = {}
                # The story is sampled (temperature 0.8, seed 1): greedy decoding of a small model
                # falls into loops, which are repeats the drafter would find.
                temp = 0.8 if name == "story" else 0.0
                for t in tools:
                    if t == "cortiq plain":
                        res[t] = cortiq_run(a.cortiq, a.model, prompt, a.n, a.threads, False, temp)
                    elif t == "cortiq ngram":
                        res[t] = cortiq_run(a.cortiq, a.model, prompt, a.n, a.threads, True, temp)
                    elif name != "story":
                        res[t] = llama_request(servers[t][1], prompt, a.n)
                eq = res["cortiq ngram"]["text"] == res["cortiq plain"]["text"]
                same &= eq
                line = " | ".join(f"{t} {r['n'] / r['s']:.1f} tok/s ({r['n']} tok, {r['accepted']}/{r['drafted']})"
                                  for t, r in res.items())
                print(f"[{rnd}] {name}: {line} | cortiq spec == plain: {eq}", flush=True)
                if name != "story":
                    for t, r in res.items():
                        sums[t][0] += r["n"]
                        sums[t][1] += r["s"]
                else:
                    story[0] += res["cortiq plain"]["s"]
                    story[1] += res["cortiq ngram"]["s"]
                    for _ in range(a.story_rounds - 1):
                        for spec, i in [(False, 0), (True, 1)]:
                            r = cortiq_run(a.cortiq, a.model, prompt, a.n, a.threads, spec, temp)
                            story[i] += r["s"]
                            same &= r["text"] == res["cortiq plain"]["text"]
                    print(f"story, {a.story_rounds} alternated rounds: cortiq ngram / plain decode time "
                          f"{story[1] / story[0]:.3f} (plain {story[0]:.2f} s, ngram {story[1]:.2f} s)", flush=True)
    finally:
        for p, _ in servers.values():
            p.kill()
    if a.only_story:
        return
    tps = {t: n / s for t, (n, s) in sums.items()}
    print("edit prompts, tokens / seconds: " + ", ".join(f"{t} {v:.1f}" for t, v in tps.items()))
    print(f"cortiq ngram / cortiq plain: {tps['cortiq ngram'] / tps['cortiq plain']:.2f}x")
    if servers:
        best = max(tps[t] for t in servers)
        print(f"cortiq ngram / llama.cpp's better mode: {tps['cortiq ngram'] / best:.2f}x")
    print(f"cortiq outputs identical with and without speculation: {same}")


if __name__ == "__main__":
    main()
