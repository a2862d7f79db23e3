//! Limits against abusive or broken clients (docs/security.md): connections and connection
//! attempts per source IP, messages and bytes per second per connection, and the timeouts
//! (handshake, idle) that stop a client from holding resources without using them.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The `[limits]` section of the config. A zero disables a limit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// TCP connections open at once from one source IP.
    pub max_connections_per_ip: usize,
    /// New connections per second from one source IP, sustained (a token bucket)...
    pub connect_rate_per_ip: f64,
    /// ...and in a burst.
    pub connect_burst_per_ip: u32,
    /// Sources the per-IP limits do not apply to. Loopback by default: a TLS proxy on the same
    /// host (every client then has its address), and local benchmarks.
    pub exempt_ips: Vec<IpAddr>,
    /// Time a client has to send its HTTP request headers, to finish a TLS handshake, and (when
    /// auth is on and it brought no token) to send `{"op":"auth"}` (seconds).
    pub handshake_timeout_secs: u64,
    /// A WebSocket connection from which nothing arrived for this long is closed (seconds).
    pub idle_timeout_secs: u64,
    /// How often herald pings an otherwise quiet connection, so live clients are never idle.
    pub ping_interval_secs: u64,
    /// Frames per second one connection may send (over a one-second window).
    pub max_messages_per_sec: u64,
    /// Bytes per second one connection may send (over a one-second window).
    pub max_bytes_per_sec: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_connections_per_ip: 256,
            connect_rate_per_ip: 20.0,
            connect_burst_per_ip: 100,
            exempt_ips: vec![[127, 0, 0, 1].into(), std::net::Ipv6Addr::LOCALHOST.into()],
            handshake_timeout_secs: 10,
            idle_timeout_secs: 60,
            ping_interval_secs: 20,
            max_messages_per_sec: 100_000,
            max_bytes_per_sec: 512 << 20,
        }
    }
}

impl LimitsConfig {
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_secs(self.handshake_timeout_secs)
    }
}

/// Why a connection attempt was turned away before any HTTP was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpRefusal {
    TooManyConnections,
    TooFast,
}

impl IpRefusal {
    pub fn label(self) -> &'static str {
        match self {
            IpRefusal::TooManyConnections => "per_ip",
            IpRefusal::TooFast => "ip_rate",
        }
    }
}

/// Per-source-IP bookkeeping, shared by the accept loop.
pub struct IpLimits {
    config: LimitsConfig,
    table: Mutex<HashMap<IpAddr, IpState>>,
}

struct IpState {
    open: usize,
    tokens: f64,
    refilled: Instant,
}

/// Holds one connection's place in its IP's count; released when the connection is dropped.
pub struct IpGuard {
    limits: Option<(Arc<IpLimits>, IpAddr)>,
}

impl Drop for IpGuard {
    fn drop(&mut self) {
        if let Some((limits, ip)) = self.limits.take() {
            if let Some(state) = limits.table.lock().get_mut(&ip) {
                state.open -= 1;
            }
        }
    }
}

/// Entries kept before idle ones are pruned.
const PRUNE_AT: usize = 4096;

impl IpLimits {
    pub fn new(config: LimitsConfig) -> Arc<IpLimits> {
        Arc::new(IpLimits {
            config,
            table: Mutex::new(HashMap::new()),
        })
    }

    /// Admits a connection from `ip`, or says why not.
    pub fn admit(self: &Arc<Self>, ip: IpAddr, now: Instant) -> Result<IpGuard, IpRefusal> {
        if self.config.exempt_ips.contains(&ip) {
            return Ok(IpGuard { limits: None });
        }
        let c = &self.config;
        let burst = f64::from(c.connect_burst_per_ip);
        let mut table = self.table.lock();
        if table.len() >= PRUNE_AT {
            table.retain(|_, s| s.open > 0 || refill(s, c.connect_rate_per_ip, burst, now) < burst);
        }
        let state = table.entry(ip).or_insert(IpState {
            open: 0,
            tokens: burst,
            refilled: now,
        });
        if c.max_connections_per_ip > 0 && state.open >= c.max_connections_per_ip {
            return Err(IpRefusal::TooManyConnections);
        }
        if c.connect_rate_per_ip > 0.0 {
            if refill(state, c.connect_rate_per_ip, burst, now) < 1.0 {
                return Err(IpRefusal::TooFast);
            }
            state.tokens -= 1.0;
        }
        state.open += 1;
        Ok(IpGuard {
            limits: Some((self.clone(), ip)),
        })
    }
}

/// Tops up a token bucket for the time passed; returns the tokens now held.
fn refill(state: &mut IpState, rate: f64, burst: f64, now: Instant) -> f64 {
    let elapsed = now.saturating_duration_since(state.refilled).as_secs_f64();
    state.tokens = (state.tokens + elapsed * rate).min(burst);
    state.refilled = now;
    state.tokens
}

/// One connection's inbound rate over one-second windows.
pub struct Meter {
    max_frames: u64,
    max_bytes: u64,
    /// When the current window ends: a comparison per frame, not a subtraction.
    window_end: Instant,
    frames: u64,
    bytes: u64,
}

impl Meter {
    pub fn new(config: &LimitsConfig, now: Instant) -> Meter {
        Meter {
            max_frames: config.max_messages_per_sec,
            max_bytes: config.max_bytes_per_sec,
            window_end: now + Duration::from_secs(1),
            frames: 0,
            bytes: 0,
        }
    }

    /// Counts one frame of `bytes`; says which limit it broke, if any.
    pub fn record(&mut self, bytes: usize, now: Instant) -> Result<(), String> {
        if now >= self.window_end {
            self.window_end = now + Duration::from_secs(1);
            self.frames = 0;
            self.bytes = 0;
        }
        self.frames += 1;
        self.bytes += bytes as u64;
        if self.max_frames > 0 && self.frames > self.max_frames {
            return Err(format!(
                "more than {} frames in one second (limits.max_messages_per_sec)",
                self.max_frames
            ));
        }
        if self.max_bytes > 0 && self.bytes > self.max_bytes {
            return Err(format!(
                "more than {} bytes in one second (limits.max_bytes_per_sec)",
                self.max_bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict() -> LimitsConfig {
        LimitsConfig {
            max_connections_per_ip: 2,
            connect_rate_per_ip: 1.0,
            connect_burst_per_ip: 3,
            exempt_ips: vec![],
            ..LimitsConfig::default()
        }
    }

    #[test]
    fn per_ip_connections_and_rate() {
        let limits = IpLimits::new(strict());
        let ip: IpAddr = [10, 0, 0, 1].into();
        let other: IpAddr = [10, 0, 0, 2].into();
        let t = Instant::now();
        let a = limits.admit(ip, t).unwrap();
        let _b = limits.admit(ip, t).unwrap();
        assert_eq!(
            limits.admit(ip, t).err(),
            Some(IpRefusal::TooManyConnections)
        );
        assert!(limits.admit(other, t).is_ok());
        drop(a);
        let _c = limits.admit(ip, t).unwrap(); // third token of the burst
        drop(_c);
        assert_eq!(limits.admit(ip, t).err(), Some(IpRefusal::TooFast));
        assert!(limits.admit(ip, t + Duration::from_millis(1100)).is_ok());
    }

    #[test]
    fn exempt_ips_bypass() {
        let limits = IpLimits::new(LimitsConfig {
            exempt_ips: vec![[10, 0, 0, 1].into()],
            ..strict()
        });
        let t = Instant::now();
        let held: Vec<_> = (0..10)
            .map(|_| limits.admit([10, 0, 0, 1].into(), t).unwrap())
            .collect();
        assert_eq!(held.len(), 10);
    }

    #[test]
    fn meter_windows() {
        let config = LimitsConfig {
            max_messages_per_sec: 3,
            max_bytes_per_sec: 100,
            ..LimitsConfig::default()
        };
        let t = Instant::now();
        let mut m = Meter::new(&config, t);
        for _ in 0..3 {
            m.record(1, t).unwrap();
        }
        assert!(m.record(1, t).unwrap_err().contains("frames"));
        let t = t + Duration::from_secs(1);
        m.record(100, t).unwrap();
        assert!(m.record(1, t).unwrap_err().contains("bytes"));
    }
}
