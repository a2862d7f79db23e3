//! The data types MQTT packets are made of (§1.5 of both specifications): big-endian
//! integers, the variable byte integer, length-prefixed UTF-8 strings and binary data.
//!
//! Reading is checked at every step and ends in a [`Fault`] (the reason code and what was
//! wrong), never in a panic. Writing takes what the server itself produced.

use super::ReasonCode;
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The largest value a variable byte integer holds (four bytes of seven bits).
pub const MAX_VARINT: u32 = 268_435_455;

/// The largest string or binary data: its length is a two-byte integer.
pub const MAX_STRING: usize = u16::MAX as usize;

/// What was wrong with a packet: the reason code to close with and a short description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub reason: ReasonCode,
    pub detail: &'static str,
}

/// A [`Fault`] with reason code 0x81: the packet does not follow the grammar.
pub fn malformed<T>(detail: &'static str) -> Result<T, Fault> {
    Err(Fault {
        reason: ReasonCode::MalformedPacket,
        detail,
    })
}

/// A [`Fault`] with another reason code: the packet parses but breaks a rule.
pub fn fault<T>(reason: ReasonCode, detail: &'static str) -> Result<T, Fault> {
    Err(Fault { reason, detail })
}

/// Decodes a variable byte integer from the start of `bytes`: `Ok(None)` when `bytes` ends
/// before it does. With `minimal`, an encoding longer than needed is malformed (MQTT 5.0
/// §1.5.5 requires the shortest; 3.1.1 does not say).
pub fn read_varint(bytes: &[u8], minimal: bool) -> Result<Option<(u32, usize)>, Fault> {
    let mut value = 0u32;
    for (i, &b) in bytes.iter().enumerate() {
        if i == 4 {
            return malformed("a variable byte integer is longer than four bytes");
        }
        value |= u32::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            if minimal && i > 0 && b == 0 {
                return malformed("a variable byte integer is not in its shortest encoding");
            }
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() >= 4 {
        return malformed("a variable byte integer is longer than four bytes");
    }
    Ok(None)
}

/// How many bytes `value` takes as a variable byte integer (at most [`MAX_VARINT`]).
pub fn varint_len(value: usize) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Appends `value` (at most [`MAX_VARINT`]) as a variable byte integer.
pub fn put_varint(out: &mut BytesMut, value: usize) {
    let mut value = value;
    loop {
        let byte = (value & 0x7F) as u8;
        value >>= 7;
        if value == 0 {
            out.put_u8(byte);
            return;
        }
        out.put_u8(byte | 0x80);
    }
}

/// Appends a string with its two-byte length. The server's own strings only; one longer than
/// [`MAX_STRING`] is cut at the last character boundary that fits.
pub fn put_string(out: &mut BytesMut, s: &str) {
    put_binary(out, fitted(s).as_bytes());
}

/// `s`, or its longest prefix of whole characters that fits in [`MAX_STRING`] bytes.
fn fitted(s: &str) -> &str {
    let mut end = s.len().min(MAX_STRING);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Appends binary data with its two-byte length, cut to [`MAX_STRING`] bytes.
pub fn put_binary(out: &mut BytesMut, data: &[u8]) {
    let data = &data[..data.len().min(MAX_STRING)];
    out.put_u16(data.len() as u16);
    out.put_slice(data);
}

/// The bytes [`put_string`] writes for `s`.
pub fn string_len(s: &str) -> usize {
    2 + fitted(s).len()
}

/// Checked reads from the body of one packet. Binary data and payloads are slices of the
/// packet's buffer, not copies.
pub struct Reader {
    rest: Bytes,
}

impl Reader {
    pub fn new(bytes: Bytes) -> Reader {
        Reader { rest: bytes }
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    pub fn u8(&mut self) -> Result<u8, Fault> {
        if self.rest.is_empty() {
            return malformed("the packet ends inside a field");
        }
        Ok(self.rest.get_u8())
    }

    pub fn u16(&mut self) -> Result<u16, Fault> {
        if self.rest.len() < 2 {
            return malformed("the packet ends inside a field");
        }
        Ok(self.rest.get_u16())
    }

    pub fn u32(&mut self) -> Result<u32, Fault> {
        if self.rest.len() < 4 {
            return malformed("the packet ends inside a field");
        }
        Ok(self.rest.get_u32())
    }

    /// A variable byte integer in its shortest encoding (these appear only in MQTT 5.0).
    pub fn varint(&mut self) -> Result<u32, Fault> {
        match read_varint(&self.rest, true)? {
            Some((value, len)) => {
                self.rest.advance(len);
                Ok(value)
            }
            None => malformed("the packet ends inside a variable byte integer"),
        }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<Bytes, Fault> {
        if self.rest.len() < n {
            return malformed("a length runs past the end of the packet");
        }
        Ok(self.rest.split_to(n))
    }

    /// Everything left.
    pub fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.rest)
    }

    /// Binary data: a two-byte length, then that many bytes.
    pub fn binary(&mut self) -> Result<Bytes, Fault> {
        let len = usize::from(self.u16()?);
        self.take(len)
    }

    /// A UTF-8 encoded string (§1.5.4): well-formed UTF-8 without U+0000, else malformed.
    /// UTF-8 itself excludes the surrogates.
    pub fn string(&mut self) -> Result<String, Fault> {
        let bytes = self.binary()?;
        let text = match std::str::from_utf8(&bytes) {
            Ok(text) => text,
            Err(_) => return malformed("a string is not well-formed UTF-8"),
        };
        if text.contains('\0') {
            return malformed("a string contains U+0000");
        }
        Ok(text.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(value: usize) -> Vec<u8> {
        let mut out = BytesMut::new();
        put_varint(&mut out, value);
        out.to_vec()
    }

    #[test]
    fn varint_boundaries_from_the_specification() {
        // §1.5.5's table: the smallest and largest value of each length.
        for (value, bytes) in [
            (0, vec![0x00]),
            (127, vec![0x7F]),
            (128, vec![0x80, 0x01]),
            (16_383, vec![0xFF, 0x7F]),
            (16_384, vec![0x80, 0x80, 0x01]),
            (2_097_151, vec![0xFF, 0xFF, 0x7F]),
            (2_097_152, vec![0x80, 0x80, 0x80, 0x01]),
            (268_435_455, vec![0xFF, 0xFF, 0xFF, 0x7F]),
        ] {
            assert_eq!(encoded(value), bytes, "{value}");
            assert_eq!(varint_len(value), bytes.len(), "{value}");
            assert_eq!(
                read_varint(&bytes, true),
                Ok(Some((value as u32, bytes.len())))
            );
        }
    }

    #[test]
    fn varint_faults() {
        // A fifth byte is malformed, whether or not it has arrived.
        assert!(read_varint(&[0xFF, 0xFF, 0xFF, 0xFF], false).is_err());
        assert!(read_varint(&[0xFF, 0xFF, 0xFF, 0xFF, 0x01], false).is_err());
        // Incomplete: not yet an answer.
        assert_eq!(read_varint(&[0x80, 0x80], false), Ok(None));
        assert_eq!(read_varint(&[], false), Ok(None));
        // 0 in two bytes: tolerated unless the shortest encoding is required.
        assert_eq!(read_varint(&[0x80, 0x00], false), Ok(Some((0, 2))));
        assert!(read_varint(&[0x80, 0x00], true).is_err());
        assert!(read_varint(&[0xFF, 0x80, 0x00], true).is_err());
    }

    #[test]
    fn strings_are_checked() {
        let read = |bytes: &[u8]| Reader::new(Bytes::copy_from_slice(bytes)).string();
        assert_eq!(read(b"\x00\x02hi").unwrap(), "hi");
        assert_eq!(read(b"\x00\x00").unwrap(), "");
        // §1.5.4's example: U+2A6D4 followed by "A" is fine (and not a BOM to strip).
        assert_eq!(read(b"\x00\x05\xF0\xAA\x9B\x94A").unwrap(), "\u{2A6D4}A");
        for bad in [
            &b"\x00\x01\x00"[..],    // U+0000
            b"\x00\x02\xC0\x80",     // overlong U+0000
            b"\x00\x03\xED\xA0\x80", // a surrogate
            b"\x00\x01\xFF",         // not UTF-8
            b"\x00\x03ab",           // shorter than its length
            b"\x00",                 // a length cut short
        ] {
            assert_eq!(
                read(bad).unwrap_err().reason,
                ReasonCode::MalformedPacket,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn long_strings_are_cut_at_a_character_boundary() {
        let mut out = BytesMut::new();
        let long = "é".repeat(40_000); // 80,000 bytes
        put_string(&mut out, &long);
        let back = Reader::new(out.freeze()).string().unwrap();
        assert_eq!(back.len(), 65_534);
        assert_eq!(string_len(&"a".repeat(70_000)), 2 + MAX_STRING);
    }
}
