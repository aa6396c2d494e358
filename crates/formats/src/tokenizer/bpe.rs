//! Byte-pair-encoding merges over one pre-tokenized word, with llama.cpp's exact tie rules.
//!
//! Symbols start as the word's UTF-8 characters; the adjacent pair with the lowest merge rank is
//! merged first, ties going to the leftmost pair. Merge sides are interned to small ids at load
//! time so the inner loop looks up `(left, right)` integer pairs instead of building strings.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

const NONE: u32 = u32::MAX;

/// The merge table: `rank[(left, right)]` over interned piece strings.
pub(crate) struct Merges {
    pieces: HashMap<Box<str>, u32>,
    ranks: HashMap<(u32, u32), u32>,
}

impl Merges {
    /// Build from GGUF merge lines "left right" (rank = line index; the first of duplicates wins).
    pub fn new<'a>(lines: impl Iterator<Item = &'a str>) -> Merges {
        let mut pieces: HashMap<Box<str>, u32> = HashMap::new();
        let mut ranks = HashMap::new();
        let intern = |s: &str, pieces: &mut HashMap<Box<str>, u32>| -> u32 {
            if let Some(&id) = pieces.get(s) {
                return id;
            }
            let id = pieces.len() as u32;
            pieces.insert(s.into(), id);
            id
        };
        for (rank, line) in lines.enumerate() {
            // The separator is the first space after the first character: a merge side may
            // itself be a lone space in vocabularies without byte-level encoding.
            let Some(first_len) = line.chars().next().map(char::len_utf8) else { continue };
            let Some(sp) = line[first_len..].find(' ').map(|p| p + first_len) else { continue };
            let l = intern(&line[..sp], &mut pieces);
            let r = intern(&line[sp + 1..], &mut pieces);
            ranks.entry((l, r)).or_insert(rank as u32);
        }
        Merges { pieces, ranks }
    }

    #[inline]
    fn piece(&self, s: &str) -> u32 {
        self.pieces.get(s).copied().unwrap_or(NONE)
    }

    /// Merge `word` and return its final symbols as byte ranges of `word`.
    pub fn apply(&self, word: &str, out: &mut Vec<(usize, usize)>) {
        let mut syms: Vec<Sym> = Vec::with_capacity(word.len());
        for (i, (b, c)) in word.char_indices().enumerate() {
            let n = c.len_utf8();
            syms.push(Sym {
                start: b,
                len: n,
                prev: i as i32 - 1,
                next: if b + n == word.len() { -1 } else { i as i32 + 1 },
                piece: self.piece(&word[b..b + n]),
            });
        }
        let mut heap = BinaryHeap::new();
        for i in 1..syms.len() {
            self.push_pair(&syms, i - 1, i, &mut heap);
        }
        while let Some(Pair { left, right, size, .. }) = heap.pop() {
            let (l, r) = (&syms[left], &syms[right]);
            // Stale entry: one side was merged away or grew since the pair was queued.
            if l.len == 0 || r.len == 0 || l.len + r.len != size {
                continue;
            }
            let next = r.next;
            let start = syms[left].start;
            syms[left].len = size;
            syms[left].next = next;
            syms[left].piece = self.piece(&word[start..start + size]);
            syms[right].len = 0;
            if next >= 0 {
                syms[next as usize].prev = left as i32;
            }
            let prev = syms[left].prev;
            if prev >= 0 {
                self.push_pair(&syms, prev as usize, left, &mut heap);
            }
            if next >= 0 {
                self.push_pair(&syms, left, next as usize, &mut heap);
            }
        }
        out.extend(syms.iter().filter(|s| s.len > 0).map(|s| (s.start, s.start + s.len)));
    }

    #[inline]
    fn push_pair(&self, syms: &[Sym], left: usize, right: usize, heap: &mut BinaryHeap<Pair>) {
        let (l, r) = (syms[left].piece, syms[right].piece);
        if l == NONE || r == NONE {
            return;
        }
        if let Some(&rank) = self.ranks.get(&(l, r)) {
            heap.push(Pair { rank, left, right, size: syms[left].len + syms[right].len });
        }
    }
}

struct Sym {
    start: usize,
    len: usize,
    prev: i32,
    next: i32,
    piece: u32,
}

#[derive(PartialEq, Eq)]
struct Pair {
    rank: u32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Pair {
    // BinaryHeap pops the greatest: lowest rank first, then the leftmost pair.
    fn cmp(&self, o: &Self) -> Ordering {
        o.rank.cmp(&self.rank).then(o.left.cmp(&self.left))
    }
}
impl PartialOrd for Pair {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_rank_then_leftmost() {
        let m = Merges::new(["a b", "b c", "ab c"].into_iter());
        let mut out = Vec::new();
        m.apply("abc", &mut out);
        assert_eq!(out, [(0, 3)]);
        out.clear();
        // "b c" ranks below "a b" only when "a b" is absent.
        let m = Merges::new(["b c", "a b"].into_iter());
        m.apply("abc", &mut out);
        assert_eq!(out, [(0, 1), (1, 3)]);
        out.clear();
        // Equal pairs: the leftmost merges first ("aa" + "a").
        let m = Merges::new(["a a"].into_iter());
        m.apply("aaa", &mut out);
        assert_eq!(out, [(0, 2), (2, 3)]);
    }
}
