#!/usr/bin/env python3
"""Random hybrid models of real geometry for speed comparisons with llama.cpp (issue 4,
acceptance 3): weights are random (no trained hybrid checkpoint exists in the registries), the
shapes are the real ones, so both engines do the real work.

  qwen3_5  Qwen3.5-0.8B-like: hidden 1024, 24 layers in a 3 GatedDeltaNet : 1 attention
           pattern, 16 key and value heads x 128, attention 8 heads (2 kv) x 256, FFN 3584,
           vocab 151936, tied embeddings
  lfm2     LFM2-350M-like: hidden 1024, 16 layers (10 conv, 6 attention), 16 heads (8 kv),
           FFN 6656 (before LFM2's auto-adjust), conv kernel 3, vocab 65536

Writes OUT/ (config.json, model.safetensors in bf16, a synthetic byte-level BPE tokenizer of the
vocab size) and OUT/model-bf16.gguf through llama.cpp's own convert_hf_to_gguf.py.

Run with the fixture venv (tools/fixtures/requirements*.txt):
  python tools/bench/gen_real_geometry.py qwen3_5 /tmp/q35-geo /path/to/llama.cpp
Deterministic (torch.manual_seed).
"""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "fixtures"))
import gen_gguf  # noqa: E402  (the fixtures' converter wrapper and byte symbol table)


def config(arch: str):
    if arch == "qwen3_5":
        from transformers import Qwen3_5TextConfig

        return Qwen3_5TextConfig(
            vocab_size=151936, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
            num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_key_head_dim=128,
            linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16,
            linear_conv_kernel_dim=4, max_position_embeddings=32768, tie_word_embeddings=True,
            layer_types=["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(24)],
            pad_token_id=0, bos_token_id=1, eos_token_id=2,
        )
    if arch == "lfm2":
        from transformers import Lfm2Config

        attn = {2, 5, 8, 10, 12, 14}
        return Lfm2Config(
            vocab_size=65536, hidden_size=1024, intermediate_size=6656, num_hidden_layers=16,
            num_attention_heads=16, num_key_value_heads=8, conv_L_cache=3, max_position_embeddings=32768,
            layer_types=["full_attention" if i in attn else "conv" for i in range(16)],
            block_multiple_of=256, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
            tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        )
    sys.exit(f"unknown arch {arch!r} (qwen3_5, lfm2)")


def model_class(arch: str):
    if arch == "qwen3_5":
        from transformers import Qwen3_5ForCausalLM

        return Qwen3_5ForCausalLM
    from transformers import Lfm2ForCausalLM

    return Lfm2ForCausalLM


def synthetic_tokenizer(out: Path, vocab_size: int) -> str:
    """Byte-level BPE with exactly vocab_size tokens: 3 specials, 256 bytes, then merges of
    byte pairs and (pair, byte) triples in a fixed order. Only its size and format matter."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    sym = gen_gguf.byte_symbols()
    specials = ["<pad>", "<bos>", "<eos>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for s in sym:
        vocab[s] = len(vocab)
    merges = []
    for a in sym:
        for b in sym:
            if len(vocab) >= vocab_size:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    pairs = [a + b for a in sym for b in sym]
    i = 0
    while len(vocab) < vocab_size:
        p, c = pairs[i // 256], sym[i % 256]
        vocab[p + c] = len(vocab)
        merges.append((p, c))
        i += 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "TokenizersBackend", "add_bos_token": False, "pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>"})
    )
    return hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest()


def add_mtp(out: Path, arch: str) -> None:
    """llama.cpp's qwen35 converter requires a multi-token-prediction block (real checkpoints
    carry one): append mtp.fc, its norms and one full-attention layer, random, and announce it
    in config.json (mtp_num_hidden_layers 1)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    cfg1 = config(arch)
    cfg1.num_hidden_layers = 1
    cfg1.layer_types = ["full_attention"]
    cfg1.vocab_size = 8
    layer = model_class(arch)(cfg1).to(torch.bfloat16)
    h = cfg1.hidden_size
    extra = {"mtp.fc.weight": torch.randn(h, 2 * h) * 0.02}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        extra[f"mtp.{n}.weight"] = torch.zeros(h)
    for k, v in layer.state_dict().items():
        if k.startswith("model.layers.0."):
            extra["mtp." + k[len("model."):]] = v
    path = out / "model.safetensors"
    with safe_open(path, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    tensors.update({k: v.to(torch.bfloat16).contiguous() for k, v in extra.items()})
    save_file(tensors, str(path), metadata=meta)
    c = json.loads((out / "config.json").read_text())
    c["mtp_num_hidden_layers"] = 1
    (out / "config.json").write_text(json.dumps(c, indent=2))


def main():
    arch, out, llama = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(20261130)
    cfg = config(arch)
    model = model_class(arch)(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    del model
    if arch == "qwen3_5":
        add_mtp(out, arch)
    sha = synthetic_tokenizer(out, cfg.vocab_size)
    code = (
        f"import sys; sys.path.insert(0, {str(HERE.parent / 'fixtures')!r}); import gen_gguf; "
        f"gen_gguf.convert_child(__import__('pathlib').Path({str(llama)!r}), __import__('pathlib').Path({str(out)!r}), "
        f"__import__('pathlib').Path({str(out / 'model-bf16.gguf')!r}), 'bf16', {sha!r})"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"convert_hf_to_gguf.py failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    print(out / "model-bf16.gguf")


if __name__ == "__main__":
    main()
