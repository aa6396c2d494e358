//! Unicode helpers the tokenizers need: per-codepoint category flags and the GPT-2 byte <-> char map.
//!
//! The flags mirror what llama.cpp's pre-tokenizers test (`\p{N}`, `\p{L}`, `\p{Z}`, `\p{M}`,
//! `\p{P}`, `\p{S}`, `\p{C}`, `\s`). Rather than carrying our own copy of the Unicode database, the
//! category ranges are read once from `regex-syntax` (already compiled in for the regex engine), so
//! the hand-written splitters and the regex fallback agree on every codepoint.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

pub(crate) const UNDEFINED: u16 = 0x0001;
pub(crate) const NUMBER: u16 = 0x0002;
pub(crate) const LETTER: u16 = 0x0004;
pub(crate) const SEPARATOR: u16 = 0x0008;
pub(crate) const ACCENT_MARK: u16 = 0x0010;
pub(crate) const PUNCTUATION: u16 = 0x0020;
pub(crate) const SYMBOL: u16 = 0x0040;
pub(crate) const CONTROL: u16 = 0x0080;
pub(crate) const WHITESPACE: u16 = 0x0100;

const N_CODEPOINTS: usize = 0x11_0000;

/// Category flags of one codepoint. `0` is reserved for "outside the fragment" by the splitters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags(pub u16);

impl Flags {
    #[inline]
    pub fn is_number(self) -> bool {
        self.0 & NUMBER != 0
    }
    #[inline]
    pub fn is_letter(self) -> bool {
        self.0 & LETTER != 0
    }
    #[inline]
    pub fn is_whitespace(self) -> bool {
        self.0 & WHITESPACE != 0
    }
    #[inline]
    pub fn is_accent_mark(self) -> bool {
        self.0 & ACCENT_MARK != 0
    }
    /// Any flag set: a real codepoint (assigned or not) as opposed to "past the end".
    #[inline]
    pub fn any(self) -> bool {
        self.0 != 0
    }
}

fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    // The patterns are fixed literals below; a failure here is a build-time bug, not bad input.
    let hir =
        regex_syntax::ParserBuilder::new().build().parse(pattern).unwrap_or_else(|e| panic!("unicode class {pattern}: {e}"));
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c.ranges().iter().map(|r| (r.start() as u32, r.end() as u32)).collect(),
        other => panic!("unicode class {pattern}: unexpected {other:?}"),
    }
}

fn build_table() -> Vec<u16> {
    // 1.1 M entries x 2 bytes: a flat table makes the per-codepoint lookup in the splitters a
    // single load, which matters for 100 KB prompts.
    let mut table = vec![UNDEFINED; N_CODEPOINTS];
    let cats: [(&str, u16); 7] = [
        (r"\p{N}", NUMBER),
        (r"\p{L}", LETTER),
        (r"\p{Z}", SEPARATOR),
        (r"\p{M}", ACCENT_MARK),
        (r"\p{P}", PUNCTUATION),
        (r"\p{S}", SYMBOL),
        (r"[\p{Cc}\p{Cf}\p{Co}]", CONTROL),
    ];
    for (pat, flag) in cats {
        for (a, b) in class_ranges(pat) {
            for cp in a..=b {
                table[cp as usize] = flag;
            }
        }
    }
    for (a, b) in class_ranges(r"\s") {
        for cp in a..=b {
            table[cp as usize] |= WHITESPACE;
        }
    }
    table
}

fn table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(build_table)
}

#[inline]
pub(crate) fn flags(c: char) -> Flags {
    Flags(table()[c as usize])
}

/// GPT-2's reversible byte -> printable char map (bytes that are printable Latin-1 map to
/// themselves, the rest to U+0100 onwards in byte order).
pub(crate) fn byte_to_char_table() -> &'static [char; 256] {
    static T: OnceLock<[char; 256]> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = ['\0'; 256];
        let mut n = 0u32;
        for b in 0..256u32 {
            let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
            t[b as usize] = if printable {
                char::from_u32(b).unwrap_or('\0')
            } else {
                let c = char::from_u32(256 + n).unwrap_or('\0');
                n += 1;
                c
            };
        }
        t
    })
}

/// Inverse of [`byte_to_char_table`]: `None` for chars that no byte maps to.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    static T: OnceLock<Vec<i16>> = OnceLock::new();
    let t = T.get_or_init(|| {
        let mut t = vec![-1i16; 0x144];
        for (b, &c) in byte_to_char_table().iter().enumerate() {
            t[c as usize] = b as i16;
        }
        t
    });
    t.get(c as usize).copied().filter(|&b| b >= 0).map(|b| b as u8)
}

/// Byte-level encoding of UTF-8 text: every byte becomes its GPT-2 printable char.
pub(crate) fn byte_encode(text: &str, out: &mut String) {
    let t = byte_to_char_table();
    for &b in text.as_bytes() {
        out.push(t[b as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_of_known_codepoints() {
        assert!(flags('a').is_letter());
        assert!(flags('Ж').is_letter());
        assert!(flags('7').is_number());
        assert!(flags('½').is_number());
        assert!(flags(' ').is_whitespace());
        assert!(flags('\u{3000}').is_whitespace());
        assert!(flags('\u{0301}').is_accent_mark());
        assert_eq!(flags('!').0, PUNCTUATION);
        assert_eq!(flags('$').0, SYMBOL);
        assert_eq!(flags('\u{0378}').0, UNDEFINED);
        assert_eq!(flags('\n').0, CONTROL | WHITESPACE);
    }

    #[test]
    fn byte_map_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char_table()[b as usize]), Some(b));
        }
        assert_eq!(byte_to_char_table()[b' ' as usize], 'Ġ');
        assert_eq!(byte_to_char_table()[b'\n' as usize], 'Ċ');
    }
}
