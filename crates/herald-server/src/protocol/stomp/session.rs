//! A STOMP connection's side of a session ([`Protocol`]): client frames become herald
//! requests, and the frames herald answers itself (CONNECTED, ERROR) go out at once.
//!
//! - CONNECT (or STOMP) first: version and heart-beats negotiated, `passcode` presented as a
//!   herald token. Any other frame first, a refused token, or a second CONNECT: ERROR, close.
//! - SEND publishes; SUBSCRIBE subscribes (`ack:auto` under the slow-consumer policy,
//!   `client` and `client-individual` as herald's `lossless`, the window `prefetch-count`);
//!   ACK and NACK give the credit back (herald never redelivers, so a NACK is an ACK that
//!   says the client did not process the message); UNSUBSCRIBE.
//! - BEGIN, COMMIT, ABORT: SEND, ACK and NACK naming a transaction are held until COMMIT,
//!   then carried out in order, or discarded on ABORT (bounded by [`MAX_TRANSACTIONS`] and
//!   [`TRANSACTION_BYTES_PER_BODY`]).
//! - A frame with `receipt` gets its RECEIPT once herald has carried it out: its requests
//!   carry an id whose reply the codec turns into the RECEIPT (a ping when it has none), so
//!   a RECEIPT follows everything the client sent before. DISCONNECT closes after its RECEIPT.
//! - Every refusal is an ERROR with `message` (and `receipt-id` when the frame had
//!   `receipt`), then the close, as the specification requires.

use super::codec::{AckMode, AckTarget, StompCodec, Subscription};
use super::decode::{Decoded, Decoder, Limits};
use super::destination::{self, Dialect};
use super::encode::{self, ErrorFrame};
use super::frame::{Command, Frame};
use super::heartbeat;
use super::version::{self, Version};
use crate::connection::{Codec, Framing};
use crate::metrics::Disconnect;
use crate::session::{Context, Input, Keepalive, Ping, Protocol};
use bytes::{Bytes, BytesMut};
use herald_core::policy::Policy;
use herald_core::request::{self, PayloadKind, Position, Publish, Request, Subscribe};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Transactions one connection may have open at once.
pub const MAX_TRANSACTIONS: usize = 16;
/// The frames held by open transactions may hold this many times the largest body in all.
pub const TRANSACTION_BYTES_PER_BODY: usize = 4;
/// A client that heart-beats is taken for dead after this many of its intervals of silence
/// (the specification leaves the margin to the server).
pub const HEART_BEAT_TOLERANCE: u32 = 2;
/// Header lines of one frame, and bytes of its command and header lines.
pub const MAX_HEADERS: usize = 64;
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// What every STOMP session of a server shares.
#[derive(Clone, Debug)]
pub struct Settings {
    pub dialect: Dialect,
    pub limits: Limits,
    /// herald's heart-beat offer `(sx, sy)` in milliseconds: how often it can send, and how
    /// often it wants to hear from the client.
    pub heart_beat: (u64, u64),
    /// How long a client has to send CONNECT.
    pub connect_timeout: Duration,
}

impl Settings {
    pub fn of(config: &crate::Config) -> Settings {
        let ping = config.limits.ping_interval_secs * 1000;
        Settings {
            dialect: config.stomp_dialect,
            limits: Limits {
                max_head_bytes: MAX_HEAD_BYTES,
                max_headers: MAX_HEADERS,
                max_body_bytes: config.max_message_bytes,
            },
            heart_beat: (ping, ping),
            connect_timeout: Duration::from_secs(config.limits.handshake_timeout_secs),
        }
    }
}

/// Why a frame is refused: the ERROR's words, and the close's reason.
struct Refusal {
    message: String,
    receipt: Option<String>,
    why: Disconnect,
    /// Name the versions herald speaks (a CONNECT with none in common).
    list_versions: bool,
}

impl Refusal {
    fn of(frame: &Frame, message: impl Into<String>) -> Refusal {
        Refusal {
            message: message.into(),
            receipt: frame.receipt().map(str::to_owned),
            why: Disconnect::ProtocolError,
            list_versions: false,
        }
    }
}

/// One STOMP connection.
pub struct StompSession {
    settings: Settings,
    codec: Arc<StompCodec>,
    decoder: Decoder,
    buf: BytesMut,
    /// Negotiated by CONNECT; `None` before it.
    version: Option<Version>,
    transactions: HashMap<String, Vec<Frame>>,
    /// Body bytes the open transactions hold.
    held_bytes: usize,
    /// DISCONNECT was received: nothing after it counts.
    disconnected: bool,
}

impl StompSession {
    pub fn new(settings: Settings, framing: Framing) -> StompSession {
        StompSession {
            codec: Arc::new(StompCodec::new(framing, settings.dialect)),
            decoder: Decoder::new(settings.limits),
            buf: BytesMut::new(),
            version: None,
            transactions: HashMap::new(),
            held_bytes: 0,
            disconnected: false,
            settings,
        }
    }

    /// Sends the ERROR for `refusal`; the caller then closes.
    fn refuse(&self, cx: &mut Context<'_>, refusal: Refusal) -> Disconnect {
        let error = ErrorFrame {
            message: &refusal.message,
            receipt_id: refusal.receipt.as_deref(),
            detail: "",
            list_versions: refusal.list_versions,
        };
        cx.send(self.codec.control(error.encode(self.version)));
        refusal.why
    }

    fn frame(&mut self, cx: &mut Context<'_>, frame: Frame) -> Result<(), Refusal> {
        let Some(version) = self.version else {
            if frame.command.is_connect() {
                return self.connect(cx, &frame);
            }
            return Err(Refusal::of(
                &frame,
                format!(
                    "{} before CONNECT; a session starts with CONNECT or STOMP",
                    frame.command
                ),
            ));
        };
        match frame.header("transaction") {
            Some(tx) if matches!(frame.command, Command::Send | Command::Ack | Command::Nack) => {
                return self.hold(tx.to_owned(), frame)
            }
            _ => {}
        }
        match frame.command {
            Command::Connect | Command::Stomp => Err(Refusal::of(&frame, "already connected")),
            Command::Send => self.send(cx, &frame),
            Command::Subscribe => self.subscribe(cx, &frame, version),
            Command::Unsubscribe => self.unsubscribe(cx, &frame, version),
            Command::Ack | Command::Nack => self.ack(cx, &frame, version),
            Command::Begin => self.begin(cx, &frame),
            Command::Commit => self.commit(cx, &frame),
            Command::Abort => {
                let tx = self.transaction(&frame)?;
                self.discard(&tx);
                self.receipt(cx, &frame, false);
                Ok(())
            }
            Command::Disconnect => {
                self.disconnected = true;
                self.receipt(cx, &frame, true);
                Ok(())
            }
        }
    }

    fn connect(&mut self, cx: &mut Context<'_>, frame: &Frame) -> Result<(), Refusal> {
        let version = version::negotiate(frame.header("accept-version")).map_err(|e| Refusal {
            list_versions: true,
            ..Refusal::of(frame, e.to_string())
        })?;
        let beats = heartbeat::negotiate(frame.header("heart-beat"), self.settings.heart_beat)
            .map_err(|e| Refusal::of(frame, e.to_string()))?;
        if let Some(token) = frame.header("passcode") {
            cx.authenticate(token).map_err(|refused| Refusal {
                why: Disconnect::Unauthorized,
                ..Refusal::of(frame, format!("passcode refused: {}", refused.0))
            })?;
        } else if !cx.is_authenticated() {
            return Err(Refusal {
                why: Disconnect::Unauthorized,
                ..Refusal::of(
                    frame,
                    "authentication required: send a herald token as passcode",
                )
            });
        }
        self.version = Some(version);
        self.decoder.set_version(version);
        self.codec.set_version(version);
        let keepalive = Keepalive {
            ping: beats.server_sends.map(|every| Ping {
                every,
                frame: self.codec.control(encode::HEART_BEAT),
                steady: true,
            }),
            idle: beats
                .client_sends
                .map_or(Duration::ZERO, |every| every * HEART_BEAT_TOLERANCE),
        };
        let session = cx.id.to_string();
        let server = concat!("herald/", env!("CARGO_PKG_VERSION"));
        let (sx, sy) = self.settings.heart_beat;
        // Heart-beats herald does not use are offered as 0, so the client expects none.
        let offer = (
            if beats.server_sends.is_some() { sx } else { 0 },
            if beats.client_sends.is_some() { sy } else { 0 },
        );
        cx.send(
            self.codec
                .control(encode::connected(version, offer, server, &session)),
        );
        cx.set_keepalive(keepalive);
        Ok(())
    }

    fn send(&mut self, cx: &mut Context<'_>, frame: &Frame) -> Result<(), Refusal> {
        let dest = required(frame, "destination")?;
        let topic = destination::publish_topic(dest, self.settings.dialect)
            .map_err(|e| Refusal::of(frame, e.to_string()))?;
        let kind = match request::utf8(&frame.body) {
            Ok(_) => PayloadKind::Text,
            Err(_) => PayloadKind::Binary,
        };
        let id = frame
            .receipt()
            .map(|r| self.codec.await_replies(Some(r), 1, false));
        cx.request(Request::Publish(Publish {
            id,
            topic: topic.into(),
            payload: frame.body.clone(),
            kind,
            content_type: frame.header("content-type").map(str::to_owned),
            stamp: frame.header("stamp") == Some("true"),
            extras: None,
        }));
        Ok(())
    }

    fn subscribe(
        &mut self,
        cx: &mut Context<'_>,
        frame: &Frame,
        version: Version,
    ) -> Result<(), Refusal> {
        let dest = required(frame, "destination")?;
        let id = match (frame.header("id"), version) {
            (Some(id), _) => id.to_owned(),
            (None, Version::V1_0) => dest.to_owned(),
            (None, _) => return Err(Refusal::of(frame, "SUBSCRIBE needs an id header")),
        };
        if self.codec.subscription(&id).is_some() {
            return Err(Refusal::of(
                frame,
                format!("subscription id {id:?} is already in use"),
            ));
        }
        let ack = AckMode::parse(frame.header("ack"))
            .ok_or_else(|| Refusal::of(frame, "ack must be auto, client or client-individual"))?;
        let patterns = destination::subscription_patterns(dest, self.settings.dialect)
            .map_err(|e| Refusal::of(frame, e.to_string()))?;
        let window = match frame.header("prefetch-count") {
            None => None,
            Some(v) => Some(v.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                Refusal::of(
                    frame,
                    format!("prefetch-count {v:?} is not a positive number"),
                )
            })?),
        };
        let since = match frame.header("since") {
            None => None,
            Some(v) if patterns.iter().any(|p| herald_core::topic::is_pattern(p)) => {
                return Err(Refusal::of(
                    frame,
                    format!("since {v:?} names a position on one topic; a wildcard destination recovers with cursor"),
                ))
            }
            Some(v) => Some(super::codec::parse_since(v).ok_or_else(|| {
                Refusal::of(frame, format!("since {v:?} is not <seq>@<epoch>"))
            })?),
        };
        let mut fresh = Vec::new();
        for pattern in &patterns {
            match self.codec.holder(pattern) {
                None => fresh.push(pattern.clone()),
                Some((_, AckMode::Auto)) if ack == AckMode::Auto => {}
                Some((other, _)) => {
                    return Err(Refusal::of(
                        frame,
                        format!("subscription {other:?} already covers {dest}; a destination acknowledged by the client takes one subscription per connection"),
                    ))
                }
            }
        }
        self.codec
            .add(Subscription::new(id, patterns, ack, version));
        let requests: Vec<Request> = fresh
            .into_iter()
            .map(|topic| {
                let since = since
                    .iter()
                    .map(|(seq, epoch)| {
                        (
                            topic.clone(),
                            Position {
                                seq: *seq,
                                epoch: epoch.clone(),
                            },
                        )
                    })
                    .collect();
                Request::Subscribe(Subscribe {
                    id: None,
                    topic,
                    snapshot: frame.header("snapshot") == Some("true"),
                    since,
                    cursor: frame.header("cursor").map(str::to_owned),
                    policy: (ack != AckMode::Auto).then_some(Policy::Lossless),
                    window,
                    ..Subscribe::default()
                })
            })
            .collect();
        self.carry(cx, frame, requests);
        Ok(())
    }

    fn unsubscribe(
        &mut self,
        cx: &mut Context<'_>,
        frame: &Frame,
        version: Version,
    ) -> Result<(), Refusal> {
        let id = match (frame.header("id"), version) {
            (Some(id), _) => id,
            (None, Version::V1_0) => required(frame, "destination")?,
            (None, _) => return Err(Refusal::of(frame, "UNSUBSCRIBE needs an id header")),
        };
        let ended = self
            .codec
            .remove(id)
            .ok_or_else(|| Refusal::of(frame, format!("no subscription with id {id:?}")))?;
        let requests = ended
            .into_iter()
            .map(|topic| Request::Unsubscribe {
                id: None,
                topic,
                group: None,
            })
            .collect();
        self.carry(cx, frame, requests);
        Ok(())
    }

    fn ack(
        &mut self,
        cx: &mut Context<'_>,
        frame: &Frame,
        version: Version,
    ) -> Result<(), Refusal> {
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| Refusal::of(frame, format!("{v:?} names no message herald sent")))
        };
        let target = match version {
            Version::V1_2 => {
                let id = required(frame, "id")?;
                match encode::parse_ack(id) {
                    Some((sub, message)) => AckTarget {
                        subscription: Some(sub),
                        message: number(message)?,
                    },
                    None => AckTarget {
                        subscription: None,
                        message: number(id)?,
                    },
                }
            }
            Version::V1_1 | Version::V1_0 => AckTarget {
                subscription: frame.header("subscription"),
                message: number(required(frame, "message-id")?)?,
            },
        };
        if let Some(sub) = target.subscription {
            if self.codec.subscription(sub).is_none() {
                return Err(Refusal::of(
                    frame,
                    format!("no subscription with id {sub:?}"),
                ));
            }
        }
        for (topic, n) in self.codec.ack(target) {
            cx.request(Request::Credit {
                id: None,
                topic,
                group: None,
                n,
                bytes: 0,
            });
        }
        self.receipt(cx, frame, false);
        Ok(())
    }

    fn transaction(&self, frame: &Frame) -> Result<String, Refusal> {
        let tx = required(frame, "transaction")?;
        if !self.transactions.contains_key(tx) {
            return Err(Refusal::of(frame, format!("no transaction {tx:?} is open")));
        }
        Ok(tx.to_owned())
    }

    fn begin(&mut self, cx: &mut Context<'_>, frame: &Frame) -> Result<(), Refusal> {
        let tx = required(frame, "transaction")?;
        if self.transactions.contains_key(tx) {
            return Err(Refusal::of(
                frame,
                format!("transaction {tx:?} is already open"),
            ));
        }
        if self.transactions.len() == MAX_TRANSACTIONS {
            return Err(Refusal::of(
                frame,
                format!("more than {MAX_TRANSACTIONS} transactions open"),
            ));
        }
        self.transactions.insert(tx.to_owned(), Vec::new());
        self.receipt(cx, frame, false);
        Ok(())
    }

    fn hold(&mut self, tx: String, frame: Frame) -> Result<(), Refusal> {
        let limit = self.settings.limits.max_body_bytes * TRANSACTION_BYTES_PER_BODY;
        let Some(held) = self.transactions.get_mut(&tx) else {
            return Err(Refusal::of(
                &frame,
                format!("no transaction {tx:?} is open"),
            ));
        };
        if self.held_bytes + frame.body.len() > limit {
            return Err(Refusal::of(
                &frame,
                format!("open transactions would hold more than {limit} bytes"),
            ));
        }
        self.held_bytes += frame.body.len();
        held.push(frame);
        Ok(())
    }

    fn discard(&mut self, tx: &str) -> Vec<Frame> {
        let frames = self.transactions.remove(tx).unwrap_or_default();
        self.held_bytes -= frames.iter().map(|f| f.body.len()).sum::<usize>();
        frames
    }

    fn commit(&mut self, cx: &mut Context<'_>, frame: &Frame) -> Result<(), Refusal> {
        let tx = self.transaction(frame)?;
        for mut held in self.discard(&tx) {
            held.headers.retain(|(name, _)| name != "transaction");
            self.frame(cx, held)?;
        }
        self.receipt(cx, frame, false);
        Ok(())
    }

    /// Asks for `requests`, with the ids that bring the RECEIPT after the last of their
    /// replies when the frame has `receipt`.
    fn carry(&self, cx: &mut Context<'_>, frame: &Frame, mut requests: Vec<Request>) {
        if requests.is_empty() {
            return self.receipt(cx, frame, false);
        }
        if let Some(receipt) = frame.receipt() {
            let id = self
                .codec
                .await_replies(Some(receipt), requests.len(), false);
            for request in &mut requests {
                match request {
                    Request::Subscribe(s) => s.id = Some(id.clone()),
                    Request::Unsubscribe { id: rid, .. } => *rid = Some(id.clone()),
                    _ => {}
                }
            }
        }
        for request in requests {
            cx.request(request);
        }
    }

    /// The RECEIPT for `frame`, if it asked for one, after everything asked for so far (a
    /// ping's reply brings it); with `close` the connection ends after it.
    fn receipt(&self, cx: &mut Context<'_>, frame: &Frame, close: bool) {
        let receipt = frame.receipt();
        if receipt.is_none() && !close {
            return;
        }
        let id = self.codec.await_replies(receipt, 1, close);
        cx.request(Request::Ping { id: Some(id) });
    }
}

/// The value of header `name`, which the frame must have.
fn required<'f>(frame: &'f Frame, name: &str) -> Result<&'f str, Refusal> {
    frame
        .header(name)
        .ok_or_else(|| Refusal::of(frame, format!("{} needs a {name} header", frame.command)))
}

impl Protocol for StompSession {
    fn codec(&self) -> Codec {
        self.codec.clone()
    }

    /// Until CONNECT: nothing sent, and the client has `connect_timeout` to send it.
    fn renegotiates_keepalive(&self) -> bool {
        true
    }

    fn keepalive(&self) -> Keepalive {
        Keepalive {
            ping: None,
            idle: self.settings.connect_timeout,
        }
    }

    fn input(&mut self, cx: &mut Context<'_>, input: Input) -> Result<(), Disconnect> {
        let bytes: Bytes = match input {
            Input::Message { payload, .. } | Input::Bytes(payload) => payload,
        };
        if self.disconnected {
            return Ok(());
        }
        self.buf.extend_from_slice(&bytes);
        loop {
            match self.decoder.decode(&mut self.buf) {
                Ok(None) => return Ok(()),
                Ok(Some(Decoded::HeartBeat)) => {}
                Ok(Some(Decoded::Frame(frame))) => {
                    if let Err(refusal) = self.frame(cx, frame) {
                        return Err(self.refuse(cx, refusal));
                    }
                    if self.disconnected {
                        return Ok(());
                    }
                }
                Err(e) => {
                    let refusal = Refusal {
                        message: e.reason.to_string(),
                        receipt: e.receipt,
                        why: Disconnect::ProtocolError,
                        list_versions: false,
                    };
                    return Err(self.refuse(cx, refusal));
                }
            }
        }
    }
}
