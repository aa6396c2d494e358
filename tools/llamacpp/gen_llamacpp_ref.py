#!/usr/bin/env python3
"""llama.cpp reference logits for `--numerics llamacpp` (crates/cli/tests/llamacpp_parity.rs).

Writes crates/cli/tests/data/llamacpp_ref/<model>.json for the three real GGUFs of MODELS.md:
for each prompt, the token ids llama.cpp gives it (BOS as the model adds it, no special-token
parsing), the logits of EVERY prompt position from one llama_decode of the whole prompt
(n_batch = n_ubatch = 512, so one micro-batch), then DECODE_STEPS greedy steps, one token per
llama_decode, each step's logits row. Each row is stored as the sha256 of its f32
little-endian bytes (the whole vocabulary: the bit-for-bit check) plus, for diagnostics only,
its top-8 (id, value) and its values at a few fixed probe ids. With --ppl it also computes
alice29 perplexity exactly as llama-perplexity does (-c 512 -b 512 --chunks 8 -t 2) and stores
the figure in the JSON ("perplexity").

llama.cpp is the one vendored in the PyPI sdist llama-cpp-python==0.3.36 (build 0c1e570), built
from source on the machine that generates (x86-64 AVX-512, GCC 12), AMX off (GCC 12 miscompiles
ggml's AMX kernel; these machines have none), driven through the binding's low-level ctypes API
(llama_cpp.llama_cpp, the C API one to one). It is a generator's dependency only; nothing of
llama.cpp is built into or linked by cortiq.

    python3 -m venv /tmp/lcpp-venv && /tmp/lcpp-venv/bin/pip install cmake ninja numpy
    F="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    PATH=/tmp/lcpp-venv/bin:$PATH CMAKE_BUILD_PARALLEL_LEVEL=2 \
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DCMAKE_C_FLAGS='$F' -DCMAKE_CXX_FLAGS='$F'" \
      /tmp/lcpp-venv/bin/pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36
    /tmp/lcpp-venv/bin/python tools/llamacpp/gen_llamacpp_ref.py --ppl   # ~10 min on 2 cores

The settings are the ones `--numerics llamacpp` reproduces (crates/engine/src/compat.rs):
2 threads (n_threads = n_threads_batch), f16 K and V cache (llama.cpp's default), flash
attention ON (what the default 'auto' picks on CPU; forced here so the reference cannot change
with that heuristic), n_ctx 512, one sequence. Every sequence stays under 256 positions: ggml's
decode attention past 256 cells splits the cache over the threads (KV-split), which cortiq
follows through `set_llamacpp_threads`; below it the thread count does not enter the result.
One prompt is >= 64 tokens so ggml's tiled flash-attention path (micro-batches of >= 64
queries) is covered as well as the one-chunk path (short prompts, decode).
"""

import argparse
import ctypes
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

import llama_cpp as L  # llama-cpp-python==0.3.36, built from the sdist as above

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "crates/cli/tests/data/llamacpp_ref"

# (short name in cortiq's registry, file in the cortiq model cache)
MODELS = [
    ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf"),
    ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
]

PROMPTS = [
    # Short: the one-chunk flash-attention path for the prompt (real_models.rs's greedy prompt).
    "The capital of France is",
    # Code, still under 64 tokens.
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    # >= 64 tokens on every tokenizer: the prompt takes ggml's tiled flash-attention path.
    "A lighthouse keeper kept a logbook for forty years. Each morning he wrote down the direction "
    "of the wind, the height of the waves and the ships that passed the point, and each evening "
    "he added a line about the birds. When the light was automated, the logbooks went to the "
    "town library, where a student noticed that the birds had started arriving two weeks earlier "
    "over the decades. She plotted the dates against the water temperature and found that",
]

DECODE_STEPS = 32
N_THREADS = 2
N_CTX = 512
N_BATCH = 512
N_UBATCH = 512
TOP_K = 8

# ggml type ids (ggml.h): the K/V cache type recorded in the JSON.
GGML_TYPE_NAMES = {0: "f32", 1: "f16", 8: "q8_0"}


def cache_dir() -> Path:
    """The cortiq cache, resolved as `cortiq pull` does (CORTIQ_CACHE, XDG_CACHE_HOME, HOME)."""
    if os.environ.get("CORTIQ_CACHE"):
        return Path(os.environ["CORTIQ_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "cortiq"
    return Path.home() / ".cache" / "cortiq"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def row_sha256(row: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(row, dtype="<f4").tobytes()).hexdigest()


def probe_ids(vocab: int) -> list:
    """Fixed ids spread over the vocabulary (diagnostics only)."""
    return sorted({0, 1, 2, 13, 100, 1000, vocab // 3, vocab // 2, (2 * vocab) // 3, vocab - 1})


class Ctx:
    """One model, one context with the settings above, one reusable batch."""

    def __init__(self, path: Path):
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            sys.exit(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cp = L.llama_context_default_params()
        cp.n_ctx = N_CTX
        cp.n_batch = N_BATCH
        cp.n_ubatch = N_UBATCH
        cp.n_seq_max = 1
        cp.n_threads = N_THREADS
        cp.n_threads_batch = N_THREADS
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
        self.type_k, self.type_v = cp.type_k, cp.type_v
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            sys.exit(f"llama.cpp could not create a context for {path}")
        self.batch = L.llama_batch_init(N_BATCH, 0, 1)

    def settings(self) -> dict:
        return {
            "n_threads": N_THREADS,
            "n_threads_batch": N_THREADS,
            "n_ctx": L.llama_n_ctx(self.ctx),
            "n_batch": L.llama_n_batch(self.ctx),
            "n_ubatch": L.llama_n_ubatch(self.ctx),
            "n_seq_max": 1,
            "flash_attn": "enabled",
            "type_k": GGML_TYPE_NAMES.get(self.type_k, str(self.type_k)),
            "type_v": GGML_TYPE_NAMES.get(self.type_v, str(self.type_v)),
        }

    def tokenize(self, text: str, add_special: bool) -> list:
        raw = text.encode("utf-8")
        buf = (L.llama_token * (len(raw) + 8))()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), add_special, False)
        if n < 0:
            buf = (L.llama_token * (-n))()
            n = L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), add_special, False)
        return list(buf[:n])

    def clear(self):
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)

    def decode(self, tokens: list, pos0: int, outputs) -> np.ndarray:
        """One llama_decode of `tokens` at positions pos0..; `outputs(i)` says whether position
        i of the batch produces logits. Returns those rows [n_out, vocab] (a copy)."""
        b = self.batch
        b.n_tokens = len(tokens)
        n_out = 0
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            want = bool(outputs(i))
            b.logits[i] = 1 if want else 0
            n_out += want
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            sys.exit(f"llama_decode returned {rc}")
        p = L.llama_get_logits(self.ctx)
        flat = np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), shape=(n_out * self.n_vocab,))
        return flat.reshape(n_out, self.n_vocab).astype(np.float32, copy=True)

    def free(self):
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)


def row_record(row: np.ndarray, kind: str, pos: int, probes: list) -> dict:
    top = np.argsort(-row, kind="stable")[:TOP_K]
    return {
        "kind": kind,
        "pos": pos,
        "sha256": row_sha256(row),
        "top": [[int(i), float(row[i])] for i in top],
        "probes": [float(row[i]) for i in probes],
    }


def reference_case(c: Ctx, prompt: str, probes: list) -> dict:
    ids = c.tokenize(prompt, add_special=True)
    assert len(ids) + DECODE_STEPS <= 256, f"{prompt!r}: {len(ids)} + {DECODE_STEPS} positions reach the KV-split path"
    c.clear()
    logits = c.decode(ids, 0, lambda i: True)  # [n_prompt, vocab], one micro-batch
    rows = [row_record(logits[i], "prompt", i, probes) for i in range(len(ids))]
    greedy = []
    last = logits[-1]
    for k in range(DECODE_STEPS):
        tok = int(np.argmax(last))  # llama.cpp's greedy sampler: the first maximum
        greedy.append(tok)
        last = c.decode([tok], len(ids) + k, lambda i: True)[0]
        rows.append(row_record(last, "decode", len(ids) + k, probes))
    return {"prompt": prompt, "add_bos": bool(L.llama_vocab_get_add_bos(c.vocab)), "prompt_ids": ids, "greedy": greedy, "rows": rows}


def perplexity(c: Ctx, text_path: Path, n_ctx: int = 512, n_chunks: int = 8) -> float:
    """llama-perplexity (tools/perplexity/perplexity.cpp, perplexity()) with -c 512 -b 512
    --chunks 8: the file minus one trailing newline, tokenized with add_special; each chunk of
    n_ctx tokens with its first token replaced by BOS, one decode with logits for the second
    half; nll of token i+1 as max + log(sum exp(l - max)) - l[tok] (expf in f32, sums in f64)."""
    text = text_path.read_bytes().decode("utf-8")
    if text.endswith("\n"):
        text = text[:-1]
    tokens = c.tokenize(text, add_special=True)
    add_bos = bool(L.llama_vocab_get_add_bos(c.vocab))
    bos = L.llama_vocab_bos(c.vocab)
    first = n_ctx // 2
    nll, count = 0.0, 0
    for i in range(min(n_chunks, len(tokens) // n_ctx)):
        chunk = list(tokens[i * n_ctx : (i + 1) * n_ctx])
        if add_bos:
            chunk[0] = bos
        c.clear()
        logits = c.decode(chunk, 0, lambda k: k >= first)  # [n_ctx - first, vocab]
        for j in range(n_ctx - 1 - first):
            row = logits[j]
            m = row.max()
            lse = np.log(np.exp(row - m).astype(np.float64).sum())
            nll += -(float(row[tokens[i * n_ctx + first + j + 1]] - m) - lse)
            count += 1
    return float(np.exp(nll / count))


def dump(doc: dict) -> str:
    """JSON with one row per line (reviewable diffs, ~100 KB per model)."""
    one = lambda v: json.dumps(v, separators=(",", ":"))
    head = [f' "{k}": ' + (json.dumps(v, indent=1).replace("\n", "\n ") if isinstance(v, dict) else one(v))
            for k, v in doc.items() if k != "cases"]
    out = "{\n" + ",\n".join(head) + ',\n "cases": [\n'
    cases = []
    for cs in doc["cases"]:
        fields = [f'  "{k}": {one(v)}' for k, v in cs.items() if k != "rows"]
        rows = ",\n".join("   " + one(r) for r in cs["rows"])
        cases.append(" {\n" + ",\n".join(fields) + ',\n  "rows": [\n' + rows + "\n  ]\n }")
    return out + ",\n".join(cases) + "\n ]\n}\n"


# llama.cpp logs every tensor and graph input at load; silent unless --verbose.
_QUIET = L.llama_log_callback(lambda level, text, user_data: None)


def cpu_has_avx512_fp16():
    """Whether this CPU has AVX512-FP16 (what a GGML_NATIVE build here compiles f16 rows to)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "avx512_fp16" in line.split() for line in f)
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*", help="short names to regenerate (default: all three)")
    ap.add_argument("--ppl", action="store_true", help="also compute the alice29 perplexity as llama-perplexity does")
    ap.add_argument("--verbose", action="store_true", help="keep llama.cpp's own log (model and context settings)")
    args = ap.parse_args()
    if not args.verbose:
        L.llama_log_set(_QUIET, ctypes.c_void_p())
    L.llama_backend_init()
    system_info = L.llama_print_system_info().decode()
    print(system_info, file=sys.stderr)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, file in MODELS:
        if args.models and name not in args.models:
            continue
        path = cache_dir() / "models" / file
        if not path.is_file():
            sys.exit(f"{path} is missing: `cortiq pull {name}` first")
        c = Ctx(path)
        probes = probe_ids(c.n_vocab)
        doc = {
            "generator": "tools/llamacpp/gen_llamacpp_ref.py",
            "llama_cpp": {
                "source": "llama-cpp-python==0.3.36 sdist (vendored llama.cpp), built with GGML_NATIVE=ON, AMX off",
                "system_info": system_info.strip(),
                # A native build on an AVX512-FP16 CPU does f16 rows in f16 arithmetic (GCC's
                # __AVX512FP16__); system_info does not say so, the CPU's flags do.
                "avx512_fp16": cpu_has_avx512_fp16(),
            },
            "settings": c.settings(),
            "model": {"name": name, "file": file, "sha256": sha256_file(path)},
            "vocab": c.n_vocab,
            "probe_ids": probes,
            "cases": [reference_case(c, p, probes) for p in PROMPTS],
        }
        if args.ppl:
            text = cache_dir() / "texts" / "alice29.txt"
            ppl = perplexity(c, text)
            doc["perplexity"] = {"text": "alice29.txt", "n_ctx": 512, "n_batch": 512, "chunks": 8, "ppl": ppl, "printed": f"{ppl:.4f}"}
            print(f"{name}: PPL = {ppl:.4f}", file=sys.stderr)
        c.free()
        out = OUT_DIR / f"{name}.json"
        with open(out, "w") as f:
            f.write(dump(doc))
        n_rows = sum(len(cs["rows"]) for cs in doc["cases"])
        print(f"{name}: {n_rows} rows -> {out.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
