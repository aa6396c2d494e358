#!/usr/bin/env python3
"""Random-weight GGUF of a real MoE model's geometry at reduced depth, for speed comparisons of
cortiq and llama.cpp on the same file (issue 50: "side by side with llama.cpp on random-weight
GGUFs of the real geometries at reduced depth").

The weights are N(0, 0.02) (norm gains 1), quantized with the `gguf` package (Q8_0, or MXFP4
for the experts); the tokenizer is copied from a GGUF of the same vocabulary, so both tools
tokenize and run it like the released file. Speed only: the text it writes is noise.

Usage (the venv needs numpy and gguf==0.19.0):
  python bench/moe_geometry.py --geometry qwen3-30b-a3b --layers 4 --tokenizer QWEN.gguf --out q3moe.gguf
The full-size file (issue 50 point 3: Qwen3-30B-A3B's 48 layers in Q4_K_M's type mix, ~17.7 GB,
random blocks instead of quantized draws so it writes at disk speed, one tensor in memory at a time):
  python bench/moe_geometry.py --layers 48 --random-blocks --mix q4_k_m --tokenizer QWEN.gguf --out q3moe-48l-q4km.gguf
Geometries: qwen3-30b-a3b (Qwen3-30B-A3B / Qwen3-Coder-30B-A3B: d 2048, 32 q / 4 kv heads of
128, 128 experts of 768, top-8, vocab 151936); granite-4.0-h-tiny (Mamba2 + one attention layer
in four, 64 experts of 512 top-6 and a shared MLP; the tokenizer's vocabulary); gpt-oss-20b
(`--experts-type MXFP4` for the released file's experts); lfm2-8b-a1b.
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
    # gpt-oss-20b: 64 q / 8 kv heads of 64, sliding (128) and full layers alternating, learned
    # sinks, q/k/v/o biases, YaRN (x32 over 4,096), 32 experts of 2880 top-4 with biases, the
    # router's bias. Its vocabulary is 201,088: the file takes the tokenizer's (a smaller head).
    "gpt-oss-20b": dict(
        arch="gpt-oss", d=2880, heads=64, kv=8, head_dim=64, experts=32, top_k=4, ff_exp=2880, vocab=None,
        theta=150_000.0, eps=1e-5, ctx=131072, window=128, yarn=(32.0, 4096),
    ),
    # LFM2-8B-A1B: short-conv (cache 3) and attention layers (32 q / 8 kv heads of 64, q/k norms)
    # in the released pattern (attention at 2, 6, 10, 14, 18, 21), the first two layers dense
    # (7168), then 32 experts of 1792 top-4, sigmoid router with a selection bias. Its vocabulary
    # is 65,536: the file takes the tokenizer's (a larger head).
    "lfm2-8b-a1b": dict(
        arch="lfm2moe", d=2048, heads=32, kv=8, head_dim=64, experts=32, top_k=4, ff_exp=1792, vocab=None,
        theta=1_000_000.0, eps=1e-5, ctx=128000, ff_dense=7168, dense_first=2, conv=3,
        attn_layers=(2, 6, 10, 14, 18, 21),
    ),
}


def random_blocks(rng: np.random.Generator, shape: tuple[int, ...], qt: gguf.GGMLQuantizationType) -> np.ndarray:
    """Random Q4_K / Q6_K / Q8_0 / MXFP4 blocks of a tensor of `shape`: every quant and
    sub-block scale byte random, the block scales set so the weights have mean ~0 and a
    standard deviation near the drawn tensors' 0.02 (speed and cross-tool agreement only)."""
    bshape = gguf.quant_shape_to_byte_shape(shape, qt)
    block = gguf.GGML_QUANT_SIZES[qt][1]
    x = np.frombuffer(rng.bytes(int(np.prod(bshape))), np.uint8).reshape(-1, block).copy()
    n = x.shape[0]
    if qt == gguf.GGMLQuantizationType.Q4_K:
        # w = d·sc·q − dmin·m, q in 0..15, sc and m in 0..63: dmin = 7.5·d centres it.
        d = np.full(n, 1.0e-4, np.float16)
        x[:, 0:2] = d.view(np.uint8).reshape(n, 2)
        x[:, 2:4] = (d * np.float16(7.5)).view(np.uint8).reshape(n, 2)
    elif qt == gguf.GGMLQuantizationType.Q6_K:
        # w = d·scale·(q − 32), scale a random i8: already centred.
        x[:, 208:210] = np.full(n, 1.7e-5, np.float16).view(np.uint8).reshape(n, 2)
    elif qt == gguf.GGMLQuantizationType.Q8_0:
        # w = d·q, q a random i8.
        x[:, 0:2] = np.full(n, 2.7e-4, np.float16).view(np.uint8).reshape(n, 2)
    elif qt == gguf.GGMLQuantizationType.MXFP4:
        # w = 2^(e − 127)·E2M1(nibble) with |E2M1| ≤ 6: e = 119 keeps |w| ≤ 0.023.
        x[:, 0] = 119
    else:
        raise ValueError(f"no random blocks for {qt.name}")
    return x.reshape(bshape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--geometry", choices=list(GEOMETRIES), default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokenizer", required=True, help="a GGUF whose tokenizer.* fields have the geometry's vocabulary")
    ap.add_argument("--experts-type", choices=["Q8_0", "MXFP4"], default="Q8_0")
    ap.add_argument(
        "--random-blocks",
        action="store_true",
        help="random blocks instead of quantized draws (seconds per GB, for a full-size file)",
    )
    ap.add_argument("--mix", choices=["q8_0", "q4_k_m"], default="q8_0", help="the other matrices' types")
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
    w.add_feed_forward_length(g.get("ff_dense", g["ff_exp"]))
    w.add_head_count(g["heads"])
    hybrid = arch == "granitehybrid"
    gpt_oss = arch == "gpt-oss"
    lfm2 = arch == "lfm2moe"
    # Granite's last layer is its attention layer; LFM2's follow the released pattern; head_count_kv
    # 0 marks a Mamba2 / short-conv layer.
    if hybrid:
        attn = [il == a.layers - 1 for il in range(a.layers)]
    elif lfm2:
        attn = [il in g["attn_layers"] for il in range(a.layers)]
    else:
        attn = [True] * a.layers
    w.add_head_count_kv([g["kv"] if x else 0 for x in attn] if hybrid or lfm2 else g["kv"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(g["theta"])
    w.add_layer_norm_rms_eps(g["eps"])
    w.add_expert_count(g["experts"])
    w.add_expert_used_count(g["top_k"])
    w.add_expert_feed_forward_length(g["ff_exp"])
    if gpt_oss:
        w.add_sliding_window(g["window"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(g["yarn"][0])
        w.add_rope_scaling_orig_ctx_len(g["yarn"][1])
    if lfm2:
        w.add_leading_dense_block_count(g["dense_first"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_shortconv_l_cache(g["conv"])
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

    # Every tensor is declared first and drawn only when its turn to be written comes (the
    # same draws in the same order as drawing them all up front), so a full-size file (~18 GB)
    # streams through memory one tensor at a time.
    plan: list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType, object]] = []

    def q(name: str, shape: tuple[int, ...], qt=gguf.GGMLQuantizationType.Q8_0, role: str = "") -> None:
        if a.mix == "q4_k_m":
            qt = k_mix_type(name, role)
        if a.random_blocks:
            plan.append((name, shape, qt, lambda: random_blocks(rng, shape, qt)))
        else:
            plan.append((name, shape, qt, lambda: quantize(mat(*shape), qt)))

    def f32(name: str, shape: tuple[int, ...], make) -> None:
        plan.append((name, shape, gguf.GGMLQuantizationType.F32, make))

    def ones(name: str, *shape: int) -> None:
        f32(name, shape, lambda: np.ones(shape, np.float32))

    def small(name: str, *shape: int) -> None:
        f32(name, shape, lambda: mat(*shape))

    n_more = a.layers

    def k_mix_type(name: str, role: str) -> gguf.GGMLQuantizationType:
        # llama.cpp's Q4_K_M: Q6_K for the output, and for attn_v / ffn_down in the layers its
        # `use_more_bits` picks (the first and last eighth, every third between); Q4_K elsewhere.
        il = int(name.split(".")[1]) if name.startswith("blk.") else -1
        more = il >= 0 and (il < n_more // 8 or il >= 7 * n_more // 8 or (il - n_more // 8) % 3 == 2)
        if name == "output.weight" or (role in ("attn_v", "ffn_down") and more):
            return gguf.GGMLQuantizationType.Q6_K
        return gguf.GGMLQuantizationType.Q4_K

    exp_t = getattr(gguf.GGMLQuantizationType, a.experts_type)
    q("token_embd.weight", (g["vocab"], d))
    if lfm2:
        ones("token_embd_norm.weight", d)  # LFM2's final norm; the head is tied to the embedding
    else:
        ones("output_norm.weight", d)
        q("output.weight", (g["vocab"], d))
    for il in range(a.layers):
        b = f"blk.{il}."
        ones(b + "attn_norm.weight", d)
        if attn[il]:
            q(b + "attn_q.weight", (g["heads"] * hd, d))
            q(b + "attn_k.weight", (g["kv"] * hd, d))
            q(b + "attn_v.weight", (g["kv"] * hd, d), role="attn_v")
            q(b + "attn_output.weight", (d, g["heads"] * hd))
        if attn[il] and not hybrid and not gpt_oss:
            ones(b + "attn_q_norm.weight", hd)
            ones(b + "attn_k_norm.weight", hd)
        if gpt_oss:
            small(b + "attn_q.bias", g["heads"] * hd)
            small(b + "attn_k.bias", g["kv"] * hd)
            small(b + "attn_v.bias", g["kv"] * hd)
            small(b + "attn_output.bias", d)
            small(b + "attn_sinks.weight", g["heads"])
        if lfm2 and not attn[il]:
            f32(b + "shortconv.conv.weight", (d, g["conv"]), lambda s=(d, g["conv"]): mat(*s) * 10)
            q(b + "shortconv.in_proj.weight", (3 * d, d))
            q(b + "shortconv.out_proj.weight", (d, d))
        if hybrid and not attn[il]:
            nh, inner, ns, ng = g["ssm_heads"], g["ssm_heads"] * g["ssm_head_dim"], g["ssm_state"], g["ssm_groups"]
            conv_dim = inner + 2 * ng * ns
            q(b + "ssm_in.weight", (2 * inner + 2 * ng * ns + nh, d))
            f32(b + "ssm_conv1d.weight", (conv_dim, g["conv"]), lambda s=(conv_dim, g["conv"]): mat(*s) * 10)
            f32(b + "ssm_conv1d.bias", (conv_dim,), lambda n=conv_dim: np.zeros(n, np.float32))
            f32(b + "ssm_dt.bias", (nh,), lambda n=nh: np.zeros(n, np.float32))
            f32(b + "ssm_a", (nh, 1), lambda n=nh: -np.exp(rng.uniform(np.log(0.005), 0, (n, 1))).astype(np.float32))
            ones(b + "ssm_d", nh, 1)
            ones(b + "ssm_norm.weight", ng, inner // ng)
            q(b + "ssm_out.weight", (d, inner))
        ones(b + ("post_attention_norm.weight" if gpt_oss else "ffn_norm.weight"), d)
        if lfm2 and il < g["dense_first"]:
            q(b + "ffn_gate.weight", (g["ff_dense"], d))
            q(b + "ffn_up.weight", (g["ff_dense"], d))
            q(b + "ffn_down.weight", (d, g["ff_dense"]), role="ffn_down")
            continue
        if hybrid:
            q(b + "ffn_gate_shexp.weight", (g["shared"], d))
            q(b + "ffn_up_shexp.weight", (g["shared"], d))
            q(b + "ffn_down_shexp.weight", (d, g["shared"]), role="ffn_down")
        small(b + "ffn_gate_inp.weight", g["experts"], d)
        if gpt_oss:
            small(b + "ffn_gate_inp.bias", g["experts"])
        if lfm2:
            f32(b + "exp_probs_b.bias", (g["experts"],), lambda n=g["experts"]: np.zeros(n, np.float32))
        q(b + "ffn_gate_exps.weight", (g["experts"], g["ff_exp"], d), exp_t)
        q(b + "ffn_up_exps.weight", (g["experts"], g["ff_exp"], d), exp_t)
        q(b + "ffn_down_exps.weight", (g["experts"], d, g["ff_exp"]), exp_t, role="ffn_down")
        if gpt_oss:
            small(b + "ffn_gate_exps.bias", g["experts"], g["ff_exp"])
            small(b + "ffn_up_exps.bias", g["experts"], g["ff_exp"])
            small(b + "ffn_down_exps.bias", g["experts"], d)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if a.mix == "q4_k_m" else gguf.LlamaFileType.MOSTLY_Q8_0)
    total = 0
    for name, shape, qt, _ in plan:
        if qt == gguf.GGMLQuantizationType.F32:
            nbytes = int(np.prod(shape)) * 4
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes)
        else:
            bshape = gguf.quant_shape_to_byte_shape(shape, qt)
            nbytes = int(np.prod(bshape))
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), nbytes, raw_dtype=qt)
        total += nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    done = 0
    for name, shape, qt, make in plan:
        x = make()
        w.write_tensor_data(x)
        done += x.nbytes
        if name.startswith("blk.") and name.endswith(("ffn_down_exps.weight", "ffn_down.weight")):
            print(f"layer {name.split('.')[1]} written ({done / 1e9:.2f} of {total / 1e9:.2f} GB)", flush=True)
    w.close()
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
