//! The byte codec of session files (`session`): little-endian integers and length-prefixed
//! f32 / f16 arrays, read back against the size the loading model's own state expects. A leaf:
//! each mixer writes and reads its state with it (`MixerState::save` / `load`).

use half::f16;

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn get_u64(r: &mut &[u8]) -> Result<u64, String> {
    if r.len() < 8 {
        return Err("truncated".into());
    }
    let v = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
    *r = &r[8..];
    Ok(v)
}

pub(crate) fn get_u8(r: &mut &[u8]) -> Result<u8, String> {
    let (&v, rest) = r.split_first().ok_or("truncated")?;
    *r = rest;
    Ok(v)
}

/// An f32 array: its length, then its values.
pub(crate) fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    put_u64(out, v.len() as u64);
    out.reserve(4 * v.len());
    v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
}

/// An f32 array of exactly `want` values (`what` names it in the error).
pub(crate) fn get_f32s(r: &mut &[u8], want: usize, what: &str) -> Result<Vec<f32>, String> {
    get_array(r, want, what, |c: [u8; 4]| f32::from_le_bytes(c))
}

pub(crate) fn put_f16s(out: &mut Vec<u8>, v: &[f16]) {
    put_u64(out, v.len() as u64);
    out.reserve(2 * v.len());
    v.iter().for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes()));
}

pub(crate) fn get_f16s(r: &mut &[u8], want: usize, what: &str) -> Result<Vec<f16>, String> {
    get_array(r, want, what, |c: [u8; 2]| f16::from_bits(u16::from_le_bytes(c)))
}

/// A length-prefixed array of exactly `want` values of W bytes each, decoded by `value`.
fn get_array<T, const W: usize>(r: &mut &[u8], want: usize, what: &str, value: impl Fn([u8; W]) -> T) -> Result<Vec<T>, String> {
    let n = get_u64(r)? as usize;
    if n != want {
        return Err(format!("{what}: {n} values where this model's layer holds {want}"));
    }
    if r.len() / W < n {
        return Err(format!("{what}: truncated"));
    }
    let v = r[..W * n].chunks_exact(W).map(|c| value(c.try_into().expect("W bytes"))).collect();
    *r = &r[W * n..];
    Ok(v)
}
