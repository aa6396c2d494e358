//! The tokenizer.json backend against the Python `tokenizers` library on the same files.
//!
//! Fixtures (tests/data/tokenizer/hf/, from tools/tokenizer/gen_expected.py): a byte-level BPE
//! (GPT-2/Qwen style, with a tokenizer_config.json naming EOS and a chat template) and a
//! SentencePiece-style BPE with byte fallback whose post-processor adds `<s>` (Llama style, no
//! tokenizer_config.json: BOS and add_bos come from the post-processor). Ids with special tokens
//! parsed, left as text, and with BOS added must equal the library's; decoding must equal its
//! decode(skip_special_tokens=True); streaming must give the same text.

use std::path::PathBuf;

use cortiq_formats::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer/hf")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn check(name: &str) -> Tokenizer {
    let fx: Value = serde_json::from_str(&std::fs::read_to_string(dir().join(format!("{name}.expected.json"))).unwrap()).unwrap();
    let cfg = fx["tokenizer_config"].as_str().map(|c| dir().join(c));
    let tok = Tokenizer::from_tokenizer_json(&dir().join(fx["tokenizer"].as_str().unwrap()), cfg.as_deref()).unwrap();
    let mut n = 0;
    for c in fx["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        let label = format!("{name}/{}", c["name"].as_str().unwrap());
        let parsed = tok.encode_with(text, false, true).unwrap();
        assert_eq!(parsed, ids(&c["ids"]), "{label}: ids (special tokens parsed)");
        assert_eq!(
            tok.encode_with(text, false, false).unwrap(),
            ids(&c["ids_literal_special"]),
            "{label}: ids (special as text)"
        );
        assert_eq!(tok.encode(text, true).unwrap(), ids(&c["ids_add_special"]), "{label}: ids with add_special");
        let want = c["decode_skip_special"].as_str().unwrap();
        assert_eq!(tok.decode(&parsed), want, "{label}: decode");
        let mut dec = StreamDecoder::new(&tok).strip_leading_space(true);
        let mut streamed: String = parsed.iter().map(|&i| dec.push(i)).collect();
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, want, "{label}: streamed decode");
        n += 1;
    }
    eprintln!("[{name}] {n} cases identical to the tokenizers library: {tok:?}");
    tok
}

#[test]
fn byte_level_bpe_with_config() {
    let tok = check("bytelevel");
    assert!(!tok.add_bos());
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert_eq!(tok.eos_id(), Some(im_end));
    assert!(tok.eos_ids().contains(&im_end));
    assert!(tok.is_control(im_end));
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
    assert_eq!(tok.token_bytes(tok.token_to_id("Ġ").unwrap()), b" ");
}

#[test]
fn spm_bpe_with_byte_fallback_from_post_processor() {
    let tok = check("spm_byte_fallback");
    let bos = tok.token_to_id("<s>").unwrap();
    assert_eq!(tok.bos_id(), Some(bos));
    assert!(tok.add_bos());
    assert_eq!(tok.token_bytes(tok.token_to_id("<0x0A>").unwrap()), b"\n");
    assert!(tok.chat_template().is_none());
}

/// gpt-oss's harmony tokens (all `special` in its tokenizer.json), as llama.cpp loads them: the
/// markup between messages is rendered in generated text (the output splitter reads the
/// channels from it), `<|end|>` ends a message and not generation, `<|return|>` and `<|call|>`
/// end the turn and are left out.
#[test]
fn harmony_markup_is_rendered() {
    let specials = ["<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"];
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": 2 + i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": true})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": {"a": 0, "b": 1}, "merges": []},
    });
    let cfg = r#"{"eos_token": "<|return|>"}"#;
    let tok = Tokenizer::from_tokenizer_json_str(std::path::Path::new("harmony"), &json.to_string(), Some(cfg)).unwrap();
    let id = |t: &str| tok.token_to_id(t).unwrap();
    let mut eog: Vec<&str> = tok.eos_ids().iter().map(|&i| tok.token_text(i).unwrap()).collect();
    eog.sort_unstable();
    assert_eq!(eog, ["<|call|>", "<|return|>"]);
    let out: Vec<u32> =
        ["<|channel|>", "a", "<|message|>", "b", "<|end|>", "<|start|>", "<|constrain|>", "a", "<|call|>"].map(id).to_vec();
    let want = "<|channel|>a<|message|>b<|end|><|start|><|constrain|>a";
    assert_eq!(tok.decode(&out), want);
    let mut dec = StreamDecoder::new(&tok);
    let streamed: String = out.iter().map(|&i| dec.push(i)).collect();
    assert_eq!(streamed + &dec.finish(), want);
    // Text with the markup encodes to its tokens even when control tokens are not parsed (as
    // llama.cpp matches user-defined tokens; a forced grammar's header is tokenized so), while
    // the control tokens' texts stay text there.
    let plain = tok.encode_with("<|channel|>a<|message|>b<|call|>", false, false).unwrap();
    assert_eq!(&plain[..4], &[id("<|channel|>"), id("a"), id("<|message|>"), id("b")], "{plain:?}");
    assert!(!plain.contains(&id("<|call|>")), "a control token parsed with parse_special off: {plain:?}");
    let parsed = tok.encode_with("<|channel|>a<|call|>", false, true).unwrap();
    assert_eq!(parsed, [id("<|channel|>"), id("a"), id("<|call|>")]);
}

/// A tokenizer.json that pads and truncates (sentence-transformers' folders: Fixed 128, cut at
/// 128) encodes a prompt whole and unpadded: every token, no pad ids.
#[test]
fn padding_and_truncation_of_the_file_are_ignored() {
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": {"direction": "Right", "max_length": 3, "strategy": "LongestFirst", "stride": 0},
        "padding": {"strategy": {"Fixed": 16}, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 0,
            "pad_type_id": 0, "pad_token": "[PAD]"},
        "added_tokens": [{"id": 0, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"[PAD]": 0, "a": 1, "b": 2, "c": 3, "[UNK]": 4}, "unk_token": "[UNK]"},
    });
    let tok = Tokenizer::from_tokenizer_json_str(std::path::Path::new("padded"), &json.to_string(), None).unwrap();
    assert_eq!(tok.encode("a b c a b", false).unwrap(), [1, 2, 3, 1, 2]);
    assert_eq!(tok.encode_with("c c", false, true).unwrap(), [3, 3]);
}

/// A BERT tokenizer's post-processor (TemplateProcessing `[CLS] $A [SEP]`, no tokenizer_config
/// bos/eos): `[CLS]` is prepended and `[SEP]` appended, as the library does (sentence
/// encoders pool over both); WordPiece splits with `##` continuations, lower-cased and
/// accent-stripped by the BertNormalizer. Before the appended token was read, `[SEP]` was
/// missing from every input.
#[test]
fn bert_template_adds_cls_and_sep() {
    let vocab = serde_json::json!({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "cafe": 4, "play": 5, "##ing": 6, "!": 7});
    let special = |id: u32, s: &str| serde_json::json!({"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "[PAD]"), special(1, "[UNK]"), special(2, "[CLS]"), special(3, "[SEP]")],
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}}, {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]}, "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": vocab},
    });
    let tok = Tokenizer::from_tokenizer_json_str(std::path::Path::new("bert"), &json.to_string(), None).unwrap();
    assert_eq!(tok.encode_input("Café PLAYING!").unwrap(), [2, 4, 5, 6, 7, 3]);
    assert_eq!(tok.encode("playing", true).unwrap(), [2, 5, 6, 3]);
    assert_eq!(tok.encode("playing", false).unwrap(), [5, 6]);
    assert!(tok.add_bos() && tok.add_eos());
}
