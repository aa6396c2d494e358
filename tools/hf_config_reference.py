#!/usr/bin/env python3
"""Reference values for cortiq-formats' config.json normalization (crates/formats/src/hf.rs).

Owns: crates/engine/tests/fixtures/hf_configs/v5/*.json and .../hf_configs/expected.json

Input: crates/engine/tests/fixtures/hf_configs/*.json, small transformers-4-style configs
modelled on real checkpoints (SmolLM2, Qwen2.5, Qwen3, Llama 3.2, Gemma 3, Qwen3-Next, LFM2).
For each, transformers 5.24 loads it (AutoConfig.from_pretrained), which applies the class
defaults and normalizes rope / layer types; we then
  - save it back with save_pretrained: that is the genuine transformers-5 key style of the same
    model, written to hf_configs/v5/<name>.json (reloading it must give the same values);
  - record what the loaded config says (text sub-config for multimodal models) in expected.json.
The Rust test parses both the v4 input and the v5 output and compares with expected.json.

Pinned: transformers==5.24.0 (torch is NOT needed for configs).
    python3 -m venv /tmp/v && /tmp/v/bin/pip install transformers==5.24.0
    /tmp/v/bin/python tools/hf_config_reference.py
"""

import json
import tempfile
from pathlib import Path

import transformers
from transformers import AutoConfig

assert transformers.__version__ == "5.24.0", transformers.__version__

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "crates/engine/tests/fixtures/hf_configs"


def ids(v):
    if v is None:
        return []
    return list(v) if isinstance(v, (list, tuple)) else [v]


def summarize(cfg):
    t = cfg.get_text_config()
    get = lambda k, d=None: getattr(t, k, d)
    head_dim = get("head_dim") or t.hidden_size // t.num_attention_heads
    return {
        "model_type": t.model_type,
        "outer_model_type": cfg.model_type if t is not cfg else None,
        "hidden_size": t.hidden_size,
        "intermediate_size": t.intermediate_size,
        "num_hidden_layers": t.num_hidden_layers,
        "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": get("num_key_value_heads") or t.num_attention_heads,
        "head_dim": head_dim,
        "vocab_size": t.vocab_size,
        "max_position_embeddings": t.max_position_embeddings,
        "rms_norm_eps": get("rms_norm_eps", get("norm_eps")),
        # The top config's flag is what PreTrainedModel ties on.
        "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
        "attention_bias": bool(get("attention_bias", False)),
        "hidden_act": get("hidden_activation") or get("hidden_act"),
        "sliding_window": get("sliding_window"),
        "query_pre_attn_scalar": get("query_pre_attn_scalar"),
        "attn_logit_softcapping": get("attn_logit_softcapping"),
        "final_logit_softcapping": get("final_logit_softcapping"),
        "bos_token_id": get("bos_token_id"),
        "eos_token_ids_text": ids(get("eos_token_id")),
        "eos_token_ids_top": ids(getattr(cfg, "eos_token_id", None)) if t is not cfg else None,
        "pad_token_id": get("pad_token_id"),
        "dtype": None if getattr(cfg, "dtype", None) is None else str(cfg.dtype).replace("torch.", ""),
        "layer_types": list(get("layer_types")) if get("layer_types") is not None else None,
        "rope_parameters": get("rope_parameters"),
    }


def main():
    (DIR / "v5").mkdir(exist_ok=True)
    expected = {}
    for src in sorted(DIR.glob("*.json")):
        if src.name == "expected.json":
            continue
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            (Path(a) / "config.json").write_text(src.read_text())
            cfg = AutoConfig.from_pretrained(a)
            cfg.save_pretrained(b)
            v5 = (Path(b) / "config.json").read_text()
            again = AutoConfig.from_pretrained(b)
        s, s2 = summarize(cfg), summarize(again)
        assert s == s2, (src.name, s, s2)
        (DIR / "v5" / src.name).write_text(v5)
        expected[src.stem] = s
    (DIR / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"{len(expected)} configs")


if __name__ == "__main__":
    main()
