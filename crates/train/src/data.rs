//! The polish's data pipeline after tokenization: token-id files packed into training windows,
//! the train/validation split by file, and the seeded epoch order the trainer walks (its
//! position is part of a checkpoint, so a resumed run sees the same windows in the same order).
//!
//! A window holds T + 1 consecutive tokens of one file (windows never cross files): inputs
//! `w[..T]`, targets `w[1..]`. Windows start every T tokens, so each token is a target once; the
//! tail shorter than T + 1 is dropped. With `bos` given, each window's first token is replaced
//! by it, as `ppl` does with its chunks. The trainer scores positions from T/2 (the sealed
//! prompt is the first half, exactly like `ppl --o1`).

use crate::trainer::TrainError;

/// One tokenized text file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFile {
    /// For messages (a path, usually).
    pub name: String,
    pub tokens: Vec<u32>,
}

/// Packed windows of one split: `windows[i]` has `ctx + 1` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windows {
    pub ctx: usize,
    pub windows: Vec<Vec<u32>>,
}

impl Windows {
    pub fn len(&self) -> usize {
        self.windows.len()
    }
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}

/// Packs `files` into windows of `ctx + 1` tokens. `what` names the split in errors ("training",
/// "validation"). Errors: no files, an empty file (named), no file long enough for one window.
pub fn pack(files: &[TokenFile], ctx: usize, bos: Option<u32>, what: &'static str) -> Result<Windows, TrainError> {
    if ctx < 2 {
        return Err(TrainError::Config(format!("--ctx {ctx}: a window needs at least 2 positions")));
    }
    if files.is_empty() {
        return Err(TrainError::NoFiles { what });
    }
    let mut windows = Vec::new();
    for f in files {
        if f.tokens.is_empty() {
            return Err(TrainError::EmptyFile { name: f.name.clone() });
        }
        let mut s = 0;
        while s + ctx < f.tokens.len() {
            let mut w = f.tokens[s..s + ctx + 1].to_vec();
            if let Some(b) = bos {
                w[0] = b;
            }
            windows.push(w);
            s += ctx;
        }
    }
    if windows.is_empty() {
        let longest = files.iter().map(|f| f.tokens.len()).max().unwrap_or(0);
        return Err(TrainError::NoWindows { what, need: ctx + 1, longest });
    }
    Ok(Windows { ctx, windows })
}

/// Train and validation windows, split by file: a file named in both is an error (the
/// validation ppl ratio must come from text the student never trained on).
pub fn split(train: &[TokenFile], valid: &[TokenFile], ctx: usize, bos: Option<u32>) -> Result<(Windows, Windows), TrainError> {
    if let Some(f) = train.iter().find(|f| valid.iter().any(|v| v.name == f.name)) {
        return Err(TrainError::TrainValidOverlap { name: f.name.clone() });
    }
    Ok((pack(train, ctx, bos, "training")?, pack(valid, ctx, bos, "validation")?))
}

/// splitmix64: the trainer's only randomness (the epoch order), cheap to reseed per epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0), by rejection (no modulo bias).
    pub fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }
}

/// The order of windows in epoch `epoch`: a Fisher–Yates shuffle seeded by (seed, epoch), or
/// the identity when `shuffle` is off. A function of its arguments only, so the data cursor
/// of a checkpoint is just (epoch, position).
pub fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut r = SplitMix(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
        for i in (1..n).rev() {
            let j = r.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
    }
    order
}

/// Where the trainer is in its data: window `pos` of epoch `epoch`'s order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    pub epoch: u64,
    pub pos: u64,
}

impl Cursor {
    /// The next `batch` window indices, advancing (wrapping into the next epoch's order).
    pub fn take(&mut self, n: usize, batch: usize, seed: u64, shuffle: bool) -> Vec<usize> {
        let mut out = Vec::with_capacity(batch);
        let mut order = epoch_order(n, seed, self.epoch, shuffle);
        while out.len() < batch {
            if self.pos as usize >= n {
                self.epoch += 1;
                self.pos = 0;
                order = epoch_order(n, seed, self.epoch, shuffle);
            }
            out.push(order[self.pos as usize]);
            self.pos += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, n: usize) -> TokenFile {
        TokenFile { name: name.into(), tokens: (0..n as u32).collect() }
    }

    #[test]
    fn packing_and_split() {
        // 10 tokens, ctx 4: windows [0..5), [4..9); the tail 8, 9 cannot fill a third.
        let w = pack(&[file("a", 10)], 4, None, "training").unwrap();
        assert_eq!(w.windows, vec![vec![0, 1, 2, 3, 4], vec![4, 5, 6, 7, 8]]);
        let w = pack(&[file("a", 10), file("b", 5)], 4, Some(99), "training").unwrap();
        assert_eq!(w.windows, vec![vec![99, 1, 2, 3, 4], vec![99, 5, 6, 7, 8], vec![99, 1, 2, 3, 4]]);
        assert!(matches!(pack(&[], 4, None, "training"), Err(TrainError::NoFiles { what: "training" })));
        assert!(
            matches!(pack(&[file("a", 10), file("e", 0)], 4, None, "training"), Err(TrainError::EmptyFile { name }) if name == "e")
        );
        let e = pack(&[file("a", 4)], 4, None, "validation").unwrap_err();
        assert!(matches!(e, TrainError::NoWindows { what: "validation", need: 5, longest: 4 }), "{e}");
        assert!(matches!(split(&[file("a", 10)], &[file("a", 10)], 4, None), Err(TrainError::TrainValidOverlap { .. })));
        let (t, v) = split(&[file("a", 10)], &[file("b", 9)], 4, None).unwrap();
        assert_eq!((t.len(), v.len()), (2, 2));
    }

    #[test]
    fn order_is_a_seeded_permutation() {
        let a = epoch_order(50, 7, 0, true);
        let mut s = a.clone();
        s.sort();
        assert_eq!(s, (0..50).collect::<Vec<_>>());
        assert_eq!(a, epoch_order(50, 7, 0, true));
        assert_ne!(a, epoch_order(50, 7, 1, true));
        assert_eq!(epoch_order(5, 7, 3, false), vec![0, 1, 2, 3, 4]);
        // Taking 3 + 4 equals taking 7 (the cursor wraps into the next epoch's order).
        let (mut c1, mut c2) = (Cursor::default(), Cursor::default());
        let mut x = c1.take(5, 3, 9, true);
        x.extend(c1.take(5, 4, 9, true));
        assert_eq!(x, c2.take(5, 7, 9, true));
        assert_eq!(c1, Cursor { epoch: 1, pos: 2 });
    }
}
