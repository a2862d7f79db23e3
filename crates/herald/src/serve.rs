//! `herald serve`.

use anyhow::Context;
use clap::{Args, ValueEnum};
use herald_server::{Config, Server};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args)]
pub struct ServeArgs {
    /// TOML configuration file (see docs/configuration.md)
    #[arg(long, short, env = "HERALD_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: Overrides,
    /// Log format
    #[arg(long, value_enum, default_value = "text", env = "HERALD_LOG_FORMAT")]
    log_format: LogFormat,
    /// Log filter, e.g. `info` or `herald_server=debug`
    #[arg(long, default_value = "info", env = "HERALD_LOG")]
    log: String,
}

/// Flags that override the config file and environment; only those given are applied.
#[derive(Args, Serialize)]
struct Overrides {
    /// Address to listen on [default: 127.0.0.1:8080]
    #[arg(long, short)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    /// Serve MQTT over plain TCP (TLS with --tls-cert-file) on this address, e.g.
    /// 127.0.0.1:1883 [default: none]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    mqtt_listen: Option<SocketAddr>,
    /// Longest an MQTT session outlives its connection, in seconds; 4294967295: no maximum
    /// [default: 86400]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    mqtt_session_expiry_max_secs: Option<u32>,
    /// Most messages an MQTT session keeps while its client is away [default: 1000]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    mqtt_session_queue_messages: Option<usize>,
    /// Most bytes of messages an MQTT session keeps while its client is away
    /// [default: 16777216]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    mqtt_session_queue_bytes: Option<usize>,
    /// Largest message payload accepted, in bytes [default: 67108864]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_message_bytes: Option<usize>,
    /// Bytes queued for one connection before it is cut off as a slow consumer [default: 16777216]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_outbound_bytes: Option<usize>,
    /// Bytes of replayed history and snapshot values queued for one connection; a larger
    /// replay sends the newest and reports the rest as a gap, a larger snapshot waits for the
    /// client to read [default: 268435456]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_recovery_bytes: Option<usize>,
    /// Most topics held at once; publishing to another is refused [default: 1000000]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_topics: Option<usize>,
    /// Seconds after which a topic with no publish and no subscriber is forgotten; 0: never
    /// [default: 3600]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    topic_idle_secs: Option<u64>,
    /// Threads serving connections (1: the serving thread alone, no pool); 0: one per core
    /// [default: 0]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    workers: Option<usize>,
    /// Sockets (HTTP and WebSocket) open at once [default: 10000]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections: Option<usize>,
    /// Address of a plain TCP listener speaking STOMP [default: none]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    stomp_listen: Option<SocketAddr>,
    /// How STOMP destinations name topics: herald (/topic/a/b) or dotted (/topic/a.b)
    /// [default: herald]
    #[arg(long, value_parser = ["herald", "dotted"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    stomp_dialect: Option<String>,
    #[command(flatten)]
    #[serde(skip_serializing_if = "AuthOverrides::is_empty")]
    auth: AuthOverrides,
    #[command(flatten)]
    #[serde(skip_serializing_if = "TlsOverrides::is_empty")]
    tls: TlsOverrides,
    #[command(flatten)]
    #[serde(skip_serializing_if = "NatsOverrides::is_empty")]
    nats: NatsOverrides,
}

/// Flags for the `[tls]` section.
#[derive(Args, Serialize)]
struct TlsOverrides {
    /// Serve TLS with this PEM certificate chain (tls.cert_file; needs --tls-key-file)
    #[arg(long = "tls-cert-file", value_name = "FILE", requires = "key_file")]
    #[serde(skip_serializing_if = "Option::is_none")]
    cert_file: Option<PathBuf>,
    /// The certificate's PEM private key (tls.key_file)
    #[arg(long = "tls-key-file", value_name = "FILE", requires = "cert_file")]
    #[serde(skip_serializing_if = "Option::is_none")]
    key_file: Option<PathBuf>,
}

impl TlsOverrides {
    fn is_empty(&self) -> bool {
        self.cert_file.is_none() && self.key_file.is_none()
    }
}

/// Flags for the `[auth]` section.
#[derive(Args, Serialize)]
struct AuthOverrides {
    /// Turn authentication on: verify HS256 tokens with the secret in this file (auth.hs256_secret_file)
    #[arg(long = "auth-hs256-secret-file", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    hs256_secret_file: Option<PathBuf>,
}

impl AuthOverrides {
    fn is_empty(&self) -> bool {
        self.hs256_secret_file.is_none()
    }
}

/// Flags for the `[nats]` section: each overrides only its own key, the others keep their file
/// values.
#[derive(Args, Serialize)]
struct NatsOverrides {
    /// Join a cluster through this NATS server, e.g. nats://127.0.0.1:4222 (nats.url)
    #[arg(long = "nats", value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    /// Keep durable history in NATS JetStream (nats.jetstream; see docs/cluster.md)
    #[arg(long = "nats-jetstream")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    jetstream: bool,
    /// NATS user name, with --nats-password-file (nats.user)
    #[arg(long = "nats-user", value_name = "NAME", requires = "password_file")]
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    /// File holding the NATS user's password (nats.password_file)
    #[arg(long = "nats-password-file", value_name = "FILE", requires = "user")]
    #[serde(skip_serializing_if = "Option::is_none")]
    password_file: Option<PathBuf>,
    /// File holding a NATS token (nats.token_file)
    #[arg(long = "nats-token-file", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    token_file: Option<PathBuf>,
    /// File holding a NATS NKey seed (nats.nkey_seed_file)
    #[arg(long = "nats-nkey-seed-file", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    nkey_seed_file: Option<PathBuf>,
    /// A NATS credentials file, JWT and NKey seed (nats.credentials_file)
    #[arg(long = "nats-credentials-file", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    credentials_file: Option<PathBuf>,
    /// PEM CA certificates for the NATS server's certificate; implies TLS (nats.tls_ca_file)
    #[arg(long = "nats-tls-ca-file", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for NATS, with --nats-tls-key-file (nats.tls_cert_file)
    #[arg(
        long = "nats-tls-cert-file",
        value_name = "FILE",
        requires = "tls_key_file"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cert_file: Option<PathBuf>,
    /// The NATS client certificate's PEM private key (nats.tls_key_file)
    #[arg(
        long = "nats-tls-key-file",
        value_name = "FILE",
        requires = "tls_cert_file"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_key_file: Option<PathBuf>,
    /// Refuse to talk to NATS without TLS (nats.tls_required)
    #[arg(long = "nats-tls-required")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    tls_required: bool,
    /// Sign what this node sends to NATS and drop what is not signed, with the shared secret
    /// in this file (nats.cluster_key_file; see docs/cluster.md)
    #[arg(long = "nats-cluster-key-file", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster_key_file: Option<PathBuf>,
}

impl NatsOverrides {
    fn is_empty(&self) -> bool {
        self.url.is_none()
            && !self.jetstream
            && self.user.is_none()
            && self.password_file.is_none()
            && self.token_file.is_none()
            && self.nkey_seed_file.is_none()
            && self.credentials_file.is_none()
            && self.tls_ca_file.is_none()
            && self.tls_cert_file.is_none()
            && self.tls_key_file.is_none()
            && !self.tls_required
            && self.cluster_key_file.is_none()
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Runs `herald serve` on a runtime of its own, sized by the configuration's `workers` (0: one
/// per core this process may run on). One worker gets tokio's single-threaded scheduler, which
/// runs everything on the serving thread without the bookkeeping that work stealing costs
/// every task wake-up and poll (shared run queues, waking idle workers, the scheduler's
/// statistics) and that buys nothing when there is no other worker to steal from.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref(), &args.overrides)?;
    let workers = match config.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let mut runtime = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut runtime = tokio::runtime::Builder::new_multi_thread();
        runtime.worker_threads(workers);
        runtime
    };
    let runtime = runtime
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(args, config))
}

async fn serve(args: ServeArgs, config: Config) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log)?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    herald_server::process::raise_open_file_limit();
    if let Err(e) =
        herald_server::process::set_transparent_huge_pages(config.transparent_huge_pages)
    {
        tracing::warn!(error = %e, "cannot set transparent huge pages as configured");
    }
    // Before the listener exists: a SIGTERM as soon as herald accepts connections must already
    // be a graceful stop, not the default (die).
    let shutdown = shutdown_signal()?;
    let server = Server::bind(config).await?;
    server.run(shutdown).await
}

/// Installs the Ctrl-C and SIGTERM handlers now; the future completes on either.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = term.recv() => {}
        }
    })
}
