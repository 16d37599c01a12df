//! The protobuf wire decoder: varints, keys and field readers with prost's rules and, for the
//! common faults, its words (`record_at_a_time_decode_equals_prost` checks bit by bit).

use prost::encoding::{skip_field, DecodeContext, WireType};

/// What is wrong with a payload's protobuf encoding (the rules, and for the common faults the
/// words, of prost's decoder, which `record_at_a_time_decode_equals_prost` checks bit by bit).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("invalid varint")]
    Varint,
    #[error("invalid key value: {0}")]
    Key(u64),
    #[error("invalid tag value: 0")]
    Tag,
    #[error("{message}.{field}: invalid wire type {got} (expected {want})")]
    WireType {
        message: &'static str,
        field: &'static str,
        got: u8,
        want: u8,
    },
    #[error("{message}.{field}: buffer underflow")]
    Underflow {
        message: &'static str,
        field: &'static str,
    },
    #[error("{message}.{field}: invalid string value: data is not UTF-8 encoded")]
    Utf8 {
        message: &'static str,
        field: &'static str,
    },
    /// A field its message does not have: the strict decoder every consumer uses refuses it
    /// (a batch of another type shows up as such fields), so the sink does too.
    #[error("{message}: unknown field {tag}")]
    Unknown { message: &'static str, tag: u32 },
    /// prost's own decoder: skipping an unknown field (`skip_field`), or a message decoded
    /// with prost (the INT records).
    #[error(transparent)]
    Prost(#[from] prost::DecodeError),
}

pub(crate) const VARINT: u8 = 0;
pub(crate) const LENGTH_DELIMITED: u8 = 2;

/// A base-128 varint (prost's rules: at most 10 bytes, the 10th at most 1).
#[inline(always)]
pub(crate) fn varint(buf: &mut &[u8]) -> Result<u64, WireError> {
    let (value, len) = varint_at(buf);
    match buf.get(len..) {
        Some(rest) if len > 0 => {
            *buf = rest;
            Ok(value)
        }
        _ => Err(WireError::Varint),
    }
}

/// The varint at the front of `buf` and its length in bytes (0: not a valid varint). Inline,
/// returned in registers: the cursor stays in a register too (a call taking `&mut &[u8]` sent
/// it through memory on every field, one long chain of dependent loads and stores).
#[inline(always)]
pub(crate) fn varint_at(buf: &[u8]) -> (u64, usize) {
    if let Some(&b) = buf.first() {
        if b < 0x80 {
            return (u64::from(b), 1);
        }
    }
    // With 10 bytes left, the first 8 are read as one word and their 7-bit groups gathered
    // without a branch a byte; near the end, a byte at a time.
    if let (Some(word), true) = (buf.first_chunk::<8>(), buf.len() >= 10) {
        let word = u64::from_le_bytes(*word);
        let ends = !word & 0x8080_8080_8080_8080;
        if ends != 0 {
            let len = (ends.trailing_zeros() / 8 + 1) as usize;
            let kept = if len == 8 {
                word
            } else {
                word & ((1u64 << (8 * len)) - 1)
            };
            return (gather7(kept), len);
        }
        let value = gather7(word) | (u64::from(buf[8] & 0x7f) << 56);
        if buf[8] < 0x80 {
            return (value, 9);
        }
        if buf[9] > 1 {
            return (0, 0);
        }
        return (value | (u64::from(buf[9]) << 63), 10);
    }
    varint_bytewise(buf)
}

/// The 7-bit groups of up to 8 little-endian varint bytes, gathered into one value.
#[inline(always)]
fn gather7(word: u64) -> u64 {
    let x = word & 0x7f7f_7f7f_7f7f_7f7f;
    let x = (x & 0x007f_007f_007f_007f) | ((x & 0x7f00_7f00_7f00_7f00) >> 1);
    let x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
    (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4)
}

#[inline(never)]
fn varint_bytewise(buf: &[u8]) -> (u64, usize) {
    let mut value = 0u64;
    for (i, &b) in buf.iter().take(10).enumerate() {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            if i == 9 && b > 1 {
                return (0, 0);
            }
            return (value, i + 1);
        }
    }
    (0, 0)
}

/// A field key: (tag, wire type), checked as prost checks it.
#[inline(always)]
pub(crate) fn key(buf: &mut &[u8]) -> Result<(u32, u8), WireError> {
    let key = varint(buf)?;
    if key > u64::from(u32::MAX) {
        return Err(WireError::Key(key));
    }
    let tag = (key >> 3) as u32;
    if tag == 0 {
        return Err(WireError::Tag);
    }
    // Wire types 6 and 7 are no wire type: `skip` reports them (prost's error), as no known
    // field takes them.
    Ok((tag, (key & 7) as u8))
}

/// The error for field `tag` that `message` does not have: the field's own encoding error
/// first, as a decoder that skipped it would report (prost's rules), else `Unknown`.
#[inline(never)]
pub(crate) fn unknown(
    message: &'static str,
    tag: u32,
    wire_type: u8,
    buf: &mut &[u8],
) -> WireError {
    match skip(tag, wire_type, buf) {
        Err(e) => e,
        Ok(()) => WireError::Unknown { message, tag },
    }
}

/// Skips a field's value with prost's own rules.
#[inline(never)]
pub(crate) fn skip(tag: u32, wire_type: u8, buf: &mut &[u8]) -> Result<(), WireError> {
    let wire_type = WireType::try_from(u64::from(wire_type))?;
    skip_field(wire_type, tag, buf, DecodeContext::default())?;
    Ok(())
}

/// One field's wire reader: its name (for errors) and the wire type it arrived with.
#[derive(Clone, Copy)]
pub(crate) struct FieldAt {
    pub(crate) message: &'static str,
    pub(crate) field: &'static str,
    pub(crate) wire_type: u8,
}

impl FieldAt {
    pub(crate) fn expect(self, want: u8) -> Result<(), WireError> {
        if self.wire_type == want {
            Ok(())
        } else {
            Err(WireError::WireType {
                message: self.message,
                field: self.field,
                got: self.wire_type,
                want,
            })
        }
    }

    #[inline(always)]
    pub(crate) fn u64(self, buf: &mut &[u8]) -> Result<u64, WireError> {
        self.expect(VARINT)?;
        varint(buf)
    }

    /// uint32, as prost reads it: the varint truncated.
    #[inline(always)]
    pub(crate) fn u32(self, buf: &mut &[u8]) -> Result<u32, WireError> {
        Ok(self.u64(buf)? as u32)
    }

    #[inline(always)]
    pub(crate) fn bytes<'a>(self, buf: &mut &'a [u8]) -> Result<&'a [u8], WireError> {
        self.expect(LENGTH_DELIMITED)?;
        let len = varint(buf)?;
        if len > buf.len() as u64 {
            return Err(WireError::Underflow {
                message: self.message,
                field: self.field,
            });
        }
        let (value, rest) = buf.split_at(len as usize);
        *buf = rest;
        Ok(value)
    }

    pub(crate) fn string<'a>(self, buf: &mut &'a [u8]) -> Result<&'a [u8], WireError> {
        let value = self.bytes(buf)?;
        // Names and ids are ASCII: checked a word at a time, the UTF-8 rules only otherwise.
        if value.is_ascii() {
            return Ok(value);
        }
        match std::str::from_utf8(value) {
            Ok(_) => Ok(value),
            Err(_) => Err(WireError::Utf8 {
                message: self.message,
                field: self.field,
            }),
        }
    }

    /// A repeated uint64, packed or not: its values are appended to `values`.
    pub(crate) fn repeated_u64(
        self,
        buf: &mut &[u8],
        values: &mut Vec<u64>,
    ) -> Result<(), WireError> {
        if self.wire_type == LENGTH_DELIMITED {
            let mut packed = self.bytes(buf)?;
            while !packed.is_empty() {
                values.push(varint(&mut packed)?);
            }
            Ok(())
        } else {
            values.push(self.u64(buf)?);
            Ok(())
        }
    }
}

/// Takes the key of field `tag` with wire type `wire_type` off the front of `buf` when it is
/// there, canonically encoded (tags below 2048); anything else is left to `key`.
#[inline(always)]
pub(crate) fn take_key(buf: &mut &[u8], tag: u32, wire_type: u8) -> bool {
    let key = (tag << 3) | u32::from(wire_type);
    let taken = if key < 0x80 {
        buf.first() == Some(&(key as u8))
    } else {
        buf.len() >= 2 && buf[0] == (key as u8 & 0x7f) | 0x80 && u32::from(buf[1]) == key >> 7
    };
    if taken {
        *buf = &buf[if key < 0x80 { 1 } else { 2 }..];
    }
    taken
}

/// Decodes a whole message body `$b` with `$field` (one field: its tag, wire type and the rest
/// of the body): first the fields listed, in that order, each when its key comes next (see
/// `decode_record`; an absent field is just not there), then whatever remains, in any order.
macro_rules! decode_fields {
    ($b:ident, |$tag:ident, $wt:ident, $bb:ident| $field:expr; $($t:literal $w:ident),* $(,)?) => {
        $(
            if take_key($b, $t, $w) {
                let ($tag, $wt, $bb) = ($t, $w, &mut *$b);
                $field?;
            }
        )*
        while !$b.is_empty() {
            let ($tag, $wt) = key($b)?;
            let $bb = &mut *$b;
            $field?;
        }
    };
}
