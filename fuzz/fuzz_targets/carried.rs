//! What a node reads from NATS, from anyone who may publish on the NATS account: arbitrary
//! subjects, herald headers and payloads through the envelope decoder (`open`), the chunk
//! reassembly and the extras section (`Carried::publish`). Nothing may panic, no message put
//! back together may exceed the limit, what is held stays within its bounds, a signature
//! never changes what is accepted but makes everything unsigned refused, and what a message
//! is split into (section and payload) fits in it. Extras made from the input go through
//! `Departure` and back unchanged.
#![no_main]

use async_nats::HeaderMap;
use bytes::Bytes;
use herald_core::extras::Extras;
use herald_core::request::{PayloadKind, Publish};
use herald_server::cluster::envelope::{
    body_limit, open, ClusterKey, Departure, Reassembly, Reject, MAX_PARTIALS, PARTIAL_BUDGET,
};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

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
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
    /// Extras with every field drawn from the input (any UTF-8 text, any bytes).
    fn extras(&mut self) -> Option<Extras> {
        let flags = self.byte()?;
        let utf8 = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let mut e = Extras {
            expires_us: if flags & 1 == 1 { Some(self.u64()?) } else { None },
            retain: flags & 2 == 2,
            at_most_once: flags & 4 == 4,
            ..Extras::default()
        };
        if flags & 8 == 8 {
            let n = usize::from(self.byte()?);
            e.response_topic = Some(utf8(self.bytes(n)?).into());
        }
        if flags & 16 == 16 {
            let n = usize::from(self.byte()?);
            e.correlation = Some(Bytes::copy_from_slice(self.bytes(n)?));
        }
        for _ in 0..(flags >> 5) {
            let n = usize::from(self.byte()?);
            let name = utf8(self.bytes(n)?);
            let n = usize::from(self.byte()?);
            e.user_properties.push((name, utf8(self.bytes(n)?)));
        }
        Some(e)
    }
}

/// Extras made from the input leave in a `Departure` and come back as they were, their
/// expiry as the time left when they left, counted again from their arrival.
fn round_trip(input: &mut Input<'_>) -> Option<()> {
    let extras = input.extras()?;
    let (sent, arrived) = (input.u64()?, input.u64()?);
    let len = usize::from(input.byte()?);
    let p = Publish {
        id: None,
        topic: "t".into(),
        payload: Bytes::copy_from_slice(input.bytes(len)?),
        kind: PayloadKind::Binary,
        content_type: None,
        stamp: false,
        extras: Some(Arc::new(extras.clone())),
    };
    let d = Departure::message("origin", "h.t".into(), &p, "epoch", 1, sent);
    let (headers, body) = d.leaving(sent);
    let c = open("h.t", Some(&headers), &body, None).expect("what a node writes is accepted");
    let got = c.publish("t".into(), body, arrived).expect("and its section too");
    assert_eq!(got.payload, p.payload);
    let want = Extras {
        expires_us: extras
            .expires_us
            .map(|at| arrived.saturating_add(at.saturating_sub(sent))),
        ..extras
    };
    assert_eq!(got.extras.as_deref().unwrap_or(&Extras::default()), &want);
    Some(())
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let Some(flags) = input.byte() else { return };
    if flags & 0x80 == 0x80 {
        round_trip(&mut input);
        return;
    }
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
        // more) from a few input bytes; or, with the high bit of `len` set, the next `fill`
        // bytes of the input (an extras section).
        let (Some(lo), Some(hi), Some(fill)) = (input.byte(), input.byte(), input.byte()) else {
            return;
        };
        let payload = if hi & 0x80 == 0x80 {
            let Some(bytes) = input.bytes(usize::from(fill)) else { return };
            bytes.to_vec()
        } else {
            vec![fill; usize::from(u16::from_le_bytes([lo, hi]))]
        };
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
        let whole = match carried.chunk {
            None => Bytes::from(payload),
            Some(chunk) => {
                let limit = body_limit(limit);
                let added =
                    reassembly.add(&carried.origin, &subject, carried.seq, chunk, &payload, limit);
                assert!(reassembly.len() <= MAX_PARTIALS);
                assert!(reassembly.held() <= PARTIAL_BUDGET * limit);
                let Some(whole) = added.whole else { continue };
                assert!(whole.len() <= limit, "{} > {limit}", whole.len());
                whole
            }
        };
        if carried.mark {
            continue;
        }
        let size = whole.len();
        if let Ok(p) = carried.publish("t".into(), whole, u64::from(flags) << 40) {
            let extras = p.extras.as_ref().map_or(0, |e| e.size());
            assert!(p.payload.len() + extras <= size, "more than the message held");
        }
    }
});
