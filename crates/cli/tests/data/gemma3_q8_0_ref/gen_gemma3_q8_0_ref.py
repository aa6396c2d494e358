#!/usr/bin/env python3
"""Reference for crates/cli/tests/convert_real.rs: what ggml's Q8_0 conversion of the real
Gemma 3 270M GGUF (gemma-3-270m-q4_k_m.gguf) stores, tensor by tensor, by the `gguf` PyPI
package (gguf-py 0.19.0, whose Q8_0 quantizer is "bit-exact with ggml-quants.c"; the same
package crates/kernels/tests/quantize_q8_0.rs checks quantize_row against).

For each tensor of the GGUF, what `cortiq convert --quant q8_0` must store, as llama.cpp's
llama-quantize would:
- a 1-D tensor (norm gains): f32, its values (already F32 in this file);
- a 2-D tensor already Q8_0 (token_embd and some attn_v): its bytes unchanged (llama-quantize
  copies a tensor whose type is already the target: `quantize = tensor->type != new_type`);
- any other 2-D tensor (Q5_0, Q4_K, Q6_K): gguf.quants.quantize(gguf.quants.dequantize(raw),
  Q8_0), row by row (every row of this model is whole 32-element blocks).
Writes reference.json beside this script: the sha256 of each expected byte string (the whole
model's expected bytes would be ~285 MB; the digests let the test check every byte of every
tensor).

Run: VENV/bin/python gen_gemma3_q8_0_ref.py [PATH/TO/gemma-3-270m-q4_k_m.gguf]
(pip install --no-deps -r tools/fixtures/quant/requirements.txt, plus pyyaml for gguf's import;
default path: the cortiq cache, ~/.cache/cortiq/models/). Deterministic.
"""
import hashlib
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
path = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/cortiq/models/gemma-3-270m-q4_k_m.gguf")
h = hashlib.sha256()
with open(path, "rb") as f:
    for b in iter(lambda: f.read(1 << 24), b""):
        h.update(b)
assert h.hexdigest() == GGUF_SHA256, f"{path}: sha256 {h.hexdigest()} is not the pinned file's"

r = gguf.GGUFReader(path)
tensors = []
for t in r.tensors:
    shape = [int(x) for x in reversed(t.shape)]  # outermost first: [rows, cols] for a matrix
    raw = np.asarray(t.data)
    if len(shape) == 1:
        assert t.tensor_type == T.F32, t.name
        want, stored = np.ascontiguousarray(raw, dtype="<f4").tobytes(), "f32"
    elif t.tensor_type == T.Q8_0:
        want, stored = raw.tobytes(), "q8_0"
    else:
        wide = gguf.quants.dequantize(raw, t.tensor_type).astype(np.float32).reshape(shape)
        assert shape[1] % 32 == 0, t.name
        want, stored = gguf.quants.quantize(wide, T.Q8_0).tobytes(), "q8_0"
        assert len(want) == shape[0] * shape[1] // 32 * 34, t.name
    tensors.append(
        {
            "name": t.name,
            "source_type": t.tensor_type.name,
            "stored": stored,
            "shape": shape,
            "bytes": len(want),
            "sha256": hashlib.sha256(want).hexdigest(),
        }
    )
    print(t.name, t.tensor_type.name, shape, "->", stored, flush=True)

out = {
    "what": "sha256 of the bytes ggml's Q8_0 conversion stores for each tensor of gemma-3-270m-q4_k_m.gguf",
    "generator": "crates/cli/tests/data/gemma3_q8_0_ref/gen_gemma3_q8_0_ref.py",
    "gguf_file": "gemma-3-270m-q4_k_m.gguf",
    "gguf_sha256": GGUF_SHA256,
    "gguf_py": gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0",
    "numpy": np.__version__,
    "tensors": tensors,
}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.json"), "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print("wrote", len(tensors), "tensors")
