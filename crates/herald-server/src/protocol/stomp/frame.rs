//! A frame a client sends, as the decoder hands it over: its command, its headers (unescaped,
//! the first of a repeated name kept, as the specification says) and its body.

use bytes::Bytes;
use std::fmt;

/// The commands a STOMP client may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Connect,
    /// CONNECT's 1.1+ name, which a plain HTTP server cannot mistake for anything.
    Stomp,
    Send,
    Subscribe,
    Unsubscribe,
    Ack,
    Nack,
    Begin,
    Commit,
    Abort,
    Disconnect,
}

/// The client commands, as an error about an unknown one lists them ([`Command::ALL`]).
pub const CLIENT_COMMANDS: &str =
    "CONNECT, STOMP, SEND, SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, BEGIN, COMMIT, ABORT, DISCONNECT";

impl Command {
    pub const ALL: [Command; 11] = [
        Command::Connect,
        Command::Stomp,
        Command::Send,
        Command::Subscribe,
        Command::Unsubscribe,
        Command::Ack,
        Command::Nack,
        Command::Begin,
        Command::Commit,
        Command::Abort,
        Command::Disconnect,
    ];

    /// The command named by a frame's first line (case-sensitive, as in the specification).
    pub fn parse(line: &[u8]) -> Option<Command> {
        Command::ALL
            .into_iter()
            .find(|c| c.as_str().as_bytes() == line)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Connect => "CONNECT",
            Command::Stomp => "STOMP",
            Command::Send => "SEND",
            Command::Subscribe => "SUBSCRIBE",
            Command::Unsubscribe => "UNSUBSCRIBE",
            Command::Ack => "ACK",
            Command::Nack => "NACK",
            Command::Begin => "BEGIN",
            Command::Commit => "COMMIT",
            Command::Abort => "ABORT",
            Command::Disconnect => "DISCONNECT",
        }
    }

    /// CONNECT and STOMP: their headers are never escaped.
    pub fn is_connect(self) -> bool {
        matches!(self, Command::Connect | Command::Stomp)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A whole client frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub command: Command,
    /// In the order sent, each name once (the first occurrence wins).
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Frame {
    /// The value of header `name`, if the frame has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `receipt` header: the client wants a RECEIPT (or, on error, an ERROR's
    /// `receipt-id`) naming it.
    pub fn receipt(&self) -> Option<&str> {
        self.header("receipt")
    }
}
