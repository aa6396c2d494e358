#!/usr/bin/env python3
"""Expected token ids and chat-template renders for cortiq's tokenizer tests.

Writes, under crates/formats/tests/data/tokenizer/:
  <model>.json         ids of a set of varied texts for each real model vocabulary, from
                       llama.cpp (llama-tokenize) and from Hugging Face transformers loading the
                       same GGUF; the Rust test holds cortiq to llama.cpp's ids and reports where
                       transformers differs.
  hf/                  two small tokenizer.json files trained here with `tokenizers` (byte-level
                       BPE; SentencePiece-style BPE with byte fallback) and the ids/decodes that
                       library gives, for the tokenizer.json backend.
  chat_templates.json  chat templates rendered by transformers' own renderer
                       (render_jinja_template, the code behind apply_chat_template).

Inputs (nothing is downloaded here):
  * the GGUFs in the model cache (~/.cache/cortiq/models, as `cortiq pull` leaves them),
    checked against their sha256;
  * llama-cpp-python==0.3.36's source package in ~/.cache/cortiq/testdata (the tokenizer
    conformance test fetches it): its vendored llama.cpp provides a Gemma chat template and a
    Gemma 4 vocabulary whose metadata carries another;
  * brotli==1.2.1's source package in ~/.cache/cortiq/testdata (tests fetch it too): its
    alice29.txt (152 KB) is tokenized whole; only the id count and digests are stored;
  * --llama-tokenize PATH: llama.cpp's llama-tokenize built from that same vendored source
    (cmake ... --target llama-tokenize). Without it only transformers ids are written.

Pinned environment (fixture generation only; CI never runs this):
  pip install transformers==5.24.0 gguf==0.19.0 tokenizers==0.23.3 jinja2==3.1.6 numpy==2.4.6
  plus torch==2.15.0 (CPU is enough), which transformers' GGUF reader imports.

Usage: python tools/tokenizer/gen_expected.py --llama-tokenize /path/to/llama-tokenize
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

PINNED = {"transformers": "5.24.0", "gguf": "0.19.0", "tokenizers": "0.23.3", "jinja2": "3.1.6"}

MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "qwen2.5-coder": (
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}

BROTLI = "brotli-1.2.1.tar.gz"
BROTLI_SHA256 = "02b2f7b5a83485efe448a44ddf7983def05c3bb1dcf917d4f7154070260e13de"
ALICE = "brotli-1.2.1/tests/testdata/alice29.txt"
CHUNK = 1024

SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VENDOR = "llama_cpp_python-0.3.36/vendor/llama.cpp/"

# Texts tokenized as plain text (add_special=False, parse_special=False) for every model.
TEXTS = {
    "english": "Hello, world! It's 2024-11-30; the price is $1,234.56 (about 7%).\n\n"
    "New paragraph:  two  spaces,   three.\tTab\tseparated.\n",
    "code": 'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n'
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    'if __name__ == "__main__":\n\tprint({"x": [1, 2, 3]}, fib(10))  # 55\n',
    "unicode": "Café naïve façade — “smart quotes” ½ ¼ ×÷ 日本語のテキスト 한국어 텍스트 Привет, мир! "
    "Ελληνικά 🦙🚀 😶\u200d🌫️ 👍🏽 e\u0301 \u200b zero-width",
    "whitespace": "   leading spaces, trailing spaces   \n\n\n\nfour newlines\r\nCRLF  \n \t \n",
    "contractions_digits": "I've been told he's there; 'RE you sure? We'Ve a'lL 3333333 1234567890 0.5e-3",
    "special_as_text": "<|im_start|>user\nHi<|im_end|> <start_of_turn>model <bos></s><end_of_turn>",
    "empty": "",
    "single_space": " ",
}

CHAT_PROMPTS = {
    "smollm2": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "qwen2.5-coder": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWrite a haiku about Rust.<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
}

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello! How are you?"}],
    "system_user": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three primes."},
    ],
    "multi_turn": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And times 3?"},
    ],
    "whitespace_unicode": [{"role": "user", "content": "  Grüße 🦙\n  with spaces  "}],
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_root() -> Path:
    if os.environ.get("CORTIQ_CACHE"):
        return Path(os.environ["CORTIQ_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "cortiq"
    return Path.home() / ".cache" / "cortiq"


def llama_cpp_ids(exe: str, model: Path, text: str, add_bos: bool, parse_special: bool) -> list[int]:
    args = [exe, "-m", str(model), "--stdin", "--ids", "--log-disable", "--no-escape"]
    if not add_bos:
        args.append("--no-bos")
    if not parse_special:
        args.append("--no-parse-special")
    out = subprocess.run(args, input=text.encode(), capture_output=True, check=True).stdout.decode()
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def ids_digest(ids: list[int]) -> str:
    return hashlib.sha256(" ".join(map(str, ids)).encode()).hexdigest()


def digests(ids: list[int]) -> dict:
    return dict(
        n=len(ids),
        sha256=ids_digest(ids),
        chunk=CHUNK,
        chunk_sha256=[ids_digest(ids[i : i + CHUNK]) for i in range(0, len(ids), CHUNK)],
        head=ids[:32],
    )


def gen_tokenizer_fixtures(out_dir: Path, llama_tokenize: str | None) -> None:
    from transformers import AutoTokenizer

    models_dir = cache_root() / "models"
    brotli = cache_root() / "testdata" / BROTLI
    if sha256(brotli) != BROTLI_SHA256:
        sys.exit(f"{brotli}: sha256 mismatch")
    with tarfile.open(brotli) as tf:
        alice = tf.extractfile(ALICE).read().decode("utf-8")
    for name, (fname, want_sha) in MODELS.items():
        path = models_dir / fname
        got = sha256(path)
        if got != want_sha:
            sys.exit(f"{path}: sha256 {got}, expected {want_sha}")
        tok = AutoTokenizer.from_pretrained(str(models_dir), gguf_file=fname)
        cases = []
        for tname, text in TEXTS.items():
            cases.append(dict(name=tname, text=text, add_special=False, parse_special=False))
        cases.append(dict(name="chat_prompt", text=CHAT_PROMPTS[name], add_special=True, parse_special=True))
        cases.append(dict(name="english_add_special", text=TEXTS["english"], add_special=True, parse_special=False))
        for c in cases:
            c["hf"] = tok.encode(
                c["text"], add_special_tokens=c["add_special"], split_special_tokens=not c["parse_special"]
            )
            c["llama_cpp"] = (
                llama_cpp_ids(llama_tokenize, path, c["text"], c["add_special"], c["parse_special"])
                if llama_tokenize
                else None
            )
            if c["llama_cpp"] is not None and c["llama_cpp"] != c["hf"]:
                print(f"note: {name}/{c['name']}: llama.cpp and transformers differ", file=sys.stderr)
        long_text = dict(
            source="brotli==1.2.1 " + ALICE.split("/", 1)[1],
            add_special=False,
            parse_special=False,
            hf=digests(tok.encode(alice, add_special_tokens=False, split_special_tokens=True)),
            llama_cpp=digests(llama_cpp_ids(llama_tokenize, path, alice, False, False)) if llama_tokenize else None,
        )
        doc = dict(
            model_file=fname,
            sha256=want_sha,
            generated_by=dict(
                tool="tools/tokenizer/gen_expected.py",
                pinned=PINNED,
                llama_cpp="llama-tokenize from llama-cpp-python==0.3.36 vendor/llama.cpp" if llama_tokenize else None,
            ),
            cases=cases,
            long_text=long_text,
        )
        (out_dir / f"{name}.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote {name}.json ({len(cases)} cases)")


def gguf_str(path: Path, key: str) -> str | None:
    import gguf

    r = gguf.GGUFReader(str(path))
    f = r.fields.get(key)
    return None if f is None else f.contents()


def gguf_token(path: Path, key: str) -> str:
    import gguf

    r = gguf.GGUFReader(str(path))
    tid = int(r.fields[key].contents())
    f = r.fields["tokenizer.ggml.tokens"]
    return bytes(f.parts[f.data[tid]]).decode()


def gen_chat_fixtures(out_dir: Path) -> None:
    import tempfile

    from transformers.utils.chat_template_utils import render_jinja_template

    models_dir = cache_root() / "models"
    sdist = cache_root() / "testdata" / SDIST
    if sha256(sdist) != SDIST_SHA256:
        sys.exit(f"{sdist}: sha256 mismatch")
    templates = []
    for name in ("smollm2", "qwen2.5-coder"):
        path = models_dir / MODELS[name][0]
        templates.append(
            dict(
                name=name,
                source=f"{MODELS[name][0]} tokenizer.chat_template",
                template=gguf_str(path, "tokenizer.chat_template"),
                bos=gguf_token(path, "tokenizer.ggml.bos_token_id"),
                eos=gguf_token(path, "tokenizer.ggml.eos_token_id"),
            )
        )
    with tarfile.open(sdist) as tf, tempfile.TemporaryDirectory() as tmp:
        gemma2 = tf.extractfile(VENDOR + "models/templates/google-gemma-2-2b-it.jinja").read().decode()
        member = tf.getmember(VENDOR + "models/ggml-vocab-gemma-4.gguf")
        tf.extract(member, tmp, filter="data")
        g4 = Path(tmp) / member.name
        templates.append(
            dict(
                name="gemma2",
                source="llama-cpp-python==0.3.36 vendor/llama.cpp/models/templates/google-gemma-2-2b-it.jinja",
                template=gemma2,
                bos="<bos>",
                eos="<eos>",
            )
        )
        templates.append(
            dict(
                name="gemma4",
                source="llama-cpp-python==0.3.36 vendor/llama.cpp/models/ggml-vocab-gemma-4.gguf tokenizer.chat_template",
                template=gguf_str(g4, "tokenizer.chat_template"),
                bos=gguf_token(g4, "tokenizer.ggml.bos_token_id"),
                eos=gguf_token(g4, "tokenizer.ggml.eos_token_id"),
            )
        )
    for t in templates:
        t["cases"] = []
        for cname, msgs in CONVERSATIONS.items():
            for agp in (True, False):
                case = dict(conversation=cname, messages=msgs, add_generation_prompt=agp)
                try:
                    rendered, _ = render_jinja_template(
                        [msgs], chat_template=t["template"], add_generation_prompt=agp,
                        bos_token=t["bos"], eos_token=t["eos"],
                    )
                    case["expected"] = rendered[0]
                except Exception as e:  # the template's own raise_exception
                    case["error"] = str(e)
                t["cases"].append(case)
    doc = dict(generated_by=dict(tool="tools/tokenizer/gen_expected.py", pinned=PINNED), templates=templates)
    (out_dir / "chat_templates.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote chat_templates.json ({len(templates)} templates)")


def train_corpus() -> list[str]:
    brotli = cache_root() / "testdata" / BROTLI
    with tarfile.open(brotli) as tf:
        alice = tf.extractfile(ALICE).read().decode("utf-8")
    return list(TEXTS.values()) + [alice[i : i + 2000] for i in range(0, 40000, 2000)]


def gen_hf_fixtures(out_dir: Path) -> None:
    """Two small tokenizer.json files trained here with the `tokenizers` library (byte-level BPE
    like GPT-2/Qwen, and SentencePiece-style BPE with byte fallback like Llama/Mistral), with the
    ids and decodes `tokenizers` itself gives."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    corpus = train_corpus()
    hf_dir = out_dir / "hf"
    hf_dir.mkdir(exist_ok=True)

    bl = Tokenizer(models.BPE())
    bl.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bl.decoder = decoders.ByteLevel()
    bl.post_processor = processors.ByteLevel(trim_offsets=False)
    bl.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=700,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    bl_cfg = dict(
        bos_token=None,
        eos_token="<|im_end|>",
        add_bos_token=False,
        chat_template=gguf_str(cache_root() / "models" / MODELS["smollm2"][0], "tokenizer.chat_template"),
    )

    sp = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    sp.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    sp.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    sp.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=700,
            special_tokens=["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)],
            show_progress=False,
        ),
    )
    # The byte tokens were given as special tokens only to reserve them in the vocabulary; a real
    # Llama-style tokenizer.json has them as ordinary vocabulary entries, not added tokens.
    spj = json.loads(sp.to_str())
    spj["added_tokens"] = [t for t in spj["added_tokens"] if not t["content"].startswith("<0x")]
    sp = Tokenizer.from_str(json.dumps(spj))
    sp.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", sp.token_to_id("<s>"))]
    )

    for name, tok, cfg in (("bytelevel", bl, bl_cfg), ("spm_byte_fallback", sp, None)):
        (hf_dir / f"{name}.tokenizer.json").write_text(tok.to_str(pretty=False) + "\n")
        if cfg is not None:
            (hf_dir / f"{name}.tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=1) + "\n")
        cases = []
        texts = dict(TEXTS)
        texts["chat"] = CHAT_PROMPTS["smollm2"]
        # Characters absent from the training corpus: byte fallback / rare byte-level pieces.
        texts["unseen_chars"] = "Snowman \u2603, fraktur \U0001d518\U0001d52b\U0001d526, \u222e \u2295 \U0001f71a."
        for tname, text in texts.items():
            tok.encode_special_tokens = False
            parsed = tok.encode(text, add_special_tokens=False).ids
            with_special = tok.encode(text, add_special_tokens=True).ids
            tok.encode_special_tokens = True
            literal = tok.encode(text, add_special_tokens=False).ids
            tok.encode_special_tokens = False
            cases.append(
                dict(
                    name=tname,
                    text=text,
                    ids=parsed,
                    ids_add_special=with_special,
                    ids_literal_special=literal,
                    decode_skip_special=tok.decode(parsed, skip_special_tokens=True),
                )
            )
        doc = dict(
            tokenizer=f"{name}.tokenizer.json",
            tokenizer_config=f"{name}.tokenizer_config.json" if cfg is not None else None,
            generated_by=dict(tool="tools/tokenizer/gen_expected.py", pinned=PINNED),
            cases=cases,
        )
        (hf_dir / f"{name}.expected.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote hf/{name}.* ({len(cases)} cases)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-tokenize", help="path to llama.cpp's llama-tokenize (from llama-cpp-python 0.3.36)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "crates/formats/tests/data/tokenizer"))
    ap.add_argument("--only", choices=["tokenizer", "chat", "hf"], help="generate one kind of fixture")
    args = ap.parse_args()
    import importlib.metadata as md

    for pkg, ver in PINNED.items():
        have = md.version(pkg)
        if have != ver:
            print(f"warning: {pkg} {have} installed, {ver} pinned", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "tokenizer"):
        gen_tokenizer_fixtures(out, args.llama_tokenize)
    if args.only in (None, "chat"):
        gen_chat_fixtures(out)
    if args.only in (None, "hf"):
        gen_hf_fixtures(out)


if __name__ == "__main__":
    main()
