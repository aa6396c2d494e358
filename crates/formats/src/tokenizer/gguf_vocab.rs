//! Building a `Tokenizer` from GGUF `tokenizer.ggml.*` metadata, with llama.cpp's defaults.
//!
//! What llama.cpp decides at load time is decided the same way here: default special ids per
//! model type, the add_bos/add_space_prefix defaults and their metadata overrides, which tokens
//! count as end-of-generation (by id keys and by well-known texts), and the order in which
//! special tokens are cut out of raw text (longest first).

use std::collections::{BTreeSet, HashMap};

use super::pretok::PreConfig;
use super::{Backend, EOG_TEXTS, Tokenizer, attr, bpe, harmony_markup, parse_byte_token, unicode};
use crate::error::{FormatError, Result};
use crate::gguf::{GgufMeta, MetaValue};

fn str_array<'a>(g: &'a dyn GgufMeta, key: &str) -> Result<Option<Vec<&'a str>>> {
    let Some(v) = g.get(key) else { return Ok(None) };
    let arr = v.as_array().ok_or_else(|| FormatError::field(g.meta_path(), key, "expected an array of strings"))?;
    arr.iter()
        .enumerate()
        .map(|(i, x)| x.as_str().ok_or_else(|| FormatError::field(g.meta_path(), key, format!("element {i} is not a string"))))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn num_array(g: &dyn GgufMeta, key: &str) -> Result<Option<Vec<f64>>> {
    let Some(v) = g.get(key) else { return Ok(None) };
    let arr = v.as_array().ok_or_else(|| FormatError::field(g.meta_path(), key, "expected a numeric array"))?;
    arr.iter()
        .enumerate()
        .map(|(i, x)| x.as_f64().ok_or_else(|| FormatError::field(g.meta_path(), key, format!("element {i} is not a number"))))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn opt_bool(g: &dyn GgufMeta, key: &str) -> Result<Option<bool>> {
    match g.get(key) {
        None => Ok(None),
        Some(MetaValue::Bool(b)) => Ok(Some(*b)),
        Some(v) => v.as_i64().map(|x| Some(x != 0)).ok_or_else(|| FormatError::field(g.meta_path(), key, "expected a bool")),
    }
}

pub(super) fn load(g: &dyn GgufMeta) -> Result<Tokenizer> {
    let path = g.meta_path();
    let model = g.get_str("tokenizer.ggml.model")?;
    let pre_name = g.opt_str("tokenizer.ggml.pre")?.unwrap_or("");
    let tokens = str_array(g, "tokenizer.ggml.tokens")?
        .ok_or_else(|| FormatError::missing(path, "metadata key 'tokenizer.ggml.tokens'"))?;
    let n = tokens.len();
    if n == 0 || n > u32::MAX as usize / 2 {
        return Err(FormatError::field(path, "tokenizer.ggml.tokens", format!("bad vocabulary size {n}")));
    }
    let scores = num_array(g, "tokenizer.ggml.scores")?;
    let types = num_array(g, "tokenizer.ggml.token_type")?;
    for (key, arr) in [("tokenizer.ggml.scores", &scores), ("tokenizer.ggml.token_type", &types)] {
        if let Some(a) = arr
            && a.len() < n
        {
            return Err(FormatError::field(path, key, format!("{} entries for {n} tokens", a.len())));
        }
    }

    if model == "bert" {
        return wordpiece(g, &tokens);
    }
    // Per model type: the segmentation and llama.cpp's defaults.
    let (backend, mut bos, mut eos, mut unk, mut add_bos, mut add_space_prefix, escape_whitespace) = match model {
        "llama" => (Backend::Spm, Some(1u32), Some(2u32), Some(0u32), true, true, true),
        "gpt2" | "gemma4" => {
            let pre_name = if model == "gemma4" { "gemma4" } else { pre_name };
            let pre = match PreConfig::for_name(pre_name) {
                Some(Ok(p)) => p,
                Some(Err(e)) => return Err(FormatError::field(path, "tokenizer.ggml.pre", e)),
                None => {
                    return Err(FormatError::field(
                        path,
                        "tokenizer.ggml.pre",
                        format!("unsupported pre-tokenizer '{pre_name}'"),
                    ));
                }
            };
            let lines = str_array(g, "tokenizer.ggml.merges")?
                .ok_or_else(|| FormatError::missing(path, "metadata key 'tokenizer.ggml.merges'"))?;
            let merges = bpe::Merges::new(lines.into_iter());
            let (bos, eos) = if model == "gemma4" { (None, None) } else { (Some(11), Some(11)) };
            let add_bos = pre.add_bos;
            let esc = pre.escape_whitespace;
            let backend = Backend::Bpe { newline_words_whole: pre_name == "gemma4", pre, merges };
            (backend, bos, eos, None, add_bos, false, esc)
        }
        other => {
            return Err(FormatError::field(path, "tokenizer.ggml.model", format!("unsupported tokenizer model '{other}'")));
        }
    };
    if let Some(v) = opt_bool(g, "tokenizer.ggml.add_space_prefix")? {
        add_space_prefix = v;
    }

    let mut texts = Vec::with_capacity(n);
    let mut token_to_id: HashMap<Box<[u8]>, u32> = HashMap::with_capacity(n);
    let mut attrs = Vec::with_capacity(n);
    for (i, t) in tokens.iter().enumerate() {
        // llama.cpp renames empty tokens so that every text is a distinct key.
        let text = if t.is_empty() { format!("[EMPTY_{i}]") } else { t.to_string() };
        token_to_id.insert(text.as_bytes().into(), i as u32);
        texts.push(text);
        attrs.push(match types.as_ref().map(|t| t[i] as i64) {
            None | Some(1) => attr::NORMAL,
            Some(2) => attr::UNKNOWN,
            Some(3) => attr::CONTROL,
            Some(4) => attr::USER_DEFINED,
            Some(5) => attr::UNUSED,
            Some(6) => attr::BYTE,
            Some(_) => 0,
        });
    }
    let scores: Vec<f32> = scores.map(|s| s[..n].iter().map(|&x| x as f32).collect()).unwrap_or_else(|| vec![0.0; n]);

    // Special ids: defaults above, out-of-range defaults dropped, metadata keys override.
    let in_range = |id: Option<u32>| id.filter(|&x| (x as usize) < n);
    bos = in_range(bos);
    eos = in_range(eos);
    unk = in_range(unk);
    let key_id = |key: &str| -> Result<Option<u32>> {
        Ok(g.opt_u64(key)?.and_then(|x| u32::try_from(x).ok()).filter(|&x| (x as usize) < n))
    };
    if let Some(id) = key_id("tokenizer.ggml.bos_token_id")? {
        bos = Some(id);
    }
    if let Some(id) = key_id("tokenizer.ggml.eos_token_id")? {
        eos = Some(id);
    }
    if let Some(id) = key_id("tokenizer.ggml.unknown_token_id")? {
        unk = Some(id);
    }
    let mut eot = key_id("tokenizer.ggml.eot_token_id")?;
    let mut eom = key_id("tokenizer.ggml.eom_token_id")?;
    let mut fim_pad = key_id("tokenizer.ggml.fim_pad_token_id")?;
    let mut fim_rep = key_id("tokenizer.ggml.fim_rep_token_id")?;
    let mut fim_sep = key_id("tokenizer.ggml.fim_sep_token_id")?;
    if let Some(v) = opt_bool(g, "tokenizer.ggml.add_bos_token")? {
        add_bos = v;
    }
    if model == "gemma4" {
        add_bos = true;
    }
    let add_eos = opt_bool(g, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);

    // Tokens recognised by text; a match that is not typed control is made control, as
    // llama.cpp does (it then gets cut out of text only with parse_special).
    let find_text = |slot: &mut Option<u32>, names: &[&str], attrs: &mut Vec<u32>| {
        if slot.is_none()
            && let Some(id) = (0..n).find(|&i| names.contains(&texts[i].as_str()))
        {
            *slot = Some(id as u32);
            attrs[id] |= attr::CONTROL;
        }
    };
    find_text(
        &mut eot,
        &[
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "<|end_of_text|>",
            "<EOT>",
            "_<EOT>",
            "[EOT]",
            "<｜end▁of▁sentence｜>",
            "<end_of_utterance>",
        ],
        &mut attrs,
    );
    find_text(&mut eom, &["<|eom_id|>"], &mut attrs);
    find_text(&mut fim_pad, &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"], &mut attrs);
    find_text(&mut fim_rep, &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"], &mut attrs);
    find_text(&mut fim_sep, &["<|file_sep|>"], &mut attrs);

    let mut eog: BTreeSet<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
    for (i, t) in texts.iter().enumerate() {
        if EOG_TEXTS.contains(&t.as_str()) {
            eog.insert(i as u32);
            attrs[i] |= attr::CONTROL;
        }
    }
    eog.extend([eos, eot, eom].into_iter().flatten());
    harmony_markup(&texts, &mut attrs, &mut eog);
    let has = |s: &str, eog: &BTreeSet<u32>| eog.iter().find(|&&i| texts[i as usize] == s).copied();
    if let Some(s) = has("</s>", &eog)
        && (has("<|tool_response>", &eog).is_some() || has("<|plamo:eos|>", &eog).is_some())
    {
        eog.remove(&s);
        attrs[s as usize] = attr::NORMAL;
    }

    let mut specials: Vec<u32> =
        (0..n as u32).filter(|&i| attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0).collect();
    specials.sort_by_key(|&i| std::cmp::Reverse(texts[i as usize].len()));

    // Phi-3 strips whitespace after its special tokens (llama.cpp keys this on the model name).
    let name = g.opt_str("general.name")?.unwrap_or("").to_lowercase();
    if name.contains("phi-3") || name.contains("phi3") {
        for &i in &specials {
            attrs[i as usize] |= attr::RSTRIP;
        }
        for (t, on) in [("</s>", true), ("<unk>", false), ("<s>", false), ("<|endoftext|>", false)] {
            if let Some(&i) = token_to_id.get(t.as_bytes()) {
                if on {
                    attrs[i as usize] |= attr::RSTRIP;
                } else {
                    attrs[i as usize] &= !attr::RSTRIP;
                }
            }
        }
    }

    let spm_like = matches!(backend, Backend::Spm) || escape_whitespace;
    let byte_level = matches!(&backend, Backend::Bpe { pre, .. } if pre.byte_encode);
    let pieces: Vec<Box<[u8]>> =
        (0..n).map(|i| token_piece(&texts[i], attrs[i], spm_like, byte_level).into_boxed_slice()).collect();
    let mut byte_tokens = vec![None; 256];
    for (i, t) in texts.iter().enumerate() {
        if attrs[i] & attr::BYTE != 0
            && let Some(b) = parse_byte_token(t)
        {
            byte_tokens[b as usize].get_or_insert(i as u32);
        }
    }
    // SentencePiece spells unknown bytes as <0xNN> whatever their type says.
    for b in 0..=255u8 {
        if byte_tokens[b as usize].is_none() {
            byte_tokens[b as usize] = token_to_id.get(format!("<0x{b:02X}>").as_bytes()).copied();
        }
    }

    let specials_ac = super::specials_matcher(path, &texts, &specials)?;
    let chat_template = g.opt_str("tokenizer.chat_template")?.map(str::to_string);

    Ok(Tokenizer {
        source: path.to_path_buf(),
        backend,
        texts,
        scores,
        attrs,
        pieces,
        token_to_id,
        specials,
        specials_ac,
        bos,
        eos,
        unk,
        eog: eog.into_iter().collect(),
        add_bos,
        add_eos,
        add_space_prefix: add_space_prefix && matches!(model, "llama"),
        escape_whitespace,
        byte_tokens,
        chat_template,
    })
}

/// The bytes a token stands for, as llama.cpp's token_to_piece(special = true) renders it.
fn token_piece(text: &str, a: u32, spm_like: bool, byte_level: bool) -> Vec<u8> {
    if a & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
        return text.as_bytes().to_vec();
    }
    if a & attr::NORMAL != 0 {
        if byte_level && !spm_like {
            return text
                .chars()
                .flat_map(|c| match unicode::char_to_byte(c) {
                    Some(b) => vec![b],
                    None => c.to_string().into_bytes(),
                })
                .collect();
        }
        return text.replace('\u{2581}', " ").into_bytes();
    }
    if a & attr::BYTE != 0 {
        return parse_byte_token(text).map(|b| vec![b]).unwrap_or_default();
    }
    Vec::new()
}

/// A BERT WordPiece vocabulary (`tokenizer.ggml.model` "bert", as llama.cpp's converter writes
/// it: a word's first piece with a leading "▁", continuations bare, `[X]` specials as they
/// are) turned back into the library's WordPiece form (`##` continuations) with BERT's
/// normalizer (lower-casing as `tokenizer.ggml.normalizer.lowercase` says, accents stripped when
/// it does, CJK characters split), pre-tokenizer and `[CLS] … [SEP]` post-processor: the
/// `tokenizers` library then segments exactly as for the model's own tokenizer.json.
fn wordpiece(g: &dyn GgufMeta, tokens: &[&str]) -> Result<Tokenizer> {
    let path = g.meta_path();
    let id =
        |key: &str, default: u32| -> Result<u32> { Ok(g.get(key).and_then(MetaValue::as_i64).map_or(default, |v| v as u32)) };
    let (cls, sep, unk) = (
        id("tokenizer.ggml.bos_token_id", 101)?,
        id("tokenizer.ggml.seperator_token_id", 102)?,
        id("tokenizer.ggml.unknown_token_id", 100)?,
    );
    let name = |i: u32| -> Result<&str> {
        tokens.get(i as usize).copied().ok_or_else(|| FormatError::field(path, "tokenizer.ggml.tokens", format!("no token {i}")))
    };
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let piece = if t.starts_with('[') && t.ends_with(']') && t.len() > 2 {
            added.push(serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}));
            t.to_string()
        } else if let Some(word) = t.strip_prefix('\u{2581}') {
            word.to_string()
        } else {
            format!("##{t}")
        };
        vocab.entry(piece).or_insert(serde_json::json!(i));
    }
    let lowercase = opt_bool(g, "tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true);
    let (cls_t, sep_t, unk_t) = (name(cls)?, name(sep)?, name(unk)?);
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": lowercase},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": cls_t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": sep_t, "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": cls_t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": sep_t, "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}}, {"SpecialToken": {"id": sep_t, "type_id": 1}}],
            "special_tokens": {
                cls_t: {"id": cls_t, "ids": [cls], "tokens": [cls_t]},
                sep_t: {"id": sep_t, "ids": [sep], "tokens": [sep_t]}}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": unk_t, "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": vocab},
    });
    super::hf::load_str(path, &json.to_string(), None)
}
