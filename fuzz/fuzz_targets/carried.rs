//! What a node reads from NATS, from anyone who may publish on the NATS account: arbitrary
//! subjects, herald headers and payloads through the envelope decoder (`open`) and the chunk
//! reassembly. Nothing may panic, no message put back together may exceed the limit, what is
//! held stays within its bounds, and a signature never changes what is accepted but makes
//! everything unsigned refused.
#![no_main]

use async_nats::HeaderMap;
use herald_server::cluster::envelope::{
    open, ClusterKey, Reassembly, Reject, MAX_PARTIALS, PARTIAL_BUDGET,
};
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 9] = [
    "Herald-Origin",
    "Herald-Epoch",
    "Herald-Seq",
    "Herald-Kind",
    "Herald-Content-Type",
    "Herald-Stamp",
    "Herald-Chunk",
    "Herald-Signature",
    "Other",
];

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn bytes(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(b)
    }
    fn text(&mut self) -> Option<String> {
        let n = usize::from(self.byte()?);
        let text = String::from_utf8_lossy(self.bytes(n)?);
        Some(text.replace(['\r', '\n'], ""))
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let Some(flags) = input.byte() else { return };
    let key = ClusterKey::new(&[9; 32]);
    let signing = flags & 1 == 1;
    // Small limits, so that the size checks are reached with small inputs.
    let limit = 4096 * (1 + usize::from((flags >> 1) & 7));
    let mut reassembly = Reassembly::default();
    while let Some(subject) = input.text() {
        let mut headers = HeaderMap::new();
        let Some(count) = input.byte() else { return };
        for _ in 0..count % 10 {
            let (Some(name), Some(value)) = (input.byte(), input.text()) else { return };
            headers.append(NAMES[usize::from(name) % NAMES.len()], value);
        }
        // A payload is `len` copies of one byte: parts of the sizes chunks have (4 KiB and
        // more) from a few input bytes.
        let (Some(lo), Some(hi), Some(fill)) = (input.byte(), input.byte(), input.byte()) else {
            return;
        };
        let payload = vec![fill; usize::from(u16::from_le_bytes([lo, hi]))];
        let headers = (count & 0x80 == 0).then_some(&headers);
        let plain = open(&subject, headers, &payload, None);
        if signing {
            // Unsigned: refused (a Herald-Signature from the input cannot be the key's).
            let refused = open(&subject, headers, &payload, Some(&key)).unwrap_err();
            assert!(matches!(refused, Reject::Unsigned | Reject::BadSignature));
            // Signed: exactly what is accepted without a key.
            let mut signed = headers.cloned().unwrap_or_default();
            key.sign(&subject, &mut signed, &payload);
            let sealed = open(&subject, Some(&signed), &payload, Some(&key));
            match (&plain, &sealed) {
                (Ok(a), Ok(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}")),
                (Err(_), Err(_)) => {}
                _ => panic!("signed {sealed:?}, unsigned {plain:?}"),
            }
        }
        let Ok(carried) = plain else { continue };
        let Some(chunk) = carried.chunk else { continue };
        let added = reassembly.add(&carried.origin, &subject, carried.seq, chunk, &payload, limit);
        if let Some(whole) = added.whole {
            assert!(whole.len() <= limit, "{} > {limit}", whole.len());
        }
        assert!(reassembly.len() <= MAX_PARTIALS);
        assert!(reassembly.held() <= PARTIAL_BUDGET * limit);
    }
});
