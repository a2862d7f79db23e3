//! The streaming frame decoder: bytes as they arrive (from TCP reads or WebSocket messages,
//! split anywhere, several frames at once) in, whole frames out.
//!
//! The grammar is STOMP 1.2's: a command line, `name:value` header lines, a blank line, the
//! body, NUL; every line may end in CR LF instead of LF; EOLs between frames are heart-beats.
//! The body ends at the first NUL, or, when the frame has `content-length`, after exactly that
//! many bytes (NUL bytes allowed inside), which a NUL must follow.
//!
//! Everything is checked against the caller's [`Limits`] before it is held: a head that cannot
//! end within `max_head_bytes`, more than `max_headers` headers, or a `content-length` above
//! `max_body_bytes` is an error as soon as it shows, and a body without `content-length` is one
//! once `max_body_bytes` bytes came without its NUL. The decoder remembers how far it has
//! searched, so a frame that arrives in many small pieces is scanned once.

use super::escape::{self, UndefinedEscape};
use super::frame::{Command, Frame, CLIENT_COMMANDS};
use super::version::Version;
use bytes::{Buf, Bytes, BytesMut};

/// What the caller allows one frame to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of the command line and the header lines, with their EOLs (not the blank line).
    pub max_head_bytes: usize,
    /// Header lines, repeated names included.
    pub max_headers: usize,
    /// Bytes of body.
    pub max_body_bytes: usize,
}

/// What one call to [`Decoder::decode`] found at the start of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    Frame(Frame),
    /// One or more EOLs between frames: the client's heart-beat, which counts as activity.
    HeartBeat,
}

/// Why the bytes are not a frame. Every error is fatal to the connection: the caller sends an
/// ERROR frame with [`DecodeError::reason`] as its `message` and closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct DecodeError {
    pub reason: Reason,
    /// The offending frame's `receipt` header, when its head was read: the ERROR frame's
    /// `receipt-id`.
    pub receipt: Option<String>,
}

/// What was wrong, in words for the client (the ERROR frame's `message` header).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    #[error("unknown command {0:?}; a client sends {CLIENT_COMMANDS}")]
    UnknownCommand(String),
    #[error("frame command and headers exceed {limit} bytes")]
    HeadTooLong { limit: usize },
    #[error("frame has more than {limit} headers")]
    TooManyHeaders { limit: usize },
    #[error("frame body exceeds {limit} bytes")]
    BodyTooLong { limit: usize },
    #[error("frame command and headers are not UTF-8")]
    NotUtf8,
    #[error("header line {0:?} has no ':'; headers are written name:value")]
    NoColon(String),
    #[error("header line {0:?} has an empty name")]
    EmptyName(String),
    #[error(
        "header {name:?} has the undefined escape {escape:?}; STOMP {version} defines {defined}"
    )]
    UndefinedEscape {
        name: String,
        escape: String,
        version: Version,
        defined: &'static str,
    },
    #[error("content-length {0:?} is not a number of bytes")]
    BadContentLength(String),
    #[error("frame body of content-length bytes is not followed by NUL")]
    NoNulAfterBody,
    #[error("CR not followed by LF")]
    LoneCr,
}

/// Bodies at least this long are handed over as a slice of the read buffer rather than copied:
/// copying them would cost as much as receiving them, and they fill most of the allocation they
/// keep alive. Shorter bodies are copied, so that a message kept in history does not hold a
/// whole read buffer.
const SHARE_BODY_FROM: usize = 16 * 1024;

/// Quoted text in an error is cut to this many characters.
const SHOWN_CHARS: usize = 64;

/// A frame whose head has been read, waiting for its body.
struct Pending {
    command: Command,
    headers: Vec<(String, String)>,
    content_length: Option<usize>,
    /// Bytes of body already searched for NUL (without `content-length`).
    searched: usize,
}

/// Decodes the frames of one connection. Not reusable after an error.
pub struct Decoder {
    limits: Limits,
    version: Version,
    /// Bytes of an unfinished head already searched for its blank line.
    head_searched: usize,
    pending: Option<Pending>,
}

impl Decoder {
    /// A decoder for a new connection. It reads header escapes as STOMP 1.2 defines them until
    /// [`Decoder::set_version`] says otherwise (CONNECT and STOMP frames are never escaped).
    pub fn new(limits: Limits) -> Decoder {
        Decoder {
            limits,
            version: Version::V1_2,
            head_searched: 0,
            pending: None,
        }
    }

    /// The version negotiated on CONNECT, which decides how later headers are unescaped.
    pub fn set_version(&mut self, version: Version) {
        self.version = version;
    }

    /// Takes the next frame or heart-beat off the front of `buf`. `Ok(None)`: `buf` holds no
    /// whole one yet (what it holds is kept; call again once more bytes are appended). Call
    /// until `Ok(None)` to take everything a read brought.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Decoded>, DecodeError> {
        if self.pending.is_none() {
            let eols = leading_eols(buf).map_err(|reason| DecodeError {
                reason,
                receipt: None,
            })?;
            if eols > 0 {
                buf.advance(eols);
                return Ok(Some(Decoded::HeartBeat));
            }
            let Some(head_len) = self.head_end(buf)? else {
                return Ok(None);
            };
            let pending = self.parse_head(&buf[..head_len])?;
            buf.advance(head_len);
            self.head_searched = 0;
            self.pending = Some(pending);
        }
        self.body(buf)
    }

    /// The length of the head at the front of `buf` with its blank line, once it is whole.
    fn head_end(&mut self, buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        let fail = |reason| DecodeError {
            reason,
            receipt: None,
        };
        let limit = self.limits.max_head_bytes;
        // A head of at most `limit` bytes has its blank line within two more.
        let window = &buf[..buf.len().min(limit.saturating_add(2))];
        let mut line_start = self.head_searched.min(window.len());
        while let Some(lf) = memchr::memchr(b'\n', &window[line_start..]) {
            let line_end = line_start + lf;
            let line = &window[line_start..line_end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line_start == 0 {
                // The command line: refuse an unknown command before its headers arrive.
                if Command::parse(line).is_none() {
                    return Err(fail(Reason::UnknownCommand(shown(line))));
                }
            } else if line.is_empty() {
                if line_start > limit {
                    return Err(fail(Reason::HeadTooLong { limit }));
                }
                return Ok(Some(line_end + 1));
            }
            line_start = line_end + 1;
        }
        self.head_searched = line_start;
        if buf.len() > limit.saturating_add(2) {
            return Err(fail(Reason::HeadTooLong { limit }));
        }
        if line_start == 0 && !buf.is_empty() && !is_command_prefix(buf) {
            let line = buf.strip_suffix(b"\r").unwrap_or(buf);
            return Err(fail(Reason::UnknownCommand(shown(line))));
        }
        Ok(None)
    }

    /// Reads a whole head (command line to blank line).
    fn parse_head(&self, head: &[u8]) -> Result<Pending, DecodeError> {
        let fail = |reason| DecodeError {
            reason,
            receipt: None,
        };
        let text = std::str::from_utf8(head).map_err(|_| fail(Reason::NotUtf8))?;
        let mut lines = text
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .take_while(|l| !l.is_empty());
        let command = lines
            .next()
            .and_then(|l| Command::parse(l.as_bytes()))
            .ok_or_else(|| fail(Reason::UnknownCommand(shown(head))))?;
        let version = (!command.is_connect()).then_some(self.version);
        let mut headers: Vec<(String, String)> = Vec::new();
        for (count, line) in lines.enumerate() {
            if count == self.limits.max_headers {
                return Err(fail(Reason::TooManyHeaders {
                    limit: self.limits.max_headers,
                }));
            }
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| fail(Reason::NoColon(shown(line.as_bytes()))))?;
            if name.is_empty() {
                return Err(fail(Reason::EmptyName(shown(line.as_bytes()))));
            }
            let unescape = |s: &str| match version {
                Some(v) => escape::unescape(s, v).map_err(|UndefinedEscape(seq)| {
                    fail(Reason::UndefinedEscape {
                        name: shown(name.as_bytes()),
                        escape: seq,
                        version: v,
                        defined: defined_escapes(v),
                    })
                }),
                None => Ok(s.to_owned()),
            };
            let name = unescape(name)?;
            if headers.iter().all(|(n, _)| *n != name) {
                headers.push((name, unescape(value)?));
            }
        }
        let receipt = || {
            headers
                .iter()
                .find(|(n, _)| n == "receipt")
                .map(|(_, v)| v.clone())
        };
        let content_length = match headers.iter().find(|(n, _)| n == "content-length") {
            None => None,
            Some((_, v)) => {
                let len = parse_length(v).ok_or_else(|| DecodeError {
                    reason: Reason::BadContentLength(shown(v.as_bytes())),
                    receipt: receipt(),
                })?;
                if len > self.limits.max_body_bytes {
                    return Err(DecodeError {
                        reason: Reason::BodyTooLong {
                            limit: self.limits.max_body_bytes,
                        },
                        receipt: receipt(),
                    });
                }
                Some(len)
            }
        };
        Ok(Pending {
            command,
            headers,
            content_length,
            searched: 0,
        })
    }

    /// Takes the pending frame's body and NUL off the front of `buf`, once they are there.
    fn body(&mut self, buf: &mut BytesMut) -> Result<Option<Decoded>, DecodeError> {
        let Some(pending) = self.pending.as_mut() else {
            return Ok(None);
        };
        let len = match pending.content_length {
            Some(len) => {
                if buf.len() <= len {
                    return Ok(None);
                }
                if buf[len] != 0 {
                    return Err(self.pending_error(Reason::NoNulAfterBody));
                }
                len
            }
            None => match memchr::memchr(0, &buf[pending.searched.min(buf.len())..]) {
                Some(at) => pending.searched + at,
                None => {
                    pending.searched = buf.len();
                    if buf.len() > self.limits.max_body_bytes {
                        let limit = self.limits.max_body_bytes;
                        return Err(self.pending_error(Reason::BodyTooLong { limit }));
                    }
                    return Ok(None);
                }
            },
        };
        if len > self.limits.max_body_bytes {
            let limit = self.limits.max_body_bytes;
            return Err(self.pending_error(Reason::BodyTooLong { limit }));
        }
        let body = if len >= SHARE_BODY_FROM {
            buf.split_to(len).freeze()
        } else {
            let body = Bytes::copy_from_slice(&buf[..len]);
            buf.advance(len);
            body
        };
        buf.advance(1);
        Ok(self.pending.take().map(|p| {
            Decoded::Frame(Frame {
                command: p.command,
                headers: p.headers,
                body,
            })
        }))
    }

    fn pending_error(&self, reason: Reason) -> DecodeError {
        let receipt = self.pending.as_ref().and_then(|p| {
            p.headers
                .iter()
                .find(|(n, _)| n == "receipt")
                .map(|(_, v)| v.clone())
        });
        DecodeError { reason, receipt }
    }
}

/// How many bytes of EOLs (LF or CR LF) start `buf`; a CR at its very end waits for its LF, and
/// one followed by anything else is an error.
fn leading_eols(buf: &[u8]) -> Result<usize, Reason> {
    let mut at = 0;
    loop {
        match buf.get(at..).unwrap_or_default() {
            [b'\n', ..] => at += 1,
            [b'\r', b'\n', ..] => at += 2,
            // The EOLs before it are reported first, however the bytes arrived.
            [b'\r', _, ..] if at == 0 => return Err(Reason::LoneCr),
            _ => return Ok(at),
        }
    }
}

/// Whether `partial`, a command line still without its LF, may yet become a known command.
fn is_command_prefix(partial: &[u8]) -> bool {
    let partial = partial.strip_suffix(b"\r").unwrap_or(partial);
    Command::ALL
        .iter()
        .any(|c| c.as_str().as_bytes().starts_with(partial))
}

fn defined_escapes(version: Version) -> &'static str {
    match version {
        Version::V1_2 => "\\r \\n \\c \\\\",
        Version::V1_1 => "\\n \\c \\\\",
        Version::V1_0 => "none",
    }
}

/// `content-length`'s value: decimal digits only.
fn parse_length(v: &str) -> Option<usize> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Beyond usize (or any limit) it is still a length, just too large.
    Some(v.parse().unwrap_or(usize::MAX))
}

/// Text quoted in an error: valid UTF-8, cut to [`SHOWN_CHARS`] characters.
fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .take(SHOWN_CHARS)
        .collect()
}
