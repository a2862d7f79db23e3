//! The client frame decoder on arbitrary bytes: it must never panic, never yield a message over
//! its limit, and decode the same frames (or fail the same way) however the stream is cut.
#![no_main]

use bytes::BytesMut;
use herald_core::wire::client_frames::{Decoder, FrameError, Inbound};
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 4096;

/// Every frame decoded from `data` fed `step` bytes at a time, and the error that ended it.
fn decode(data: &[u8], step: usize) -> (Vec<Inbound>, Option<FrameError>) {
    let mut decoder = Decoder::new(LIMIT);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for chunk in data.chunks(step) {
        buf.extend_from_slice(chunk);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    if let Inbound::Message { payload, .. } = &frame {
                        assert!(payload.len() <= LIMIT, "a message over the limit");
                    }
                    frames.push(frame);
                }
                Ok(None) => {
                    assert!(decoder.wanted(&buf) > buf.len(), "wanted must ask for more");
                    break;
                }
                Err(e) => return (frames, Some(e)),
            }
        }
    }
    (frames, None)
}

fuzz_target!(|data: &[u8]| {
    let Some((step, stream)) = data.split_first() else {
        return;
    };
    let whole = decode(stream, stream.len().max(1));
    let cut = decode(stream, *step as usize % 64 + 1);
    assert_eq!(whole, cut);
});
