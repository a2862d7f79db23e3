//! herald's own protocol on a WebSocket session: JSON text messages and binary messages with
//! a JSON header (`docs/protocol.md`), decoded by [`herald_core::wire`] straight into herald
//! requests, and answered with what [`wire::Native`] encodes.

use crate::connection::{self, Codec};
use crate::metrics::Disconnect;
use crate::session::{Context, Input, Keepalive, Ping, Protocol};
use herald_core::reply::Reply;
use herald_core::request;
use herald_core::wire;
use std::time::Duration;

/// One client of herald's protocol.
pub struct Native {
    keepalive: Keepalive,
}

impl Native {
    /// Pings with `herald` every `limits.ping_interval_secs` of quiet, and closes after
    /// `limits.idle_timeout_secs` of silence (either 0: never).
    pub fn new(config: &crate::Config) -> Native {
        let limits = &config.limits;
        let every = Duration::from_secs(limits.ping_interval_secs);
        let ping = (!every.is_zero()).then(|| Ping {
            every,
            frame: wire::encode_control(wire::OpCode::Ping, b"herald"),
            steady: false,
        });
        Native {
            keepalive: Keepalive {
                ping,
                idle: Duration::from_secs(limits.idle_timeout_secs),
            },
        }
    }
}

impl Protocol for Native {
    fn codec(&self) -> Codec {
        connection::native()
    }

    fn keepalive(&self) -> Keepalive {
        self.keepalive.clone()
    }

    #[inline]
    fn input(&mut self, cx: &mut Context<'_>, input: Input) -> Result<(), Disconnect> {
        let (binary, payload) = match input {
            Input::Message { binary, payload } => (binary, payload),
            // Never: herald's protocol runs on WebSocket sessions only.
            Input::Bytes(_) => return Err(Disconnect::ProtocolError),
        };
        let decoded = if binary {
            wire::decode_binary(payload)
        } else {
            match request::utf8(&payload) {
                Ok(text) => wire::decode_text_frame(text, &payload),
                Err(_) => {
                    let reason = "invalid UTF-8 in a text frame";
                    cx.close(Disconnect::InvalidUtf8, 1007, reason);
                    return Err(Disconnect::InvalidUtf8);
                }
            }
        };
        match decoded {
            Ok(request) => cx.request(request),
            Err(e) => {
                cx.node.count_error(e.code);
                cx.reply(&Reply::from(e));
            }
        }
        Ok(())
    }
}
