#!/usr/bin/env python3
"""A random-weight Q4_K GGUF of Qwen3.5-0.8B's geometry (default) or, with --arch qwen2, a Q4_K_M
GGUF of Qwen2.5-1.5B's geometry, written in pure Python (standard library only), for speed
comparisons of cortiq with llama.cpp where torch is not at hand (gen_real_geometry.py does the
same through transformers and llama.cpp's converter).

--arch qwen35 (default; llama.cpp architecture `qwen35`): hidden 1024, 24 layers, layer i full
attention when (i + 1) % 4 == 0 and a GatedDeltaNet otherwise (16 key heads and 16 value heads
x 128, conv kernel 4); gated attention with 8 heads / 2 kv heads x 256 (q_proj yields q and
gate, q/k norms, 64 rotary dims); SwiGLU FFN 3584; vocab 151936; tied embeddings. With --mtp
one multi-token prediction block follows as block 24, the way llama.cpp's converter writes
Qwen3.5's MTP layer (blk.24.nextn.eh_proj/enorm/hnorm/shared_head_norm plus a full attention
layer and FFN), with block_count 25 and qwen35.nextn_predict_layers 1.

--arch qwen2 (llama.cpp architecture `qwen2`): hidden 1536, 28 layers, attention with 12 heads /
2 kv heads x 128 and F32 biases on q/k/v, SwiGLU FFN 8960, vocab 151936, tied embeddings (no
output.weight), rope theta 1e6, rms eps 1e-6, context 32768.

Nothing about the layout is typed in by hand that the converter decides: the metadata keys (and
their GGUF value types), tensor names per layer kind, tensor order and which tensors stay F32 are
read from the committed tiny fixture of the architecture, crates/engine/tests/fixtures/qwen3_5/
model.gguf or crates/engine/tests/fixtures/qwen2/model.gguf (both written by llama.cpp's
convert_hf_to_gguf.py), and the shape formulas below are checked against every tensor of that
fixture before anything is written. The qwen2 fixture is sharded, so its blocks come out of the
converter interleaved; the block layout is taken from blk.0 (whole in the first shard) and every
other fixture block must hold the same tensors; the blocks are written in layer order.

Tensor types, qwen35: every 2-D matrix the converter stored in BF16 becomes Q4_K (GGML type 12),
except token_embd (also the output matrix, tied) which becomes Q6_K (type 14), as llama.cpp's
Q4_K mixes keep it; norms, ssm_a, ssm_dt.bias and ssm_conv1d stay F32. general.file_type says
MOSTLY_Q4_K_S (14).

Tensor types, qwen2: llama.cpp's Q4_K_M mix (llama-quant.cpp): token_embd (the tied output matrix)
Q6_K; attn_v and ffn_down Q6_K on the layers use_more_bits(i, n) picks (i < n/8 || i >= 7n/8 ||
(i - n/8) % 3 == 2, here layers 0-2, 5, 8, ..., 23, 24-27), Q4_K otherwise; every other 2-D matrix
Q4_K; the 1-D tensors (the fixture is all F32: norms and biases) stay F32. general.file_type says
MOSTLY_Q4_K_M (15).

Values are random but sane, so activations stay finite through all layers: Q4_K blocks have
random scales and quants with d ~ 1.2e-4 and dmin = 7.5 d (zero-mean weights, std ~ 0.03), Q6_K
blocks random with d ~ 6.5e-5 (std ~ 0.09) for token_embd and d ~ 2.3e-5 (std ~ 0.03, as the Q4_K
matrices) for qwen2's in-layer Q6_K matrices; norm gains 1 +- 0.1, ssm_a = -exp(U(0, ln 16)) as
HF's A_log init, dt bias U(-0.5, 0.5), conv taps U(-0.25, 0.25), q/k/v biases U(-0.1, 0.1). The
quantized bytes come from a seeded pool of ~8k blocks (per type and scale) tiled through each
tensor from a random start (a prime pool length, so rows do not repeat in step), which keeps the
0.4-1 GB of output at disk speed. Values are therefore
not independent; they are realistic for timing, not for quality.

The tokenizer is synthetic (the fixture's has 256 tokens and no merges, which llama.cpp refuses
for a gpt2 vocabulary): 256 GPT-2 byte tokens, all 65536 byte pairs and 86141 byte triples, each
with its merge, and <|endoftext|> / <|im_start|> / <|im_end|> as control tokens at the end, pre
"qwen35" (or "qwen2"); 151677 merges, so loading costs about what a real Qwen vocabulary costs.

    python3 tools/bench/gen_geometry_gguf.py /tmp/q35-geo.gguf
    python3 tools/bench/gen_geometry_gguf.py --mtp /tmp/q35-geo-mtp.gguf
    python3 tools/bench/gen_geometry_gguf.py --arch qwen2 /tmp/qwen2-1.5b-geo.gguf

Deterministic: the same --seed (default 0) gives the same bytes.
"""
import argparse
import math
import random
import struct
import sys
import time
from pathlib import Path

FIXTURES = {arch: Path(__file__).resolve().parents[2] / f"crates/engine/tests/fixtures/{d}/model.gguf"
            for arch, d in (("qwen35", "qwen3_5"), ("qwen2", "qwen2"))}
ALIGN = 32  # GGUF default (no general.alignment key)

# The models written: Qwen3.5-0.8B's text geometry, with gen_real_geometry.py's vocab so the files
# compare, and Qwen2.5-1.5B's.
GEOMETRY = {
    "qwen35": dict(d=1024, n_layers=24, ff=3584, vocab=151936, nh=8, nkv=2, hd=256, nk=16, dk=128,
                   nv=16, dv=128, conv=4, rot=64, rope_sections=[11, 11, 10, 0], ctx=262144, interval=4),
    "qwen2": dict(d=1536, n_layers=28, ff=8960, vocab=151936, nh=12, nkv=2, hd=128, ctx=32768,
                  theta=1e6, eps=1e-6),
}

# GGUF metadata value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q", F64: "d"}
# GGML tensor types used here: (name, values per block, bytes per block).
GGML = {0: ("F32", 1, 4), 12: ("Q4_K", 256, 144), 14: ("Q6_K", 256, 210), 30: ("BF16", 1, 2)}
T_F32, T_Q4K, T_Q6K = 0, 12, 14
Q6K_D = 6.5e-5  # Q6_K super-block scale: weight std ~ 0.09 (token_embd)
Q6K_D_LAYER = 2.3e-5  # std ~ 0.03, as the Q4_K matrices (qwen2's Q4_K_M in-layer Q6_K matrices)


# ---- reading ------------------------------------------------------------------------------------

class Reader:
    def __init__(self, data: bytes):
        self.b, self.o = data, 0

    def take(self, fmt: str):
        v = struct.unpack_from("<" + fmt, self.b, self.o)
        self.o += struct.calcsize("<" + fmt)
        return v[0]

    def string(self) -> str:
        n = self.take("Q")
        s = self.b[self.o:self.o + n].decode("utf-8")
        self.o += n
        return s

    def value(self, ty: int):
        if ty == STR:
            return self.string()
        if ty == ARR:
            ety, n = self.take("I"), self.take("Q")
            return (ety, [self.value(ety) for _ in range(n)])
        return self.take(SCALAR[ty])


def read_gguf(path: Path, head_only_bytes: int = 1 << 26):
    """(metadata [(key, type, value)], tensors [(name, dims, ggml type, offset)], data start).
    Array values are (element type, list). Reads only the first head_only_bytes of the file."""
    with open(path, "rb") as f:
        r = Reader(f.read(head_only_bytes))
    if r.b[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    r.o = 4
    version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
    if version != 3:
        sys.exit(f"{path}: GGUF version {version}, expected 3")
    meta = []
    for _ in range(n_kv):
        key = r.string()
        ty = r.take("I")
        meta.append((key, ty, r.value(ty)))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("Q") for _ in range(r.take("I"))]
        tensors.append((name, dims, r.take("I"), r.take("Q")))
    return meta, tensors, -(-r.o // ALIGN) * ALIGN


# ---- geometry -----------------------------------------------------------------------------------

def hparams_of(meta: dict) -> dict:
    """The geometry a qwen35 file's metadata states (the inverse of what main() writes)."""
    g = lambda k: meta[f"qwen35.{k}"][1]  # noqa: E731
    nv, inner = g("ssm.time_step_rank"), g("ssm.inner_size")
    mtp = meta.get("qwen35.nextn_predict_layers", (U32, 0))[1]
    return dict(d=g("embedding_length"), n_layers=g("block_count") - mtp, mtp=mtp, ff=g("feed_forward_length"),
                vocab=len(meta["tokenizer.ggml.tokens"][1][1]), nh=g("attention.head_count"),
                nkv=g("attention.head_count_kv"), hd=g("attention.key_length"), nk=g("ssm.group_count"),
                dk=g("ssm.state_size"), nv=nv, dv=inner // nv, conv=g("ssm.conv_kernel"))


def shape(name: str, h: dict) -> list:
    """GGUF dims (ne0 = the input / contiguous dimension first) of a qwen35 tensor."""
    conv_ch = 2 * h["nk"] * h["dk"] + h["nv"] * h["dv"]  # [q | k | v] channels of the GDN conv
    d = h["d"]
    table = {
        "token_embd.weight": [d, h["vocab"]], "output.weight": [d, h["vocab"]], "output_norm.weight": [d],
        "attn_norm.weight": [d], "post_attention_norm.weight": [d],
        "ffn_gate.weight": [d, h["ff"]], "ffn_up.weight": [d, h["ff"]], "ffn_down.weight": [h["ff"], d],
        # GatedDeltaNet
        "attn_qkv.weight": [d, conv_ch], "attn_gate.weight": [d, h["nv"] * h["dv"]],
        "ssm_alpha.weight": [d, h["nv"]], "ssm_beta.weight": [d, h["nv"]], "ssm_a": [h["nv"]],
        "ssm_dt.bias": [h["nv"]], "ssm_conv1d.weight": [h["conv"], conv_ch], "ssm_norm.weight": [h["dv"]],
        "ssm_out.weight": [h["nv"] * h["dv"], d],
        # gated attention: q rows are [q | gate] per head
        "attn_q.weight": [d, 2 * h["nh"] * h["hd"]], "attn_k.weight": [d, h["nkv"] * h["hd"]],
        "attn_v.weight": [d, h["nkv"] * h["hd"]], "attn_output.weight": [h["nh"] * h["hd"], d],
        "attn_q_norm.weight": [h["hd"]], "attn_k_norm.weight": [h["hd"]],
        # MTP: eh_proj maps [embedding | hidden] (2d) to d
        "nextn.eh_proj.weight": [2 * d, d], "nextn.enorm.weight": [d], "nextn.hnorm.weight": [d],
        "nextn.shared_head_norm.weight": [d],
    }
    suffix = name.split(".", 2)[2] if name.startswith("blk.") else name
    if suffix not in table:
        sys.exit(f"fixture tensor '{name}' has no shape formula here; the converter changed, extend shape()")
    return table[suffix]


def hparams_of_qwen2(meta: dict) -> dict:
    """The geometry a qwen2 file's metadata states (head_dim is d / heads: no key_length key)."""
    g = lambda k: meta[f"qwen2.{k}"][1]  # noqa: E731
    d, nh = g("embedding_length"), g("attention.head_count")
    return dict(d=d, n_layers=g("block_count"), ff=g("feed_forward_length"),
                vocab=len(meta["tokenizer.ggml.tokens"][1][1]), nh=nh, nkv=g("attention.head_count_kv"), hd=d // nh)


def shape_qwen2(name: str, h: dict) -> list:
    """GGUF dims (ne0 first) of a qwen2 tensor."""
    d, q, kv = h["d"], h["nh"] * h["hd"], h["nkv"] * h["hd"]
    table = {
        "token_embd.weight": [d, h["vocab"]], "output.weight": [d, h["vocab"]], "output_norm.weight": [d],
        "attn_norm.weight": [d], "ffn_norm.weight": [d],
        "ffn_gate.weight": [d, h["ff"]], "ffn_up.weight": [d, h["ff"]], "ffn_down.weight": [h["ff"], d],
        "attn_q.weight": [d, q], "attn_q.bias": [q], "attn_k.weight": [d, kv], "attn_k.bias": [kv],
        "attn_v.weight": [d, kv], "attn_v.bias": [kv], "attn_output.weight": [q, d],
    }
    suffix = name.split(".", 2)[2] if name.startswith("blk.") else name
    if suffix not in table:
        sys.exit(f"fixture tensor '{name}' has no shape formula here; the converter changed, extend shape_qwen2()")
    return table[suffix]


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's (llama-quant.cpp) choice of the layers whose attn_v / ffn_down Q4_K_M keeps in Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, ndim: int, n_layers: int) -> int:
    """The GGML type llama.cpp's Q4_K_M gives a qwen2 tensor (tied embeddings: token_embd is the output)."""
    if ndim == 1:
        return T_F32
    if name in ("token_embd.weight", "output.weight"):
        return T_Q6K
    parts = name.split(".")
    if parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down") and use_more_bits(int(parts[1]), n_layers):
        return T_Q6K
    return T_Q4K


def templates(tensors: list, recurrent: list, n_layers: int):
    """From the fixture's tensor list: the (suffix, type) lists of a GatedDeltaNet block, an
    attention block and the MTP block, and the non-block tensors before and after the blocks."""
    def block(i):
        return [(n.split(".", 2)[2], ty) for n, _, ty, _ in tensors if n.startswith(f"blk.{i}.")]
    rec = block(recurrent.index(True))
    att = block(recurrent[:n_layers].index(False))
    mtp = block(n_layers) if len(recurrent) > n_layers else None
    first_blk = next(i for i, t in enumerate(tensors) if t[0].startswith("blk."))
    head = [(n, ty) for n, _, ty, _ in tensors[:first_blk]]
    tail = [(n, ty) for n, _, ty, _ in tensors[first_blk:] if not n.startswith("blk.")]
    return rec, att, mtp, head, tail


def templates_qwen2(tensors: list, n_layers: int):
    """From the (sharded, so interleaved) qwen2 fixture: the (suffix, number of dims) list of a block,
    in blk.0's order, and the non-block tensors before and after the blocks."""
    def block(i):
        return [(n.split(".", 2)[2], len(dims)) for n, dims, _, _ in tensors if n.startswith(f"blk.{i}.")]
    blk = block(0)
    for i in range(1, n_layers):
        if sorted(block(i)) != sorted(blk):
            sys.exit(f"fixture block {i} holds other tensors than block 0: {sorted(block(i))} vs {sorted(blk)}")
    first_blk = next(i for i, t in enumerate(tensors) if t[0].startswith("blk."))
    head = [(n, len(dims)) for n, dims, _, _ in tensors[:first_blk]]
    tail = [(n, len(dims)) for n, dims, _, _ in tensors[first_blk:] if not n.startswith("blk.")]
    return blk, head, tail


# ---- tokenizer ----------------------------------------------------------------------------------

def byte_chars() -> list:
    """GPT-2's bytes_to_unicode in its id order (printable bytes first): the 256 byte tokens."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def vocab(n: int):
    """n tokens (bytes, byte pairs, byte triples, 3 control tokens), their types and merges."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    ch = byte_chars()
    toks, merges = ch[:], []
    for a in ch:
        for b in ch:
            toks.append(a + b)
            merges.append(f"{a} {b}")
    need = n - len(specials) - len(toks)
    if need < 0:
        sys.exit(f"vocab {n} is smaller than {len(toks) + len(specials)}")
    common = ch[:95]  # printable ASCII and the first Latin-1 letters
    triples = ((a + b, c) for a in common for b in common for c in common)
    for _ in range(need):
        ab, c = next(triples)
        toks.append(ab + c)
        merges.append(f"{ab} {c}")
    types = [1] * len(toks) + [3] * len(specials)  # NORMAL, CONTROL
    toks += specials
    return toks, types, merges


# ---- writing ------------------------------------------------------------------------------------

def pack_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def pack_value(ty: int, v) -> bytes:
    if ty == STR:
        return pack_string(v)
    if ty == ARR:
        ety, items = v
        head = struct.pack("<IQ", ety, len(items))
        if ety == STR:
            return head + b"".join(pack_string(s) for s in items)
        return head + struct.pack(f"<{len(items)}{SCALAR[ety]}", *items)
    return struct.pack("<" + SCALAR[ty], v)


def quant_pool(rng: random.Random, ty: int, n_blocks: int, q6k_d: float = Q6K_D) -> bytes:
    """n_blocks random blocks of a k-quant with sane scales (see the module docstring)."""
    size = GGML[ty][2]
    pool = bytearray(rng.randbytes(n_blocks * size))
    for i in range(n_blocks):
        jitter = rng.uniform(0.8, 1.25)
        if ty == T_Q4K:  # y = d * sc * q - dmin * m, sc, m in 0..63, q in 0..15: mean 0 at dmin = 7.5 d
            d = 1.2e-4 * jitter
            struct.pack_into("<ee", pool, i * size, d, 7.5 * d)
        else:  # Q6_K: y = d * sc * (q - 32), sc int8, d last
            struct.pack_into("<e", pool, i * size + 208, q6k_d * jitter)
    return bytes(pool)


def f32_values(rng: random.Random, suffix: str, n: int) -> list:
    if suffix == "ssm_a":  # -exp(A_log), A_log = log U(1, 16)
        return [-math.exp(rng.uniform(0.0, math.log(16.0))) for _ in range(n)]
    if suffix == "ssm_dt.bias":
        return [rng.uniform(-0.5, 0.5) for _ in range(n)]
    if suffix == "ssm_conv1d.weight":
        return [rng.uniform(-0.25, 0.25) for _ in range(n)]
    if suffix.endswith("norm.weight"):  # (1+w) gains are stored folded, so all sit near 1
        return [1.0 + rng.uniform(-0.1, 0.1) for _ in range(n)]
    if suffix in ("attn_q.bias", "attn_k.bias", "attn_v.bias"):
        return [rng.uniform(-0.1, 0.1) for _ in range(n)]
    sys.exit(f"no F32 value rule for '{suffix}'")


def plan_qwen35(args, fmeta: dict, ftensors: list, G: dict, toks: list, types: list):
    """Metadata values and rules, and the tensor plan [(name, GGML type, Q6_K d)] of a qwen35 file."""
    tiny = hparams_of(fmeta)
    for name, dims, _, _ in ftensors:
        if shape(name, tiny) != dims:
            sys.exit(f"fixture tensor {name} has dims {dims}, the formula gives {shape(name, tiny)}")
    frec = [bool(x) for x in fmeta["qwen35.attention.recurrent_layers"][1][1]]
    rec_t, att_t, mtp_t, head_t, tail_t = templates(ftensors, frec, tiny["n_layers"])
    if args.mtp and mtp_t is None:
        sys.exit(f"{args.fixture} has no MTP block to copy the layout of")

    L = G["n_layers"]
    recurrent = [(i + 1) % G["interval"] != 0 for i in range(L)] + [False] * G["mtp"]
    new_vals = {
        "general.name": "Qwen3.5-0.8B geometry (random weights)", "general.size_label": "0.8B",
        "block_count": L + G["mtp"], "context_length": G["ctx"], "embedding_length": G["d"],
        "feed_forward_length": G["ff"], "attention.head_count": G["nh"], "attention.head_count_kv": G["nkv"],
        "rope.dimension_sections": G["rope_sections"], "attention.key_length": G["hd"],
        "attention.value_length": G["hd"], "general.file_type": 14, "nextn_predict_layers": G["mtp"],
        "ssm.conv_kernel": G["conv"], "ssm.state_size": G["dk"], "ssm.group_count": G["nk"],
        "ssm.time_step_rank": G["nv"], "ssm.inner_size": G["nv"] * G["dv"], "attention.recurrent_layers": recurrent,
        "full_attention_interval": G["interval"], "rope.dimension_count": G["rot"],
        "tokenizer.ggml.pre": "qwen35", "tokenizer.ggml.tokens": toks, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": len(toks) - 3, "tokenizer.ggml.eos_token_id": len(toks) - 1,
        "tokenizer.ggml.padding_token_id": len(toks) - 3,
    }
    keep = {"general.architecture", "general.type", "rope.freq_base", "attention.layer_norm_rms_epsilon",
            "general.quantization_version", "tokenizer.ggml.model", "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.add_eos_token"}
    drop = {"tokenizer.ggml.unknown_token_id"} | (set() if args.mtp else {"nextn_predict_layers"})

    # Tensors: the fixture's order with blocks copied from the template of their kind.
    plan = [(n, ty) for n, ty in head_t if n != "output.weight"]  # tied embeddings
    for i in range(L):
        plan += [(f"blk.{i}.{s}", ty) for s, ty in (rec_t if recurrent[i] else att_t)]
    plan += tail_t
    if args.mtp:
        plan += [(f"blk.{L}.{s}", ty) for s, ty in mtp_t]
    plan = [(name, T_F32 if fty == T_F32 else T_Q6K if name == "token_embd.weight" else T_Q4K, Q6K_D)
            for name, fty in plan]
    return new_vals, keep, drop, plan


def plan_qwen2(args, fmeta: dict, ftensors: list, G: dict, toks: list, types: list):
    """Metadata values and rules, and the tensor plan [(name, GGML type, Q6_K d)] of a qwen2 file."""
    tiny = hparams_of_qwen2(fmeta)
    for name, dims, _, _ in ftensors:
        if shape_qwen2(name, tiny) != dims:
            sys.exit(f"fixture tensor {name} has dims {dims}, the formula gives {shape_qwen2(name, tiny)}")
    blk_t, head_t, tail_t = templates_qwen2(ftensors, tiny["n_layers"])
    if G["d"] != G["nh"] * G["hd"]:
        sys.exit("qwen2 states no head_dim: hidden must be heads x head_dim")

    L = G["n_layers"]
    new_vals = {
        "general.name": "Qwen2.5-1.5B geometry (random weights)", "general.size_label": "1.5B",
        "block_count": L, "context_length": G["ctx"], "embedding_length": G["d"],
        "feed_forward_length": G["ff"], "attention.head_count": G["nh"], "attention.head_count_kv": G["nkv"],
        "rope.freq_base": G["theta"], "attention.layer_norm_rms_epsilon": G["eps"], "general.file_type": 15,
        "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": toks, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": len(toks) - 3, "tokenizer.ggml.eos_token_id": len(toks) - 1,
        "tokenizer.ggml.padding_token_id": len(toks) - 3,
    }
    keep = {"general.architecture", "general.type", "general.quantization_version", "tokenizer.ggml.model",
            "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"}
    drop = {"tokenizer.ggml.unknown_token_id"}

    # Tensors: non-block tensors around the blocks in layer order, each block laid out as blk.0.
    plan = [(n, nd) for n, nd in head_t if n != "output.weight"]  # tied embeddings
    for i in range(L):
        plan += [(f"blk.{i}.{s}", nd) for s, nd in blk_t]
    plan += [(n, nd) for n, nd in tail_t if n != "output.weight"]
    out = []
    for name, ndim in plan:
        ty = q4_k_m_type(name, ndim, L)
        out.append((name, ty, Q6K_D if name == "token_embd.weight" else Q6K_D_LAYER))
    return new_vals, keep, drop, out


ARCHS = {"qwen35": (plan_qwen35, shape), "qwen2": (plan_qwen2, shape_qwen2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--arch", choices=list(ARCHS), default="qwen35",
                    help="qwen35: Qwen3.5-0.8B, Q4_K (default); qwen2: Qwen2.5-1.5B, Q4_K_M")
    ap.add_argument("--mtp", action="store_true", help="append one MTP block (blk.24.nextn.*; qwen35 only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fixture", type=Path, help="the architecture's tiny GGUF (default: its committed fixture)")
    args = ap.parse_args()
    t0 = time.time()
    arch = args.arch
    if args.mtp and arch != "qwen35":
        sys.exit("--mtp is for --arch qwen35 only")
    args.fixture = args.fixture or FIXTURES[arch]
    make_plan, shape_of = ARCHS[arch]

    fmeta_list, ftensors, _ = read_gguf(args.fixture)
    fmeta = {k: (ty, v) for k, ty, v in fmeta_list}
    if fmeta["general.architecture"][1] != arch:
        sys.exit(f"{args.fixture}: architecture {fmeta['general.architecture'][1]!r}, expected {arch!r}")

    G = dict(GEOMETRY[arch], mtp=1 if args.mtp else 0)
    L = G["n_layers"]
    toks, types, merges = vocab(G["vocab"])
    new_vals, keep, drop, plan = make_plan(args, fmeta, ftensors, G, toks, types)

    # Metadata: the fixture's keys, order and value types, the geometry's values.
    meta = []
    for key, ty, v in fmeta_list:
        short = key.removeprefix(f"{arch}.")
        if short in drop:
            continue
        if short in new_vals:
            v = (v[0], new_vals[short]) if ty == ARR else new_vals[short]
        elif short not in keep:
            sys.exit(f"fixture metadata key '{key}' has no rule here (keep it or give its value)")
        meta.append((key, ty, v))
        if key == "tokenizer.ggml.token_type":  # the fixture has no merges; llama.cpp needs them
            meta.append(("tokenizer.ggml.merges", ARR, (STR, merges)))

    infos, offset = [], 0
    for name, ty, q6k_d in plan:
        dims = shape_of(name, G)
        per, size = GGML[ty][1:]
        n = math.prod(dims)
        if dims[0] % per:
            sys.exit(f"{name} {dims}: ne0 is not a multiple of {per} for {GGML[ty][0]}")
        offset = -(-offset // ALIGN) * ALIGN
        infos.append((name, dims, ty, offset, n // per * size, (ty, q6k_d if ty == T_Q6K else None)))
        offset += n // per * size

    header = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(meta)))
    for key, ty, v in meta:
        header += pack_string(key) + struct.pack("<I", ty) + pack_value(ty, v)
    for name, dims, ty, off, _, _ in infos:
        header += pack_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ty, off)
    header += bytes(-len(header) % ALIGN)

    rng = random.Random(args.seed)
    n_pool = 8191  # prime: a row of k blocks restarts the pool at a different phase each time
    # One pool per (type, Q6_K scale), drawn in a fixed order: Q4_K, Q6_K at Q6K_D, then the rest.
    pool_keys = [(T_Q4K, None), (T_Q6K, Q6K_D)]
    pool_keys += sorted({i[5] for i in infos if i[2] != T_F32} - set(pool_keys))
    pools = {(ty, d): quant_pool(rng, ty, n_pool, d or Q6K_D) * 2 for ty, d in pool_keys}
    with open(args.out, "wb") as f:
        f.write(header)
        pos = 0
        for name, dims, ty, off, nbytes, pool_key in infos:
            f.write(bytes(off - pos))
            if ty == T_F32:
                suffix = name.split(".", 2)[2] if name.startswith("blk.") else name
                f.write(struct.pack(f"<{nbytes // 4}f", *f32_values(rng, suffix, nbytes // 4)))
            else:
                pool, size = memoryview(pools[pool_key]), GGML[ty][2]
                start, left = rng.randrange(n_pool) * size, nbytes
                while left:
                    chunk = min(left, n_pool * size)
                    f.write(pool[start:start + chunk])
                    left -= chunk
            pos = off + nbytes

    # Read back what was written: counts, offsets and the file's length must agree.
    m2, t2, data0 = read_gguf(args.out, len(header) + 64)
    end = data0 + infos[-1][3] + infos[-1][4]
    size = args.out.stat().st_size
    if len(m2) != len(meta) or [t[:3] for t in t2] != [i[:3] for i in infos] or size != end:
        sys.exit(f"{args.out}: read-back mismatch (file {size} bytes, expected {end})")
    by_type = {}
    for _, _, ty, _, nbytes, _ in infos:
        count, total = by_type.get(GGML[ty][0], (0, 0))
        by_type[GGML[ty][0]] = (count + 1, total + nbytes)
    params = sum(math.prod(i[1]) for i in infos)
    print(f"{args.out}: {arch}, {size / 1e6:.1f} MB, {len(infos)} tensors, {params / 1e6:.1f} M parameters, "
          f"{len(meta)} metadata keys, {L} layers{' + 1 MTP block' if args.mtp else ''}; "
          + ", ".join(f"{k} x{c} {v / 1e6:.1f} MB" for k, (c, v) in by_type.items()) + f"; {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
