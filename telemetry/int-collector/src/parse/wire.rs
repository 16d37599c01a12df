//! Bounds-checked big-endian reads over the received buffer, and the parse error type.
//!
//! Every read goes through these helpers, so no parser indexes a slice directly: a short or
//! lying packet becomes a `ParseError` naming the header and field, never a panic.

use thiserror::Error;

/// Why a report (or a part of it) could not be decoded. `Copy` and allocation-free, so the
/// receive path can count errors by [`ParseError::reason`] at line rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ParseError {
    #[error("truncated {what}: need {need} bytes, {have} left")]
    Truncated { what: &'static str, need: usize, have: usize },
    #[error("unsupported {what} {value}")]
    Unsupported { what: &'static str, value: u32 },
    #[error("bad {what}: {detail} (value {value})")]
    Invalid { what: &'static str, detail: &'static str, value: u32 },
}

impl ParseError {
    /// Stable counter key: `<kind>:<header or field>`.
    pub fn reason(&self) -> (&'static str, &'static str) {
        match self {
            ParseError::Truncated { what, .. } => ("truncated", what),
            ParseError::Unsupported { what, .. } => ("unsupported", what),
            ParseError::Invalid { what, .. } => ("invalid", what),
        }
    }
}

pub type Result<T> = std::result::Result<T, ParseError>;

/// `buf[at..at+n]`, or `Truncated` naming `what`.
#[inline]
pub fn take<'a>(buf: &'a [u8], at: usize, n: usize, what: &'static str) -> Result<&'a [u8]> {
    let have = buf.len().saturating_sub(at);
    match at.checked_add(n) {
        Some(end) if end <= buf.len() => Ok(&buf[at..end]),
        _ => Err(ParseError::Truncated { what, need: n, have }),
    }
}

/// `buf[at..]`, or `Truncated` when `at` is past the end.
#[inline]
pub fn rest<'a>(buf: &'a [u8], at: usize, what: &'static str) -> Result<&'a [u8]> {
    buf.get(at..).ok_or(ParseError::Truncated { what, need: at, have: buf.len() })
}

#[inline]
pub fn u8_at(buf: &[u8], at: usize, what: &'static str) -> Result<u8> {
    Ok(take(buf, at, 1, what)?[0])
}

#[inline]
pub fn u16_at(buf: &[u8], at: usize, what: &'static str) -> Result<u16> {
    let b = take(buf, at, 2, what)?;
    Ok(u16::from_be_bytes([b[0], b[1]]))
}

#[inline]
pub fn u32_at(buf: &[u8], at: usize, what: &'static str) -> Result<u32> {
    let b = take(buf, at, 4, what)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

#[inline]
pub fn u64_at(buf: &[u8], at: usize, what: &'static str) -> Result<u64> {
    let b = take(buf, at, 8, what)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Ok(u64::from_be_bytes(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounds_checked() {
        let b = [1u8, 2, 3];
        assert_eq!(u16_at(&b, 1, "x"), Ok(0x0203));
        assert_eq!(
            u32_at(&b, 0, "hdr"),
            Err(ParseError::Truncated { what: "hdr", need: 4, have: 3 })
        );
        assert!(take(&b, usize::MAX, 2, "x").is_err());
        assert!(rest(&b, 4, "x").is_err());
        assert_eq!(rest(&b, 3, "x"), Ok(&[][..]));
    }
}
