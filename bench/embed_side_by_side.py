"""Embeddings side by side: N sentences to `cortiq serve` and to llama-server (`--embedding`)
serving the same GGUF, in requests of --per inputs to /v1/embeddings, the two servers
alternated --reps times; prints each time, the ratio (llama-server's time / cortiq's), and the
cosine between the two servers' vectors (lowest over the first 64 sentences).

Sentences: --text FILE split after . ! ? (those of 4 to 60 words, in order, repeated if short),
else generated ones ("Sentence number i: the quick brown fox ...").

usage: start both servers first, e.g. (all-MiniLM-L6-v2 converted with llama.cpp's
convert_hf_to_gguf.py, mean pooling, 2 threads):
  cortiq serve -m minilm-f16.gguf --port 18434 -t 2
  llama-server -m minilm-f16.gguf --embedding --pooling mean -t 2 -c 8192 -np 16 -b 2048 -ub 2048 --port 18500
  python3 bench/embed_side_by_side.py --n 1000 --per 1000 --text ~/.cache/cortiq/texts/alice29.txt
(decoder embedding models: `--pooling last` on llama-server; cortiq takes the GGUF's own.)
"""
import argparse
import json
import re
import time
import urllib.request


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=3600))


def sentences(path, n):
    if not path:
        return [f"Sentence number {i}: the quick brown fox jumps over the lazy dog {i*7}." for i in range(n)]
    text = " ".join(open(path, encoding="latin-1").read().split())
    keep = [p for p in re.split(r"(?<=[.!?])\s+", text) if 4 <= len(p.split()) <= 60]
    return [keep[i % len(keep)] for i in range(n)]


def run(port, texts, per):
    rows, tokens = [], 0
    t = time.time()
    for i in range(0, len(texts), per):
        r = post(port, {"input": texts[i:i + per]})
        rows += [d["embedding"] for d in r["data"]]
        tokens += r["usage"]["prompt_tokens"]
    return time.time() - t, rows, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--per", type=int, default=256, help="inputs per request")
    ap.add_argument("--text", default=None)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--cortiq", type=int, default=18434)
    ap.add_argument("--llama", type=int, default=18500)
    a = ap.parse_args()
    texts = sentences(a.text, a.n)
    for port in (a.cortiq, a.llama):
        post(port, {"input": texts[:4]})
    res, vecs = {}, {}
    for rep in range(a.reps):
        for name, port in (("cortiq", a.cortiq), ("llama-server", a.llama)):
            dt, rows, tokens = run(port, texts, a.per)
            res.setdefault(name, []).append(dt)
            vecs[name] = rows
            print(f"{name}: {len(texts)} inputs ({tokens} tokens) in {dt:.2f} s ({len(texts)/dt:.1f}/s)")
    def cos(p, q):
        return sum(x * y for x, y in zip(p, q)) / (sum(x * x for x in p) ** 0.5 * sum(y * y for y in q) ** 0.5)
    low = min(cos(p, q) for p, q in zip(vecs["cortiq"][:64], vecs["llama-server"][:64]))
    print(f"lowest cosine cortiq vs llama-server over the first 64: {low:.6f}")
    print("ratio (llama-server time / cortiq time):", [round(l / c, 2) for c, l in zip(res["cortiq"], res["llama-server"])])


if __name__ == "__main__":
    main()
