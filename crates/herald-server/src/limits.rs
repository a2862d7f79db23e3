//! Limits against abusive or broken clients (docs/security.md): connections and connection
//! attempts per source IP, every accepted socket against `max_connections`, sockets that have
//! not authenticated, bytes of partly received messages server-wide, HTTP publishes per source
//! IP, messages and bytes per second per connection, and the timeouts (handshake, idle, body)
//! that stop a client from holding resources without using them.

use crate::metrics::{Metrics, Reason};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

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
    /// Sockets (HTTP or WebSocket) open at once that have not presented a valid token or the
    /// admin key, server-wide; only with auth on. Past it the oldest is closed to make room.
    pub max_unauthenticated: usize,
    /// The same per source IPv4 address or IPv6 /64 (not for `exempt_ips`).
    pub max_unauthenticated_per_ip: usize,
    /// Time an HTTP request body may take, beyond one second per `body_min_bytes_per_sec`
    /// bytes received (seconds).
    pub body_timeout_secs: u64,
    /// The slowest a long body may arrive at, on average (bytes per second).
    pub body_min_bytes_per_sec: u64,
    /// Bytes of partly received WebSocket messages and HTTP bodies held at once, server-wide
    /// (each connection's first [`PARTIAL_FREE_BYTES`] not counted).
    pub max_partial_bytes: u64,
    /// HTTP publishes per second from one source IP, sustained (a token bucket)...
    pub http_publish_rate_per_ip: f64,
    /// ...and in a burst.
    pub http_publish_burst_per_ip: u32,
    /// Topics one token subject may have created that herald still holds (auth on); a publish
    /// that would create another is refused (`too_many_topics`).
    pub max_topics_per_subject: usize,
    /// Bytes the topics one token subject created may keep (history, or last value); past it,
    /// it may create no more topics (`retained_limit`).
    pub max_retained_bytes_per_subject: usize,
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
            max_unauthenticated: 1000,
            max_unauthenticated_per_ip: 32,
            body_timeout_secs: 10,
            body_min_bytes_per_sec: 64 << 10,
            max_partial_bytes: 512 << 20,
            http_publish_rate_per_ip: 10_000.0,
            http_publish_burst_per_ip: 10_000,
            max_topics_per_subject: 10_000,
            max_retained_bytes_per_subject: 128 << 20,
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

/// Per-source-IP bookkeeping, shared by the accept loop and HTTP publish.
pub struct IpLimits {
    config: LimitsConfig,
    table: Mutex<HashMap<IpAddr, IpState>>,
}

struct IpState {
    open: usize,
    connects: Bucket,
    publishes: Bucket,
}

/// A token bucket: `tokens` as of `refilled`.
struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            refilled: now,
        }
    }

    /// Tops the bucket up for the time passed; returns the tokens now held.
    fn refill(&mut self, rate: f64, burst: f64, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.refilled = now;
        self.tokens
    }

    /// Takes a token if there is one.
    fn take(&mut self, rate: f64, burst: f64, now: Instant) -> bool {
        if self.refill(rate, burst, now) < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

/// What the per-IP limits count by: an IPv4 address, or an IPv6 /64 (a single subscriber's
/// allocation, whose hosts may pick any address in it). An IPv4-mapped IPv6 address counts
/// as its IPv4 address.
pub fn ip_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0).into()
        }
        v4 => v4,
    }
}

/// Holds one connection's place in its IP's count; released when the connection is dropped.
pub struct IpGuard {
    limits: Option<(Arc<IpLimits>, IpAddr)>,
}

impl Drop for IpGuard {
    fn drop(&mut self) {
        if let Some((limits, key)) = self.limits.take() {
            if let Some(state) = limits.table.lock().get_mut(&key) {
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

    /// Whether `ip` is one the per-IP limits skip.
    pub fn is_exempt(&self, ip: IpAddr) -> bool {
        self.config.exempt_ips.contains(&ip.to_canonical())
    }

    /// The state of `ip`'s key, made if new (pruning idle entries when the table is large).
    fn with_state<R>(&self, ip: IpAddr, now: Instant, f: impl FnOnce(&mut IpState) -> R) -> R {
        let c = &self.config;
        let (connect_burst, publish_burst) = (
            f64::from(c.connect_burst_per_ip),
            f64::from(c.http_publish_burst_per_ip),
        );
        let mut table = self.table.lock();
        if table.len() >= PRUNE_AT {
            table.retain(|_, s| {
                s.open > 0
                    || s.connects.refill(c.connect_rate_per_ip, connect_burst, now) < connect_burst
                    || s.publishes
                        .refill(c.http_publish_rate_per_ip, publish_burst, now)
                        < publish_burst
            });
        }
        let state = table.entry(ip_key(ip)).or_insert_with(|| IpState {
            open: 0,
            connects: Bucket::full(connect_burst, now),
            publishes: Bucket::full(publish_burst, now),
        });
        f(state)
    }

    /// Admits a connection from `ip`, or says why not.
    pub fn admit(self: &Arc<Self>, ip: IpAddr, now: Instant) -> Result<IpGuard, IpRefusal> {
        if self.is_exempt(ip) {
            return Ok(IpGuard { limits: None });
        }
        let c = &self.config;
        self.with_state(ip, now, |state| {
            if c.max_connections_per_ip > 0 && state.open >= c.max_connections_per_ip {
                return Err(IpRefusal::TooManyConnections);
            }
            let burst = f64::from(c.connect_burst_per_ip);
            if c.connect_rate_per_ip > 0.0
                && !state.connects.take(c.connect_rate_per_ip, burst, now)
            {
                return Err(IpRefusal::TooFast);
            }
            state.open += 1;
            Ok(())
        })?;
        Ok(IpGuard {
            limits: Some((self.clone(), ip_key(ip))),
        })
    }

    /// Whether `ip` may publish over HTTP now (`limits.http_publish_rate_per_ip`); takes a
    /// token if so.
    pub fn may_publish(&self, ip: IpAddr, now: Instant) -> bool {
        let c = &self.config;
        if c.http_publish_rate_per_ip <= 0.0 || self.is_exempt(ip) {
            return true;
        }
        let burst = f64::from(c.http_publish_burst_per_ip);
        self.with_state(ip, now, |state| {
            state.publishes.take(c.http_publish_rate_per_ip, burst, now)
        })
    }
}

/// Bytes of a connection's partly received message (or HTTP body) that are not counted
/// against `limits.max_partial_bytes`: what any connection may hold while reading a frame.
pub const PARTIAL_FREE_BYTES: usize = 64 << 10;

/// Every socket the listener accepted: counted against `max_connections`; with auth on, those
/// not yet authenticated are kept oldest first, so that the oldest can be shed to make room
/// (`limits.max_unauthenticated`, `..._per_ip`, and `max_connections` itself); and the
/// server-wide budget of partly received bytes (`limits.max_partial_bytes`).
pub struct Sockets {
    max_connections: usize,
    max_unauthenticated: usize,
    max_unauthenticated_per_ip: usize,
    /// Whether sockets start unauthenticated (auth is on).
    auth: bool,
    open: AtomicUsize,
    unauthenticated: Mutex<Unauthenticated>,
    max_partial_bytes: u64,
    partial_bytes: AtomicU64,
    metrics: Arc<Metrics>,
}

/// The unauthenticated sockets: by age (a sequence number), and per IP key.
#[derive(Default)]
struct Unauthenticated {
    next: u64,
    by_age: BTreeMap<u64, Arc<SocketState>>,
    /// Per IP key (exempt sources are not listed): its sockets' sequence numbers.
    per_ip: HashMap<IpAddr, BTreeSet<u64>>,
}

impl Unauthenticated {
    fn remove(&mut self, state: &SocketState) -> bool {
        if self.by_age.remove(&state.age).is_none() {
            return false;
        }
        if let Some(key) = state.key {
            if let Some(ages) = self.per_ip.get_mut(&key) {
                ages.remove(&state.age);
                if ages.is_empty() {
                    self.per_ip.remove(&key);
                }
            }
        }
        true
    }

    /// Sheds the oldest unauthenticated socket (of `key`, if given).
    fn shed_oldest(&mut self, key: Option<IpAddr>) -> bool {
        let age = match key {
            Some(key) => self.per_ip.get(&key).and_then(|ages| ages.first().copied()),
            None => self.by_age.keys().next().copied(),
        };
        let Some(state) = age.and_then(|age| self.by_age.get(&age).cloned()) else {
            return false;
        };
        self.remove(&state);
        state.unauthenticated.store(false, Ordering::Relaxed);
        state.shed.store(true, Ordering::Release);
        state.wake.notify_waiters();
        true
    }
}

/// One accepted socket's entry, shared by its [`Socket`] (the owner) and [`SocketHandle`]s.
struct SocketState {
    sockets: Arc<Sockets>,
    peer: IpAddr,
    /// Its IP key, `None` for an exempt source.
    key: Option<IpAddr>,
    age: u64,
    unauthenticated: AtomicBool,
    /// Set, and `wake` notified, when the socket is shed.
    shed: AtomicBool,
    wake: Notify,
}

/// An accepted socket's place among the open ones; released when dropped (the connection
/// task, or for an upgraded WebSocket the session, holds it).
pub struct Socket {
    state: Arc<SocketState>,
}

/// What a request or session on an accepted socket may do with it: mark it authenticated,
/// learn when it is shed, reach the server-wide budgets. Found in each request's extensions.
#[derive(Clone)]
pub struct SocketHandle {
    state: Arc<SocketState>,
}

/// Why [`Sockets::admit`] refused a socket: `max_connections` are open, none unauthenticated.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

impl Sockets {
    pub fn new(
        max_connections: usize,
        limits: &LimitsConfig,
        auth: bool,
        metrics: Arc<Metrics>,
    ) -> Arc<Sockets> {
        Arc::new(Sockets {
            max_connections,
            max_unauthenticated: limits.max_unauthenticated,
            max_unauthenticated_per_ip: limits.max_unauthenticated_per_ip,
            auth,
            open: AtomicUsize::new(0),
            unauthenticated: Mutex::new(Unauthenticated::default()),
            max_partial_bytes: limits.max_partial_bytes,
            partial_bytes: AtomicU64::new(0),
            metrics,
        })
    }

    /// Admits a socket from `peer` (`exempt`: a source the per-IP limits skip). At
    /// `max_connections` the oldest unauthenticated socket is shed to make room, if there is
    /// one; else the new socket is refused. With auth on, the new socket counts as
    /// unauthenticated until [`SocketHandle::authenticated`], and past either cap on those the
    /// oldest (of its IP, for the per-IP cap) is shed.
    pub fn admit(self: &Arc<Self>, peer: IpAddr, exempt: bool) -> Result<Socket, Full> {
        let key = (!exempt).then(|| ip_key(peer));
        let mut unauthenticated = self.unauthenticated.lock();
        if self.max_connections > 0 && self.open.load(Ordering::Relaxed) >= self.max_connections {
            if !unauthenticated.shed_oldest(None) {
                return Err(Full);
            }
            self.count_shed("max_connections");
        }
        let age = unauthenticated.next;
        unauthenticated.next += 1;
        let state = Arc::new(SocketState {
            sockets: self.clone(),
            peer,
            key,
            age,
            unauthenticated: AtomicBool::new(self.auth),
            shed: AtomicBool::new(false),
            wake: Notify::new(),
        });
        if self.auth {
            if let Some(key) = key {
                let held = unauthenticated.per_ip.get(&key).map_or(0, BTreeSet::len);
                if self.max_unauthenticated_per_ip > 0
                    && held >= self.max_unauthenticated_per_ip
                    && unauthenticated.shed_oldest(Some(key))
                {
                    self.count_shed("unauthenticated_per_ip");
                }
            }
            if self.max_unauthenticated > 0
                && unauthenticated.by_age.len() >= self.max_unauthenticated
                && unauthenticated.shed_oldest(None)
            {
                self.count_shed("unauthenticated");
            }
            unauthenticated.by_age.insert(age, state.clone());
            if let Some(key) = key {
                unauthenticated.per_ip.entry(key).or_default().insert(age);
            }
        }
        self.open.fetch_add(1, Ordering::Relaxed);
        self.metrics.sockets.inc();
        Ok(Socket { state })
    }

    fn count_shed(&self, reason: &'static str) {
        self.metrics
            .connections_shed
            .get_or_create(&Reason { reason })
            .inc();
    }

    /// Sockets open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Counts `more` bytes of partly received data against `limits.max_partial_bytes`; false
    /// (nothing counted) if they would exceed it.
    pub fn charge_partial(&self, more: u64) -> bool {
        let limit = match self.max_partial_bytes {
            0 => u64::MAX,
            n => n,
        };
        let mut held = self.partial_bytes.load(Ordering::Relaxed);
        loop {
            if held.saturating_add(more) > limit {
                return false;
            }
            match self.partial_bytes.compare_exchange_weak(
                held,
                held + more,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => held = now,
            }
        }
    }

    /// Releases bytes counted by [`Sockets::charge_partial`].
    pub fn release_partial(&self, bytes: u64) {
        self.partial_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Partly received bytes counted now.
    pub fn partial_bytes(&self) -> u64 {
        self.partial_bytes.load(Ordering::Relaxed)
    }
}

impl Socket {
    pub fn handle(&self) -> SocketHandle {
        SocketHandle {
            state: self.state.clone(),
        }
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let sockets = &self.state.sockets;
        if self.state.unauthenticated.load(Ordering::Relaxed) {
            sockets.unauthenticated.lock().remove(&self.state);
        }
        sockets.open.fetch_sub(1, Ordering::Relaxed);
        sockets.metrics.sockets.dec();
    }
}

impl SocketHandle {
    /// The socket presented a valid token or the admin key: it is no longer shed for age.
    pub fn authenticated(&self) {
        if self.state.unauthenticated.swap(false, Ordering::Relaxed) {
            let sockets = &self.state.sockets;
            sockets.unauthenticated.lock().remove(&self.state);
        }
    }

    /// Completes when the socket is shed to make room for a newer one.
    pub async fn shed(&self) {
        loop {
            let woken = self.state.wake.notified();
            tokio::pin!(woken);
            // Registered before the check, so a shed between the two is not missed.
            woken.as_mut().enable();
            if self.state.shed.load(Ordering::Acquire) {
                return;
            }
            woken.await;
        }
    }

    /// The peer's address.
    pub fn peer(&self) -> IpAddr {
        self.state.peer
    }

    /// The server's sockets (for the partly received bytes budget).
    pub fn sockets(&self) -> &Arc<Sockets> {
        &self.state.sockets
    }
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
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(ip_key(a), ip_key(b));
        assert_ne!(ip_key(a), ip_key(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(ip_key(mapped), IpAddr::from([10, 0, 0, 1]));
        let limits = IpLimits::new(strict());
        let t = Instant::now();
        let _one = limits.admit(a, t).unwrap();
        let _two = limits.admit(b, t).unwrap();
        assert_eq!(
            limits.admit(a, t).err(),
            Some(IpRefusal::TooManyConnections)
        );
        assert!(limits.admit(c, t).is_ok());
    }

    #[test]
    fn http_publishes_per_ip_are_a_token_bucket() {
        let limits = IpLimits::new(LimitsConfig {
            http_publish_rate_per_ip: 2.0,
            http_publish_burst_per_ip: 3,
            ..strict()
        });
        let (ip, t) = ([10, 0, 0, 1].into(), Instant::now());
        assert!((0..3).all(|_| limits.may_publish(ip, t)));
        assert!(!limits.may_publish(ip, t));
        assert!(limits.may_publish([10, 0, 0, 2].into(), t));
        assert!(limits.may_publish(ip, t + Duration::from_millis(500)));
        assert!(!limits.may_publish(ip, t + Duration::from_millis(500)));
    }

    #[test]
    fn unauthenticated_sockets_are_shed_oldest_first() {
        let config = LimitsConfig {
            max_unauthenticated: 3,
            max_unauthenticated_per_ip: 2,
            ..LimitsConfig::default()
        };
        let sockets = Sockets::new(4, &config, true, Arc::new(Metrics::default()));
        let (x, y, z): (IpAddr, IpAddr, IpAddr) = (
            [10, 0, 0, 1].into(),
            [10, 0, 0, 2].into(),
            [10, 0, 0, 3].into(),
        );
        let shed = |s: &Socket| s.state.shed.load(Ordering::Relaxed);
        let x1 = sockets.admit(x, false).unwrap();
        let x2 = sockets.admit(x, false).unwrap();
        let x3 = sockets.admit(x, false).unwrap(); // x's cap of 2: x1 goes
        assert!(shed(&x1) && !shed(&x2) && !shed(&x3));
        drop(x1);
        let y1 = sockets.admit(y, false).unwrap();
        let y2 = sockets.admit(y, false).unwrap(); // 3 unauthenticated at most: x2 goes
        assert!(shed(&x2) && !shed(&y1));
        drop(x2);
        y1.handle().authenticated();
        // Four open (x3, y1, y2, z1): the fifth sheds the oldest unauthenticated, x3, not y1.
        let z1 = sockets.admit(z, true).unwrap();
        assert_eq!(sockets.open(), 4);
        let z2 = sockets.admit(z, true).unwrap();
        assert!(shed(&x3) && !shed(&y1) && !shed(&z1));
        drop(x3);
        // Only authenticated sockets left at the limit: the next one is refused.
        for s in [&y2, &z1, &z2] {
            s.handle().authenticated();
        }
        assert_eq!(sockets.admit(z, true).err(), Some(Full));
        drop((y1, y2, z1, z2));
        assert_eq!(sockets.open(), 0);
    }

    #[test]
    fn the_partial_bytes_budget_refuses_what_would_exceed_it() {
        let config = LimitsConfig {
            max_partial_bytes: 100,
            ..LimitsConfig::default()
        };
        let sockets = Sockets::new(0, &config, false, Arc::new(Metrics::default()));
        assert!(sockets.charge_partial(60));
        assert!(!sockets.charge_partial(41));
        assert!(sockets.charge_partial(40));
        sockets.release_partial(60);
        assert_eq!(sockets.partial_bytes(), 40);
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
