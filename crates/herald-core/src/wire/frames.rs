//! Server → client WebSocket frames (RFC 6455 §5.2), written by hand: a server frame is
//! unmasked, so one encoding is valid on every connection, and a binary payload is never
//! copied into it. This is the product's hot path, which is why framing is not left to the
//! WebSocket crate (which would copy and re-frame the payload for every subscriber).

use crate::codec::Frame;
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// WebSocket opcodes used by the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpCode {
    Text = 0x1,
    Binary = 0x2,
    Close = 0x8,
    Ping = 0x9,
    Pong = 0xA,
}

/// The longest WebSocket frame header a server sends (no mask): 1 + 1 + 8 bytes.
pub(super) const MAX_HEADER: usize = 10;

/// Puts the WebSocket header of a text frame before `buf`'s JSON, which starts after
/// [`MAX_HEADER`] bytes of room.
pub(super) fn text_frame(mut buf: BytesMut) -> Frame {
    let head = ws_header(OpCode::Text, buf.len() - MAX_HEADER);
    let start = MAX_HEADER - head.len();
    buf[start..MAX_HEADER].copy_from_slice(&head);
    let mut head = buf.freeze();
    head.advance(start);
    Frame {
        head,
        body: Bytes::new(),
    }
}

/// Encodes a close frame. The reason is cut to fit the 123 bytes a control frame allows.
pub fn encode_close(code: u16, reason: &str) -> Frame {
    let mut cut = reason.len().min(123);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut payload = Vec::with_capacity(2 + cut);
    payload.extend_from_slice(&code.to_be_bytes());
    payload.extend_from_slice(&reason.as_bytes()[..cut]);
    encode_control(OpCode::Close, &payload)
}

/// Encodes a control frame (close, pong) with the given payload (at most 125 bytes).
pub fn encode_control(op: OpCode, payload: &[u8]) -> Frame {
    debug_assert!(payload.len() <= 125);
    let mut buf = BytesMut::with_capacity(2 + payload.len());
    buf.put_slice(&ws_header(op, payload.len()));
    buf.put_slice(payload);
    Frame {
        head: buf.freeze(),
        body: Bytes::new(),
    }
}

/// A binary WebSocket message carrying `payload` as it is (shared, not copied): the raw
/// framing of protocols other than herald's own (VBDS image chunks).
pub fn encode_binary(payload: Bytes) -> Frame {
    Frame {
        head: Bytes::from(ws_header(OpCode::Binary, payload.len())),
        body: payload,
    }
}

/// The header of a final, unmasked WebSocket frame (RFC 6455 §5.2): also for protocols that
/// carry their own packets in binary messages and put a header before bytes they share.
pub fn ws_header(op: OpCode, len: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(10);
    put_frame_head(&mut h, 0x80 | op as u8, 0, len);
    h
}

/// A WebSocket frame header up to its mask key: the first byte (FIN, opcode), then the length
/// in its 7-, 16- or 64-bit form with `mask_bit` (0, or 0x80 for a client's frame).
pub(super) fn put_frame_head(out: &mut Vec<u8>, first: u8, mask_bit: u8, len: usize) {
    out.push(first);
    match len {
        0..=125 => out.push(mask_bit | len as u8),
        126..=0xFFFF => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::unframe;

    #[test]
    fn close_frame_reason_is_cut_on_a_char_boundary() {
        let reason = "é".repeat(100);
        let (op, body) = unframe(&encode_close(4008, &reason));
        assert_eq!(op, 0x8);
        assert_eq!(u16::from_be_bytes([body[0], body[1]]), 4008);
        assert!(body.len() <= 125);
        assert!(std::str::from_utf8(&body[2..]).is_ok());
    }

    #[test]
    fn a_binary_frame_carries_its_payload_as_it_is() {
        let chunk = encode_binary(Bytes::from_static(b"\n"));
        assert_eq!(unframe(&chunk), (0x2, b"\n".to_vec()));
    }
}
