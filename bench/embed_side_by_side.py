"""Embeddings side by side: 256 short sentences in one /v1/embeddings request to `cortiq serve`
and to llama-server (`--embedding --pooling last`) on the same GGUF, alternated twice; prints
each time, the ratio, and the cosine between the two servers' vectors for the first 8.

usage: start both servers first, e.g.
  cortiq serve -m MODEL.gguf --port 18434 --ctx 4096
  llama-server -m MODEL.gguf --embedding --pooling last -t 2 -c 8192 -b 2048 -ub 2048 --port 18500
  python3 bench/embed_side_by_side.py
"""
import json, sys, time, urllib.request
def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))
texts = [f"Sentence number {i}: the quick brown fox jumps over the lazy dog {i*7}." for i in range(256)]
for port in (18434, 18500):
    post(port, {"input": texts[:4]})
res = {}
for rep in range(2):
    for name, port in (("cortiq", 18434), ("llama-server", 18500)):
        t = time.time(); r = post(port, {"input": texts}); dt = time.time() - t
        res.setdefault(name, []).append(dt)
        print(f"{name}: 256 inputs in {dt:.2f} s ({256/dt:.1f}/s), tokens {r['usage']['prompt_tokens']}")
a = post(18434, {"input": texts[:8]})["data"]; b = post(18500, {"input": texts[:8]})["data"]
cos = [sum(x*y for x, y in zip(p["embedding"], q["embedding"])) / (sum(x*x for x in p["embedding"])**0.5 * sum(y*y for y in q["embedding"])**0.5) for p, q in zip(a, b)]
print("cosine cortiq vs llama-server:", [round(c, 5) for c in cos])
print("ratio (llama time / cortiq time):", [round(l / c, 2) for c, l in zip(res["cortiq"], res["llama-server"])])
