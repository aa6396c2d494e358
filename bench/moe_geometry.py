#!/usr/bin/env python3
"""Random-weight GGUF of a real MoE model's geometry at reduced depth, for speed comparisons of
cortiq and llama.cpp on the same file (issue 50: "side by side with llama.cpp on random-weight
GGUFs of the real geometries at reduced depth").

The weights are N(0, 0.02) (norm gains 1), quantized with the `gguf` package (Q8_0, or MXFP4
for the experts); the tokenizer is copied from a GGUF of the same vocabulary, so both tools
tokenize and run it like the released file. Speed only: the text it writes is noise.

Usage (the venv needs numpy and gguf==0.19.0):
  python bench/moe_geometry.py --geometry qwen3-30b-a3b --layers 4 --tokenizer QWEN.gguf --out q3moe.gguf
Geometries: qwen3-30b-a3b (Qwen3-30B-A3B / Qwen3-Coder-30B-A3B: d 2048, 32 q / 4 kv heads of
128, 128 experts of 768, top-8, vocab 151936); granite-4.0-h-tiny (Mamba2 + one attention layer
in four, 64 experts of 512 top-6 and a shared MLP; the tokenizer's vocabulary).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import gguf
from gguf.quants import quantize

GEOMETRIES = {
    "qwen3-30b-a3b": dict(
        arch="qwen3moe", d=2048, heads=32, kv=4, head_dim=128, experts=128, top_k=8, ff_exp=768, vocab=151936,
        theta=1_000_000.0, eps=1e-6, ctx=40960,
    ),
    # Granite-4.0-H-Tiny: Mamba2 (48 heads of 64, state 128, 1 group) with an attention layer
    # every tenth (here the last of four), 64 experts of 512 top-6 + a shared MLP of 1024. Its
    # vocabulary is 100,352: the file takes the tokenizer's (a larger head, noted in the results).
    "granite-4.0-h-tiny": dict(
        arch="granitehybrid", d=1536, heads=12, kv=4, head_dim=128, experts=64, top_k=6, ff_exp=512, vocab=None,
        theta=10_000.0, eps=1e-5, ctx=131072, shared=1024, ssm_heads=48, ssm_head_dim=64, ssm_state=128,
        ssm_groups=1, conv=4,
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--geometry", choices=list(GEOMETRIES), default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokenizer", required=True, help="a GGUF whose tokenizer.* fields have the geometry's vocabulary")
    ap.add_argument("--experts-type", choices=["Q8_0", "MXFP4"], default="Q8_0")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=50)
    a = ap.parse_args()
    g = GEOMETRIES[a.geometry]
    rng = np.random.default_rng(a.seed)
    arch, d, hd = g["arch"], g["d"], g["head_dim"]

    tok = gguf.GGUFReader(a.tokenizer)
    n_tok = len(tok.fields["tokenizer.ggml.tokens"].data)
    if g["vocab"] is None:
        g = dict(g, vocab=n_tok)
    if n_tok != g["vocab"]:
        sys.exit(f"{a.tokenizer}: {n_tok} tokens, the geometry's vocabulary is {g['vocab']}")

    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(f"random {a.geometry} ({a.layers} layers)")
    w.add_block_count(a.layers)
    w.add_context_length(g["ctx"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(g["ff_exp"])
    w.add_head_count(g["heads"])
    hybrid = arch == "granitehybrid"
    # The hybrid's last layer is its attention layer; head_count_kv 0 marks a Mamba2 layer.
    attn = [not hybrid or il == a.layers - 1 for il in range(a.layers)]
    w.add_head_count_kv([g["kv"] if x else 0 for x in attn] if hybrid else g["kv"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(g["theta"])
    w.add_layer_norm_rms_eps(g["eps"])
    w.add_expert_count(g["experts"])
    w.add_expert_used_count(g["top_k"])
    w.add_expert_feed_forward_length(g["ff_exp"])
    if hybrid:
        w.add_expert_shared_feed_forward_length(g["shared"])
        w.add_ssm_conv_kernel(g["conv"])
        w.add_ssm_state_size(g["ssm_state"])
        w.add_ssm_group_count(g["ssm_groups"])
        w.add_ssm_inner_size(g["ssm_heads"] * g["ssm_head_dim"])
        w.add_ssm_time_step_rank(g["ssm_heads"])
        w.add_rope_scaling_finetuned(False)
        w.add_attention_scale(0.0078125)
        w.add_embedding_scale(12.0)
        w.add_residual_scale(0.22)
        w.add_logit_scale(6.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    for name, field in tok.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vt = field.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            et = field.types[1]
            if et == gguf.GGUFValueType.STRING:
                vals = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
            else:
                vals = [field.parts[i].tolist()[0] for i in field.data]
            w.add_array(name, vals)
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8", "replace"))
        else:
            w.add_key_value(name, field.parts[field.data[0]].tolist()[0], vt)

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    def q(name: str, x: np.ndarray, qt=gguf.GGMLQuantizationType.Q8_0) -> None:
        w.add_tensor(name, quantize(x, qt), raw_dtype=qt)

    def f32(name: str, x: np.ndarray) -> None:
        w.add_tensor(name, x.astype(np.float32))

    q("token_embd.weight", mat(g["vocab"], d))
    f32("output_norm.weight", np.ones(d, np.float32))
    q("output.weight", mat(g["vocab"], d))
    exp_t = getattr(gguf.GGMLQuantizationType, a.experts_type)
    for il in range(a.layers):
        b = f"blk.{il}."
        f32(b + "attn_norm.weight", np.ones(d, np.float32))
        if attn[il]:
            q(b + "attn_q.weight", mat(g["heads"] * hd, d))
            q(b + "attn_k.weight", mat(g["kv"] * hd, d))
            q(b + "attn_v.weight", mat(g["kv"] * hd, d))
            q(b + "attn_output.weight", mat(d, g["heads"] * hd))
        if attn[il] and not hybrid:
            f32(b + "attn_q_norm.weight", np.ones(hd, np.float32))
            f32(b + "attn_k_norm.weight", np.ones(hd, np.float32))
        if not attn[il]:
            nh, inner, ns, ng = g["ssm_heads"], g["ssm_heads"] * g["ssm_head_dim"], g["ssm_state"], g["ssm_groups"]
            conv_dim = inner + 2 * ng * ns
            q(b + "ssm_in.weight", mat(2 * inner + 2 * ng * ns + nh, d))
            f32(b + "ssm_conv1d.weight", mat(conv_dim, g["conv"]) * 10)
            f32(b + "ssm_conv1d.bias", np.zeros(conv_dim, np.float32))
            f32(b + "ssm_dt.bias", np.zeros(nh, np.float32))
            f32(b + "ssm_a", -np.exp(rng.uniform(np.log(0.005), 0, (nh, 1))).astype(np.float32))
            f32(b + "ssm_d", np.ones((nh, 1), np.float32))
            f32(b + "ssm_norm.weight", np.ones((ng, inner // ng), np.float32))
            q(b + "ssm_out.weight", mat(d, inner))
        f32(b + "ffn_norm.weight", np.ones(d, np.float32))
        if hybrid:
            q(b + "ffn_gate_shexp.weight", mat(g["shared"], d))
            q(b + "ffn_up_shexp.weight", mat(g["shared"], d))
            q(b + "ffn_down_shexp.weight", mat(d, g["shared"]))
        f32(b + "ffn_gate_inp.weight", mat(g["experts"], d))
        q(b + "ffn_gate_exps.weight", mat(g["experts"], g["ff_exp"], d), exp_t)
        q(b + "ffn_up_exps.weight", mat(g["experts"], g["ff_exp"], d), exp_t)
        q(b + "ffn_down_exps.weight", mat(g["experts"], d, g["ff_exp"]), exp_t)
        print(f"layer {il} drawn", flush=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
