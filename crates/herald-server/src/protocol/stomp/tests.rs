//! The decoder and encoders through their public interface: frames split anywhere, limits,
//! errors, and the bytes real clients send (captured from stomp.py 9.0.0 over TCP and
//! @stomp/stompjs 7.5.0 with ws 8 over WebSocket, each talking to a listener on 127.0.0.1 that
//! recorded what arrived and answered CONNECT and receipts).

use super::encode::{self, ErrorFrame, MessageHead, MessageParts, Subscriber};
use super::*;
use bytes::{BufMut, Bytes, BytesMut};

const LIMITS: Limits = Limits {
    max_head_bytes: 1024,
    max_headers: 16,
    max_body_bytes: 64 * 1024,
};

/// stomp.py `Connection12` with heartbeats (4000, 4000): STOMP, SUBSCRIBE, a binary SEND with
/// an escaped custom header, a text SEND, a heart-beat, ACK, NACK, UNSUBSCRIBE, DISCONNECT.
const STOMP_PY_12: &[u8] = b"STOMP\naccept-version:1.2\nclient-id:py\nheart-beat:4000,4000\nhost:127.0.0.1\nlogin:user\npasscode:token-abc\n\n\x00SUBSCRIBE\nack:client-individual\ndestination:/topic/quotes.fx.*\nid:sub-1\n\n\x00SEND\ncontent-length:11\ncontent-type:application/octet-stream\ndestination:/topic/quotes/fx/EURUSD\nnote:a\\cb\\nc\\\\d\n\n\x00\x01\x02bin\x00ary\xff\x00SEND\ncontent-length:12\ndestination:/topic/quotes/fx/EURUSD\n\nHello World!\x00\nACK\nid:msg-1\n\n\x00NACK\nid:msg-2\n\n\x00UNSUBSCRIBE\nid:sub-1\n\n\x00DISCONNECT\nreceipt:bye\n\n\x00";
/// stomp.py `Connection10` and `Connection11`: CONNECT or STOMP, SUBSCRIBE, DISCONNECT.
const STOMP_PY_10: &[u8] = b"CONNECT\naccept-version:1.0\nlogin:user\npasscode:pw\n\n\x00SUBSCRIBE\nack:client\ndestination:/topic/a.b.#\nid:s1\n\n\x00DISCONNECT\nreceipt:r1\n\n\x00";
const STOMP_PY_11: &[u8] = b"STOMP\naccept-version:1.1\nlogin:user\npasscode:pw\n\n\x00SUBSCRIBE\nack:client\ndestination:/topic/a.b.#\nid:s1\n\n\x00DISCONNECT\nreceipt:r1\n\n\x00";
/// stompjs, one entry per WebSocket message (it picked subprotocol v12.stomp).
const STOMPJS: [&[u8]; 12] = [
    b"CONNECT\nlogin:user\npasscode:token-abc\nhost:herald\naccept-version:1.2,1.1,1.0\nheart-beat:1000,0\n\n\x00",
    b"SUBSCRIBE\nid:sub-0\nack:client\ndestination:/topic/quotes/*/EURUSD\n\n\x00",
    b"SEND\ndestination:/topic/quotes/fx/EURUSD\ncontent-length:12\n\nHello World!\x00",
    b"SEND\ndestination:/topic/img/cam1\ncontent-type:application/octet-stream\nx-note:a\\cb\\nc\ncontent-length:5\n\n\x00\x01\x02\x00\xff\x00",
    b"BEGIN\ntransaction:tx-1\n\n\x00",
    b"SEND\ndestination:/topic/a\ntransaction:tx-1\ncontent-length:5\n\nin tx\x00",
    b"COMMIT\ntransaction:tx-1\n\n\x00",
    b"ACK\nid:msg-1\nsubscription:sub-0\n\n\x00",
    b"NACK\nid:msg-2\nsubscription:sub-0\n\n\x00",
    b"\n",
    b"UNSUBSCRIBE\nid:sub-0\n\n\x00",
    b"DISCONNECT\nreceipt:close-0\n\n\x00",
];

/// Everything a decoder yields from `chunks` fed one after another, ending at the first error.
fn decode_chunks<'a>(
    version: Version,
    limits: Limits,
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<Decoded>, DecodeError> {
    let mut decoder = Decoder::new(limits);
    decoder.set_version(version);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        while let Some(d) = decoder.decode(&mut buf)? {
            out.push(d);
        }
    }
    Ok(out)
}

fn decode_all(bytes: &[u8]) -> Result<Vec<Decoded>, DecodeError> {
    decode_chunks(Version::V1_2, LIMITS, [bytes])
}

fn frames(decoded: Vec<Decoded>) -> Vec<Frame> {
    decoded
        .into_iter()
        .filter_map(|d| match d {
            Decoded::Frame(f) => Some(f),
            Decoded::HeartBeat => None,
        })
        .collect()
}

fn reason(bytes: &[u8]) -> Reason {
    decode_all(bytes).unwrap_err().reason
}

/// A client frame as a 1.2 client writes it (the tests' encoder).
fn client_frame(command: Command, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    out.put_slice(command.as_str().as_bytes());
    out.put_u8(b'\n');
    let v = (!command.is_connect()).then_some(Version::V1_2);
    for (n, val) in headers {
        escape::write(&mut out, n, v);
        out.put_u8(b':');
        escape::write(&mut out, val, v);
        out.put_u8(b'\n');
    }
    out.put_u8(b'\n');
    out.put_slice(body);
    out.put_u8(0);
    out.to_vec()
}

#[test]
fn stomp_py_frames_decode_whole_and_split_at_every_byte() {
    let whole = decode_all(STOMP_PY_12).unwrap();
    let commands: Vec<_> = whole
        .iter()
        .map(|d| match d {
            Decoded::Frame(f) => f.command.as_str(),
            Decoded::HeartBeat => "heart-beat",
        })
        .collect();
    assert_eq!(
        commands,
        [
            "STOMP",
            "SUBSCRIBE",
            "SEND",
            "SEND",
            "heart-beat",
            "ACK",
            "NACK",
            "UNSUBSCRIBE",
            "DISCONNECT"
        ]
    );
    let f = frames(whole.clone());
    assert_eq!(f[0].header("passcode"), Some("token-abc"));
    assert_eq!(f[0].header("heart-beat"), Some("4000,4000"));
    assert_eq!(
        version::negotiate(f[0].header("accept-version")),
        Ok(Version::V1_2)
    );
    assert_eq!(f[1].header("ack"), Some("client-individual"));
    assert_eq!(&f[2].body[..], b"\x00\x01\x02bin\x00ary\xff");
    assert_eq!(f[2].header("note"), Some("a:b\nc\\d"));
    assert_eq!(&f[3].body[..], b"Hello World!");
    assert_eq!(f[7].receipt(), Some("bye"));
    for at in 0..=STOMP_PY_12.len() {
        let (a, b) = STOMP_PY_12.split_at(at);
        assert_eq!(
            decode_chunks(Version::V1_2, LIMITS, [a, b]).unwrap(),
            whole,
            "split at {at}"
        );
    }
    let bytewise = decode_chunks(Version::V1_2, LIMITS, STOMP_PY_12.chunks(1)).unwrap();
    assert_eq!(bytewise, whole);
}

#[test]
fn stomp_py_10_and_11_connect() {
    for (bytes, version) in [(STOMP_PY_10, Version::V1_0), (STOMP_PY_11, Version::V1_1)] {
        let f = frames(decode_chunks(version, LIMITS, [bytes]).unwrap());
        assert_eq!(f.len(), 3);
        assert!(f[0].command.is_connect());
        assert_eq!(
            version::negotiate(f[0].header("accept-version")),
            Ok(version)
        );
        assert_eq!(f[1].header("destination"), Some("/topic/a.b.#"));
        assert_eq!(f[2].command, Command::Disconnect);
    }
}

#[test]
fn stompjs_websocket_messages_decode() {
    let decoded = decode_chunks(Version::V1_2, LIMITS, STOMPJS).unwrap();
    assert_eq!(
        decoded.iter().filter(|d| **d == Decoded::HeartBeat).count(),
        1
    );
    let f = frames(decoded);
    assert_eq!(f.len(), 11);
    assert_eq!(
        version::negotiate(f[0].header("accept-version")),
        Ok(Version::V1_2)
    );
    let hb = heartbeat::negotiate(f[0].header("heart-beat"), (10_000, 10_000)).unwrap();
    assert_eq!(hb.client_sends, Some(std::time::Duration::from_secs(10)));
    assert_eq!(hb.server_sends, None);
    assert_eq!(&f[3].body[..], b"\x00\x01\x02\x00\xff");
    assert_eq!(f[3].header("x-note"), Some("a:b\nc"));
    assert_eq!(f[5].header("transaction"), Some("tx-1"));
    assert_eq!(f[7].header("subscription"), Some("sub-0"));
    // All messages in one buffer decode the same.
    assert_eq!(frames(decode_all(&STOMPJS.concat()).unwrap()), f);
}

#[test]
fn round_trips_every_command_with_escaped_headers_and_binary_bodies() {
    let body: Vec<u8> = (0..=255u8).chain([0, 0, b'\n']).collect();
    let len = body.len().to_string();
    let mut wire = Vec::new();
    let mut want = Vec::new();
    for command in Command::ALL {
        let headers = [
            ("destination", "/topic/a/b"),
            ("we:ird\\name", "line\none\r:colon\\"),
            ("content-length", len.as_str()),
            ("receipt", "r-1"),
        ];
        wire.extend(client_frame(command, &headers, &body));
        want.push(Frame {
            command,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: Bytes::from(body.clone()),
        });
    }
    // CONNECT and STOMP headers are not escaped: `escape::write` without a version turned CR
    // and LF into spaces and left `:` and `\` alone, and the first `:` splits name from value.
    for f in want.iter_mut().filter(|f| f.command.is_connect()) {
        f.headers[1] = ("we".into(), "ird\\name:line one :colon\\".into());
    }
    assert_eq!(frames(decode_all(&wire).unwrap()), want);
}

#[test]
fn bodies_end_at_nul_without_content_length() {
    let f = frames(decode_all(b"SEND\ndestination:/topic/a\n\nhello\x00SEND\n\n\x00").unwrap());
    assert_eq!(&f[0].body[..], b"hello");
    assert!(f[1].body.is_empty());
}

#[test]
fn crlf_lines_repeated_headers_and_heartbeats() {
    let bytes = b"\r\n\n\r\nSEND\r\ndestination:/topic/first\r\ndestination:/topic/second\r\nempty:\r\n\r\nx\x00\n\r\n";
    let decoded = decode_all(bytes).unwrap();
    assert_eq!(decoded[0], Decoded::HeartBeat);
    let Decoded::Frame(f) = &decoded[1] else {
        panic!("{decoded:?}")
    };
    assert_eq!(f.header("destination"), Some("/topic/first"));
    assert_eq!(f.header("empty"), Some(""));
    assert_eq!(f.headers.len(), 2);
    assert_eq!(decoded[2], Decoded::HeartBeat);
    assert_eq!(decoded.len(), 3);
    // A CR at the end of what arrived waits for its LF.
    assert_eq!(decode_all(b"\r").unwrap(), []);
    // EOLs before a CR without LF are reported before the error, however the bytes arrive.
    for pieces in [[b"\n\r\n\r".as_slice(), b"x"], [b"\n\r\n\rx", b""]] {
        let mut decoder = Decoder::new(LIMITS);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(pieces[0]);
        assert_eq!(decoder.decode(&mut buf), Ok(Some(Decoded::HeartBeat)));
        buf.extend_from_slice(pieces[1]);
        assert_eq!(decoder.decode(&mut buf).unwrap_err().reason, Reason::LoneCr);
    }
}

#[test]
fn versions_unescape_differently() {
    let send = b"SEND\nx:a\\nb\n\n\x00";
    let header = |v| {
        frames(decode_chunks(v, LIMITS, [send.as_slice()]).unwrap())[0]
            .header("x")
            .map(str::to_owned)
    };
    assert_eq!(header(Version::V1_2).as_deref(), Some("a\nb"));
    assert_eq!(header(Version::V1_1).as_deref(), Some("a\nb"));
    assert_eq!(header(Version::V1_0).as_deref(), Some("a\\nb"));
    let cr = b"SEND\nx:\\r\n\n\x00".as_slice();
    assert!(decode_chunks(Version::V1_2, LIMITS, [cr]).is_ok());
    let err = decode_chunks(Version::V1_1, LIMITS, [cr]).unwrap_err();
    assert!(
        matches!(err.reason, Reason::UndefinedEscape { .. }),
        "{err}"
    );
}

#[test]
fn malformed_frames_are_errors_with_a_message() {
    assert!(matches!(reason(b"HELLO\n\n\x00"), Reason::UnknownCommand(c) if c == "HELLO"));
    assert!(matches!(reason(b"send\n\n\x00"), Reason::UnknownCommand(_)));
    assert!(matches!(
        reason(b"MESSAGE\n\n\x00"),
        Reason::UnknownCommand(_)
    ));
    // Known to be unknown before its line ends.
    assert!(matches!(
        reason(b"GET / HTTP/1.1"),
        Reason::UnknownCommand(_)
    ));
    assert!(matches!(
        reason(b"SEND\nnocolon\n\n\x00"),
        Reason::NoColon(_)
    ));
    assert!(matches!(reason(b"SEND\n:v\n\n\x00"), Reason::EmptyName(_)));
    assert!(matches!(
        reason(b"SEND\na:\\t\n\n\x00"),
        Reason::UndefinedEscape { .. }
    ));
    assert!(matches!(reason(b"SEND\na\xff:b\n\n\x00"), Reason::NotUtf8));
    assert!(matches!(
        reason(b"SEND\ncontent-length:x\n\n\x00"),
        Reason::BadContentLength(_)
    ));
    assert!(matches!(
        reason(b"SEND\ncontent-length:-1\n\n\x00"),
        Reason::BadContentLength(_)
    ));
    assert!(matches!(
        reason(b"SEND\ncontent-length:1\n\nab\x00"),
        Reason::NoNulAfterBody
    ));
    assert!(matches!(reason(b"\rX"), Reason::LoneCr));
    let err = decode_all(b"SEND\nreceipt:r9\ncontent-length:2\n\nabc").unwrap_err();
    assert_eq!(err.receipt.as_deref(), Some("r9"));
    assert!(!err.to_string().is_empty());
    let unknown = reason(b"FOO\n\n\x00").to_string();
    assert!(unknown.contains("SUBSCRIBE"), "{unknown}");
}

#[test]
fn limits_refuse_a_frame_before_it_is_whole() {
    let limits = Limits {
        max_head_bytes: 64,
        max_headers: 3,
        max_body_bytes: 100,
    };
    let run = |bytes: &[u8]| decode_chunks(Version::V1_2, limits, [bytes]);
    // A head without its end, already past the limit.
    let long = [b"SEND\nx:".as_slice(), &[b'y'; 80]].concat();
    assert!(matches!(
        run(&long).unwrap_err().reason,
        Reason::HeadTooLong { limit: 64 }
    ));
    let head_at_limit = [b"SEND\nx:".as_slice(), &[b'y'; 56], b"\n"].concat();
    assert_eq!(head_at_limit.len(), 64);
    assert!(run(&[head_at_limit.as_slice(), b"\n\x00"].concat()).is_ok());
    let over = [b"SEND\nx:".as_slice(), &[b'y'; 57], b"\n\n\x00"].concat();
    assert!(matches!(
        run(&over).unwrap_err().reason,
        Reason::HeadTooLong { .. }
    ));
    assert!(run(b"SEND\na:1\nb:2\nc:3\n\n\x00").is_ok());
    assert!(matches!(
        run(b"SEND\na:1\na:2\nc:3\nd:4\n\n\x00").unwrap_err().reason,
        Reason::TooManyHeaders { limit: 3 }
    ));
    // content-length over the limit: refused on the head alone, receipt kept.
    let err = run(b"SEND\nreceipt:big\ncontent-length:101\n\n").unwrap_err();
    assert_eq!(err.reason, Reason::BodyTooLong { limit: 100 });
    assert_eq!(err.receipt.as_deref(), Some("big"));
    assert!(run(&[
        b"SEND\ncontent-length:100\n\n".as_slice(),
        &[0; 100],
        b"\x00"
    ]
    .concat())
    .is_ok());
    // Without content-length: refused once more than the limit came without NUL.
    let err = run(&[b"SEND\n\n".as_slice(), &[b'z'; 101]].concat()).unwrap_err();
    assert_eq!(err.reason, Reason::BodyTooLong { limit: 100 });
    assert!(run(&[b"SEND\n\n".as_slice(), &[b'z'; 100]].concat())
        .unwrap()
        .is_empty());
}

#[test]
fn large_bodies_share_the_read_buffer_small_ones_are_copied() {
    let limits = Limits {
        max_body_bytes: 1 << 20,
        ..LIMITS
    };
    for len in [10, 100_000] {
        let mut buf =
            BytesMut::from(&[b"SEND\n\n".as_slice(), &vec![7; len], b"\x00"].concat()[..]);
        let start = buf.as_ptr() as usize;
        let Some(Decoded::Frame(f)) = Decoder::new(limits).decode(&mut buf).unwrap() else {
            panic!()
        };
        assert_eq!(f.body.len(), len);
        let shared = f.body.as_ptr() as usize == start + 6;
        assert_eq!(shared, len >= 16 * 1024, "{len}");
    }
}

#[test]
fn server_frames_are_exact() {
    assert_eq!(
        &encode::connected(Version::V1_2, (10_000, 5_000), "herald/0.1", "s-1")[..],
        b"CONNECTED\nversion:1.2\nheart-beat:10000,5000\nserver:herald/0.1\nsession:s-1\n\n\x00"
    );
    assert_eq!(
        &encode::connected(Version::V1_0, (0, 0), "herald", "a\nb")[..],
        b"CONNECTED\nversion:1.0\nserver:herald\nsession:a b\n\n\x00"
    );
    assert_eq!(
        &encode::receipt("r:1", &[], Version::V1_2)[..],
        b"RECEIPT\nreceipt-id:r\\c1\n\n\x00"
    );
    let error = ErrorFrame {
        message: "bad frame",
        receipt_id: Some("r-7"),
        detail: "line\none",
        list_versions: true,
    };
    assert_eq!(
        &error.encode(Some(Version::V1_2))[..],
        b"ERROR\nmessage:bad frame\nversion:1.0,1.1,1.2\nreceipt-id:r-7\ncontent-type:text/plain;charset=utf-8\ncontent-length:8\n\nline\none\x00"
    );
    let plain = ErrorFrame {
        message: "x:y",
        receipt_id: None,
        detail: "",
        list_versions: false,
    };
    assert_eq!(
        &plain.encode(Some(Version::V1_2))[..],
        b"ERROR\nmessage:x\\cy\n\n\x00"
    );
}

/// A MESSAGE as a client library reads it: the frame decoder run on its bytes, since a MESSAGE
/// has the grammar of a client frame but not a client command.
fn read_message(frame: &encode::MessageFrame) -> (Vec<(String, String)>, Bytes) {
    let bytes = frame.0.concat();
    assert_eq!(bytes.len(), frame.len());
    let rest = bytes.strip_prefix(b"MESSAGE").expect("a MESSAGE");
    let mut send = b"SEND".to_vec();
    send.extend_from_slice(rest);
    let f = frames(decode_all(&send).unwrap());
    assert_eq!(f.len(), 1);
    (f[0].headers.clone(), f[0].body.clone())
}

#[test]
fn message_frames_share_their_head_and_body() {
    let payload = Bytes::from_static(b"\x00binary\x00payload");
    let parts = MessageParts {
        message_id: 42,
        destination: "/topic/quotes/fx/EUR:USD",
        content_type: Some("application/octet-stream"),
        body_len: payload.len(),
        seq: 42,
        epoch: "e1",
        ts: None,
        dropped: None,
    };
    let head = MessageHead::new(&parts, Version::V1_2);
    let auto = Subscriber::new("sub-0", Version::V1_2, false);
    let acked = Subscriber::new("s:1\n", Version::V1_2, true);

    let a = head.frame(&auto, &payload);
    let (headers, body) = read_message(&a);
    assert_eq!(body, payload);
    let want = [
        ("subscription", "sub-0"),
        ("message-id", "42"),
        ("destination", "/topic/quotes/fx/EUR:USD"),
        ("content-type", "application/octet-stream"),
        ("content-length", "15"),
        ("seq", "42"),
        ("epoch", "e1"),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    assert_eq!(headers, want);

    let b = head.frame(&acked, &payload);
    let (headers, _) = read_message(&b);
    assert_eq!(headers[0], ("subscription".into(), "s:1\n".into()));
    assert_eq!(headers[1], ("ack".into(), "s:1\n:42".into()));
    assert_eq!(encode::parse_ack(&headers[1].1), Some(("s:1\n", "42")));
    assert_eq!(headers[2..], want[1..]);

    // Nothing was copied: both frames point at the payload and at one shared head buffer.
    assert_eq!(a.0[2].as_ptr(), payload.as_ptr());
    assert_eq!(b.0[2].as_ptr(), payload.as_ptr());
    assert_eq!(
        a.0[1].as_ptr() as usize + a.0[1].len(),
        b.0[1].as_ptr() as usize + b.0[1].len()
    );
    // A stamped message carries herald's receive time after its position.
    let stamped = MessageHead::new(
        &MessageParts {
            ts: Some(1_700_000_000_123_456),
            ..parts
        },
        Version::V1_2,
    );
    let (headers, _) = read_message(&stamped.frame(&auto, &payload));
    assert_eq!(headers.len(), want.len() + 1);
    assert_eq!(headers[..want.len()], want);
    assert_eq!(
        headers[want.len()],
        ("ts".into(), "1700000000123456".into())
    );
    // 1.1 and 1.0 subscribers acknowledge by message-id: no ack header.
    let head11 = MessageHead::new(&parts, Version::V1_1);
    let (headers, _) =
        read_message(&head11.frame(&Subscriber::new("s", Version::V1_1, true), &payload));
    assert!(headers.iter().all(|(n, _)| n != "ack"));
}
