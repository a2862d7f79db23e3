//! Server configuration: embedded defaults, then a TOML file, then `HERALD_*` environment
//! variables, then command-line flags — each overriding the one before.

use crate::auth::AuthConfig;
use crate::limits::LimitsConfig;
use crate::tls::TlsConfig;
use anyhow::{bail, Context};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use herald_core::engine::{EngineConfig, HistoryRule};
use herald_core::policy::PolicyRule;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP and WebSocket listener binds to.
    pub listen: SocketAddr,
    /// Address of the plain MQTT listener (TCP, or TLS with `[tls]`), e.g. `127.0.0.1:1883`;
    /// absent: none (MQTT over WebSocket is always served at `/mqtt`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mqtt_listen: Option<SocketAddr>,
    /// The longest an MQTT session outlives its connection (seconds): a client asking for more
    /// (5.0 session expiry, or a 3.1.1 persistent session) gets this; 4294967295: no maximum.
    pub mqtt_session_expiry_max_secs: u32,
    /// Most messages an MQTT session keeps for its client while it is away (the newest).
    pub mqtt_session_queue_messages: usize,
    /// Most bytes of messages an MQTT session keeps for its client while it is away.
    pub mqtt_session_queue_bytes: usize,
    /// Largest message payload accepted, over WebSocket or HTTP (bytes).
    pub max_message_bytes: usize,
    /// Most bytes queued for one connection before it is disconnected as a slow consumer.
    pub max_outbound_bytes: usize,
    /// Most bytes of replayed history and snapshot values queued for one connection; a larger
    /// replay sends its newest messages and reports the rest as a `recovery_limit` gap, a
    /// larger snapshot waits for the client to read.
    pub max_recovery_bytes: usize,
    pub max_subscriptions_per_connection: usize,
    /// Accepted sockets (HTTP and WebSocket) open at once; at the limit the oldest
    /// unauthenticated one is shed to make room, else a new one is refused with 503.
    pub max_connections: usize,
    /// How long shutdown waits for clients to receive their close frame, and how long a
    /// connection herald closed waits for the client's close frame (seconds).
    pub shutdown_grace_secs: u64,
    /// Per-topic history, first matching pattern wins; topics no rule matches keep only their
    /// last value.
    pub history: Vec<HistoryRule>,
    /// Authentication and permissions (`[auth]`, docs/security.md); off unless a key is set.
    pub auth: AuthConfig,
    /// Limits against abusive clients (`[limits]`, docs/security.md).
    pub limits: LimitsConfig,
    /// TLS on the listener (`[tls]`); plain HTTP unless both paths are set.
    pub tls: TlsConfig,
    /// Join a cluster of herald nodes through NATS (see docs/cluster.md); absent: run alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats: Option<NatsConfig>,
    /// Default slow-consumer policy per topic, first matching pattern wins; topics no rule
    /// matches (and subscriptions that name no policy) get `disconnect`.
    pub policy: Vec<PolicyRule>,
    /// How long a publish waits for a `lossless` subscriber's credit before that subscriber is
    /// disconnected and the publish goes ahead (milliseconds).
    pub lossless_hold_timeout_ms: u64,
    /// Patterns within which clients may subscribe `lossless` (hold publishers); with auth on,
    /// a token also needs a `lossless` grant.
    pub lossless_topics: Vec<String>,
    /// The share of time (0 to 1) one `lossless` subscriber may keep publishers waiting,
    /// counted over each `LOSSLESS_HOLD_WINDOW`; past it the subscriber is closed (4008).
    pub lossless_max_hold_share: f64,
    /// Most topics held at once; a publish that would create another is refused
    /// (`too_many_topics`).
    pub max_topics: usize,
    /// A topic nothing was published on for this long (seconds) and that no subscription
    /// matches is forgotten (its memory freed; published again, it starts a new epoch); 0 keeps
    /// topics until herald stops.
    pub topic_idle_secs: u64,
    /// Whether the kernel may give `herald serve` transparent huge pages; off by default, for
    /// the latency tail (see [`crate::process::set_transparent_huge_pages`]).
    pub transparent_huge_pages: bool,
    /// Threads `herald serve` runs connections on; 0: one per core the process may use.
    /// Connections, the publish fan-out and the writes spread over them; the engine's state
    /// is one, behind one lock (docs/performance.md, "Cores").
    pub workers: usize,
    /// Address of a plain TCP listener speaking STOMP (docs/stomp.md); absent: none. STOMP
    /// over WebSocket is always served at `/stomp` on `listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stomp_listen: Option<SocketAddr>,
    /// How STOMP destinations name herald topics: `herald` (`/topic/a/b`) or `dotted`
    /// (`/topic/a.b`, RabbitMQ and ActiveMQ clients); see docs/stomp.md.
    pub stomp_dialect: crate::protocol::stomp::Dialect,
}

impl Default for Config {
    fn default() -> Self {
        let engine = EngineConfig::default();
        Config {
            listen: ([127, 0, 0, 1], 8080).into(),
            mqtt_listen: None,
            mqtt_session_expiry_max_secs: 86_400,
            mqtt_session_queue_messages: 1_000,
            mqtt_session_queue_bytes: 16 << 20,
            max_message_bytes: engine.max_message_bytes,
            max_outbound_bytes: 16 << 20,
            max_recovery_bytes: 256 << 20,
            max_subscriptions_per_connection: engine.max_subscriptions_per_connection,
            max_connections: 10_000,
            shutdown_grace_secs: 5,
            history: engine.history,
            auth: AuthConfig::default(),
            limits: LimitsConfig::default(),
            tls: TlsConfig::default(),
            nats: None,
            policy: engine.policy,
            lossless_hold_timeout_ms: 5000,
            lossless_topics: engine.lossless_topics,
            lossless_max_hold_share: 0.5,
            max_topics: engine.max_topics,
            topic_idle_secs: engine.topic_idle_us / 1_000_000,
            transparent_huge_pages: false,
            workers: 0,
            stomp_listen: None,
            stomp_dialect: Default::default(),
        }
    }
}

/// The keys `HERALD_*` variables may set. Listed so that the CLI's own variables (`HERALD_URL`,
/// `HERALD_TOKEN`) are not mistaken for server settings.
const ENV_KEYS: &[&str] = &[
    "listen",
    "mqtt_listen",
    "mqtt_session_expiry_max_secs",
    "mqtt_session_queue_messages",
    "mqtt_session_queue_bytes",
    "max_message_bytes",
    "max_outbound_bytes",
    "max_recovery_bytes",
    "max_subscriptions_per_connection",
    "max_connections",
    "shutdown_grace_secs",
    "lossless_hold_timeout_ms",
    "lossless_max_hold_share",
    "max_topics",
    "topic_idle_secs",
    "transparent_huge_pages",
    "workers",
    "stomp_listen",
    "stomp_dialect",
];

/// Keys of the `[auth]`, `[tls]` and `[nats]` sections that `HERALD_*` variables may set, as
/// (variable name after `HERALD_`, key path): keys and certificates usually reach a container
/// as mounted files named by environment variables
/// (`HERALD_AUTH_HS256_SECRET_FILE=/run/secrets/herald`), with no config file to write.
const NESTED_ENV_KEYS: &[(&str, &str)] = &[
    ("auth_hs256_secret_file", "auth.hs256_secret_file"),
    ("auth_rs256_public_key_file", "auth.rs256_public_key_file"),
    ("auth_es256_public_key_file", "auth.es256_public_key_file"),
    ("auth_jwks_file", "auth.jwks_file"),
    ("auth_jwks_url", "auth.jwks_url"),
    ("auth_admin_api_key_file", "auth.admin_api_key_file"),
    ("tls_cert_file", "tls.cert_file"),
    ("tls_key_file", "tls.key_file"),
    ("nats_url", "nats.url"),
    ("nats_user", "nats.user"),
    ("nats_password_file", "nats.password_file"),
    ("nats_token_file", "nats.token_file"),
    ("nats_nkey_seed_file", "nats.nkey_seed_file"),
    ("nats_credentials_file", "nats.credentials_file"),
    ("nats_tls_ca_file", "nats.tls_ca_file"),
    ("nats_tls_cert_file", "nats.tls_cert_file"),
    ("nats_tls_key_file", "nats.tls_key_file"),
    ("nats_tls_required", "nats.tls_required"),
    ("nats_cluster_key_file", "nats.cluster_key_file"),
];

/// The `HERALD_*` variables for [`NESTED_ENV_KEYS`], mapped to their key paths (figment nests
/// on the dots).
fn nested_env() -> Env {
    Env::prefixed("HERALD_").filter_map(|var| {
        NESTED_ENV_KEYS
            .iter()
            .find(|(name, _)| var.as_str().eq_ignore_ascii_case(name))
            .map(|(_, key)| (*key).into())
    })
}

impl Config {
    /// Loads the layered configuration. `overrides` holds the command-line flags that were given
    /// (serialized; absent fields leave lower layers alone).
    pub fn load(file: Option<&Path>, overrides: impl Serialize) -> anyhow::Result<Config> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.is_file() {
                bail!(
                    "config file {} does not exist (or is not a file)",
                    path.display()
                );
            }
            figment = figment.merge(Toml::file(path));
        }
        let config: Config = figment
            .merge(Env::prefixed("HERALD_").only(ENV_KEYS))
            .merge(nested_env())
            .merge(Serialized::defaults(overrides))
            .extract()
            .context("invalid configuration")?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        for rule in &self.history {
            herald_core::topic::validate_pattern(&rule.pattern)
                .with_context(|| format!("history rule pattern {:?}", rule.pattern))?;
        }
        if let Some(nats) = &self.nats {
            nats.validate()?;
        }
        for rule in &self.policy {
            if let Some(problem) = rule.problem() {
                bail!("policy rule {:?}: {problem}", rule.pattern);
            }
        }
        for pattern in &self.lossless_topics {
            herald_core::topic::validate_pattern(pattern)
                .with_context(|| format!("lossless_topics pattern {pattern:?}"))?;
        }
        if !(self.lossless_max_hold_share > 0.0 && self.lossless_max_hold_share <= 1.0) {
            bail!(
                "lossless_max_hold_share must be above 0 and at most 1 (a share of time), not {}",
                self.lossless_max_hold_share
            );
        }
        if self.max_message_bytes == 0 || self.max_outbound_bytes == 0 {
            bail!("max_message_bytes and max_outbound_bytes must be greater than zero");
        }
        Ok(())
    }

    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            history: self.history.clone(),
            max_subscriptions_per_connection: self.max_subscriptions_per_connection,
            max_message_bytes: self.max_message_bytes,
            policy: self.policy.clone(),
            lossless_topics: self.lossless_topics.clone(),
            max_topics: self.max_topics,
            topic_idle_us: self.topic_idle_secs.saturating_mul(1_000_000),
            max_topics_per_origin: self.limits.max_topics_per_subject,
            max_retained_bytes_per_origin: self.limits.max_retained_bytes_per_subject,
        }
    }
}

/// `[nats]` in the configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// NATS server URL(s), comma-separated, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// Subject prefix: topics travel as `<prefix>.t.<escaped levels>`. Clusters sharing one NATS
    /// keep apart by using different prefixes.
    pub prefix: String,
    /// Bytes of published messages waiting to be handed to NATS before more are not carried.
    pub max_pending_bytes: usize,
    /// Keep durable history in a JetStream stream (see [`crate::cluster::jetstream`]).
    pub jetstream: bool,
    /// The stream's total size bound: past it, JetStream drops the oldest messages.
    pub jetstream_max_bytes: u64,
    /// NATS user name; with `password_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// File holding the NATS user's password (a trailing newline ignored).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// File holding a NATS authentication token (a trailing newline ignored).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// File holding a NATS user's NKey seed (`SU…`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nkey_seed_file: Option<PathBuf>,
    /// A NATS credentials file (user JWT and NKey seed, as `nsc` writes them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<PathBuf>,
    /// PEM CA certificates that sign the NATS server's certificate (instead of the system's
    /// roots); implies `tls_required`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate presented to NATS (with `tls_key_file`); implies `tls_required`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's PEM private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// Refuse to talk to NATS without TLS.
    pub tls_required: bool,
    /// File holding the cluster's shared secret (at least 32 bytes): nodes sign what they send
    /// to NATS with it and drop what is not signed with it. All nodes need the same file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_key_file: Option<PathBuf>,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: String::new(),
            prefix: "herald".into(),
            max_pending_bytes: 64 << 20,
            jetstream: false,
            jetstream_max_bytes: 1 << 30,
            user: None,
            password_file: None,
            token_file: None,
            nkey_seed_file: None,
            credentials_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_required: false,
            cluster_key_file: None,
        }
    }
}

impl NatsConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.url.is_empty() {
            bail!("[nats] needs a url, e.g. url = \"nats://127.0.0.1:4222\" (or --nats)");
        }
        let token_ok = |t: &str| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_graphic() && !b"*>.".contains(&b))
        };
        if !self.prefix.split('.').all(token_ok) {
            bail!(
                "[nats] prefix {:?} is not a NATS subject prefix; use tokens of letters and digits separated by '.'",
                self.prefix
            );
        }
        if self.max_pending_bytes == 0 {
            bail!("[nats] max_pending_bytes must be greater than zero");
        }
        if self.jetstream && self.jetstream_max_bytes == 0 {
            bail!("[nats] jetstream_max_bytes must be greater than zero");
        }
        if self.user.is_some() != self.password_file.is_some() {
            bail!("[nats] user and password_file go together");
        }
        let methods = [
            self.user.is_some(),
            self.token_file.is_some(),
            self.nkey_seed_file.is_some(),
            self.credentials_file.is_some(),
        ];
        if methods.into_iter().filter(|m| *m).count() > 1 {
            bail!("[nats] takes one way to authenticate: user and password_file, token_file, nkey_seed_file or credentials_file");
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            bail!("[nats] tls_cert_file and tls_key_file go together");
        }
        Ok(())
    }

    /// Whether herald insists on TLS to NATS: asked for, or implied by a TLS file.
    pub fn requires_tls(&self) -> bool {
        self.tls_required || self.tls_ca_file.is_some() || self.tls_cert_file.is_some()
    }
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closure signature, not ours
mod tests {
    use super::*;

    #[test]
    fn layers_override_in_order() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "herald.toml",
                r#"
                listen = "127.0.0.1:9000"
                max_connections = 5
                max_outbound_bytes = 1000
                transparent_huge_pages = true
                [[history]]
                pattern = "quotes/>"
                max_messages = 7
                [[policy]]
                pattern = "quotes/>"
                policy = "conflate"
                max_rate = 2.0
                "#,
            )?;
            jail.set_env("HERALD_MAX_CONNECTIONS", "6");
            jail.set_env("HERALD_URL", "ws://ignored");
            jail.set_env("HERALD_MQTT_LISTEN", "127.0.0.1:1883");
            jail.set_env("HERALD_MQTT_SESSION_EXPIRY_MAX_SECS", "60");
            jail.set_env("HERALD_WORKERS", "3");
            let flags = serde_json::json!({ "listen": "127.0.0.1:9001" });
            let c = Config::load(Some(Path::new("herald.toml")), flags).unwrap();
            assert_eq!(c.listen, "127.0.0.1:9001".parse().unwrap());
            assert_eq!(c.mqtt_listen, Some("127.0.0.1:1883".parse().unwrap()));
            assert_eq!(Config::default().mqtt_listen, None);
            assert_eq!(c.mqtt_session_expiry_max_secs, 60);
            assert_eq!(c.max_connections, 6);
            assert_eq!((c.workers, Config::default().workers), (3, 0));
            assert_eq!(c.max_outbound_bytes, 1000);
            assert!(c.transparent_huge_pages && !Config::default().transparent_huge_pages);
            assert_eq!(c.history.len(), 1);
            assert_eq!(
                (c.policy[0].policy, c.policy[0].max_rate),
                (herald_core::policy::Policy::Conflate, Some(2.0))
            );
            assert_eq!(
                (c.history[0].max_messages, c.history[0].max_bytes),
                (7, 1 << 20)
            );
            Ok(())
        });
    }

    #[test]
    fn connection_limits_are_set_in_the_limits_section() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "c.toml",
                r#"
                [limits]
                max_unauthenticated = 50
                max_unauthenticated_per_ip = 4
                body_timeout_secs = 3
                body_min_bytes_per_sec = 1000
                max_partial_bytes = 1048576
                http_publish_rate_per_ip = 100.0
                http_publish_burst_per_ip = 200
                exempt_ips = []
                "#,
            )?;
            let c = Config::load(Some(Path::new("c.toml")), serde_json::json!({})).unwrap();
            let l = &c.limits;
            assert_eq!(
                (l.max_unauthenticated, l.max_unauthenticated_per_ip),
                (50, 4)
            );
            assert_eq!((l.body_timeout_secs, l.body_min_bytes_per_sec), (3, 1000));
            assert_eq!(l.max_partial_bytes, 1 << 20);
            assert_eq!(
                (l.http_publish_rate_per_ip, l.http_publish_burst_per_ip),
                (100.0, 200)
            );
            assert!(l.exempt_ips.is_empty());
            Ok(())
        });
    }

    #[test]
    fn stomp_settings_come_from_toml_environment_and_flags() {
        figment::Jail::expect_with(|jail| {
            let c = Config::load(None, serde_json::json!({})).unwrap();
            assert_eq!(c.stomp_listen, None, "no STOMP listener unless configured");
            jail.create_file("c.toml", "stomp_dialect = \"dotted\"")?;
            jail.set_env("HERALD_STOMP_LISTEN", "127.0.0.1:61613");
            let c = Config::load(Some(Path::new("c.toml")), serde_json::json!({})).unwrap();
            assert_eq!(c.stomp_listen, Some(([127, 0, 0, 1], 61613).into()));
            assert_eq!(c.stomp_dialect, crate::protocol::stomp::Dialect::Dotted);
            let flags = serde_json::json!({ "stomp_dialect": "herald" });
            let c = Config::load(Some(Path::new("c.toml")), flags).unwrap();
            assert_eq!(c.stomp_dialect, crate::protocol::stomp::Dialect::Herald);
            Ok(())
        });
    }

    #[test]
    fn auth_and_tls_files_come_from_the_environment_below_flags() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("c.toml", "[tls]\ncert_file = \"/toml/cert.pem\"")?;
            jail.set_env("HERALD_AUTH_HS256_SECRET_FILE", "/run/secrets/herald");
            jail.set_env("HERALD_AUTH_ADMIN_API_KEY_FILE", "/run/secrets/admin");
            jail.set_env("HERALD_TLS_CERT_FILE", "/env/cert.pem");
            jail.set_env("HERALD_TLS_KEY_FILE", "/env/key.pem");
            jail.set_env("HERALD_CA_FILE", "/a/client/setting");
            let flags = serde_json::json!({ "tls": { "key_file": "/flag/key.pem" } });
            let c = Config::load(Some(Path::new("c.toml")), flags).unwrap();
            let path = |p: &Option<std::path::PathBuf>| p.as_ref().unwrap().display().to_string();
            assert_eq!(path(&c.auth.hs256_secret_file), "/run/secrets/herald");
            assert_eq!(path(&c.auth.admin_api_key_file), "/run/secrets/admin");
            assert_eq!(path(&c.tls.cert_file), "/env/cert.pem", "env over TOML");
            assert_eq!(path(&c.tls.key_file), "/flag/key.pem", "flag over env");
            assert_eq!(c.auth.rs256_public_key_file, None);
            Ok(())
        });
    }

    #[test]
    fn the_nats_flag_sets_only_the_url() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("c.toml", "[nats]\nprefix = \"prod.herald\"")?;
            let flags = serde_json::json!({ "nats": { "url": "nats://127.0.0.1:4222" } });
            let c = Config::load(Some(Path::new("c.toml")), flags).unwrap();
            let nats = c.nats.unwrap();
            assert_eq!(
                (nats.url.as_str(), nats.prefix.as_str()),
                ("nats://127.0.0.1:4222", "prod.herald")
            );
            let err = format!(
                "{:#}",
                Config::load(Some(Path::new("c.toml")), serde_json::json!({})).unwrap_err()
            );
            assert!(err.contains("needs a url"), "{err}");
            jail.create_file("bad.toml", "[nats]\nurl = \"nats://x\"\nprefix = \"a b\"")?;
            let err = format!(
                "{:#}",
                Config::load(Some(Path::new("bad.toml")), serde_json::json!({})).unwrap_err()
            );
            assert!(err.contains("\"a b\""), "{err}");
            Ok(())
        });
    }

    #[test]
    fn nats_security_comes_from_toml_environment_and_flags() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "c.toml",
                "[nats]\nurl = \"tls://10.0.0.5:4222\"\nuser = \"herald\"\npassword_file = \"/toml/pw\"\ntls_required = true",
            )?;
            jail.set_env("HERALD_NATS_PASSWORD_FILE", "/env/pw");
            jail.set_env("HERALD_NATS_TLS_CA_FILE", "/env/ca.pem");
            jail.set_env("HERALD_NATS_CLUSTER_KEY_FILE", "/env/cluster.key");
            let flags = serde_json::json!({ "nats": { "tls_ca_file": "/flag/ca.pem" } });
            let c = Config::load(Some(Path::new("c.toml")), flags).unwrap();
            let nats = c.nats.unwrap();
            let path = |p: &Option<std::path::PathBuf>| p.as_ref().unwrap().display().to_string();
            assert_eq!(nats.user.as_deref(), Some("herald"));
            assert_eq!(path(&nats.password_file), "/env/pw", "env over TOML");
            assert_eq!(path(&nats.tls_ca_file), "/flag/ca.pem", "flag over env");
            assert_eq!(path(&nats.cluster_key_file), "/env/cluster.key");
            assert!(nats.tls_required && nats.requires_tls());
            // Two ways to authenticate, half a pair: refused with the keys named.
            jail.set_env("HERALD_NATS_TOKEN_FILE", "/env/token");
            let err = format!(
                "{:#}",
                Config::load(Some(Path::new("c.toml")), serde_json::json!({})).unwrap_err()
            );
            assert!(err.contains("one way to authenticate"), "{err}");
            Ok(())
        });
        // The whole section from the environment, as in a container.
        figment::Jail::expect_with(|jail| {
            jail.set_env("HERALD_NATS_URL", "nats://127.0.0.1:4222");
            jail.set_env("HERALD_NATS_TOKEN_FILE", "/env/token");
            jail.set_env("HERALD_NATS_TLS_REQUIRED", "true");
            let nats = Config::load(None, serde_json::json!({}))
                .unwrap()
                .nats
                .unwrap();
            assert_eq!(nats.url, "nats://127.0.0.1:4222");
            assert_eq!(nats.token_file.unwrap().display().to_string(), "/env/token");
            assert!(nats.tls_required);
            jail.create_file(
                "half.toml",
                "[nats]\nurl = \"nats://x\"\ntls_cert_file = \"/c.pem\"",
            )?;
            let err = format!(
                "{:#}",
                Config::load(Some(Path::new("half.toml")), serde_json::json!({})).unwrap_err()
            );
            assert!(err.contains("tls_cert_file and tls_key_file"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn bad_configs_are_explained() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("typo.toml", "max_conections = 5")?;
            let err = format!(
                "{:#}",
                Config::load(Some(Path::new("typo.toml")), serde_json::json!({})).unwrap_err()
            );
            assert!(err.contains("max_conections"), "{err}");
            jail.create_file("bad.toml", "[[history]]\npattern = \"a/>/b\"")?;
            let err = format!(
                "{:#}",
                Config::load(Some(Path::new("bad.toml")), serde_json::json!({})).unwrap_err()
            );
            assert!(err.contains("a/>/b"), "{err}");
            jail.create_file(
                "lossless.toml",
                "[[policy]]\npattern = \"a\"\npolicy = \"lossless\"",
            )?;
            let err = format!(
                "{:#}",
                Config::load(Some(Path::new("lossless.toml")), serde_json::json!({})).unwrap_err()
            );
            assert!(err.contains("credit"), "{err}");
            let err = format!(
                "{:#}",
                Config::load(Some(Path::new("missing.toml")), serde_json::json!({})).unwrap_err()
            );
            assert!(err.contains("missing.toml"), "{err}");
            Ok(())
        });
    }
}
