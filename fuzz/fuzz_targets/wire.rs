//! The protocol decoder on arbitrary client frames: it must never panic, whatever it accepts
//! must survive the engine and encode to a well-formed frame, and the plain-`pub` fast path
//! must decode every text exactly as the general (serde) decoder does.
#![no_main]

use herald_core::codec::{Encode, Frame};
use herald_core::engine::{Engine, EngineConfig, Outbox};
use herald_core::message::Message;
use herald_core::outbox::Delivery;
use herald_core::reply::{DropReason, Reply};
use herald_core::request::Request;
use herald_core::wire::{self, Native};
use libfuzzer_sys::fuzz_target;

/// Encodes everything it is sent as herald's protocol does, and checks the frame.
struct Sink;

impl Sink {
    fn check(frame: Frame) {
        assert!(frame.len() >= 2, "every frame has a WebSocket header");
    }
}

impl Outbox for Sink {
    fn reply(&self, reply: &Reply) {
        Sink::check(Native.reply(reply));
    }
    fn dropped(&self, topic: &str, count: u64, reason: DropReason) {
        Sink::check(Native.dropped(topic, count, reason));
    }
    fn deliver(&self, message: &Message, _: &Delivery) {
        Sink::check(Native.frame(message));
    }
    fn recovered(&self, message: &Message) {
        Sink::check(Native.frame(message));
    }
    fn snapshot(&self, pattern: &str, count: usize) {
        Sink::check(
            Native
                .snapshot(pattern, count)
                .expect("herald's protocol announces snapshot slices"),
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let (binary, body) = match data.split_first() {
        Some((flag, body)) => (flag & 1 == 1, body),
        None => return,
    };
    let decoded = if binary {
        wire::decode_binary(bytes::Bytes::copy_from_slice(body))
    } else {
        match std::str::from_utf8(body) {
            Ok(text) => {
                let decoded = wire::decode_text(text);
                assert_eq!(decoded, wire::decode_text_general(text), "{text}");
                decoded
            }
            Err(_) => return,
        }
    };
    match decoded {
        Ok(request) => {
            let mut engine = Engine::new(EngineConfig::default(), 7);
            let conn = engine.connect(Sink);
            // Subscribe to everything first so a publish is also encoded and delivered.
            let all = wire::decode_text(r#"{"op":"sub","topic":">","snapshot":true}"#).unwrap();
            engine.handle(conn, all, 0).unwrap();
            let _ = engine.handle(conn, request.clone(), 1);
            if let Request::Subscribe(_) = request {
                let _ = engine.handle(conn, request, 2);
            }
        }
        Err(e) => assert!(!e.message.is_empty() && !e.code.is_empty()),
    }
});
