//! Text <-> token ids: one `Tokenizer` over two sources.
//!
//! * GGUF `tokenizer.ggml.*` metadata (`from_gguf`): a re-implementation of llama.cpp's SPM and
//!   BPE tokenizers that reproduces its ids exactly (pre-tokenizer chosen by `tokenizer.ggml.pre`,
//!   special tokens split out before segmentation as its `tokenizer_st_partition` does).
//! * Hugging Face `tokenizer.json` (`from_tokenizer_json`) through the `tokenizers` crate.
//!
//! Decoding is ours for both: every token has its raw bytes precomputed (byte-level BPE chars
//! mapped back to bytes, SentencePiece `▁` to a space, `<0xNN>` to the byte), so `decode` is a
//! concatenation and `StreamDecoder` can cut the stream on UTF-8 boundaries.
//!
//! Module map: `unicode` (category flags, GPT-2 byte map), `pretok` (BPE word splitting),
//! `bpe` (merges), `spm` (SentencePiece segmentation), `gguf_vocab` (loading GGUF metadata),
//! `hf` (tokenizer.json backend), `stream` (StreamDecoder).

mod bpe;
mod gguf_vocab;
mod hf;
mod pretok;
mod spm;
mod stream;
mod unicode;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{FormatError, Result};
use crate::gguf::GgufMeta;

pub use stream::StreamDecoder;

/// Token attribute bits (llama.cpp's llama_token_attr values).
pub(crate) mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// The segmentation model behind a tokenizer.
enum Backend {
    /// SentencePiece as llama.cpp runs it (GGUF model "llama").
    Spm,
    /// Byte-pair encoding with a llama.cpp pre-tokenizer (GGUF model "gpt2" or "gemma4").
    Bpe { pre: pretok::PreConfig, merges: bpe::Merges, newline_words_whole: bool },
    /// A Hugging Face tokenizer.json.
    Hf(Box<hf::HfBackend>),
}

/// A loaded tokenizer. Cheap to share by reference; all methods take `&self`.
pub struct Tokenizer {
    source: PathBuf,
    backend: Backend,
    /// Token texts as stored (GGUF strings / HF vocabulary entries).
    texts: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<u32>,
    /// Raw bytes each token stands for (special tokens: their text).
    pieces: Vec<Box<[u8]>>,
    token_to_id: HashMap<Box<[u8]>, u32>,
    /// Tokens split out of raw text before segmentation, longest text first.
    specials: Vec<u32>,
    /// Finds which specials occur in a text at all, so the exact (sequential) partition only
    /// walks those; Gemma has ~6,400 control/user tokens.
    specials_ac: Option<aho_corasick::AhoCorasick>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    /// SentencePiece "dummy prefix": a space is prepended to raw text at the start and after
    /// each special token; decode drops the first one.
    add_space_prefix: bool,
    /// Replace ' ' by U+2581 before segmentation (SentencePiece and SPM-style BPE).
    escape_whitespace: bool,
    /// `<0xNN>` byte-fallback tokens.
    byte_tokens: Vec<Option<u32>>,
    chat_template: Option<String>,
}

// Shared across generation threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
};

/// A piece of text after special-token partitioning.
#[derive(Clone, Copy, Debug)]
enum Frag {
    Raw(usize, usize),
    Tok(u32),
}

impl Tokenizer {
    /// Load a Hugging Face `tokenizer.json`, with BOS/EOS/add_bos and the chat template taken
    /// from `tokenizer_config.json` when given (else from the post-processor).
    pub fn from_tokenizer_json(path: &Path, tokenizer_config: Option<&Path>) -> Result<Tokenizer> {
        hf::load(path, tokenizer_config)
    }

    /// Load a Hugging Face tokenizer from the texts of `tokenizer.json` and (optionally)
    /// `tokenizer_config.json`, as embedded in a .cmf; `source` names them in errors.
    pub fn from_tokenizer_json_str(source: &Path, tokenizer_json: &str, tokenizer_config: Option<&str>) -> Result<Tokenizer> {
        hf::load_str(source, tokenizer_json, tokenizer_config)
    }

    /// Build from `tokenizer.ggml.*` metadata: a GGUF file's, or a .cmf's converted from one.
    pub fn from_gguf(g: &dyn GgufMeta) -> Result<Tokenizer> {
        gguf_vocab::load(g)
    }

    /// Encode text: BOS (and EOS) as the model adds them when `add_special`; special-token
    /// texts such as `<|im_start|>` in `text` become their ids (chat prompts).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let mut ids = self.encode_with(text, add_special && self.add_bos, true)?;
        if add_special
            && self.add_eos
            && let Some(eos) = self.eos
        {
            ids.push(eos);
        }
        Ok(ids)
    }

    /// Encode with explicit control: `add_bos` prepends the BOS token (an error if there is
    /// none); `parse_special` lets control tokens written in the text become their ids
    /// (llama.cpp's parse_special). User-defined tokens are always matched, as in llama.cpp.
    pub fn encode_with(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>> {
        self.encode_ranges(text, add_bos, parse_special, &[])
    }

    /// As `encode_with(text, add_bos, true)`, except inside the `literal` byte ranges, where
    /// control tokens' texts are plain text: a chat message's content, so a user who types
    /// `<|im_end|>` gets its characters, not the token (role injection). Text whose literal
    /// ranges hold no control token's text encodes exactly as `encode_with` does.
    pub fn encode_guarded(&self, text: &str, add_bos: bool, literal: &[(usize, usize)]) -> Result<Vec<u32>> {
        let literal: Vec<(usize, usize)> =
            literal.iter().copied().filter(|&(a, b)| a < b && b <= text.len() && self.has_control_text(&text[a..b])).collect();
        if literal.is_empty() {
            return self.encode_ranges(text, add_bos, true, &[]);
        }
        if let Backend::Hf(h) = &self.backend {
            // The tokenizers crate takes one mode per call: the text in segments, the literal
            // ones without special tokens.
            let mut out = Vec::with_capacity(text.len() / 3 + 2);
            if add_bos {
                out.push(self.bos.ok_or_else(|| FormatError::missing(&self.source, "a BOS token (add_bos requested)"))?);
            }
            let mut at = 0;
            for &(a, b) in &literal {
                if a > at {
                    h.encode(&self.source, &text[at..a], true, &mut out)?;
                }
                h.encode(&self.source, &text[a..b], false, &mut out)?;
                at = b;
            }
            if at < text.len() {
                h.encode(&self.source, &text[at..], true, &mut out)?;
            }
            return Ok(out);
        }
        self.encode_ranges(text, add_bos, true, &literal)
    }

    /// Whether `s` holds the text of a control token.
    fn has_control_text(&self, s: &str) -> bool {
        // (An HF tokenizer's automaton holds only the special tokens that render as text.)
        if let (Some(ac), false) = (&self.specials_ac, matches!(self.backend, Backend::Hf(_))) {
            return ac.find_overlapping_iter(s).any(|m| {
                let id = self.specials[m.pattern().as_usize()];
                self.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) != 0
            });
        }
        // The Hugging Face backend keeps no automaton: its control tokens are the few added ones.
        self.attrs
            .iter()
            .enumerate()
            .any(|(id, &a)| a & attr::CONTROL != 0 && !self.texts[id].is_empty() && s.contains(self.texts[id].as_str()))
    }

    fn encode_ranges(&self, text: &str, add_bos: bool, parse_special: bool, literal: &[(usize, usize)]) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            let bos = self.bos.ok_or_else(|| FormatError::missing(&self.source, "a BOS token (add_bos requested)"))?;
            out.push(bos);
        }
        if let Backend::Hf(h) = &self.backend {
            if parse_special || self.specials.is_empty() {
                h.encode(&self.source, text, parse_special, &mut out)?;
                return Ok(out);
            }
            // Control tokens as text, the library's special tokens that render as text
            // (`specials` of an HF tokenizer) as their ids; the text between them as usual.
            for f in self.partition(text, false, literal) {
                match f {
                    Frag::Raw(a, b) => h.encode(&self.source, &text[a..b], false, &mut out)?,
                    Frag::Tok(id) => out.push(id),
                }
            }
            return Ok(out);
        }
        let frags = self.partition(text, parse_special, literal);
        match &self.backend {
            Backend::Spm => {
                let mut prev_special = true;
                let mut buf = String::new();
                for f in frags {
                    match f {
                        Frag::Raw(a, b) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(&text[a..b]);
                            let escaped = buf.replace(' ', "\u{2581}");
                            spm::tokenize(self, &escaped, &mut out);
                            prev_special = false;
                        }
                        Frag::Tok(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Backend::Bpe { pre, merges, newline_words_whole } => {
                let mut enc = String::new();
                let mut ranges = Vec::new();
                for f in frags {
                    let (a, b) = match f {
                        Frag::Raw(a, b) => (a, b),
                        Frag::Tok(id) => {
                            out.push(id);
                            continue;
                        }
                    };
                    let escaped;
                    let raw = if self.escape_whitespace {
                        escaped = text[a..b].replace(' ', "\u{2581}");
                        escaped.as_str()
                    } else {
                        &text[a..b]
                    };
                    for word in pre.split(raw) {
                        enc.clear();
                        if pre.byte_encode {
                            unicode::byte_encode(word, &mut enc);
                        } else {
                            enc.push_str(word);
                        }
                        let whole = (pre.ignore_merges || (*newline_words_whole && enc.bytes().all(|c| c == b'\n')))
                            .then(|| self.id_of(enc.as_bytes()))
                            .flatten();
                        if let Some(id) = whole {
                            out.push(id);
                            continue;
                        }
                        ranges.clear();
                        merges.apply(&enc, &mut ranges);
                        for &(s, e) in &ranges {
                            if let Some(id) = self.id_of(&enc.as_bytes()[s..e]) {
                                out.push(id);
                                continue;
                            }
                            // Not a token: fall back to one token per byte of the symbol, the
                            // byte-level char itself or <0xNN>, skipping bytes with neither.
                            for &byte in &enc.as_bytes()[s..e] {
                                let id = if pre.byte_encode { self.id_of(&[byte]) } else { self.byte_tokens[byte as usize] };
                                out.extend(id);
                            }
                        }
                    }
                }
            }
            Backend::Hf(_) => unreachable!("handled above"),
        }
        Ok(out)
    }

    /// Split out special tokens, as llama.cpp's tokenizer_st_partition: for each special token,
    /// longest text first, every occurrence in the remaining raw fragments is cut out. Control
    /// and unknown tokens only when `parse_special`; user-defined ones always.
    fn partition(&self, text: &str, parse_special: bool, literal: &[(usize, usize)]) -> Vec<Frag> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Frag::Raw(0, text.len()));
        let Some(ac) = &self.specials_ac else { return frags };
        let mut present = vec![false; self.specials.len()];
        let mut any = false;
        for m in ac.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
            any = true;
        }
        if !any {
            return frags;
        }
        let is_space = |c: u8| matches!(c, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r');
        let mut next = Vec::new();
        for (k, &id) in self.specials.iter().enumerate() {
            if !present[k] {
                continue;
            }
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let pat = self.texts[id as usize].as_str();
            next.clear();
            for &f in &frags {
                let Frag::Raw(mut start, end) = f else {
                    next.push(f);
                    continue;
                };
                let control = a & (attr::CONTROL | attr::UNKNOWN) != 0;
                while start < end {
                    // The next occurrence, passing over control tokens inside literal ranges.
                    let mut from = start;
                    let found = loop {
                        let Some(off) = text[from..end].find(pat) else { break None };
                        let m = from + off;
                        if control && literal.iter().any(|&(la, lb)| m < lb && m + pat.len() > la) {
                            from = m + pat.chars().next().map_or(1, char::len_utf8);
                            continue;
                        }
                        break Some(m);
                    };
                    let Some(m) = found else {
                        next.push(Frag::Raw(start, end));
                        break;
                    };
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > start && is_space(text.as_bytes()[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Frag::Raw(start, left_end));
                    }
                    next.push(Frag::Tok(id));
                    start = m + pat.len();
                    if a & attr::RSTRIP != 0 {
                        while start < end && is_space(text.as_bytes()[start]) {
                            start += 1;
                        }
                    }
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }

    #[inline]
    fn id_of(&self, bytes: &[u8]) -> Option<u32> {
        self.token_to_id.get(bytes).copied()
    }

    /// Text of the tokens, special (control) tokens left out; the SentencePiece dummy-prefix
    /// space at the very start is dropped, as the Hugging Face decoder does.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, false)
    }

    /// As `decode`, with control tokens rendered as their text when `render_special`.
    pub fn decode_with(&self, ids: &[u32], render_special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            if render_special || !self.is_control(id) {
                bytes.extend_from_slice(self.token_bytes_ref(id));
            }
        }
        let mut s = String::from_utf8_lossy(&bytes).into_owned();
        if self.add_space_prefix && s.starts_with(' ') {
            s.remove(0);
        }
        s
    }

    /// The raw bytes a token stands for (for special tokens: their text). Empty for ids out of
    /// range and for unused tokens.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.token_bytes_ref(id).to_vec()
    }

    pub(crate) fn token_bytes_ref(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map(|p| &p[..]).unwrap_or(&[])
    }

    /// Control or unknown token (not content; left out of `decode`).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs.get(id as usize).is_some_and(|a| a & (attr::CONTROL | attr::UNKNOWN) != 0)
    }

    /// The token's text as stored in the vocabulary (byte-level or `▁` form).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.id_of(text.as_bytes())
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Every token that ends generation: EOS, end-of-turn (`<|im_end|>`, `<end_of_turn>`,
    /// `<|eot_id|>` ...) and the others llama.cpp treats as end-of-generation. Sorted.
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eog.clone()
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// An embedding model's input: its special tokens around the text as the model adds them
    /// (BOS, and EOS where its post-processor appends one: BERT's `[CLS]` … `[SEP]`), control
    /// tokens typed in the text kept as text.
    pub fn encode_input(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode_with(text, self.add_bos, false)?;
        if self.add_eos
            && let Some(eos) = self.eos
        {
            ids.push(eos);
        }
        Ok(ids)
    }

    /// Whether `encode(_, true)` appends EOS (a post-processor that appends one: BERT's [SEP]).
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether `encode(_, true)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    /// The chat template shipped with the model (`tokenizer.chat_template`).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The file this tokenizer was read from.
    pub fn source(&self) -> &Path {
        &self.source
    }
}

impl spm::SpmVocab for Tokenizer {
    #[inline]
    fn piece_id(&self, bytes: &[u8]) -> Option<u32> {
        self.id_of(bytes)
    }
    #[inline]
    fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }
    fn byte_token(&self, b: u8) -> Option<u32> {
        self.byte_tokens[b as usize].or_else(|| self.id_of(&[b]))
    }
    fn unk_id(&self) -> Option<u32> {
        self.unk
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.backend {
            Backend::Spm => "spm",
            Backend::Bpe { .. } => "bpe",
            Backend::Hf(_) => "tokenizer.json",
        };
        f.debug_struct("Tokenizer")
            .field("source", &self.source)
            .field("kind", &kind)
            .field("vocab_size", &self.texts.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

/// Parse `<0xNN>` (byte-fallback token text).
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The automaton `partition` finds the texts of `specials` with (longest first, as the caller
/// sorted them); None when there are none.
pub(crate) fn specials_matcher(path: &Path, texts: &[String], specials: &[u32]) -> Result<Option<aho_corasick::AhoCorasick>> {
    if specials.is_empty() {
        return Ok(None);
    }
    let pats: Vec<&str> = specials.iter().map(|&i| texts[i as usize].as_str()).collect();
    aho_corasick::AhoCorasick::new(pats)
        .map(Some)
        .map_err(|e| FormatError::malformed(path, format!("special-token matcher: {e}")))
}

/// Harmony vocabularies (gpt-oss) as llama.cpp loads them. The markup between messages
/// (`<|channel|>`, `<|message|>`, `<|start|>`, `<|constrain|>`) is rendered in generated text,
/// for the output splitter to read the channels from (`calls::Family::Harmony`); where the turn
/// ends with `<|return|>` or `<|call|>`, `<|end|>` only ends a message (the analysis before the
/// answer): it is rendered and does not end generation.
pub(crate) fn harmony_markup(texts: &[String], attrs: &mut [u32], eog: &mut std::collections::BTreeSet<u32>) {
    for (i, t) in texts.iter().enumerate() {
        if matches!(t.as_str(), "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>") {
            attrs[i] = attr::USER_DEFINED;
        }
    }
    let has = |s: &str, eog: &std::collections::BTreeSet<u32>| eog.iter().find(|&&i| texts[i as usize] == s).copied();
    if let Some(end) = has("<|end|>", eog) {
        let call = has("<|call|>", eog).or(has("<|calls|>", eog)).is_some();
        if call && (has("<|return|>", eog).is_some() || has("<|flush|>", eog).is_some()) {
            eog.remove(&end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
    }
}

/// Texts llama.cpp treats as end of generation (besides EOS/EOT/EOM ids from the metadata).
pub(crate) const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
];
