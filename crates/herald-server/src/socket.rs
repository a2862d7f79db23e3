//! The byte stream under a session: a WebSocket's, taken out of hyper after the upgrade, or a
//! plain TCP or TLS stream accepted by a stream listener (MQTT, STOMP).
//!
//! A plain TCP socket is split without a lock (`TcpStream::into_split`), so that its write half
//! can be written to directly by the task that queued a frame (see [`crate::flush`]) as well as
//! by the connection's writer task. Anything else (TLS) goes through tokio's `split`, whose
//! halves share a lock, and is written by the writer task alone.

use crate::limits::{IpGuard, Socket};
use bytes::{Bytes, BytesMut};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use std::io::{self, IoSlice};
#[cfg(target_os = "linux")]
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

type Split<T> = (tokio::io::ReadHalf<T>, tokio::io::WriteHalf<T>);

/// The read side of a session's stream.
pub enum SocketRead {
    /// Plain TCP, with the bytes hyper had already read past the handshake; holds the
    /// connection's places in its IP's and the server's counts for as long as the session
    /// reads.
    Tcp {
        half: OwnedReadHalf,
        ahead: Bytes,
        guard: Held,
    },
    Split(tokio::io::ReadHalf<TokioIo<Upgraded>>),
    /// Any other stream (TLS accepted by a stream listener), holding its places in the counts.
    Boxed(Box<dyn AsyncRead + Send + Unpin>),
}

impl SocketRead {
    /// The bytes read past the handshake, to be taken before anything read from the socket.
    pub fn take_ahead(&mut self) -> Bytes {
        match self {
            SocketRead::Tcp { ahead, .. } => std::mem::take(ahead),
            SocketRead::Split(_) | SocketRead::Boxed(_) => Bytes::new(),
        }
    }

    /// Reads at least one byte into `buf`, with room for `want` more; `Ok(0)` at the end of the
    /// stream. A plain TCP socket with nothing buffered is read into this thread's scratch
    /// buffer and `buf` gets just what arrived: a quiet connection holds no read buffer while it
    /// waits, and a read that finds nothing allocates nothing. (TLS keeps buffers of its own.)
    pub async fn read_into(&mut self, buf: &mut BytesMut, want: usize) -> io::Result<usize> {
        match self {
            SocketRead::Tcp { half, .. } => loop {
                half.readable().await?;
                let read = if buf.is_empty() && want <= SCRATCH_BYTES {
                    SCRATCH.with_borrow_mut(|scratch| {
                        let n = half.try_read(&mut scratch[..want])?;
                        buf.extend_from_slice(&scratch[..n]);
                        Ok(n)
                    })
                } else {
                    buf.reserve(want);
                    half.try_read_buf(buf)
                };
                match read {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    result => return result,
                }
            },
            SocketRead::Split(io) => {
                buf.reserve(want);
                io.read_buf(buf).await
            }
            SocketRead::Boxed(io) => {
                buf.reserve(want);
                io.read_buf(buf).await
            }
        }
    }
}

/// The most a read into [`SCRATCH`] takes.
pub const SCRATCH_BYTES: usize = 16 << 10;

thread_local! {
    /// Where a connection with nothing buffered is read into (see [`SocketRead::read_into`]).
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; SCRATCH_BYTES]);
}

/// The write side of a session's stream.
pub enum SocketWrite {
    Tcp(OwnedWriteHalf),
    Split(tokio::io::WriteHalf<TokioIo<Upgraded>>),
    Boxed(Box<dyn AsyncWrite + Send + Unpin>),
}

/// Splits a plain TCP socket accepted by a stream listener (no HTTP before it), the lock-free
/// way; `held`: its places in the counts, kept while the session reads.
pub fn split_tcp(tcp: TcpStream, held: Held) -> (SocketRead, SocketWrite) {
    let (half, write) = tcp.into_split();
    let read = SocketRead::Tcp {
        half,
        ahead: Bytes::new(),
        guard: held,
    };
    (read, SocketWrite::Tcp(write))
}

/// Splits any other stream (TLS) accepted by a stream listener; its halves share a lock.
pub fn split_boxed<S>(io: S, held: Held) -> (SocketRead, SocketWrite)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (read, write) = tokio::io::split(Guarded::new(io, held));
    (
        SocketRead::Boxed(Box::new(read)),
        SocketWrite::Boxed(Box::new(write)),
    )
}

/// Splits an upgraded connection, the lock-free way when it is plain TCP accepted by herald's
/// listener.
pub fn split(upgraded: Upgraded) -> (SocketRead, SocketWrite) {
    match into_tcp(upgraded) {
        Ok((tcp, guard, read_ahead)) => {
            let (half, write) = tcp.into_split();
            let read = SocketRead::Tcp {
                half,
                // A copy: hyper's leftover is a slice of its whole read buffer, kept alive by it.
                ahead: Bytes::copy_from_slice(&read_ahead),
                guard,
            };
            (read, SocketWrite::Tcp(write))
        }
        Err(upgraded) => {
            let (read, write): Split<_> = tokio::io::split(TokioIo::new(upgraded));
            (SocketRead::Split(read), SocketWrite::Split(write))
        }
    }
}

impl AsyncWrite for SocketWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            SocketWrite::Tcp(io) => Pin::new(io).poll_write(cx, buf),
            SocketWrite::Split(io) => Pin::new(io).poll_write(cx, buf),
            SocketWrite::Boxed(io) => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            SocketWrite::Tcp(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            SocketWrite::Split(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            SocketWrite::Boxed(io) => Pin::new(io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            SocketWrite::Tcp(io) => io.is_write_vectored(),
            SocketWrite::Split(io) => io.is_write_vectored(),
            SocketWrite::Boxed(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SocketWrite::Tcp(io) => Pin::new(io).poll_flush(cx),
            SocketWrite::Split(io) => Pin::new(io).poll_flush(cx),
            SocketWrite::Boxed(io) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SocketWrite::Tcp(io) => Pin::new(io).poll_shutdown(cx),
            SocketWrite::Split(io) => Pin::new(io).poll_shutdown(cx),
            SocketWrite::Boxed(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}

/// The most bytes of several slices that [`DirectSocket::send`] copies into one buffer and
/// sends as one: a hold's 64 small messages for one connection fit.
#[cfg(target_os = "linux")]
pub(crate) const GATHERED: usize = 8 * 1024;

/// The write half of a plain TCP socket, for writes from any task through a shared reference.
pub struct DirectSocket {
    half: OwnedWriteHalf,
    /// `half`'s descriptor, kept here: reading it through tokio's stream costs a cache miss per
    /// write.
    fd: RawFd,
}

impl DirectSocket {
    pub fn new(half: OwnedWriteHalf) -> Self {
        let fd = half.as_ref().as_raw_fd();
        DirectSocket { half, fd }
    }

    pub fn stream(&self) -> &TcpStream {
        self.half.as_ref()
    }

    /// One non-blocking send of `slices`, in order. Not tokio's `try_write_vectored`, which
    /// first reads the socket's readiness in tokio's I/O driver, another cache miss per
    /// delivery: a full socket's EAGAIN goes to the writer task, whose tokio write learns
    /// readiness the usual way.
    ///
    /// One slice (a connection sent one text message since its last write: most writes under
    /// a wide fan-out) goes by `sendto`. So do several that come to at most [`GATHERED`]
    /// bytes, copied one after the other into a buffer first: a backlog of small messages, an
    /// MQTT PUBLISH's head and payload. Larger writes go by `sendmsg`. `sendmsg` copies its
    /// header and then its array of slices in from user memory, in layers of the kernel that
    /// `sendto` does without, and the kernel then copies each slice's bytes apart: on loopback
    /// that is a visible part of a small write, more than copying the slices here.
    ///
    /// On Linux the system calls are made through `syscall` rather than libc's wrappers,
    /// which make each, as a thread-cancellation point, enable and disable asynchronous
    /// cancellation: more user-space work than the rest of the call, once per direct write,
    /// for a feature herald never uses (no thread of it is ever cancelled).
    #[cfg(target_os = "linux")]
    pub fn send(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        let sent = match slices {
            [slice] => self.send_to(slice),
            _ => self.send_several(slices),
        };
        match usize::try_from(sent) {
            Ok(sent) => Ok(sent),
            Err(_) => Err(io::Error::last_os_error()),
        }
    }

    /// One `sendto` of `bytes` (see [`DirectSocket::send`]).
    #[cfg(target_os = "linux")]
    fn send_to(&self, bytes: &[u8]) -> libc::c_long {
        // SAFETY: `fd` belongs to `half`, which lives as long as `self`; the bytes outlive the
        // call, and the kernel only reads them. No address: the socket is connected.
        unsafe {
            libc::syscall(
                libc::SYS_sendto,
                libc::c_long::from(self.fd),
                bytes.as_ptr(),
                bytes.len(),
                libc::c_long::from(libc::MSG_NOSIGNAL),
                std::ptr::null::<libc::sockaddr>(),
                0 as libc::socklen_t,
            )
        }
    }

    /// `slices` (not one): copied one after the other into a buffer and sent by one
    /// [`DirectSocket::send_to`] if they come to at most [`GATHERED`] bytes, by `sendmsg` if
    /// more (see [`DirectSocket::send`]). Never inlined: its buffer would make every direct
    /// write's stack frame probe two pages, and its code lengthen the one-slice path around it.
    #[cfg(target_os = "linux")]
    #[inline(never)]
    fn send_several(&self, slices: &[IoSlice<'_>]) -> libc::c_long {
        let mut buffer = [MaybeUninit::<u8>::uninit(); GATHERED];
        if let Some(bytes) = gather(slices, &mut buffer) {
            return self.send_to(bytes);
        }
        // SAFETY: `msghdr` is plain data, and all zeroes is a valid (empty) one.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // `IoSlice` is guaranteed ABI-compatible with `iovec` on Unix.
        msg.msg_iov = slices.as_ptr().cast_mut().cast();
        msg.msg_iovlen = slices.len() as _;
        // SAFETY: `fd` belongs to `half`, which lives as long as `self`; `msg` and the slices it
        // points at outlive the call, and the kernel only reads them.
        unsafe {
            libc::syscall(
                libc::SYS_sendmsg,
                libc::c_long::from(self.fd),
                &msg as *const libc::msghdr,
                libc::c_long::from(libc::MSG_NOSIGNAL),
            )
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub fn send(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: `fd` belongs to `half`, which lives as long as `self`.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) };
        socket2::SockRef::from(&fd).send_vectored_with_flags(slices, libc::MSG_NOSIGNAL)
    }
}

/// `slices` copied one after the other into `buffer`, the bytes to send as one, if they come
/// to at most [`GATHERED`]; `None` if they do not (nothing is copied then). `buffer` is left
/// uninitialised by the caller: only the bytes copied in are read.
#[cfg(target_os = "linux")]
#[inline(always)]
fn gather<'b>(
    slices: &[IoSlice<'_>],
    buffer: &'b mut [MaybeUninit<u8>; GATHERED],
) -> Option<&'b [u8]> {
    let total: usize = slices.iter().map(|s| s.len()).sum();
    if total > GATHERED {
        return None;
    }
    let mut at = 0;
    for slice in slices {
        // SAFETY: the slices' lengths sum to `total`, at most `GATHERED`, so each copy stays
        // inside `buffer`; a slice never overlaps the buffer, which is borrowed mutably.
        unsafe {
            std::ptr::copy_nonoverlapping(
                slice.as_ptr(),
                buffer.as_mut_ptr().cast::<u8>().add(at),
                slice.len(),
            );
        }
        at += slice.len();
    }
    // SAFETY: the first `total` bytes were written just above.
    Some(unsafe { std::slice::from_raw_parts(buffer.as_ptr().cast::<u8>(), total) })
}

/// Writes to a TCP socket through a shared reference, so the writer task can use the socket
/// that direct writes use too (they never write at the same time: see `Connection`).
/// tokio implements `AsyncWrite` only for an owned stream or half.
pub struct SharedWrite<'a>(pub &'a TcpStream);

impl AsyncWrite for SharedWrite<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            // A WouldBlock here clears the readiness, so the next poll waits for the socket.
            match self.0.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                result => return Poll::Ready(result),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(self.0).shutdown(std::net::Shutdown::Write))
    }
}

/// A stream (plain TCP, or TLS over it) that holds its source IP's connection slot and its
/// place among the open sockets until it is dropped, which, for an upgraded WebSocket, is when
/// the session ends.
pub struct Guarded<S> {
    io: S,
    held: Held,
}

impl<S> Guarded<S> {
    pub fn new(io: S, held: Held) -> Guarded<S> {
        Guarded { io, held }
    }
}

/// What an accepted socket holds while it is open: its places in its IP's count and in the
/// server's.
pub struct Held {
    #[allow(dead_code)] // held for its Drop
    guard: IpGuard,
    #[allow(dead_code)] // held for its Drop
    socket: Socket,
}

impl Held {
    pub fn new(guard: IpGuard, socket: Socket) -> Held {
        Held { guard, socket }
    }
}

/// The plain TCP socket under a WebSocket upgraded from herald's listener, with its places in
/// the counts and the bytes hyper read past the handshake; `Err` gives back anything else
/// (TLS, or a connection served by another listener, as in tests).
fn into_tcp(upgraded: Upgraded) -> Result<(TcpStream, Held, Bytes), Upgraded> {
    let parts = upgraded.downcast::<TokioIo<Guarded<TcpStream>>>()?;
    let guarded = parts.io.into_inner();
    Ok((guarded.io, guarded.held, parts.read_buf))
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn several_slices_are_gathered_in_order_up_to_the_bound() {
        let mut buffer = [MaybeUninit::uninit(); GATHERED];
        let slices = [IoSlice::new(b"ab"), IoSlice::new(b""), IoSlice::new(b"cde")];
        assert_eq!(gather(&slices, &mut buffer), Some(&b"abcde"[..]));
        assert_eq!(gather(&[], &mut buffer), Some(&b""[..]));
        // Exactly the bound still fits; one byte more goes by `sendmsg`.
        let half = vec![7u8; GATHERED / 2];
        let full = [IoSlice::new(&half), IoSlice::new(&half)];
        assert_eq!(gather(&full, &mut buffer).map(<[u8]>::len), Some(GATHERED));
        let over = [IoSlice::new(&half), IoSlice::new(&half), IoSlice::new(b"x")];
        assert_eq!(gather(&over, &mut buffer), None);
    }
}
