#!/usr/bin/env python3
"""The prompt cache, measured: cortiq serve against llama-server on the same GGUF, threads and
prompts, through the official `openai` client.

  chat   a 6-turn conversation (each turn resends the whole conversation): per turn the prompt
         tokens, those computed and those reused, and the time to the answer, both servers side
         by side (cortiq: usage.prompt_tokens_details.cached_tokens; llama-server: timings.cache_n
         and timings.prompt_n).
  speed  a repeated long prompt (--long tokens): time to first token cold (cache_prompt false)
         and from the cache; then a prompt sharing the first half with it and a new second half:
         its time against the marginal cost of that second half cold (cold full minus cold half).
         cortiq only (llama-server's figures for the same in the chat table).
  memory N requests with varied prefixes (random picks among a few shared heads and tails)
         against a small --cache-ram: the server's RSS before and after, and the hit rate.

usage: ~/.cache/cortiq/pyenv-openai-*/bin/python bench/prompt_cache.py MODEL.gguf
       [--cortiq target/release/cortiq] [--llama-bin DIR] [--threads 2] [--long 8192]
       [--parts chat,speed,memory] [--requests 200] [--cache-ram 512] [--skip-llama]
"""

import argparse
import json
import os
import random
import subprocess
import time
import urllib.request

import openai

TURNS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Now make it ignore case and punctuation.",
    "Add a docstring and two doctest examples.",
    "Rewrite it without slicing, with two indices.",
    "What is its time complexity? One sentence.",
    "Give the final version again, complete.",
]


def wait_health(port, proc, what):
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except Exception:
            if proc.poll() is not None:
                raise SystemExit(f"{what} exited")
            time.sleep(0.2)
    raise SystemExit(f"{what} did not start")


def start_cortiq(a, port, cache_ram):
    p = subprocess.Popen([a.cortiq, "serve", "-m", a.model, "-t", str(a.threads), "--port", str(port),
                          "--ctx", str(a.ctx), "--parallel", "1", "--cache-ram", str(cache_ram), "--alias", "m",
                          "--cache-checkpoint-every", str(a.every)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_health(port, p, "cortiq serve")
    return p


def start_llama(a, port):
    env = dict(os.environ, LD_LIBRARY_PATH=a.llama_bin)
    p = subprocess.Popen([f"{a.llama_bin}/llama-server", "-m", a.model, "-t", str(a.threads), "-c", str(a.ctx),
                          "-np", "1", "--port", str(port), "--jinja"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wait_health(port, p, "llama-server")
    return p


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


RAW = False  # --raw: /v1/completions over a plain-text transcript (models without a chat template)


def ask(client, msgs, n, **extra):
    t0 = time.time()
    if RAW:
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in msgs) + "Assistant:"
        r = client.completions.create(model="m", prompt=text, max_tokens=n, temperature=0, extra_body=extra or None)
    else:
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=n, temperature=0, extra_body=extra or None)
    secs = time.time() - t0
    u = r.usage
    cached = (u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0) or 0
    t = (r.model_extra or {}).get("timings")
    if t:  # llama-server
        computed, cached = t["prompt_n"], t.get("cache_n", cached)
    else:
        computed = u.prompt_tokens - cached
    out = r.choices[0].text if RAW else r.choices[0].message.content
    return out, u.prompt_tokens, computed, cached, secs


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=3600))


def chat_ids(a, ports, clients):
    """The conversation kept as token ids (models without a chat template, random weights
    whose output text does not re-tokenize to the same ids): each turn sends the ids so far +
    the new user line, and appends the ids the server generated (`return_tokens`)."""
    print(f"## chat over token ids: {len(TURNS)} turns, 48 tokens per answer, temperature 0")
    hist = {n: [] for n in ports}
    for i, q in enumerate(TURNS):
        cells = []
        for name, port in ports.items():
            ids = hist[name] + post(port, "/tokenize", {"content": f"User: {q}\nAssistant:"})["tokens"]
            t0 = time.time()
            if name == "cortiq":
                # The official client: completions over a token-id prompt, the ids generated
                # back through `return_tokens`.
                r = clients[name].completions.create(model="m", prompt=ids, max_tokens=48, temperature=0,
                                                     extra_body={"return_tokens": True, "ignore_eos": True})
                out = r.choices[0].model_extra["tokens"]
                cached = r.usage.prompt_tokens_details.cached_tokens or 0
                computed = len(ids) - cached
            else:
                r = post(port, "/completion", {"prompt": ids, "n_predict": 48, "temperature": 0, "return_tokens": True,
                                               "cache_prompt": True, "ignore_eos": True})
                out, cached, computed = r["tokens"], r["timings"].get("cache_n", 0), r["timings"]["prompt_n"]
            secs = time.time() - t0
            hist[name] = ids + out + post(port, "/tokenize", {"content": "\n"})["tokens"]
            cells.append(f"{name}: prompt {len(ids)}, computed {computed}, reused {cached}, {secs:.2f} s")
            time.sleep(1.0)
        print(f"turn {i + 1}: " + " | ".join(cells), flush=True)


def chat(a, clients):
    print(f"## chat: {len(TURNS)} turns, max_tokens 48, temperature 0")
    convs = {name: [{"role": "system", "content": "You are a concise Python expert."}] for name in clients}
    totals = {name: [0, 0] for name in clients}
    for i, q in enumerate(TURNS):
        cells = []
        for name, c in clients.items():
            convs[name].append({"role": "user", "content": q})
            text, prompt, computed, cached, secs = ask(c, convs[name], 48)
            convs[name].append({"role": "assistant", "content": text})
            totals[name][0] += computed
            totals[name][1] += cached
            cells.append(f"{name}: prompt {prompt}, computed {computed}, reused {cached}, {secs:.2f} s")
            time.sleep(1.0)  # the user reads (cortiq refills prompt + answer meanwhile)
        print(f"turn {i + 1}: " + " | ".join(cells), flush=True)
    print("totals: " + " | ".join(f"{n}: computed {t[0]}, reused {t[1]}" for n, t in totals.items()))


def speed(a, client, port):
    rng = random.Random(7)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()
    text = lambda n: " ".join(rng.choice(words) for _ in range(n))
    # Words per token of this vocabulary, from the server's tokenizer.
    probe = text(1000)
    per = 1000 / len(post(port, "/tokenize", {"content": probe})["tokens"])
    n_words = int(a.long // 2 * per)
    head = text(n_words)
    tail1, tail2 = text(n_words), text(n_words)
    full = [{"role": "user", "content": head + " " + tail1}]
    half = [{"role": "user", "content": tail2}]
    other = [{"role": "user", "content": head + " " + tail2}]
    print(f"## speed: prompts of ~{a.long} tokens")
    _, n_full, _, _, cold = ask(client, full, 1, cache_prompt=False)
    _, n_half, _, _, cold_half = ask(client, half, 1, cache_prompt=False)
    _, _, _, _, warm_up = ask(client, full, 1)  # caches it
    time.sleep(1.0)
    _, _, comp, reused, warm = ask(client, full, 1)
    print(f"repeat: cold {cold:.2f} s ({n_full} tokens), from the cache {warm:.3f} s "
          f"({reused} reused, {comp} computed): {100 * warm / cold:.1f}% of cold", flush=True)
    _, n_other, comp, reused, shared = ask(client, other, 1)
    _, _, _, _, cold_other = ask(client, other, 1, cache_prompt=False)
    print(f"shared first half: {shared:.2f} s ({reused} reused, {comp} computed of {n_other}); "
          f"the same prompt cold {cold_other:.2f} s; a {n_half}-token prompt alone, cold {cold_half:.2f} s; "
          f"cold full minus cold half-length prompt {cold - cold_half:.2f} s", flush=True)


def memory(a, proc, client, port):
    rng = random.Random(11)
    heads = [" ".join(rng.choice("abcdefghij") * rng.randint(1, 4) for _ in range(rng.randint(200, 900))) for _ in range(6)]
    tails = [" ".join(rng.choice("klmnopqrst") * rng.randint(1, 3) for _ in range(rng.randint(5, 120))) for _ in range(40)]
    def metrics():
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l.startswith("cortiq_") and " " in l}

    # The baseline after a warm-up that serves every head with the longest tail uncached (every
    # weight page touched, the slot's KV pages and the scratch buffers at the workload's
    # high-water mark), so that what grows after is the cache.
    longest = max(tails, key=len)
    for h in heads:
        ask(client, [{"role": "user", "content": h + "\n" + longest}], 4, cache_prompt=False)
    base = rss_mb(proc.pid)
    peak, peak_cache = base, 0.0
    for i in range(a.requests):
        msgs = [{"role": "user", "content": rng.choice(heads) + "\n" + rng.choice(tails)}]
        ask(client, msgs, 4)
        peak = max(peak, rss_mb(proc.pid))
        peak_cache = max(peak_cache, metrics()["cortiq_cache_bytes"] / 2**20)
    val = metrics()
    hits, misses = val["cortiq_cache_hits_total"], val["cortiq_cache_misses_total"]
    print(f"## memory: {a.requests} requests, --cache-ram {a.cache_ram} MiB: RSS {base:.0f} MiB before, "
          f"peak {peak:.0f} MiB (+{peak - base:.0f}); cache at most {peak_cache:.0f} MiB, at the end {val['cortiq_cache_bytes'] / 2**20:.0f} MiB in "
          f"{val['cortiq_cache_entries']:.0f} entries, {val['cortiq_cache_evictions_total']:.0f} evictions; "
          f"hit rate {hits / max(1, hits + misses):.2f} ({hits:.0f} of {hits + misses:.0f}), "
          f"{val['cortiq_cache_reused_tokens_total']:.0f} tokens reused, {val['cortiq_prompt_tokens_total']:.0f} computed "
          f"(reuse {val['cortiq_cache_reused_tokens_total'] / max(1, val['cortiq_cache_reused_tokens_total'] + val['cortiq_prompt_tokens_total']):.2f} "
          f"of prompt positions, warm-up and refills included)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--cortiq", default="target/release/cortiq")
    ap.add_argument("--llama-bin", default="/tmp/lcpp-src/build/bin")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--long", type=int, default=8192)
    ap.add_argument("--parts", default="chat,speed,memory")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--cache-ram", type=int, default=512)
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--every", type=int, default=1024, help="cortiq's --cache-checkpoint-every")
    ap.add_argument("--raw", action="store_true", help="completions over a plain transcript (no chat template)")
    a = ap.parse_args()
    global RAW
    RAW = a.raw
    parts = a.parts.split(",")
    procs = {}
    try:
        procs["cortiq"] = (start_cortiq(a, 18801, 2048), 18801)
        if "chat" in parts and not a.skip_llama:
            procs["llama.cpp"] = (start_llama(a, 18802), 18802)
        clients = {n: openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=3600)
                   for n, (_, port) in procs.items()}
        if "chat" in parts and a.raw:
            chat_ids(a, {n: port for n, (_, port) in procs.items()}, clients)
        elif "chat" in parts:
            chat(a, clients)
        if "speed" in parts:
            speed(a, clients["cortiq"], procs["cortiq"][1])
        for p, _ in procs.values():
            p.kill()
        procs = {}
        if "memory" in parts:
            p = start_cortiq(a, 18803, a.cache_ram)
            procs["mem"] = (p, 18803)
            memory(a, p, openai.OpenAI(base_url="http://127.0.0.1:18803/v1", api_key="x", timeout=3600), 18803)
    finally:
        for p, _ in procs.values():
            p.kill()


if __name__ == "__main__":
    main()
