//! JSON strings and numbers as herald's encoders write them, by hand: most topics and payloads
//! need no escape and are copied as they are. Marked `#[inline]`: the encoders and the
//! plain-`pub` scan call them from other modules, on every message.

use bytes::{BufMut, BytesMut};

#[inline]
pub(super) fn write_u64(out: &mut BytesMut, n: u64) {
    out.put_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A JSON string. Most topics and payloads need no escape: they are copied as they are
/// (serde_json escapes exactly `"`, `\` and control characters, so the output is the same).
#[inline]
pub(super) fn write_json_str(out: &mut BytesMut, s: &str) {
    write_json_utf8(out, s.as_bytes())
}

/// [`write_json_str`] for bytes known to be UTF-8 (a text payload, checked when published):
/// the common case, nothing to escape, needs no second check.
#[inline]
pub(super) fn write_json_utf8(out: &mut BytesMut, utf8: &[u8]) {
    if unescaped_len(utf8) == utf8.len() {
        out.put_u8(b'"');
        out.put_slice(utf8);
        out.put_u8(b'"');
    } else {
        let s = std::str::from_utf8(utf8).expect("text payloads are checked UTF-8 when published");
        serde_json::to_writer(out.writer(), s).expect("writing JSON to memory cannot fail");
    }
}

/// The length of the leading run of `bytes` that a JSON string holds as it is: no `"`, no `\`,
/// no control character. Tested a word (8 bytes) at a time, by hand, because it runs over every
/// text payload twice (decoding the publish, encoding the message), where a byte-wise loop is
/// a visible part of taking a message in.
#[inline]
pub(super) fn unescaped_len(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // The high bit of every byte of `w` below `n` (n <= 0x80; bytes >= 0x80 never count). A
    // borrow can also mark a byte above a marked one, never one below it: the lowest mark is
    // exact, and that is the only one read.
    let below = |w: u64, n: u8| w.wrapping_sub(ONES * u64::from(n)) & !w & HIGH;
    let equal = |w: u64, b: u8| below(w ^ (ONES * u64::from(b)), 1);
    // Whole words are read in place and the short tail byte by byte: padding a copy of the
    // tail would cost a libc memcpy call per word, more than the test itself.
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for word in &mut words {
        let w = u64::from_le_bytes(word.try_into().expect("chunks of 8 bytes"));
        let marks = below(w, 0x20) | equal(w, b'"') | equal(w, b'\\');
        if marks != 0 {
            return at + (marks.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    let tail = words.remainder();
    at + tail
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
        .unwrap_or(tail.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(5000))]
        /// The word-at-a-time test finds the first byte to escape exactly where a byte-wise
        /// search does, wherever it falls in a word.
        #[test]
        fn unescaped_len_finds_the_first_byte_to_escape(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => 0x20u8..0x7f,
                    1 => 0x80u8..=0xff,
                    1 => proptest::sample::select(vec![0u8, 0x1f, b'"', b'\\', 0x21, 0x5b, 0x5d, 0x7f]),
                ],
                0..40,
            )
        ) {
            let naive = bytes
                .iter()
                .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
                .unwrap_or(bytes.len());
            proptest::prop_assert_eq!(unescaped_len(&bytes), naive);
        }
    }
}
