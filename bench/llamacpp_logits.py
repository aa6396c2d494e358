#!/usr/bin/env python3
"""cortiq's logits beside llama.cpp's on the same GGUF and tokens (issue 50 point 2: "logits
agree with llama.cpp's" on the random-weight geometry files of bench/moe_geometry.py).

llama.cpp runs through llama-cpp-python's ctypes API (the C API one to one) over an EXISTING
llama.cpp build: the sdist's Python package on PYTHONPATH and LLAMA_CPP_LIB_PATH at the build's
bin/ (libllama.so). Nothing of llama.cpp is built here or linked by cortiq.

Both run the same token ids (seeded, drawn from the vocabulary, no BOS) as one prompt, every
position's logits kept: llama.cpp in one llama_decode (n_ubatch = the length), cortiq in one
forward (`cortiq logits`) under its fast numerics and its exact (f32) ones. Printed per file and
pair (llama.cpp vs fast, llama.cpp vs exact, fast vs exact): max |diff| over all positions and
the vocabulary, that over the logits' standard deviation, the mean |diff|, and how many
positions agree on the arg-max. With random weights a mixture's router may pick a different
expert where two scores are within rounding of each other; the first position whose rows differ
by more than 10x the median position's max |diff| is named as where that happens.

  PYTHONPATH=/tmp/llama/llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=/tmp/llama/build/bin \\
    python bench/llamacpp_logits.py --cortiq target/release/cortiq /tmp/q3moe-4l-q8.gguf ...
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def llama_logits(path: Path, tokens: list[int], threads: int) -> np.ndarray:
    import llama_cpp as L

    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    if not model:
        sys.exit(f"llama.cpp could not load {path}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    cp = L.llama_context_default_params()
    n = len(tokens)
    cp.n_ctx = max(256, n)
    cp.n_batch = cp.n_ubatch = n
    cp.n_seq_max = 1
    cp.n_threads = cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit(f"llama.cpp could not create a context for {path}")
    b = L.llama_batch_init(n, 0, 1)
    b.n_tokens = n
    for i, t in enumerate(tokens):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, i, 1, 1
        b.seq_id[i][0] = 0
    if L.llama_decode(ctx, b) != 0:
        sys.exit("llama_decode failed")
    p = L.llama_get_logits(ctx)
    flat = np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), shape=(n * n_vocab,))
    out = flat.reshape(n, n_vocab).astype(np.float32, copy=True)
    L.llama_batch_free(b)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="+", type=Path)
    ap.add_argument("--cortiq", default="target/release/cortiq")
    ap.add_argument("--n", type=int, default=64, help="tokens (default 64)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=50)
    a = ap.parse_args()
    for path in a.gguf:
        import gguf

        vocab = len(gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"].data)
        # Ids from the first tenth of the vocabulary (ordinary BPE pieces, no special tokens).
        tokens = np.random.default_rng(a.seed).integers(0, vocab // 10, a.n).tolist()
        ref = llama_logits(path, tokens, a.threads)
        ours = {}
        with tempfile.TemporaryDirectory() as td:
            for numerics in ("fast", "exact"):
                out = Path(td) / f"{numerics}.npy"
                subprocess.run(
                    [a.cortiq, "logits", "-m", str(path), "-t", str(a.threads), "-o", str(out), "-b", str(a.n),
                     "--numerics", numerics, "--tokens", ",".join(map(str, tokens))],
                    check=True, stderr=subprocess.DEVNULL,
                )
                ours[numerics] = np.load(out)
        # The scale of the disagreement: llama.cpp (8-bit activations, f16 cache) against cortiq's
        # fast path (the same kinds of rounding) and its exact f32 path, beside cortiq's own fast
        # against exact: llama.cpp agreeing with exact as closely as fast does is agreement
        # within the rounding both make.
        print(f"{path.name}: {a.n} positions, logits' std {ref.std():.4g}")
        for name, x, y in [
            ("llama.cpp vs cortiq fast", ref, ours["fast"]),
            ("llama.cpp vs cortiq exact", ref, ours["exact"]),
            ("cortiq fast vs exact", ours["fast"], ours["exact"]),
        ]:
            d = np.abs(x.astype(np.float64) - y.astype(np.float64))
            per_pos = d.max(axis=1)
            med = float(np.median(per_pos))
            far = np.nonzero(per_pos > 10 * med)[0]
            agree = int((x.argmax(1) == y.argmax(1)).sum())
            print(
                f"  {name}: max |diff| {d.max():.4g} ({d.max() / ref.std():.3g} std), mean {d.mean():.3g}, "
                f"arg-max equal {agree}/{a.n}, "
                + (f"first position past 10x the median position's max: {int(far[0])} ({len(far)})" if len(far) else "no outlier position")
            )

if __name__ == "__main__":
    main()
