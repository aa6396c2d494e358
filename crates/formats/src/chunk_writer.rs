//! Model files written so that the page cache holds them in 2 MiB pages (`PageShare`): a file's
//! freshly written pages stay cached in the sizes the writes gave them, and only a write that
//! covers a whole 2 MiB-aligned stretch gets a 2 MiB page (1 GiB written in 1 MiB writes: none;
//! in 4 MiB writes at 4 MiB-aligned offsets: all; 2026-12-07, Linux 6.18, ext4). `ChunkWriter`
//! buffers what it is given and writes only whole stretches that end on a multiple of its chunk
//! in file offset, whatever sizes the caller writes in (a download's reads, a header of any
//! length, tensors bigger than the chunk).

use std::io::{self, Write};

/// Bytes per write of downloads and converted files: two 2 MiB pages.
pub const WRITE_CHUNK: usize = 4 << 20;

/// A writer whose writes end on multiples of `chunk` bytes of file offset (the last one, at
/// `flush`, excepted).
pub struct ChunkWriter<W: Write> {
    inner: W,
    /// File offset of the first buffered byte.
    at: u64,
    buf: Vec<u8>,
    chunk: u64,
}

impl<W: Write> ChunkWriter<W> {
    /// Writing to `inner` whose next byte lands at file offset `at`.
    pub fn new(inner: W, at: u64, chunk: usize) -> ChunkWriter<W> {
        ChunkWriter { inner, at, buf: Vec::with_capacity(chunk), chunk: chunk.max(1) as u64 }
    }

    /// Everything written out; the inner writer back.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.flush()?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for ChunkWriter<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        let end = self.at + self.buf.len() as u64;
        let boundary = end / self.chunk * self.chunk;
        if boundary > self.at {
            let n = (boundary - self.at) as usize;
            self.inner.write_all(&self.buf[..n])?;
            self.buf.drain(..n);
            self.at = boundary;
            self.buf.shrink_to(self.chunk as usize);
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.write_all(&self.buf)?;
        self.at += self.buf.len() as u64;
        self.buf.clear();
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the offsets and lengths of the writes it receives.
    struct Log(Vec<(u64, usize)>, u64);

    impl Write for Log {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.push((self.1, b.len()));
            self.1 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn writes_end_on_chunk_boundaries() {
        // from offset 5 (a resumed download), pieces of 3, 1, 17 and 40 bytes, chunk 8
        let mut w = ChunkWriter::new(Log(Vec::new(), 5), 5, 8);
        for n in [3usize, 1, 17, 40] {
            w.write_all(&vec![7u8; n]).unwrap();
        }
        let log = w.into_inner().unwrap();
        let (body, last) = log.0.split_at(log.0.len() - 1);
        assert!(body.iter().all(|&(at, n)| (at + n as u64) % 8 == 0), "{:?}", log.0);
        assert_eq!(log.0[0], (5, 3), "the first write goes up to the first boundary");
        let total: usize = log.0.iter().map(|w| w.1).sum();
        assert_eq!(total, 3 + 1 + 17 + 40);
        assert_eq!(last[0].0 + last[0].1 as u64, 5 + 61, "the tail at flush");
    }
}
