//! BPE pre-tokenization: splitting text into words before merges, the way llama.cpp does it.
//!
//! A pre-tokenizer is a list of split passes applied in order; each pass splits every fragment
//! left by the previous pass, keeping both the matches and the text between them. The common
//! patterns (GPT-2, Llama 3, Qwen2, Qwen3.5) are hand-written state machines rather than regexes:
//! llama.cpp special-cases exactly these patterns, and its hand-written versions differ from a true
//! regex on a few inputs (e.g. how `\s+(?!\S)` treats a whitespace run at the end of a fragment),
//! so matching its ids means matching its state machines. Every other pattern runs through
//! `fancy-regex` (look-arounds), which agrees with llama.cpp's std::regex fallback on the
//! categories that fallback understands.
//!
//! Offsets are counted in codepoints while splitting and turned into byte ranges at the end.

use super::unicode::{Flags, flags};

/// The pre-tokenizer settings that a `tokenizer.ggml.pre` name implies.
pub(crate) struct PreConfig {
    pub passes: Vec<Pass>,
    /// GPT-2 byte-level encoding of each word before merges (false for SentencePiece-style BPE).
    pub byte_encode: bool,
    /// A word that is itself a token is emitted whole, without merges (Llama 3 style).
    pub ignore_merges: bool,
    /// Default for add_bos when the GGUF does not say.
    pub add_bos: bool,
    /// Replace spaces by U+2581 before tokenizing (SentencePiece-style BPE).
    pub escape_whitespace: bool,
}

pub(crate) enum Pass {
    Gpt2,
    Llama3,
    Qwen2,
    Qwen35,
    Newlines,
    Regex(Box<fancy_regex::Regex>),
}

// Patterns as published in the models' tokenizer.json files (case-insensitive groups spelled out,
// as std::regex in llama.cpp needs them).
const RE_CHATGLM4: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_BLOOM: &str = r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+";
const RE_SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_BAILING: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const RE_GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_DEEPSEEK_LLM_LATIN: &str = r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+";

enum P {
    Gpt2,
    Llama3,
    Qwen2,
    Qwen35,
    Newlines,
    Re(&'static str),
}

impl PreConfig {
    /// Settings for a `tokenizer.ggml.pre` value, following llama.cpp's table; `None` for names
    /// we do not know (the caller reports them).
    pub fn for_name(pre: &str) -> Option<Result<PreConfig, String>> {
        use P::*;
        let mut ignore_merges = false;
        let mut add_bos = false;
        let mut byte_encode = true;
        let mut escape_whitespace = false;
        let passes: Vec<P> = match pre {
            "default" | "" => vec![Re(r"[\p{P}\$\+<=>\^~\|]+"), Gpt2, Re(r"\p{N}+"), Re(r"[0-9][0-9][0-9]")],
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "jina-v5-nano" => {
                ignore_merges = true;
                add_bos = true;
                vec![Llama3]
            }
            "dbrx" | "smaug-bpe" => vec![Llama3],
            "deepseek-llm" => vec![
                Re(r"[\r\n]"),
                Re(RE_DEEPSEEK_LLM_LATIN),
                Re(r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+"),
                Re(r"\s+$"),
                Re(r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+"),
                Re(r"\p{N}+"),
            ],
            "deepseek-coder" => {
                vec![
                    Re(r"[\r\n]"),
                    Re(r"\s?\p{L}+"),
                    Re(r"\s?\p{P}+"),
                    Re(r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+"),
                    Re(r"\p{N}"),
                ]
            }
            "falcon" => vec![Re(r"[\p{P}\$\+<=>\^~\|`]+"), Gpt2, Re(r"[0-9][0-9][0-9]")],
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                vec![Re(r"\p{N}"), Gpt2]
            }
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
            | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" | "trillion"
            | "granite-docling" | "exaone4" => vec![Gpt2],
            "stablelm2" | "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "hunyuan" | "solar-open" | "grok-2" => {
                vec![Qwen2]
            }
            "qwen35" => vec![Qwen35],
            "poro-chat" | "bloom" | "gpt3-finnish" => vec![Re(RE_BLOOM)],
            "chatglm-bpe" => vec![Re(RE_CHATGLM4)],
            "glm4" | "glm5" => {
                ignore_merges = true;
                vec![Re(RE_CHATGLM4)]
            }
            "viking" => vec![Re(RE_BLOOM), Re(r"\p{N}")],
            "tekken" => {
                ignore_merges = true;
                add_bos = true;
                vec![Re(RE_TEKKEN)]
            }
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => vec![Re(RE_GPT4O)],
            "seed-coder" => vec![Re(RE_SEED_CODER)],
            "bailingmoe" | "bailingmoe2" | "llada-moe" => vec![Re(RE_BAILING)],
            "gemma4" => {
                byte_encode = false;
                escape_whitespace = true;
                add_bos = true;
                vec![Newlines]
            }
            _ => return None,
        };
        let mut out = Vec::with_capacity(passes.len());
        for p in passes {
            out.push(match p {
                Gpt2 => Pass::Gpt2,
                Llama3 => Pass::Llama3,
                Qwen2 => Pass::Qwen2,
                Qwen35 => Pass::Qwen35,
                Newlines => Pass::Newlines,
                Re(s) => match fancy_regex::Regex::new(s) {
                    Ok(r) => Pass::Regex(Box::new(r)),
                    Err(e) => return Some(Err(format!("pre-tokenizer '{pre}': regex {s:?}: {e}"))),
                },
            });
        }
        Some(Ok(PreConfig { passes: out, byte_encode, ignore_merges, add_bos, escape_whitespace }))
    }

    /// Split `text` into words (byte ranges of `text`, in order, covering all of it).
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        if text.is_empty() {
            return Vec::new();
        }
        let cpts: Vec<char> = text.chars().collect();
        // byte_pos[i] = byte offset of codepoint i; byte_pos[n] = text.len().
        let mut byte_pos: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        byte_pos.push(text.len());
        let mut lens = vec![cpts.len()];
        for pass in &self.passes {
            lens = match pass {
                Pass::Gpt2 => split_custom(&cpts, &lens, Style::Gpt2),
                Pass::Llama3 => split_custom(&cpts, &lens, Style::Llama3),
                Pass::Qwen2 => split_custom(&cpts, &lens, Style::Qwen2),
                Pass::Qwen35 => split_custom(&cpts, &lens, Style::Qwen35),
                Pass::Newlines => split_newlines(&cpts, &lens),
                Pass::Regex(re) => split_regex(text, &byte_pos, &lens, re),
            };
        }
        let mut words = Vec::with_capacity(lens.len());
        let mut start = 0;
        for len in lens {
            words.push(&text[byte_pos[start]..byte_pos[start + len]]);
            start += len;
        }
        words
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    /// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
    Gpt2,
    /// (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    Llama3,
    /// As Llama3 with \p{N} (one digit per word).
    Qwen2,
    /// As Qwen2 with marks joining letters: [\p{L}\p{M}]+ and [^\s\p{L}\p{M}\p{N}]+.
    Qwen35,
}

/// One fragment's view: codepoints and flags inside [ini, end), "nothing" outside.
struct Frag<'a> {
    cpts: &'a [char],
    ini: usize,
    end: usize,
}

impl Frag<'_> {
    #[inline]
    fn cpt(&self, pos: usize) -> Option<char> {
        if pos >= self.ini && pos < self.end { Some(self.cpts[pos]) } else { None }
    }
    #[inline]
    fn flags(&self, pos: usize) -> Flags {
        if pos >= self.ini && pos < self.end { flags(self.cpts[pos]) } else { Flags(0) }
    }
}

fn is_contraction(f: &Frag, pos: usize, fold_case: bool) -> usize {
    // Returns the length of a contraction ('s, 't, 're, 've, 'm, 'll, 'd) starting at pos, or 0.
    if f.cpt(pos) != Some('\'') || pos + 1 >= f.end {
        return 0;
    }
    let low = |c: Option<char>| c.map(|c| if fold_case { c.to_ascii_lowercase() } else { c });
    let n1 = low(f.cpt(pos + 1));
    if matches!(n1, Some('s' | 't' | 'm' | 'd')) {
        return 2;
    }
    if pos + 2 < f.end {
        let n2 = low(f.cpt(pos + 2));
        if matches!((n1, n2), (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))) {
            return 3;
        }
    }
    0
}

fn split_custom(cpts: &[char], lens: &[usize], style: Style) -> Vec<usize> {
    let mut out = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &len in lens {
        let f = Frag { cpts, ini: start, end: start + len };
        start += len;
        let mut prev_end = f.ini;
        let mut emit = |end: usize, out: &mut Vec<usize>| {
            if end > prev_end {
                out.push(end - prev_end);
            }
            prev_end = end;
        };
        let mut pos = f.ini;
        while pos < f.end {
            let cpt = cpts[pos];
            let fl = f.flags(pos);

            let c = is_contraction(&f, pos, style != Style::Gpt2);
            if c > 0 {
                pos += c;
                emit(pos, &mut out);
                continue;
            }

            if style == Style::Gpt2 {
                // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional leading space joins the run.
                let fl2 = if cpt == ' ' { f.flags(pos + 1) } else { fl };
                let run: Option<fn(Flags) -> bool> = if fl2.is_letter() {
                    Some(|x| x.is_letter())
                } else if fl2.is_number() {
                    Some(|x| x.is_number())
                } else if !(fl2.is_whitespace() || fl2.is_letter() || fl2.is_number()) && fl2.any() {
                    Some(|x| !(x.is_whitespace() || x.is_letter() || x.is_number()) && x.any())
                } else {
                    None
                };
                if let Some(run) = run {
                    pos += (cpt == ' ') as usize;
                    while run(f.flags(pos)) {
                        pos += 1;
                    }
                    emit(pos, &mut out);
                    continue;
                }
            } else {
                let marks = style == Style::Qwen35;
                let wordish = |x: Flags| x.is_letter() || (marks && x.is_accent_mark());
                // [^\r\n\p{L}\p{N}]?\p{L}+ : one leading non-letter (not a newline or digit) may join.
                if !(cpt == '\r' || cpt == '\n' || fl.is_number()) && (wordish(fl) || wordish(f.flags(pos + 1))) {
                    pos += 1;
                    while wordish(f.flags(pos)) {
                        pos += 1;
                    }
                    emit(pos, &mut out);
                    continue;
                }
                if fl.is_number() {
                    if style == Style::Llama3 {
                        // \p{N}{1,3}: digits in groups of three from the left.
                        let mut ini = pos;
                        while f.flags(pos).is_number() {
                            pos += 1;
                            if pos - ini >= 3 {
                                emit(pos, &mut out);
                                ini = pos;
                            }
                        }
                    } else {
                        pos += 1;
                    }
                    emit(pos, &mut out);
                    continue;
                }
                // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
                let fl2 = if cpt == ' ' { f.flags(pos + 1) } else { fl };
                let other = |x: Flags| !(x.is_whitespace() || wordish(x) || x.is_letter() || x.is_number());
                if other(fl2) && fl.any() {
                    pos += (cpt == ' ') as usize;
                    while other(f.flags(pos)) && f.flags(pos).any() {
                        pos += 1;
                    }
                    while matches!(f.cpt(pos), Some('\r' | '\n')) {
                        pos += 1;
                    }
                    emit(pos, &mut out);
                    continue;
                }
            }

            let mut n_ws = 0;
            let mut last_newline_end = 0;
            while f.flags(pos + n_ws).is_whitespace() {
                if style != Style::Gpt2 && matches!(f.cpt(pos + n_ws), Some('\r' | '\n')) {
                    last_newline_end = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            // `\s*[\r\n]+`: whitespace up to and including the last newline of the run.
            if last_newline_end > 0 {
                pos = last_newline_end;
                emit(pos, &mut out);
                continue;
            }
            // `\s+(?!\S)`: a run followed by a non-space leaves its last space to the next word.
            if n_ws > 1 && f.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                emit(pos, &mut out);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                emit(pos, &mut out);
                continue;
            }
            pos += 1;
            emit(pos, &mut out);
        }
    }
    out
}

/// `[^\n]+|[\n]+`
fn split_newlines(cpts: &[char], lens: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &len in lens {
        let end = start + len;
        let mut pos = start;
        while pos < end {
            let nl = cpts[pos] == '\n';
            let run = pos;
            while pos < end && (cpts[pos] == '\n') == nl {
                pos += 1;
            }
            out.push(pos - run);
        }
        start = end;
    }
    out
}

/// A regex pass: matches and the gaps between them both become fragments.
fn split_regex(text: &str, byte_pos: &[usize], lens: &[usize], re: &fancy_regex::Regex) -> Vec<usize> {
    let to_cpt = |b: usize| byte_pos.partition_point(|&p| p < b);
    let mut out = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &len in lens {
        let (b0, b1) = (byte_pos[start], byte_pos[start + len]);
        let frag = &text[b0..b1];
        let mut last = start;
        for m in re.find_iter(frag) {
            // A backtracking-limit error leaves the rest of the fragment as one word.
            let Ok(m) = m else { break };
            if m.start() == m.end() {
                continue;
            }
            let (m0, m1) = (to_cpt(b0 + m.start()), to_cpt(b0 + m.end()));
            if m0 > last {
                out.push(m0 - last);
            }
            out.push(m1 - m0);
            last = m1;
        }
        if start + len > last {
            out.push(start + len - last);
        }
        start += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let cfg = PreConfig::for_name(pre).unwrap().unwrap();
        cfg.split(text).into_iter().map(String::from).collect()
    }

    #[test]
    fn gpt2_whitespace_and_contractions() {
        assert_eq!(words("gpt-2", "Hello  world's"), ["Hello", " ", " world", "'s"]);
        assert_eq!(words("gpt-2", "a   "), ["a", "   "]);
        assert_eq!(words("gpt-2", " 123abc"), [" 123", "abc"]);
    }

    #[test]
    fn llama3_digits_and_newlines() {
        assert_eq!(words("llama-bpe", "12345 x\n\n y"), ["123", "45", " x", "\n\n", " y"]);
        assert_eq!(words("llama-bpe", "I'M ok"), ["I", "'M", " ok"]);
    }

    #[test]
    fn smollm_splits_every_digit() {
        assert_eq!(words("smollm", "x 2024"), ["x", " ", "2", "0", "2", "4"]);
    }
}
