//! The trainer's checkpoint file: everything that changes across steps (master copies, AdamW
//! moments, the step count, the data cursor) plus the run identity it must be resumed with, so
//! that a resumed run continues bit-identically. Written atomically: into `<path>.tmp`, flushed
//! and synced, then renamed over `<path>` (a crash or a failed step never leaves a torn or
//! half-updated checkpoint; the previous one stays until the rename).
//!
//! ```text
//! magic "CTQPOLv1" | elem u32 (4: f32, 8: f64) | 0u32
//! step, epoch, pos | ctx, batch, seed, shuffle       u64 LE each
//! n u64 | len_i u64 × n                              (trainable tensors, StudentGrads order)
//! params_i × n | m_i × n | v_i × n                   elem-sized LE floats
//! FNV-1a 64 of every byte above                      u64 LE
//! ```

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::data::Cursor;
use crate::float::Float;
use crate::trainer::{TrainError, Trainer};

const MAGIC: &[u8; 8] = b"CTQPOLv1";

/// FNV-1a, 64 bit (corruption check, not security).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

struct HashWriter<W: Write> {
    w: W,
    h: Fnv,
}

impl<W: Write> HashWriter<W> {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.h.update(b);
        self.w.write_all(b)
    }
    fn u64(&mut self, x: u64) -> std::io::Result<()> {
        self.put(&x.to_le_bytes())
    }
    fn floats<F: Float>(&mut self, xs: &[F]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(xs.len().min(1 << 16) * 8);
        for chunk in xs.chunks(1 << 16) {
            buf.clear();
            for &x in chunk {
                if size_of::<F>() == 4 {
                    buf.extend_from_slice(&(x.to_f64() as f32).to_le_bytes());
                } else {
                    buf.extend_from_slice(&x.to_f64().to_le_bytes());
                }
            }
            self.put(&buf)?;
        }
        Ok(())
    }
}

struct HashReader<R: Read> {
    r: R,
    h: Fnv,
}

impl<R: Read> HashReader<R> {
    fn get(&mut self, b: &mut [u8]) -> std::io::Result<()> {
        self.r.read_exact(b)?;
        self.h.update(b);
        Ok(())
    }
    fn u64(&mut self) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        self.get(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    fn floats<F: Float>(&mut self, out: &mut [F]) -> std::io::Result<()> {
        let es = size_of::<F>();
        let mut buf = vec![0u8; out.len().min(1 << 16) * es];
        for chunk in out.chunks_mut(1 << 16) {
            let b = &mut buf[..size_of_val(chunk)];
            self.get(b)?;
            for (x, e) in chunk.iter_mut().zip(b.chunks_exact(es)) {
                *x = if es == 4 {
                    F::from_f64(f32::from_le_bytes(e.try_into().expect("4 bytes")) as f64)
                } else {
                    F::from_f64(f64::from_le_bytes(e.try_into().expect("8 bytes")))
                };
            }
        }
        Ok(())
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// The identity a checkpoint must be resumed with.
fn identity<F: Float>(tr: &Trainer<'_, F>) -> [u64; 4] {
    [tr.cfg.ctx as u64, tr.cfg.batch as u64, tr.cfg.seed, tr.cfg.shuffle as u64]
}

pub(crate) fn save<F: Float>(tr: &mut Trainer<'_, F>, path: &Path) -> Result<(), TrainError> {
    let tmp = tmp_path(path);
    let io = |source| TrainError::Io { path: path.to_path_buf(), source };
    let write = |tr: &mut Trainer<'_, F>| -> std::io::Result<()> {
        let f = File::create(&tmp)?;
        let mut w = HashWriter { w: BufWriter::new(f), h: Fnv::new() };
        w.put(MAGIC)?;
        w.put(&(size_of::<F>() as u32).to_le_bytes())?;
        w.put(&0u32.to_le_bytes())?;
        for x in [tr.step, tr.cursor.epoch, tr.cursor.pos] {
            w.u64(x)?;
        }
        for x in identity(tr) {
            w.u64(x)?;
        }
        let params = tr.params.tensors_mut();
        w.u64(params.len() as u64)?;
        for p in &params {
            w.u64(p.len() as u64)?;
        }
        for p in &params {
            w.floats(p)?;
        }
        for st in &tr.moments {
            w.floats(&st.m)?;
        }
        for st in &tr.moments {
            w.floats(&st.v)?;
        }
        let h = w.h.0;
        w.w.write_all(&h.to_le_bytes())?;
        let f = w.w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()
    };
    if let Err(e) = write(tr) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    // Persist the rename itself (best effort: not every platform syncs directories).
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(d) = File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

pub(crate) fn load<F: Float>(tr: &mut Trainer<'_, F>, path: &Path) -> Result<(), TrainError> {
    let bad = |what: String| TrainError::Checkpoint { path: path.to_path_buf(), what };
    let io = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::UnexpectedEof {
            TrainError::Checkpoint { path: path.to_path_buf(), what: "truncated".into() }
        } else {
            TrainError::Io { path: path.to_path_buf(), source }
        }
    };
    let f = File::open(path).map_err(io)?;
    let mut r = HashReader { r: BufReader::new(f), h: Fnv::new() };
    let mut head = [0u8; 16];
    r.get(&mut head).map_err(io)?;
    if &head[..8] != MAGIC {
        return Err(bad("not a cortiq polish checkpoint (bad magic)".into()));
    }
    let elem = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
    if elem != size_of::<F>() {
        return Err(bad(format!("holds {}-byte floats, this trainer keeps {}-byte masters", elem, size_of::<F>())));
    }
    let (step, epoch, pos) = (r.u64().map_err(io)?, r.u64().map_err(io)?, r.u64().map_err(io)?);
    let mut id = [0u64; 4];
    for x in &mut id {
        *x = r.u64().map_err(io)?;
    }
    let want = identity(tr);
    for (name, (got, exp)) in ["ctx", "batch", "seed", "shuffle"].iter().zip(id.iter().zip(&want)) {
        if got != exp {
            return Err(bad(format!("was written with {name} {got}, this run has {exp}")));
        }
    }
    // Read into fresh buffers; the trainer changes only once the whole file checked out.
    let mut params = tr.params.clone();
    let mut moments = tr.moments.clone();
    let mut pt = params.tensors_mut();
    let n = r.u64().map_err(io)? as usize;
    if n != pt.len() {
        return Err(bad(format!("holds {n} trainable tensors, this student has {}", pt.len())));
    }
    for (i, p) in pt.iter().enumerate() {
        let len = r.u64().map_err(io)? as usize;
        if len != p.len() {
            return Err(bad(format!("trainable tensor {i} has {len} values, this student's has {}", p.len())));
        }
    }
    for p in pt.iter_mut() {
        r.floats(p).map_err(io)?;
    }
    for st in moments.iter_mut() {
        r.floats(&mut st.m).map_err(io)?;
    }
    for st in moments.iter_mut() {
        r.floats(&mut st.v).map_err(io)?;
    }
    let h = r.h.0;
    let mut tail = [0u8; 8];
    r.r.read_exact(&mut tail).map_err(io)?;
    if u64::from_le_bytes(tail) != h {
        return Err(bad("checksum mismatch (corrupt file)".into()));
    }
    if r.r.read(&mut [0u8; 1]).map_err(io)? != 0 {
        return Err(bad("trailing bytes after the checksum".into()));
    }
    drop(pt);
    tr.params = params;
    tr.moments = moments;
    tr.step = step;
    tr.cursor = Cursor { epoch, pos };
    Ok(())
}
