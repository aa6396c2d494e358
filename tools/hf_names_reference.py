#!/usr/bin/env python3
"""Reference table for cortiq-formats' HF <-> GGUF tensor-name map (crates/formats/src/names.rs).

Owns: crates/engine/tests/fixtures/hf_names_gguf_py.tsv

Asks llama.cpp's own gguf-py (`gguf.get_tensor_name_map(arch, n_blocks).get_name`, the function
convert_hf_to_gguf.py uses) for the GGUF name of every candidate HF tensor name of the dense
architectures llama, qwen2, qwen3, gemma3 over 2 layers, and writes one line per query:

    arch <TAB> hf_name <TAB> gguf_name-or-"-"

The candidates are the per-layer module names of transformers' *ForCausalLM classes for all four
architectures (so names that do not exist in an arch, e.g. q_norm for llama, are checked to map to
nothing), with .weight, and .bias for linear layers.

Pinned: gguf==0.19.0 (pure Python + numpy). Usage:
    python3 -m venv /tmp/v && /tmp/v/bin/pip install gguf==0.19.0
    /tmp/v/bin/python tools/hf_names_reference.py > crates/engine/tests/fixtures/hf_names_gguf_py.tsv
"""

import gguf


ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
N_LAYERS = 2
GLOBAL = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
LINEAR = [
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
]
NORMS = [
    "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
    "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm",
]


def candidates():
    yield from GLOBAL
    for i in range(N_LAYERS):
        for m in LINEAR:
            yield f"model.layers.{i}.{m}.weight"
            yield f"model.layers.{i}.{m}.bias"
        for m in NORMS:
            yield f"model.layers.{i}.{m}.weight"


def main():
    for name in ARCHS:
        arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == name)
        tmap = gguf.get_tensor_name_map(arch, N_LAYERS)
        for hf in candidates():
            g = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
            print(f"{name}\t{hf}\t{g if g is not None else '-'}")


if __name__ == "__main__":
    main()
