//! Helpers shared by this crate's unit tests.

use crate::codec::Frame;

/// Splits an encoded server frame into (opcode, payload), checking its WebSocket header.
pub fn unframe(frame: &Frame) -> (u8, Vec<u8>) {
    let bytes = frame.to_vec();
    assert_eq!(bytes[0] & 0x80, 0x80, "FIN set");
    assert_eq!(bytes[1] & 0x80, 0, "server frames are unmasked");
    let (len, start) = match bytes[1] & 0x7F {
        126 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
        127 => (
            u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
            10,
        ),
        n => (n as usize, 2),
    };
    assert_eq!(bytes.len() - start, len, "length field matches");
    (bytes[0] & 0x0F, bytes[start..].to_vec())
}

/// The JSON of a text frame, or the JSON header of a binary one (payload appended as `"payload"`
/// bytes), so tests can compare whole frames as values.
pub fn frame_json(frame: &Frame) -> serde_json::Value {
    let (op, body) = unframe(frame);
    if op == 0x1 {
        return serde_json::from_slice(&body).expect("text frames are JSON");
    }
    let (head, at) = crate::wire::split_binary(&body).expect("binary frame");
    let mut v: serde_json::Value = serde_json::from_str(head).expect("header is JSON");
    v["payload"] = serde_json::json!(body[at..].to_vec());
    v
}
