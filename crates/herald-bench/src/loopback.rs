//! What one small write over loopback costs the writing thread's CPU on this machine, now.
//!
//! On loopback the kernel does the receiver's TCP work inside the writer's system call, so a
//! server's cost per delivery is mostly this figure, and on a shared virtual machine it moves
//! while user-space speed does not (bench/RESULTS.md, "Machine"). Every report carries it,
//! measured just before the run, so that runs on a slow and a quick host can be told apart.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use crate::sys;

/// Writes measured: about 0.3 s here.
const WRITES: usize = 40_000;

/// Bytes per write: a Solace 3.1.2 delivery (50-byte payload, herald's head and frame header).
pub const FRAME: usize = 96;

/// CPU µs (user + system) one `write()` of [`FRAME`] bytes costs the writing thread, over a
/// loopback TCP connection whose other end a second thread drains. `pinned`: the writer on
/// core 0 and the reader on core 1, as `--spawn` places herald and the bench. `None` if the
/// connection could not be made or broke.
pub fn write_cost_us(pinned: bool) -> Option<f64> {
    let listener = TcpListener::bind("127.0.0.1:0").ok()?;
    let mut writer = TcpStream::connect(listener.local_addr().ok()?).ok()?;
    let (mut reader, _) = listener.accept().ok()?;
    writer.set_nodelay(true).ok()?;
    let drain = std::thread::spawn(move || {
        if pinned {
            let _ = sys::pin_current_thread(1);
        }
        let mut buf = vec![0u8; 64 << 10];
        let mut left = WRITES * FRAME;
        while left > 0 {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    });
    let cost = std::thread::spawn(move || {
        if pinned {
            let _ = sys::pin_current_thread(0);
        }
        let frame = [b'x'; FRAME];
        let cpu = sys::thread_cpu_seconds();
        for _ in 0..WRITES {
            writer.write_all(&frame).ok()?;
        }
        Some((sys::thread_cpu_seconds() - cpu) / WRITES as f64 * 1e6)
    })
    .join()
    .ok()
    .flatten();
    let _ = drain.join();
    cost
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real measurement: a system call moving bytes costs more than nothing and, even on a
    /// loaded test machine, far less than a millisecond.
    #[test]
    fn a_loopback_write_costs_its_writer_some_microseconds() {
        let us = write_cost_us(false).expect("a loopback connection");
        assert!(us > 0.05 && us < 1_000.0, "{us} µs per write");
    }
}
