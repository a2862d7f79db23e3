//! The bench's side of STOMP 1.2: the frames a publisher and a subscriber send, and reading
//! the ones a server sends back.
//!
//! Written by hand because it is the bench's hot path: a subscriber reads each MESSAGE in
//! place (its destination, herald's `seq` and `ts` headers and the body as slices of the read
//! buffer), where a client library would build a header map and an owned frame per delivery.
//!
//! The frames the bench writes carry nothing to escape (topics are `t/123`-like, values are
//! numbers), so they are written as they are. The headers it reads are herald's `seq`, `ts` and
//! `destination`, compared or parsed as bytes; an escaped header value would not match and is
//! read as absent.

use anyhow::{bail, Context, Result};

/// The WebSocket subprotocol asked for (herald serves `/stomp` with it).
pub const SUBPROTOCOL: &str = "v12.stomp";

/// Where a herald topic lives among STOMP destinations (herald's default dialect).
const TOPIC_PREFIX: &str = "/topic/";

/// CONNECT: version 1.2, no heart-beats (a run is bounded and both ends live on one host).
pub fn connect(out: &mut Vec<u8>) {
    out.extend_from_slice(b"CONNECT\naccept-version:1.2\nhost:herald-bench\nheart-beat:0,0\n\n\0");
}

/// SUBSCRIBE to `topic` as subscription `id`, acknowledged automatically, asking for a
/// RECEIPT (how the bench learns the subscription is made).
pub fn subscribe(id: u64, topic: &str, out: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(
        out,
        "SUBSCRIBE\nid:{id}\ndestination:{TOPIC_PREFIX}{topic}\nack:auto\nreceipt:{id}\n\n\0"
    );
}

/// SEND `body` to `topic`; with `stamp`, herald adds its receive time to each MESSAGE (`ts`).
pub fn send(topic: &str, stamp: bool, body: &[u8], out: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(
        out,
        "SEND\ndestination:{TOPIC_PREFIX}{topic}\ncontent-length:{}\n{}\n",
        body.len(),
        if stamp { "stamp:true\n" } else { "" }
    );
    out.extend_from_slice(body);
    out.push(0);
}

/// A frame from the server, borrowed from the bytes it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    Connected,
    Message {
        /// The herald topic (the destination without `/topic/`).
        topic: &'a [u8],
        /// herald's sequence number of the message on its topic (`seq`).
        seq: Option<u64>,
        /// herald's receive time, µs since the UNIX epoch (`ts`), when the sender asked.
        ts: Option<u64>,
        /// Messages of the topic herald dropped for this subscriber before this one
        /// (`dropped`: its slow-consumer policy).
        dropped: Option<u64>,
        body: &'a [u8],
    },
    Receipt,
    /// ERROR: its `message` header.
    Error(&'a [u8]),
    /// An EOL between frames: a heart-beat.
    HeartBeat,
    /// Any other command.
    Other,
}

/// Reads one frame from the front of `buf`: the frame and its length in bytes, or None when
/// `buf` holds only part of it. A frame longer than `max` bytes, or one that cannot be read,
/// is an error.
pub fn parse(buf: &[u8], max: usize) -> Result<Option<(Frame<'_>, usize)>> {
    match buf.first() {
        None => return Ok(None),
        Some(b'\n') => return Ok(Some((Frame::HeartBeat, 1))),
        Some(b'\r') if buf.len() < 2 => return Ok(None),
        Some(b'\r') if buf[1] == b'\n' => return Ok(Some((Frame::HeartBeat, 2))),
        _ => {}
    }
    // The head ends at the first empty line (LF or CR LF line ends).
    let mut blank = None;
    for i in memchr::memchr_iter(b'\n', buf) {
        match buf.get(i + 1) {
            Some(b'\n') => blank = Some((i, i + 2)),
            Some(b'\r') if buf.get(i + 2) == Some(&b'\n') => blank = Some((i, i + 3)),
            _ => continue,
        }
        break;
    }
    let Some(blank) = blank else {
        if buf.len() > max {
            bail!("a STOMP frame head of over {max} bytes");
        }
        return Ok(None);
    };
    let (head_end, body_at) = blank;
    let head = &buf[..head_end];
    let mut lines = head.split(|&b| b == b'\n').map(trim_cr);
    let command = lines.next().unwrap_or_default();
    let (mut destination, mut seq, mut ts, mut dropped) = (None, None, None, None);
    let (mut length, mut message) = (None, None);
    for line in lines {
        let Some(colon) = memchr::memchr(b':', line) else {
            bail!(
                "a STOMP header line without a colon: {:?}",
                String::from_utf8_lossy(line)
            );
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        // The first occurrence of a header counts (STOMP 1.2).
        match name {
            b"destination" => destination = destination.or(Some(value)),
            b"seq" => seq = seq.or(number(value)),
            b"ts" => ts = ts.or(number(value)),
            b"dropped" => dropped = dropped.or(number(value)),
            b"content-length" => {
                length = length.or(Some(number(value).context("a bad content-length")?))
            }
            b"message" => message = message.or(Some(value)),
            _ => {}
        }
    }
    let body_end = match length {
        Some(n) => {
            let n = n as usize;
            if n > max {
                bail!("a STOMP body of {n} bytes is over the bench's limit");
            }
            if buf.len() < body_at + n + 1 {
                return Ok(None);
            }
            if buf[body_at + n] != 0 {
                bail!("a STOMP body not followed by NUL after its content-length");
            }
            body_at + n
        }
        None => match memchr::memchr(0, &buf[body_at..]) {
            Some(i) => body_at + i,
            None if buf.len() - body_at > max => bail!("a STOMP body of over {max} bytes"),
            None => return Ok(None),
        },
    };
    let body = &buf[body_at..body_end];
    let frame = match command {
        b"MESSAGE" => {
            let d = destination.context("a MESSAGE without a destination")?;
            Frame::Message {
                topic: d.strip_prefix(TOPIC_PREFIX.as_bytes()).unwrap_or(d),
                seq,
                ts,
                dropped,
                body,
            }
        }
        b"CONNECTED" => Frame::Connected,
        b"RECEIPT" => Frame::Receipt,
        b"ERROR" => Frame::Error(message.unwrap_or(body)),
        _ => Frame::Other,
    };
    Ok(Some((frame, body_end + 1)))
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn number(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_frames() {
        let mut out = vec![];
        subscribe(3, "t/9", &mut out);
        assert_eq!(
            out,
            b"SUBSCRIBE\nid:3\ndestination:/topic/t/9\nack:auto\nreceipt:3\n\n\0"
        );
        out.clear();
        send("t/9", true, b"a\0b", &mut out);
        assert_eq!(
            out,
            b"SEND\ndestination:/topic/t/9\ncontent-length:3\nstamp:true\n\na\0b\0"
        );
        out.clear();
        send("t/9", false, b"x", &mut out);
        assert_eq!(
            out,
            b"SEND\ndestination:/topic/t/9\ncontent-length:1\n\nx\0"
        );
    }

    #[test]
    fn a_message_reads_back_whole_and_never_from_a_part() {
        let frame = b"MESSAGE\r\nsubscription:0\nmessage-id:17\ndestination:/topic/t/42\ncontent-length:4\nseq:8\nepoch:e1\nts:1700\ndropped:3\n\nab\0c\0";
        let (f, n) = parse(frame, 1 << 20).unwrap().unwrap();
        assert_eq!(n, frame.len());
        assert_eq!(
            f,
            Frame::Message {
                topic: b"t/42",
                seq: Some(8),
                ts: Some(1700),
                dropped: Some(3),
                body: b"ab\0c",
            }
        );
        for cut in 0..frame.len() {
            assert_eq!(parse(&frame[..cut], 1 << 20).unwrap(), None, "cut {cut}");
        }
        // Without content-length the body ends at the first NUL.
        let (f, n) = parse(b"MESSAGE\ndestination:/topic/a\n\nhi\0\n", 100)
            .unwrap()
            .unwrap();
        assert_eq!(n, 33, "up to the NUL; the EOL after it is a heart-beat");
        assert!(matches!(
            f,
            Frame::Message {
                body: b"hi",
                seq: None,
                ts: None,
                ..
            }
        ));
    }

    #[test]
    fn other_frames() {
        let p = |b: &'static [u8]| parse(b, 1000).unwrap().unwrap();
        assert_eq!(p(b"\n"), (Frame::HeartBeat, 1));
        assert_eq!(p(b"\r\nX"), (Frame::HeartBeat, 2));
        assert_eq!(p(b"CONNECTED\nversion:1.2\n\n\0").0, Frame::Connected);
        assert_eq!(p(b"RECEIPT\nreceipt-id:4\n\n\0").0, Frame::Receipt);
        assert_eq!(
            p(b"ERROR\nmessage:no such topic\n\ndetails\0").0,
            Frame::Error(b"no such topic")
        );
    }

    #[test]
    fn bad_frames_are_errors() {
        assert!(parse(b"MESSAGE\nnocolon\n\n\0", 100).is_err());
        assert!(parse(
            b"MESSAGE\ndestination:/topic/a\ncontent-length:2\n\nabc\0",
            100
        )
        .is_err());
        assert!(parse(b"MESSAGE\ncontent-length:9999\n\n", 100).is_err());
        assert!(parse(b"MESSAGE\n\n\0", 100).is_err(), "no destination");
        assert!(parse(&[b'x'; 200], 100).is_err(), "a head over the limit");
    }
}
