//! A hand-written decoder for the request that dominates ingest: a text `pub` whose fields are
//! all plain. serde_json spent ~2,400 instructions on a 100-byte publish (callgrind, see
//! docs/performance.md), most of the cost of taking a message in; this scan is one pass over
//! the bytes.
//!
//! "Plain" means: only the fields `op`, `topic`, `data`, `ct`, `id`, `stamp`, each at most once;
//! strings without escapes or control characters; `id` a plain string or an integer; `stamp`
//! `true` or `false`. Anything else (another op, an escape, an unknown field, a float id, a
//! duplicate, bad JSON) is declined with `None` and decoded by serde, which stays the
//! definition of the protocol: whatever this accepts must decode to the very same request
//! there (checked by a property test in `wire::decode`'s tests and by the `wire` fuzz target).

use crate::request::RequestId;

/// The fields of a plain `pub`, borrowed from the request's text.
pub(super) struct PlainPub<'a> {
    pub id: Option<RequestId>,
    pub topic: &'a str,
    pub data: &'a str,
    pub ct: Option<&'a str>,
    pub stamp: bool,
}

/// `text` as a plain `pub`, or `None` if it is anything else.
pub(super) fn scan(text: &str) -> Option<PlainPub<'_>> {
    if let Some(p) = in_bench_order(text) {
        return Some(p);
    }
    let mut s = Scanner { text, at: 0 };
    s.skip_space();
    s.expect(b'{')?;
    let (mut op, mut id, mut topic, mut data, mut ct, mut stamp) =
        (None, None, None, None, None, None);
    loop {
        s.skip_space();
        let key = s.string()?;
        s.skip_space();
        s.expect(b':')?;
        s.skip_space();
        match key {
            "op" => once(&mut op, s.string()?)?,
            "topic" => once(&mut topic, s.string()?)?,
            "data" => once(&mut data, s.string()?)?,
            "ct" => once(&mut ct, s.string()?)?,
            "id" => once(&mut id, s.id()?)?,
            "stamp" => once(&mut stamp, s.boolean()?)?,
            _ => return None,
        }
        s.skip_space();
        match s.next()? {
            b',' => continue,
            b'}' => break,
            _ => return None,
        }
    }
    s.skip_space();
    if s.at != text.len() || op? != "pub" {
        return None;
    }
    Some(PlainPub {
        id,
        topic: topic?,
        data: data?,
        ct,
        stamp: stamp.unwrap_or(false),
    })
}

/// What a publish starts with when its fields come in the order below.
const OP_AND_TOPIC: &[u8] = br#"{"op":"pub","topic":""#;

/// `{"op":"pub","topic":"…",["stamp":true,]"data":"…"}` exactly, the order `herald bench`'s
/// publishers write (and a natural one to write by hand: the op, the address, the payload
/// last). Matched by its constant parts, without the general scan's work per field: a
/// saturated publish costs ~450 instructions less (callgrind). Anything else, a space
/// included, goes to the general scan.
pub(super) fn in_bench_order(text: &str) -> Option<PlainPub<'_>> {
    let bytes = text.as_bytes();
    let rest = bytes.strip_prefix(OP_AND_TOPIC)?;
    let topic_len = super::json::unescaped_len(rest);
    let after_topic = rest[topic_len..].strip_prefix(b"\"")?;
    let (stamp, data) = match after_topic.strip_prefix(br#","data":""#) {
        Some(data) => (false, data),
        None => (
            true,
            after_topic.strip_prefix(br#","stamp":true,"data":""#)?,
        ),
    };
    let data_len = super::json::unescaped_len(data);
    if &data[data_len..] != br#""}"# {
        return None;
    }
    // Both strings are bounded by ASCII quotes, so the offsets are character boundaries.
    let topic_at = OP_AND_TOPIC.len();
    let data_at = bytes.len() - 2 - data_len;
    Some(PlainPub {
        id: None,
        topic: &text[topic_at..topic_at + topic_len],
        data: &text[data_at..data_at + data_len],
        ct: None,
        stamp,
    })
}

/// Sets a field seen for the first time; a second time declines (serde reports duplicates).
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn next(&mut self) -> Option<u8> {
        let b = *self.bytes().get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn expect(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    /// JSON's whitespace: space, tab, line feed, carriage return.
    fn skip_space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.at) {
            self.at += 1;
        }
    }

    /// A string with no escape and no control character, without its quotes. The quotes are
    /// ASCII, so the slice between them is valid UTF-8 like the whole text.
    fn string(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let start = self.at;
        let len = super::json::unescaped_len(&self.bytes()[start..]);
        self.at = start + len;
        self.expect(b'"')?;
        Some(&self.text[start..start + len])
    }

    fn boolean(&mut self) -> Option<bool> {
        let rest = &self.bytes()[self.at..];
        let (value, len) = if rest.starts_with(b"true") {
            (true, 4)
        } else if rest.starts_with(b"false") {
            (false, 5)
        } else {
            return None;
        };
        self.at += len;
        Some(value)
    }

    /// A plain string or an integer that fits its JSON type (u64, or i64 when negative); a
    /// fraction, an exponent, a leading zero or `-0` decline.
    fn id(&mut self) -> Option<RequestId> {
        if self.bytes().get(self.at) == Some(&b'"') {
            return Some(RequestId::String(self.string()?.to_owned()));
        }
        let start = self.at;
        let negative = self.bytes().get(self.at) == Some(&b'-');
        let digits_at = start + usize::from(negative);
        let digits = self.bytes()[digits_at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        self.at = digits_at + digits;
        let number = &self.text[start..self.at];
        let leading_zero = self.bytes()[digits_at] == b'0';
        let fraction = matches!(self.bytes().get(self.at), Some(b'.' | b'e' | b'E'));
        if (leading_zero && (digits > 1 || negative)) || fraction {
            return None;
        }
        if negative {
            number.parse::<i64>().ok().map(RequestId::from)
        } else {
            number.parse::<u64>().ok().map(RequestId::from)
        }
    }
}
