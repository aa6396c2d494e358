//! The Hugging Face `tokenizer.json` backend (through the `tokenizers` crate).
//!
//! Segmentation is the crate's; everything around it is made to look like the GGUF path: the
//! token table, per-token raw bytes for our own decoding (the decoder's kind, byte-level or
//! SentencePiece-style, is read from the JSON), BOS/EOS/add_bos from tokenizer_config.json or the
//! post-processor, and the end-of-generation set.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use serde_json::Value;

use super::{Backend, EOG_TEXTS, Tokenizer, attr, parse_byte_token, unicode};
use crate::error::{FormatError, Result};

pub(super) struct HfBackend {
    /// Special tokens in the text are parsed.
    parse: tokenizers::Tokenizer,
    /// Special tokens in the text are left as text (encode_special_tokens = true).
    literal: tokenizers::Tokenizer,
}

impl HfBackend {
    pub(super) fn encode(&self, path: &Path, text: &str, parse_special: bool, out: &mut Vec<u32>) -> Result<()> {
        let tok = if parse_special { &self.parse } else { &self.literal };
        let enc = tok.encode(text, false).map_err(|e| FormatError::malformed(path, format!("encode: {e}")))?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }
}

/// A token given in tokenizer_config.json as "text" or {"content": "text", ...}.
fn token_str(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) => m.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// Whether any object in the tree has `"type": ty`.
fn has_type(v: &Value, ty: &str) -> bool {
    match v {
        Value::Object(m) => m.get("type").and_then(Value::as_str) == Some(ty) || m.values().any(|x| has_type(x, ty)),
        Value::Array(a) => a.iter().any(|x| has_type(x, ty)),
        _ => false,
    }
}

/// The first special token of a TemplateProcessing "single" template (the BOS it adds).
fn template_bos(v: &Value) -> Option<String> {
    match v {
        Value::Object(m) => {
            if m.get("type").and_then(Value::as_str) == Some("TemplateProcessing") {
                let first = m.get("single")?.as_array()?.first()?;
                return first.get("SpecialToken")?.get("id")?.as_str().map(str::to_string);
            }
            m.values().find_map(template_bos)
        }
        Value::Array(a) => a.iter().find_map(template_bos),
        _ => None,
    }
}

/// The special token a TemplateProcessing "single" template appends after the text (BERT's
/// `[SEP]`, Qwen3-Embedding's `<|endoftext|>`), if it ends with one.
fn template_eos(v: &Value) -> Option<String> {
    match v {
        Value::Object(m) => {
            if m.get("type").and_then(Value::as_str) == Some("TemplateProcessing") {
                let single = m.get("single")?.as_array()?;
                let text_at = single.iter().position(|p| p.get("Sequence").is_some())?;
                let last = single.last()?;
                return (single.len() > text_at + 1)
                    .then(|| last.get("SpecialToken")?.get("id")?.as_str().map(str::to_string))
                    .flatten();
            }
            m.values().find_map(template_eos)
        }
        Value::Array(a) => a.iter().find_map(template_eos),
        _ => None,
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(|e| FormatError::io(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| FormatError::malformed(path, format!("json: {e}")))
}

pub(super) fn load(path: &Path, config: Option<&Path>) -> Result<Tokenizer> {
    let text = std::fs::read_to_string(path).map_err(|e| FormatError::io(path, e))?;
    let cfg = match config {
        Some(p) => Some(read_json(p)?),
        None => None,
    };
    let mut tok = build(path, &text, cfg)?;
    // transformers >= 4.5x saves the template beside the tokenizer as chat_template.jinja.
    let jinja = path.with_file_name("chat_template.jinja");
    if tok.chat_template.is_none() && jinja.exists() {
        tok.chat_template = Some(std::fs::read_to_string(&jinja).map_err(|e| FormatError::io(&jinja, e))?);
    }
    Ok(tok)
}

/// From the files' texts (a .cmf embeds them); `path` names the source in errors.
pub(super) fn load_str(path: &Path, tokenizer_json: &str, config: Option<&str>) -> Result<Tokenizer> {
    let cfg = match config {
        Some(c) => {
            Some(serde_json::from_str(c).map_err(|e| FormatError::malformed(path, format!("tokenizer_config.json: {e}")))?)
        }
        None => None,
    };
    build(path, tokenizer_json, cfg)
}

fn build(path: &Path, text: &str, cfg: Option<Value>) -> Result<Tokenizer> {
    let json: Value = serde_json::from_str(text).map_err(|e| FormatError::malformed(path, format!("json: {e}")))?;
    let mut parse: tokenizers::Tokenizer = text.parse().map_err(|e| FormatError::malformed(path, format!("{e}")))?;
    // A file's padding and truncation are settings for training batches (sentence-transformers'
    // folders pad to 128 and cut there): a prompt's tokens are all of its tokens, unpadded.
    parse.with_padding(None);
    parse.with_truncation(None).map_err(|e| FormatError::malformed(path, format!("truncation: {e}")))?;
    let mut literal = parse.clone();
    literal.set_encode_special_tokens(true);

    let vocab = parse.get_vocab(true);
    let n = vocab.values().map(|&i| i as usize + 1).max().unwrap_or(0);
    let mut texts = vec![String::new(); n];
    for (t, &i) in &vocab {
        texts[i as usize] = t.clone();
    }
    let mut attrs = vec![attr::NORMAL; n];
    for (id, tok) in parse.get_added_tokens_decoder() {
        if let Some(a) = attrs.get_mut(id as usize) {
            *a = if tok.special { attr::CONTROL } else { attr::USER_DEFINED };
        }
    }

    let decoder = json.get("decoder").cloned().unwrap_or(Value::Null);
    let byte_level = has_type(&decoder, "ByteLevel");
    let byte_fallback = has_type(&decoder, "ByteFallback");
    for (i, t) in texts.iter().enumerate() {
        if byte_fallback && attrs[i] == attr::NORMAL && parse_byte_token(t).is_some() {
            attrs[i] = attr::BYTE;
        }
    }
    let pieces: Vec<Box<[u8]>> = texts
        .iter()
        .zip(&attrs)
        .map(|(t, &a)| {
            let p: Vec<u8> = if a & (attr::CONTROL | attr::USER_DEFINED) != 0 {
                t.as_bytes().to_vec()
            } else if a & attr::BYTE != 0 {
                parse_byte_token(t).map(|b| vec![b]).unwrap_or_default()
            } else if byte_level {
                t.chars()
                    .flat_map(|c| match unicode::char_to_byte(c) {
                        Some(b) => vec![b],
                        None => c.to_string().into_bytes(),
                    })
                    .collect()
            } else {
                t.replace('\u{2581}', " ").into_bytes()
            };
            p.into_boxed_slice()
        })
        .collect();
    // A SentencePiece-style "dummy prefix" the decoder strips: Metaspace prepending, or a
    // normalizer that prepends "▁".
    let norm = json.get("normalizer").cloned().unwrap_or(Value::Null);
    let pre = json.get("pre_tokenizer").cloned().unwrap_or(Value::Null);
    let add_space_prefix = !byte_level
        && (has_type(&decoder, "Strip")
            || (has_type(&pre, "Metaspace") && pre.to_string().contains("\"prepend_scheme\":\"first\""))
            || (has_type(&norm, "Prepend")));

    let id_of = |s: &str| vocab.get(s).copied();
    let post_bos = json.get("post_processor").and_then(template_bos);
    let bos_text = cfg.as_ref().and_then(|c| token_str(c.get("bos_token"))).or_else(|| post_bos.clone());
    let post_eos = json.get("post_processor").and_then(template_eos);
    let eos_text = cfg.as_ref().and_then(|c| token_str(c.get("eos_token"))).or_else(|| post_eos.clone());
    let bos = bos_text.as_deref().and_then(id_of);
    let eos = eos_text.as_deref().and_then(id_of);
    let add_bos = match cfg.as_ref().and_then(|c| c.get("add_bos_token")).and_then(Value::as_bool) {
        Some(v) => v,
        None => post_bos.is_some() && post_bos == bos_text,
    };
    // As the library: the post-processor appends its token unless the config says otherwise.
    let add_eos = match cfg.as_ref().and_then(|c| c.get("add_eos_token")).and_then(Value::as_bool) {
        Some(v) => v,
        None => post_eos.is_some() && post_eos == eos_text,
    };
    let unk = cfg.as_ref().and_then(|c| token_str(c.get("unk_token"))).as_deref().and_then(id_of);
    let chat_template = cfg.as_ref().and_then(|c| match c.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        // A list of named templates: take "default", else the first.
        Value::Array(a) => {
            let named =
                |n: &str| a.iter().find(|t| t.get("name").and_then(Value::as_str) == Some(n)).and_then(|t| t.get("template"));
            named("default").or_else(|| a.first().and_then(|t| t.get("template")))?.as_str().map(str::to_string)
        }
        _ => None,
    });

    let mut eog: BTreeSet<u32> = texts
        .iter()
        .enumerate()
        .filter(|(i, t)| attrs[*i] & attr::CONTROL != 0 && EOG_TEXTS.contains(&t.as_str()))
        .map(|(i, _)| i as u32)
        .collect();
    eog.extend(eos);
    super::harmony_markup(&texts, &mut attrs, &mut eog);
    // Tokens the library lists as special that render as text here (gpt-oss's harmony markup):
    // matched by `partition` when control tokens are not parsed (the library would spell them
    // in bytes), as llama.cpp matches its user-defined tokens whatever parse_special says.
    let mut specials: Vec<u32> = parse
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(id, t)| t.special && attrs.get(*id as usize).is_some_and(|a| a & attr::USER_DEFINED != 0))
        .map(|(id, _)| id)
        .collect();
    specials.sort_by_key(|&i| (std::cmp::Reverse(texts[i as usize].len()), i));
    let specials_ac = super::specials_matcher(path, &texts, &specials)?;

    let mut token_to_id: HashMap<Box<[u8]>, u32> = HashMap::with_capacity(n);
    for (t, &i) in &vocab {
        token_to_id.insert(t.as_bytes().into(), i);
    }
    let mut byte_tokens = vec![None; 256];
    for (i, t) in texts.iter().enumerate() {
        if attrs[i] & attr::BYTE != 0
            && let Some(b) = parse_byte_token(t)
        {
            byte_tokens[b as usize] = Some(i as u32);
        }
    }
    Ok(Tokenizer {
        source: path.to_path_buf(),
        backend: Backend::Hf(Box::new(HfBackend { parse, literal })),
        scores: vec![0.0; n],
        texts,
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
        add_space_prefix,
        escape_whitespace: false,
        byte_tokens,
        chat_template,
    })
}
