//! The STOMP decoder on whatever a client may send, cut into pieces at arbitrary points: it
//! never panics, never hands over more than the limits allow, and how the bytes are cut never
//! changes what it decodes.
#![no_main]

use bytes::BytesMut;
use herald_server::protocol::stomp::{DecodeError, Decoded, Decoder, Limits, Version};
use libfuzzer_sys::fuzz_target;

/// Small limits, so that the size checks are reached with small inputs.
const LIMITS: Limits = Limits {
    max_head_bytes: 256,
    max_headers: 8,
    max_body_bytes: 1024,
};

/// Everything decoded from `pieces` fed in order, up to and with the first error.
fn run<'a>(
    version: Version,
    pieces: impl Iterator<Item = &'a [u8]>,
) -> (Vec<Decoded>, Option<DecodeError>) {
    let mut decoder = Decoder::new(LIMITS);
    decoder.set_version(version);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(d)) => {
                    if let Decoded::Frame(f) = &d {
                        assert!(f.body.len() <= LIMITS.max_body_bytes);
                        assert!(f.headers.len() <= LIMITS.max_headers);
                    }
                    // EOLs that arrive together are one heart-beat: count runs, not EOLs.
                    if !(d == Decoded::HeartBeat && out.last() == Some(&Decoded::HeartBeat)) {
                        out.push(d);
                    }
                }
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
        // What waits for more is bounded by the limits.
        assert!(buf.len() <= LIMITS.max_head_bytes + 2 + LIMITS.max_body_bytes + 1);
    }
    (out, None)
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, data)) = data.split_first() else {
        return;
    };
    let version = [Version::V1_0, Version::V1_1, Version::V1_2][usize::from(control % 3)];
    let whole = run(version, std::iter::once(data));
    // Pieces of 1 to 16 bytes, their lengths drawn from the data itself.
    let step = usize::from(control / 3 % 16) + 1;
    let mut cuts = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let len = usize::from(data[at] % step as u8) + 1;
        cuts.push(&data[at..(at + len).min(data.len())]);
        at += len;
    }
    let split = run(version, cuts.into_iter());
    // Cut anywhere, the same frames come out; an error found whole is found in pieces. (In
    // pieces an error may show sooner, before bytes past it arrive, so only its frames are
    // compared when the whole input failed.)
    match (&whole.1, &split.1) {
        (None, None) => assert_eq!(whole.0, split.0),
        (Some(_), Some(_)) => assert_eq!(whole.0, split.0),
        (Some(_), None) | (None, Some(_)) => panic!("whole {:?}, split {:?}", whole.1, split.1),
    }
});
