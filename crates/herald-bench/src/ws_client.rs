//! The subscribers' WebSocket client, written by hand because it is the bench's hot path.
//!
//! With tokio-tungstenite every delivery cost a zeroed read buffer, an owned `Message` and
//! two `read` calls (the second one only to learn the socket was empty), which held one bench
//! core to about 100,000 deliveries/s — below what herald sends. This client reads straight
//! from the socket into one reusable buffer, parses frames in place, and after a short read
//! tells tokio the socket is drained instead of asking the kernel again (safe because tokio's
//! readiness is edge-triggered and `clear_ready` ignores readiness newer than the guard).
//!
//! Only what a subscriber needs is here: the client handshake (with a subprotocol for MQTT and
//! STOMP), masked client frames, and reading server frames (text, binary, continuation, close;
//! pings are answered).
//!
//! MQTT and STOMP also run over plain TCP: the same client then passes the byte stream
//! through unframed ([`Framing::Raw`]), each read's bytes as one binary message, and the
//! protocol's decoder ([`crate::protocol::Decoder`]) finds its packets in them as it does in
//! WebSocket messages (which may split or join packets too).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;

use anyhow::{bail, Context, Result};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// How a protocol's frames travel on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Each in a masked WebSocket frame (client → server).
    WebSocket,
    /// As they are, on a plain TCP stream (MQTT, STOMP).
    Raw,
}

impl Framing {
    /// Appends `payload` to `out` as one frame of this framing (`opcode`: WebSocket's text 0x1
    /// or binary 0x2).
    pub fn put(self, opcode: u8, payload: &[u8], out: &mut Vec<u8>) {
        match self {
            Framing::WebSocket => encode_client_frame(opcode, payload, out),
            Framing::Raw => out.extend_from_slice(payload),
        }
    }
}

/// A connected WebSocket client (or a plain TCP one, [`Framing::Raw`]) over a non-blocking
/// TCP socket.
pub struct WsClient {
    writer: WsWriter,
    reader: FrameReader,
    /// Whether reads ask the kernel when the bytes arrived ([`WsClient::stamp_arrivals`]).
    stamping: bool,
    /// The kernel's receive time of the last segment the latest read took, µs since the UNIX
    /// epoch (0 until a stamped read).
    arrived_us: u64,
}

/// The sending half: cheap to clone, so a trader task can publish while the receiver reads.
#[derive(Clone)]
pub struct WsWriter(Rc<AsyncFd<std::net::TcpStream>>, Framing);

/// One complete message from the server.
pub enum ServerMessage<'a> {
    Text(&'a [u8]),
    Binary(&'a [u8]),
    /// The server closed: code and reason.
    Close(u16, String),
}

impl WsClient {
    /// Performs the opening handshake on a connected socket, asking for `subprotocol` if any.
    pub async fn handshake(
        stream: tokio::net::TcpStream,
        host: &str,
        path: &str,
        subprotocol: Option<&str>,
        max_message: usize,
    ) -> Result<WsClient> {
        let mut client = WsClient::over(stream, Framing::WebSocket, max_message)?;
        let protocol = subprotocol
            .map(|p| format!("Sec-WebSocket-Protocol: {p}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: aGVyYWxkLWJlbmNoLWtleQ==\r\nSec-WebSocket-Version: 13\r\n{protocol}\r\n"
        );
        client.writer.write_all(request.as_bytes()).await?;
        loop {
            if let Some(end) = memchr::memmem::find(client.reader.unread(), b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&client.reader.unread()[..end]).into_owned();
                let status = head.lines().next().unwrap_or_default();
                if !status.starts_with("HTTP/1.1 101") {
                    bail!("the server refused the WebSocket upgrade: {status}");
                }
                client.reader.consume(end + 4);
                return Ok(client);
            }
            if client.fill().await? == 0 {
                bail!("the server closed the connection during the handshake");
            }
        }
    }

    /// A plain TCP client: no handshake, each read's bytes are one binary message.
    pub fn raw(stream: tokio::net::TcpStream, max_message: usize) -> Result<WsClient> {
        WsClient::over(stream, Framing::Raw, max_message)
    }

    fn over(
        stream: tokio::net::TcpStream,
        framing: Framing,
        max_message: usize,
    ) -> Result<WsClient> {
        let std = stream.into_std()?;
        // SAFETY: the TcpStream owns a valid, non-blocking descriptor (tokio's `into_std`
        // leaves it non-blocking) and nothing else closes or replaces it while registered.
        let fd = unsafe {
            AsyncFd::register_with_interest(std, Interest::READABLE | Interest::WRITABLE)
        }
        .map_err(|e| e.into_parts().1)?;
        Ok(WsClient {
            writer: WsWriter(Rc::new(fd), framing),
            reader: FrameReader::new(max_message, framing),
            stamping: false,
            arrived_us: 0,
        })
    }

    /// A handle for sending on this connection.
    pub fn writer(&self) -> WsWriter {
        self.writer.clone()
    }

    /// From now on, each read also asks the kernel when the bytes it takes arrived
    /// (`SO_TIMESTAMPNS`): [`WsClient::next`] then tells when the message's last segment
    /// reached this socket, which splits herald → subscriber into herald's part (until its
    /// write) and the bench's (until it read). It turns on the kernel's receive stamps for
    /// every socket on the machine, so only a diagnostic run asks for it (`--samples`).
    pub fn stamp_arrivals(&mut self) -> Result<()> {
        stamp_arrivals_on(self.writer.0.as_raw_fd()).context("cannot turn on SO_TIMESTAMPNS")?;
        self.stamping = true;
        Ok(())
    }

    /// The next complete message, and when its last bytes reached this socket (µs since the
    /// UNIX epoch, with [`WsClient::stamp_arrivals`]; else 0). Control frames are handled
    /// here (a ping is answered).
    pub async fn next(&mut self) -> Result<(ServerMessage<'_>, u64)> {
        loop {
            match self.reader.parse()? {
                Parsed::Message => break,
                Parsed::Ping(range) => {
                    let payload = self.reader.buf[range].to_vec();
                    let mut pong = Vec::with_capacity(payload.len() + 14);
                    encode_client_frame(0xA, &payload, &mut pong);
                    self.writer.write_all(&pong).await?;
                }
                Parsed::NeedMore => {
                    if self.fill().await? == 0 {
                        bail!("the connection closed without a close frame");
                    }
                }
            }
        }
        // A message is complete only once the read that brought its last bytes is in: the
        // latest read's stamp is its arrival.
        let arrived_us = self.arrived_us;
        Ok((self.reader.message(), arrived_us))
    }

    /// Reads once from the socket into the buffer; 0 means end of stream.
    async fn fill(&mut self) -> Result<usize> {
        loop {
            let mut guard = self.writer.0.readable().await?;
            let spare = self.reader.spare();
            let want = spare.len();
            let stamping = self.stamping;
            let read = guard.try_io(|s| match stamping {
                false => s.get_ref().read(spare).map(|n| (n, None)),
                true => read_stamped(s.as_raw_fd(), spare),
            });
            match read {
                Ok(Ok((n, arrived))) => {
                    if let Some(us) = arrived {
                        self.arrived_us = us;
                    }
                    if n > 0 && n < want {
                        // A short read emptied the socket: skip the read that would only
                        // return WouldBlock. New data raises a new edge.
                        guard.clear_ready();
                    }
                    self.reader.filled(n);
                    return Ok(n);
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e.into()),
                Err(_would_block) => continue,
            }
        }
    }
}

/// Asks the kernel to stamp what socket `fd` receives (`SO_TIMESTAMPNS`), for
/// [`read_stamped`].
fn stamp_arrivals_on(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: an int option of the right size, on a descriptor the caller owns.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// `read`, by `recvmsg`, also returning the kernel's receive time (`SCM_TIMESTAMPNS`, µs
/// since the UNIX epoch) of the last segment taken, when the socket stamps arrivals. TCP
/// reports the last segment's only: for bytes that arrived earlier in the same read it is
/// later than their arrival.
fn read_stamped(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for one timespec cmsg, aligned as a cmsghdr needs.
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid (no name, no iovecs, no control) before the fields
    // set below point it at live buffers, which outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` describes `buf` and `control`, both writable for their lengths.
    let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut arrived = None;
    // SAFETY: the CMSG_* walk stays within the `msg_controllen` the kernel set, and a
    // SCM_TIMESTAMPNS payload is a timespec (read unaligned to be safe).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                arrived = Some(ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, arrived))
}

impl WsWriter {
    /// How frames travel on this connection.
    pub fn framing(&self) -> Framing {
        self.1
    }

    /// Sends one masked text frame (the mask key is zero, which leaves the payload as is:
    /// servers must accept any key, and the bench need not hide its bytes from proxies).
    pub async fn send_text(&self, payload: &[u8]) -> Result<()> {
        let mut frame = Vec::with_capacity(payload.len() + 14);
        self.1.put(0x1, payload, &mut frame);
        self.write_all(&frame).await
    }

    /// Writes a whole buffer, waiting for the socket as needed.
    pub async fn write_all(&self, mut buf: &[u8]) -> Result<()> {
        while !buf.is_empty() {
            let mut guard = self.0.writable().await?;
            match guard.try_io(|s| s.get_ref().write(buf)) {
                Ok(Ok(0)) => bail!("the connection closed while writing"),
                Ok(Ok(n)) => buf = &buf[n..],
                Ok(Err(e)) => return Err(e.into()),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }
}

/// Appends a masked client frame (FIN set, zero mask key, so the payload goes as it is) to
/// `out`.
pub fn encode_client_frame(opcode: u8, payload: &[u8], out: &mut Vec<u8>) {
    herald_core::wire::client_frames::encode_client_frame(true, opcode, [0; 4], payload, out);
}

enum Parsed {
    /// A complete message is ready: [`FrameReader::message`].
    Message,
    /// A ping with this payload range in the buffer (consumed already; answer it).
    Ping(std::ops::Range<usize>),
    NeedMore,
}

/// Server frames parsed in place from one growable buffer.
struct FrameReader {
    buf: Vec<u8>,
    /// Unparsed bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    max_message: usize,
    /// Raw: whatever was read is the next message.
    framing: Framing,
    /// A fragmented message being assembled: opcode and payload so far.
    fragments: Option<(u8, Vec<u8>)>,
    /// The last message assembled from fragments.
    assembled: Vec<u8>,
    /// The message `parse` found: (opcode, payload range in `buf`, or None: `assembled`).
    ready: Option<(u8, Option<std::ops::Range<usize>>)>,
}

/// Room kept free for one read: deliveries are small, so most reads take many at once.
const READ_CHUNK: usize = 64 * 1024;

impl FrameReader {
    fn new(max_message: usize, framing: Framing) -> FrameReader {
        FrameReader {
            buf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            max_message,
            framing,
            fragments: None,
            assembled: vec![],
            ready: None,
        }
    }

    fn unread(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
    }

    /// Free space after the unread bytes, compacting or growing the buffer first.
    fn spare(&mut self) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.buf.len() - self.end < READ_CHUNK / 4 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.buf.len() - self.end < READ_CHUNK / 4 {
                self.buf.resize(self.buf.len() * 2, 0);
            }
        }
        &mut self.buf[self.end..]
    }

    fn filled(&mut self, n: usize) {
        self.end += n;
    }

    /// Parses the next frame if it is all in the buffer.
    fn parse(&mut self) -> Result<Parsed> {
        self.ready = None;
        if self.framing == Framing::Raw {
            if self.start == self.end {
                return Ok(Parsed::NeedMore);
            }
            self.ready = Some((0x2, Some(self.start..self.end)));
            self.start = self.end;
            return Ok(Parsed::Message);
        }
        loop {
            let b = &self.buf[self.start..self.end];
            if b.len() < 2 {
                return Ok(Parsed::NeedMore);
            }
            let (fin, opcode) = (b[0] & 0x80 != 0, b[0] & 0x0F);
            if b[1] & 0x80 != 0 {
                bail!("the server sent a masked frame");
            }
            let (len, head) = match b[1] & 0x7F {
                126 if b.len() >= 4 => (u16::from_be_bytes([b[2], b[3]]) as usize, 4),
                127 if b.len() >= 10 => (
                    u64::from_be_bytes(b[2..10].try_into().unwrap()) as usize,
                    10,
                ),
                126 | 127 => return Ok(Parsed::NeedMore),
                n => (n as usize, 2),
            };
            if len > self.max_message {
                bail!("a frame of {len} bytes is over the bench's limit");
            }
            if b.len() < head + len {
                self.reserve(head + len);
                return Ok(Parsed::NeedMore);
            }
            let payload = self.start + head..self.start + head + len;
            self.start += head + len;
            match opcode {
                0x1 | 0x2 if fin => {
                    self.ready = Some((opcode, Some(payload)));
                    return Ok(Parsed::Message);
                }
                0x1 | 0x2 => self.fragments = Some((opcode, self.buf[payload].to_vec())),
                0x0 => {
                    let (op, mut data) = self
                        .fragments
                        .take()
                        .context("a continuation frame without a first fragment")?;
                    data.extend_from_slice(&self.buf[payload]);
                    if data.len() > self.max_message {
                        bail!(
                            "a message of {} bytes is over the bench's limit",
                            data.len()
                        );
                    }
                    if fin {
                        self.assembled = data;
                        self.ready = Some((op, None));
                        return Ok(Parsed::Message);
                    }
                    self.fragments = Some((op, data));
                }
                0x8 => {
                    self.ready = Some((0x8, Some(payload)));
                    return Ok(Parsed::Message);
                }
                0x9 => return Ok(Parsed::Ping(payload)),
                0xA => {}
                other => bail!("the server sent a frame with opcode {other:#x}"),
            }
        }
    }

    /// Makes sure a frame of `total` bytes fits from `start`.
    fn reserve(&mut self, total: usize) {
        if self.buf.len() - self.start < total {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.buf.len() < total + READ_CHUNK / 4 {
                self.buf.resize(total + READ_CHUNK / 4, 0);
            }
        }
    }

    /// The message the last `parse` returned [`Parsed::Message`] for.
    fn message(&mut self) -> ServerMessage<'_> {
        let (op, range) = self.ready.take().expect("parse found a message");
        let bytes: &[u8] = match range {
            Some(r) => &self.buf[r],
            None => &self.assembled,
        };
        match op {
            0x1 => ServerMessage::Text(bytes),
            0x2 => ServerMessage::Binary(bytes),
            _ => {
                let code = bytes
                    .get(..2)
                    .map(|c| u16::from_be_bytes([c[0], c[1]]))
                    .unwrap_or(1005);
                let reason = String::from_utf8_lossy(bytes.get(2..).unwrap_or_default());
                ServerMessage::Close(code, reason.into_owned())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![(if fin { 0x80 } else { 0 }) | opcode];
        match payload.len() {
            n if n < 126 => f.push(n as u8),
            n if n <= 65535 => {
                f.push(126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(payload);
        f
    }

    /// Feeds `bytes` to a reader in chunks of `chunk` and collects every message.
    fn read_all(bytes: &[u8], chunk: usize) -> Vec<(u8, Vec<u8>)> {
        let mut r = FrameReader::new(1 << 20, Framing::WebSocket);
        let mut out = vec![];
        let mut fed = 0;
        loop {
            match r.parse().unwrap() {
                Parsed::Message => {
                    let m = match r.message() {
                        ServerMessage::Text(t) => (1, t.to_vec()),
                        ServerMessage::Binary(b) => (2, b.to_vec()),
                        ServerMessage::Close(c, _) => (8, c.to_be_bytes().to_vec()),
                    };
                    out.push(m);
                }
                Parsed::Ping(_) => out.push((9, vec![])),
                Parsed::NeedMore if fed == bytes.len() => return out,
                Parsed::NeedMore => {
                    let n = chunk.min(bytes.len() - fed);
                    let spare = r.spare();
                    let n = n.min(spare.len());
                    spare[..n].copy_from_slice(&bytes[fed..fed + n]);
                    r.filled(n);
                    fed += n;
                }
            }
        }
    }

    #[test]
    fn a_stamped_read_tells_when_the_bytes_arrived() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sender = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (receiver, _) = listener.accept().unwrap();
        stamp_arrivals_on(receiver.as_raw_fd()).unwrap();
        let mut buf = [0u8; 64];
        // The kernel turns its receive stamps on from a work queue, a moment after the first
        // socket asks (unless another already had): until then reads come unstamped.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            sender.write_all(b".").unwrap();
            let (n, arrived) = read_stamped(receiver.as_raw_fd(), &mut buf).unwrap();
            assert_eq!(&buf[..n], b".");
            if arrived.is_some() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no stamped read in 5 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let before = crate::wire::now_us();
        sender.write_all(b"hello").unwrap();
        let after = crate::wire::now_us();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (n, arrived) = read_stamped(receiver.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        // Stamped by the kernel during the write, not 20 ms later at the read.
        let arrived = arrived.expect("a receive stamp");
        assert!(
            (before..=after + 1).contains(&arrived),
            "{before} <= {arrived} <= {after}"
        );
        // Without the option a read gives no stamp.
        let mut sender = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (receiver, _) = listener.accept().unwrap();
        sender.write_all(b"hi").unwrap();
        let (n, arrived) = read_stamped(receiver.as_raw_fd(), &mut buf).unwrap();
        assert_eq!((&buf[..n], arrived), (&b"hi"[..], None));
    }

    #[test]
    fn frames_of_every_length_form_survive_any_chunking() {
        let big = vec![7u8; 70_000];
        let mid = vec![5u8; 300];
        let mut stream = server_frame(true, 1, b"hello");
        stream.extend(server_frame(true, 2, &mid));
        stream.extend(server_frame(true, 9, b"p"));
        stream.extend(server_frame(true, 2, &big));
        stream.extend(server_frame(false, 2, b"ab"));
        stream.extend(server_frame(false, 0, b"cd"));
        stream.extend(server_frame(true, 0, b"ef"));
        stream.extend(server_frame(true, 8, &1000u16.to_be_bytes()));
        for chunk in [1, 3, 100, 1 << 20] {
            let got = read_all(&stream, chunk);
            assert_eq!(
                got,
                vec![
                    (1, b"hello".to_vec()),
                    (2, mid.clone()),
                    (9, vec![]),
                    (2, big.clone()),
                    (2, b"abcdef".to_vec()),
                    (8, 1000u16.to_be_bytes().to_vec()),
                ],
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn masked_and_oversized_frames_are_errors() {
        let mut r = FrameReader::new(10, Framing::WebSocket);
        r.spare()[..2].copy_from_slice(&[0x81, 0x85]);
        r.filled(2);
        assert!(r.parse().is_err());
        let mut r = FrameReader::new(10, Framing::WebSocket);
        r.spare()[..2].copy_from_slice(&[0x82, 11]);
        r.filled(2);
        assert!(r.parse().is_err());
    }

    #[test]
    fn client_frames_carry_the_mask_bit_and_length() {
        let mut out = vec![];
        encode_client_frame(1, b"hi", &mut out);
        assert_eq!(out, [0x81, 0x82, 0, 0, 0, 0, b'h', b'i']);
        out.clear();
        encode_client_frame(2, &[0; 200], &mut out);
        assert_eq!(&out[..4], &[0x82, 0x80 | 126, 0, 200]);
        assert_eq!(out.len(), 4 + 4 + 200);
    }
}
