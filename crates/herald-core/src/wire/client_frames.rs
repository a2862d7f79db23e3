//! Client → server WebSocket framing (RFC 6455 §5): the frame header, unmasking, fragment
//! reassembly and every rule a server must enforce on what a client sends.
//!
//! Written by hand rather than taken from the WebSocket crate because the reader's buffer is
//! the largest part of an idle connection's memory: fastwebsockets keeps a fixed 8 KiB buffer
//! per connection for as long as it lives, and took ~650 instructions per frame. This decoder
//! works on whatever buffer the caller holds, so the server holds none while a connection is
//! quiet (see `herald-server`'s `frame_reader`). Pure: bytes in, frames out; fuzzed.

use bytes::{Buf, Bytes, BytesMut};
use std::fmt;

/// A payload below this size is copied out of the read buffer when it may outlive the request
/// (a binary payload is kept, by history and by every subscriber's queue): a slice would keep
/// the whole read buffer alive. A larger frame was read into a buffer reserved for it.
const COPY_BELOW: usize = 64 << 10;

/// `payload` fit to be kept after its request: below [`COPY_BELOW`] a copy of its own, which
/// frees the read buffer it may be a slice of (a text payload always is: a slice of its frame).
pub fn detached(payload: &Bytes) -> Bytes {
    if payload.len() < COPY_BELOW {
        Bytes::copy_from_slice(payload)
    } else {
        payload.clone()
    }
}

/// What a client sent: a whole message, or a control frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound {
    /// A whole message: one frame, or its fragments put back together. A text message's
    /// UTF-8 is not checked here: the caller checks it once, as it reads the text.
    Message {
        binary: bool,
        payload: Bytes,
    },
    /// A fragment of a message not yet whole, and its length: taken and kept, returned only
    /// so that the reader can count it against the client's rate limits.
    Fragment(usize),
    /// A ping, with the payload the pong must echo.
    Ping(Bytes),
    Pong,
    /// A close frame, with its payload (empty, or a valid code and a UTF-8 reason).
    Close(Bytes),
}

/// A frame that breaks the protocol: the connection must be closed with [`FrameError::code`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// A frame, or a message across its fragments, longer than the limit (`limit` bytes).
    TooLarge {
        limit: usize,
    },
    /// A client frame without a mask (§5.1).
    Unmasked,
    /// RSV1–3 set: no extension was negotiated.
    ReservedBits,
    UnknownOpcode(u8),
    /// A control frame that is fragmented or carries more than 125 bytes (§5.5).
    BadControlFrame,
    /// A continuation with no message in progress.
    UnexpectedContinuation,
    /// A new text or binary frame while a fragmented message is still in progress.
    ExpectedContinuation,
    /// A close frame whose status code may not be sent (§7.4), or a one-byte close payload.
    BadCloseCode,
    /// A close frame whose reason is not UTF-8.
    BadCloseReason,
}

impl FrameError {
    /// The close code RFC 6455 gives for the error.
    pub fn code(&self) -> u16 {
        match self {
            FrameError::TooLarge { .. } => 1009,
            FrameError::BadCloseReason => 1007,
            _ => 1002,
        }
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooLarge { limit } => {
                write!(f, "frame too large: the limit is {limit} bytes")
            }
            FrameError::Unmasked => {
                f.write_str("protocol error: client frames must be masked (RFC 6455 5.1)")
            }
            FrameError::ReservedBits => {
                f.write_str("protocol error: reserved bits set, no extension was negotiated")
            }
            FrameError::UnknownOpcode(op) => write!(f, "protocol error: unknown opcode {op:#x}"),
            FrameError::BadControlFrame => {
                f.write_str("protocol error: a control frame must be whole and at most 125 bytes")
            }
            FrameError::UnexpectedContinuation => {
                f.write_str("protocol error: continuation frame with no message in progress")
            }
            FrameError::ExpectedContinuation => {
                f.write_str("protocol error: new message before the fragmented one ended")
            }
            FrameError::BadCloseCode => f.write_str("protocol error: invalid close code"),
            FrameError::BadCloseReason => f.write_str("invalid UTF-8 in the close reason"),
        }
    }
}

impl std::error::Error for FrameError {}

/// A parsed frame header.
struct Head {
    fin: bool,
    opcode: u8,
    mask: [u8; 4],
    /// Header bytes, mask included.
    len: usize,
    payload: usize,
}

/// Turns a client's byte stream into [`Inbound`]s, one [`Decoder::decode`] at a time; holds
/// only a fragmented message in progress.
#[derive(Debug)]
pub struct Decoder {
    limit: usize,
    partial: Option<(bool, BytesMut)>,
}

impl Decoder {
    /// A decoder that refuses frames and messages longer than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Decoder {
            limit,
            partial: None,
        }
    }

    /// Takes the next frame from the front of `buf`; `Ok(None)` when `buf` does not hold a
    /// whole frame yet (see [`Decoder::wanted`]). Fragments are kept here until the message is
    /// whole.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Inbound>, FrameError> {
        let Some(head) = self.head(buf)? else {
            return Ok(None);
        };
        if buf.len() < head.len + head.payload {
            return Ok(None);
        }
        buf.advance(head.len);
        unmask(&mut buf[..head.payload], head.mask);
        let frame = match (head.opcode, &mut self.partial) {
            (0x8..=0xA, _) => control(head.opcode, buf.split_to(head.payload).freeze())?,
            (0x0, None) => return Err(FrameError::UnexpectedContinuation),
            (0x0, Some((_, message))) => {
                if message.len() + head.payload > self.limit {
                    return Err(FrameError::TooLarge { limit: self.limit });
                }
                message.extend_from_slice(&buf[..head.payload]);
                buf.advance(head.payload);
                if !head.fin {
                    return Ok(Some(Inbound::Fragment(head.payload)));
                }
                let (binary, message) = self.partial.take().expect("matched Some");
                Inbound::Message {
                    binary,
                    payload: message.freeze(),
                }
            }
            (_, Some(_)) => return Err(FrameError::ExpectedContinuation),
            (op, None) if !head.fin => {
                self.partial = Some((op == 0x2, BytesMut::from(&buf[..head.payload])));
                buf.advance(head.payload);
                Inbound::Fragment(head.payload)
            }
            (op, None) => {
                let binary = op == 0x2;
                let payload = if binary && head.payload < COPY_BELOW {
                    let copy = Bytes::copy_from_slice(&buf[..head.payload]);
                    buf.advance(head.payload);
                    copy
                } else if head.payload == buf.len() {
                    // The last frame read takes the buffer: no shared header to allocate.
                    std::mem::take(buf).freeze()
                } else {
                    buf.split_to(head.payload).freeze()
                };
                Inbound::Message { binary, payload }
            }
        };
        Ok(Some(frame))
    }

    /// How many bytes `buf` must hold in all before the frame at its front is whole (at least
    /// its header's first two bytes): the reader reserves that much, so a large frame is read
    /// into one buffer of its size.
    pub fn wanted(&self, buf: &[u8]) -> usize {
        match self.head(buf) {
            Ok(Some(head)) => head.len + head.payload,
            _ => header_len(buf),
        }
    }

    /// The header at the front of `buf`, checked; `None` if `buf` does not hold all of it.
    fn head(&self, buf: &[u8]) -> Result<Option<Head>, FrameError> {
        let [b0, b1, ..] = *buf else {
            return Ok(None);
        };
        let (fin, opcode) = (b0 & 0x80 != 0, b0 & 0x0F);
        if b0 & 0x70 != 0 {
            return Err(FrameError::ReservedBits);
        }
        match opcode {
            0x0..=0x2 => {}
            0x8..=0xA => {
                if !fin || b1 & 0x7F > 125 {
                    return Err(FrameError::BadControlFrame);
                }
            }
            op => return Err(FrameError::UnknownOpcode(op)),
        }
        if b1 & 0x80 == 0 {
            return Err(FrameError::Unmasked);
        }
        let len = header_len(buf);
        if buf.len() < len {
            return Ok(None);
        }
        let payload = match b1 & 0x7F {
            126 => u16::from_be_bytes([buf[2], buf[3]]) as u64,
            127 => u64::from_be_bytes(buf[2..10].try_into().expect("8 bytes")),
            n => n as u64,
        };
        if payload > self.limit as u64 {
            return Err(FrameError::TooLarge { limit: self.limit });
        }
        let mask = buf[len - 4..len].try_into().expect("4 bytes");
        Ok(Some(Head {
            fin,
            opcode,
            mask,
            len,
            payload: payload as usize,
        }))
    }
}

/// A masked frame's header length, from its second byte (2 if `buf` is shorter).
fn header_len(buf: &[u8]) -> usize {
    match buf.get(1).map(|b| b & 0x7F) {
        Some(126) => 2 + 2 + 4,
        Some(127) => 2 + 8 + 4,
        Some(_) => 2 + 4,
        None => 2,
    }
}

fn control(opcode: u8, payload: Bytes) -> Result<Inbound, FrameError> {
    match opcode {
        0x9 => Ok(Inbound::Ping(payload)),
        0xA => Ok(Inbound::Pong),
        _ => {
            check_close(&payload)?;
            Ok(Inbound::Close(payload))
        }
    }
}

/// A close payload is empty, or a status code a peer may send followed by a UTF-8 reason (§5.5.1,
/// §7.4).
fn check_close(payload: &[u8]) -> Result<(), FrameError> {
    let (code, reason) = match payload {
        [] => return Ok(()),
        [hi, lo, reason @ ..] => (u16::from_be_bytes([*hi, *lo]), reason),
        [_] => return Err(FrameError::BadCloseCode),
    };
    let sendable = matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999);
    if !sendable {
        return Err(FrameError::BadCloseCode);
    }
    std::str::from_utf8(reason).map_err(|_| FrameError::BadCloseReason)?;
    Ok(())
}

/// XORs `payload` with the frame's mask, eight bytes at a time (the mask repeats every four,
/// so a word boundary is a mask boundary).
pub fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    let word = u64::from_ne_bytes([
        mask[0], mask[1], mask[2], mask[3], mask[0], mask[1], mask[2], mask[3],
    ]);
    let mut words = payload.chunks_exact_mut(8);
    for chunk in &mut words {
        let value = u64::from_ne_bytes(chunk.try_into().expect("8 bytes")) ^ word;
        chunk.copy_from_slice(&value.to_ne_bytes());
    }
    for (i, byte) in words.into_remainder().iter_mut().enumerate() {
        *byte ^= mask[i % 4];
    }
}

/// Appends a masked client frame to `out`, as a client writes it: the bench's clients (with a
/// zero mask key, which leaves the payload as it is), tests and fuzzing.
pub fn encode_client_frame(
    fin: bool,
    opcode: u8,
    mask: [u8; 4],
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    let first = if fin { 0x80 } else { 0 } | opcode;
    super::frames::put_frame_head(out, first, 0x80, payload.len());
    out.extend_from_slice(&mask);
    let start = out.len();
    out.extend_from_slice(payload);
    if mask != [0; 4] {
        unmask(&mut out[start..], mask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    /// One client frame on its own.
    fn frame(fin: bool, opcode: u8, mask: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_client_frame(fin, opcode, mask, payload, &mut out);
        out
    }

    fn decode_all(decoder: &mut Decoder, bytes: &[u8]) -> Result<Vec<Inbound>, FrameError> {
        let mut buf = BytesMut::from(bytes);
        let mut out = Vec::new();
        while let Some(frame) = decoder.decode(&mut buf)? {
            if !matches!(frame, Inbound::Fragment(_)) {
                out.push(frame);
            }
        }
        Ok(out)
    }

    fn message(binary: bool, payload: &[u8]) -> Inbound {
        Inbound::Message {
            binary,
            payload: Bytes::copy_from_slice(payload),
        }
    }

    #[test]
    fn the_rfc_examples_decode() {
        // RFC 6455 §5.7: a masked "Hello".
        let hello = [
            0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
        ];
        let mut decoder = Decoder::new(1 << 20);
        assert_eq!(
            decode_all(&mut decoder, &hello).unwrap(),
            [message(false, b"Hello")]
        );
        assert_eq!(frame(true, 1, MASK, b"Hello"), hello);
    }

    #[test]
    fn fragments_are_put_back_together_around_a_ping() {
        let mut bytes = frame(false, 1, MASK, b"Hel");
        bytes.extend(frame(true, 9, MASK, b"are you there"));
        bytes.extend(frame(false, 0, MASK, b"lo, "));
        bytes.extend(frame(true, 0, MASK, b"world"));
        let frames = decode_all(&mut Decoder::new(100), &bytes).unwrap();
        assert_eq!(
            frames,
            [
                Inbound::Ping(Bytes::from_static(b"are you there")),
                message(false, b"Hello, world"),
            ]
        );
    }

    #[test]
    fn lengths_use_the_16_and_64_bit_forms() {
        for len in [125, 126, 65_535, 65_536, 70_000] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let bytes = frame(true, 2, MASK, &payload);
            let mut decoder = Decoder::new(1 << 20);
            let header = bytes.len() - len;
            assert_eq!(decoder.wanted(&bytes[..2]), header, "{len}");
            assert_eq!(decoder.wanted(&bytes), bytes.len(), "{len}");
            assert_eq!(
                decode_all(&mut decoder, &bytes).unwrap(),
                [message(true, &payload)]
            );
        }
    }

    #[test]
    fn a_frame_or_a_message_over_the_limit_is_refused() {
        let big = frame(true, 2, MASK, &[0; 101]);
        // Refused from the header alone, before the payload arrives.
        assert_eq!(
            Decoder::new(100).decode(&mut BytesMut::from(&big[..8])),
            Err(FrameError::TooLarge { limit: 100 })
        );
        let mut fragments = frame(false, 2, MASK, &[0; 60]);
        fragments.extend(frame(true, 0, MASK, &[0; 41]));
        let refused = decode_all(&mut Decoder::new(100), &fragments).unwrap_err();
        assert_eq!(
            (refused.code(), refused),
            (1009, FrameError::TooLarge { limit: 100 })
        );
    }

    #[test]
    fn protocol_violations_are_refused_with_their_codes() {
        let cases: [(Vec<u8>, FrameError); 9] = [
            (
                vec![0x81, 0x05, b'h', b'e', b'l', b'l', b'o'],
                FrameError::Unmasked,
            ),
            (frame(true, 0x41, MASK, b"x"), FrameError::ReservedBits),
            (frame(true, 0x3, MASK, b"x"), FrameError::UnknownOpcode(3)),
            (frame(false, 0x9, MASK, b"x"), FrameError::BadControlFrame),
            (
                frame(true, 0x9, MASK, &[0; 126]),
                FrameError::BadControlFrame,
            ),
            (
                frame(true, 0x0, MASK, b"x"),
                FrameError::UnexpectedContinuation,
            ),
            (
                [frame(false, 1, MASK, b"a"), frame(true, 1, MASK, b"b")].concat(),
                FrameError::ExpectedContinuation,
            ),
            (
                frame(true, 0x8, MASK, &[0x03, 0xEE]),
                FrameError::BadCloseCode,
            ),
            (
                frame(true, 0x8, MASK, &[0x03, 0xE8, 0xFF]),
                FrameError::BadCloseReason,
            ),
        ];
        for (bytes, expected) in cases {
            let error = decode_all(&mut Decoder::new(1000), &bytes).unwrap_err();
            assert_eq!(error, expected);
            assert_eq!(
                error.code(),
                if expected == FrameError::BadCloseReason {
                    1007
                } else {
                    1002
                }
            );
            assert!(!error.to_string().is_empty());
        }
        assert_eq!(
            decode_all(
                &mut Decoder::new(10),
                &frame(true, 8, MASK, &[0x03, 0xE8, b'o', b'k'])
            ),
            Ok(vec![Inbound::Close(Bytes::from_static(&[
                0x03, 0xE8, b'o', b'k'
            ]))])
        );
        assert_eq!(
            decode_all(&mut Decoder::new(10), &frame(true, 8, MASK, &[0x03])),
            Err(FrameError::BadCloseCode)
        );
    }

    #[test]
    fn a_small_binary_payload_is_a_copy_and_text_or_a_large_one_a_slice() {
        // Whether `payload` lies in the read buffer (and so would keep all of it alive).
        fn shares(opcode: u8, len: usize) -> bool {
            let mut buf = BytesMut::with_capacity(len + 1024);
            buf.extend_from_slice(&frame(true, opcode, MASK, &vec![1; len]));
            let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.capacity();
            let Some(Inbound::Message { payload, .. }) =
                Decoder::new(1 << 20).decode(&mut buf).unwrap()
            else {
                panic!("a message");
            };
            assert_eq!(payload.len(), len);
            range.contains(&(payload.as_ptr() as usize))
        }
        assert!(!shares(2, 100));
        assert!(shares(1, 100));
        assert!(shares(2, COPY_BELOW));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Any sequence of valid frames decodes to the same messages however the stream is cut.
        #[test]
        fn decoding_does_not_depend_on_how_the_stream_is_cut(
            messages in prop::collection::vec((any::<bool>(), prop::collection::vec(any::<u8>(), 0..300), 1usize..4), 1..8),
            cuts in prop::collection::vec(1usize..200, 0..20),
            mask in any::<[u8; 4]>(),
        ) {
            let mut stream = Vec::new();
            for (binary, payload, parts) in &messages {
                let step = payload.len().div_ceil(*parts).max(1);
                let chunks: Vec<&[u8]> = if payload.is_empty() { vec![&[][..]] } else { payload.chunks(step).collect() };
                for (i, chunk) in chunks.iter().enumerate() {
                    let op = if i == 0 { if *binary { 2 } else { 1 } } else { 0 };
                    stream.extend(frame(i + 1 == chunks.len(), op, mask, chunk));
                }
            }
            let mut decoder = Decoder::new(1 << 20);
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            let mut rest = &stream[..];
            let mut cuts = cuts.into_iter().cycle();
            while !rest.is_empty() {
                let n = cuts.next().unwrap_or(rest.len()).min(rest.len());
                buf.extend_from_slice(&rest[..n]);
                rest = &rest[n..];
                while let Some(frame) = decoder.decode(&mut buf).unwrap() {
                    if !matches!(frame, Inbound::Fragment(_)) {
                        got.push(frame);
                    }
                }
            }
            let expected: Vec<Inbound> = messages.iter().map(|(b, p, _)| message(*b, p)).collect();
            prop_assert_eq!(got, expected);
            prop_assert!(buf.is_empty());
        }

        #[test]
        fn unmasking_twice_restores_the_payload(payload in prop::collection::vec(any::<u8>(), 0..100), mask in any::<[u8; 4]>()) {
            let mut bytes = payload.clone();
            unmask(&mut bytes, mask);
            for (i, (a, b)) in bytes.iter().zip(&payload).enumerate() {
                prop_assert_eq!(*a, b ^ mask[i % 4]);
            }
            unmask(&mut bytes, mask);
            prop_assert_eq!(bytes, payload);
        }
    }
}
