//! NumPy .npy (format 1.0) for f32 arrays: the exchange format of `cortiq logits` and of the
//! committed reference fixtures. Only little-endian f4 in C order, which is all we write.

use std::io::Write;
use std::path::Path;

use crate::error::{FormatError, Result};

/// Encode an f32 array of `shape` as .npy bytes.
pub fn encode_f32(shape: &[usize], data: &[f32]) -> Vec<u8> {
    assert_eq!(shape.iter().product::<usize>(), data.len(), "npy: shape {shape:?} does not hold {} values", data.len());
    let dims = match shape {
        [d] => format!("({d},)"),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {dims}, }}");
    // Magic (6) + version (2) + header length (2) + header + '\n' is a multiple of 64.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.div_ceil(64) * 64 - total));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Write an f32 array to `path` atomically (temp file in the same folder, then rename).
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    let bytes = encode_f32(shape, data);
    let tmp = path.with_extension(format!("npy.tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        FormatError::io(path, e)
    })
}

/// Read an f32 .npy file: (shape, values).
pub fn read_f32(path: &Path) -> Result<(Vec<usize>, Vec<f32>)> {
    let b = std::fs::read(path).map_err(|e| FormatError::io(path, e))?;
    let bad = |m: &str| FormatError::malformed(path, format!("npy: {m}"));
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err(bad("missing magic"));
    }
    let (hlen, hstart) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => return Err(bad(&format!("version {v} not supported"))),
    };
    let header = std::str::from_utf8(b.get(hstart..hstart + hlen).ok_or_else(|| bad("truncated header"))?)
        .map_err(|_| bad("header not UTF-8"))?;
    if !header.contains("'descr': '<f4'") || !header.contains("'fortran_order': False") {
        return Err(bad(&format!("only little-endian f4 in C order is supported, header {header}")));
    }
    let shape_str = header.split("'shape': (").nth(1).and_then(|s| s.split(')').next()).ok_or_else(|| bad("no shape"))?;
    let shape: Vec<usize> = shape_str
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| bad(&format!("bad dimension '{s}'"))))
        .collect::<Result<_>>()?;
    let n: usize = shape.iter().product();
    let data = &b[hstart + hlen..];
    if data.len() != n * 4 {
        return Err(bad(&format!("shape {shape:?} needs {} bytes of data, file has {}", n * 4, data.len())));
    }
    Ok((shape, data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_alignment() {
        let dir = std::env::temp_dir().join(format!("cortiq-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.npy");
        let data: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
        write_f32(&p, &[2, 3], &data).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!((10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize) % 64, 0);
        let (shape, back) = read_f32(&p).unwrap();
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(back, data);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
