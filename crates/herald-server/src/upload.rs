//! Reading a large request body (an image) into one buffer, once; and the limits on every
//! request body: a deadline, and the server-wide budget of partly received bytes.
//!
//! `axum::body::to_bytes` collects the body's chunks and then copies them into one buffer, so
//! a 32 MiB image briefly costs twice that. Here each chunk is appended, as it arrives, to a
//! buffer sized from `Content-Length`, and then freed: the payload is held once, and the frame
//! every subscriber shares points into that same buffer.

use crate::limits::{LimitsConfig, Sockets, PARTIAL_FREE_BYTES};
use axum::body::{Body, HttpBody};
use axum::BoxError;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// It is larger than the limit.
    TooLarge,
    /// The client went away or sent a broken body.
    Broken,
    /// It arrived too slowly (`limits.body_timeout_secs`, `limits.body_min_bytes_per_sec`).
    TooSlow,
    /// The server holds its limit of partly received bytes (`limits.max_partial_bytes`).
    Busy,
}

/// Reads `body` whole, refusing it as soon as it exceeds `limit` bytes. `declared` is its
/// `Content-Length`, if given (a declared length over the limit is refused before reading).
pub async fn read_body(
    mut body: Body,
    limit: usize,
    declared: Option<usize>,
) -> Result<Bytes, BodyError> {
    if declared.is_some_and(|n| n > limit) {
        return Err(BodyError::TooLarge);
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0));
    while let Some(frame) = body.frame().await {
        if let Ok(chunk) = frame.map_err(body_error)?.into_data() {
            if buf.len() + chunk.len() > limit {
                return Err(BodyError::TooLarge);
            }
            buf.extend_from_slice(&chunk);
        }
    }
    Ok(buf.freeze())
}

/// What a body's error says about why it stopped.
fn body_error(e: axum::Error) -> BodyError {
    match e.into_inner().downcast::<BodyLimit>() {
        Ok(limit) => match *limit {
            BodyLimit::TooSlow => BodyError::TooSlow,
            BodyLimit::Busy => BodyError::Busy,
        },
        Err(_) => BodyError::Broken,
    }
}

/// A limit a request body ran into, as the error its reader gets.
#[derive(Debug, thiserror::Error)]
pub enum BodyLimit {
    #[error("the request body arrived too slowly (limits.body_timeout_secs, limits.body_min_bytes_per_sec)")]
    TooSlow,
    #[error("the server holds its limit of partly received bodies (limits.max_partial_bytes)")]
    Busy,
}

/// A request body under the limits: it must arrive within `body_timeout_secs` plus one second
/// per `body_min_bytes_per_sec` bytes received, and what it has delivered beyond
/// [`PARTIAL_FREE_BYTES`] counts against `max_partial_bytes` until it is dropped (its reader
/// is done with it).
pub struct LimitedBody {
    inner: Body,
    started: Instant,
    timeout: Duration,
    min_rate: u64,
    deadline: Option<Pin<Box<Sleep>>>,
    received: u64,
    budget: Option<Arc<Sockets>>,
    charged: u64,
}

impl LimitedBody {
    pub fn new(inner: Body, limits: &LimitsConfig, budget: Option<Arc<Sockets>>) -> Self {
        let started = Instant::now();
        let timeout = Duration::from_secs(limits.body_timeout_secs);
        LimitedBody {
            inner,
            started,
            timeout,
            min_rate: limits.body_min_bytes_per_sec,
            deadline: (!timeout.is_zero())
                .then(|| Box::pin(tokio::time::sleep_until(started + timeout))),
            received: 0,
            budget,
            charged: 0,
        }
    }

    /// Takes note of `n` more bytes received: moves the deadline, counts them in the budget.
    fn received(&mut self, n: usize) -> Result<(), BodyLimit> {
        self.received += n as u64;
        if let Some(deadline) = &mut self.deadline {
            if self.min_rate > 0 {
                let allowed = Duration::from_secs_f64(self.received as f64 / self.min_rate as f64);
                if let Some(at) = (self.started + self.timeout).checked_add(allowed) {
                    deadline.as_mut().reset(at);
                }
            }
        }
        if let Some(budget) = &self.budget {
            if self.received > PARTIAL_FREE_BYTES as u64 {
                if !budget.charge_partial(self.received - self.charged) {
                    return Err(BodyLimit::Busy);
                }
                self.charged = self.received;
            }
        }
        Ok(())
    }
}

impl HttpBody for LimitedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(deadline) = &mut this.deadline {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(BodyLimit::TooSlow.into())));
            }
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(limit) = this.received(data.len()) {
                        return Poll::Ready(Some(Err(limit.into())));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for LimitedBody {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.release_partial(self.charged);
        }
    }
}
