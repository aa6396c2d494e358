//! Streaming detokenization that never splits a UTF-8 character.
//!
//! Tokens are turned into their raw bytes (`Tokenizer::token_bytes`), so a SentencePiece `▁word`
//! keeps its space however the stream is cut, and byte-fallback tokens (`<0xE2><0x96><0x81>`) or
//! byte-level BPE tokens that end mid-character are held back until the character completes.
//! Bytes that can never complete a character come out as U+FFFD, as a lossy decode would.

use super::Tokenizer;

pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    pending: Vec<u8>,
    render_special: bool,
    strip_leading_space: bool,
    emitted_any: bool,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder for generated text: token bytes exactly, control tokens left out.
    pub fn new(tok: &'a Tokenizer) -> StreamDecoder<'a> {
        StreamDecoder { tok, pending: Vec::new(), render_special: false, strip_leading_space: false, emitted_any: false }
    }

    /// Render control tokens (`<|im_end|>` ...) as their text.
    pub fn render_special(mut self, on: bool) -> Self {
        self.render_special = on;
        self
    }

    /// Drop the SentencePiece dummy-prefix space from the start of the stream (as `decode` does),
    /// for vocabularies that add one; use when the stream is a text from its beginning, not when
    /// it continues a prompt. No effect on other vocabularies.
    pub fn strip_leading_space(mut self, on: bool) -> Self {
        self.strip_leading_space = on;
        self
    }

    /// Add one token; returns the text completed by it (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        if !self.render_special && self.tok.is_control(id) {
            return String::new();
        }
        self.pending.extend_from_slice(self.tok.token_bytes_ref(id));
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            let rest = &self.pending[consumed..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY-free: the prefix was just validated.
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Invalid bytes: they can never start a character.
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            consumed += valid + bad;
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            consumed += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        self.finish_text(out)
    }

    /// Flush bytes still held back (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.finish_text(s)
    }

    fn finish_text(&mut self, mut s: String) -> String {
        if !self.emitted_any && !s.is_empty() {
            self.emitted_any = true;
            if self.strip_leading_space && self.tok.add_space_prefix && s.starts_with(' ') {
                s.remove(0);
            }
        }
        s
    }
}
