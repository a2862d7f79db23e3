//! `herald pub`: publish a message, a file, or a paced series.

use crate::client::{self, Incoming};
use anyhow::{bail, Context};
use clap::Args;
use futures_util::SinkExt;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

#[derive(Args)]
pub struct PubArgs {
    /// The topic to publish to (no wildcards), e.g. quotes/fx/EURUSD
    topic: String,
    /// The message (text); or use --file
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    message: Option<String>,
    /// Publish this file's bytes (binary-safe)
    #[arg(long, short)]
    file: Option<PathBuf>,
    /// Content type to attach, e.g. image/fits
    #[arg(long)]
    ct: Option<String>,
    /// How many times to publish
    #[arg(long, short = 'n', default_value_t = 1)]
    count: u64,
    /// Messages per second when --count > 1 (0: as fast as possible)
    #[arg(long, short, default_value_t = 0.0)]
    rate: f64,
    /// Ask herald to stamp each message with its receive time
    #[arg(long)]
    stamp: bool,
    #[command(flatten)]
    server: client::ServerArgs,
}

pub async fn run(args: PubArgs) -> anyhow::Result<()> {
    if args.rate < 0.0 || !args.rate.is_finite() {
        bail!(
            "--rate must be a non-negative number of messages per second, not {}",
            args.rate
        );
    }
    let file = match &args.file {
        Some(path) => {
            Some(std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?)
        }
        None => None,
    };
    let mut socket = args.server.connect().await?;
    let start = Instant::now();
    let period = (args.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / args.rate));
    let mut last_acked: Option<u64> = None;
    for i in 0..args.count {
        if let Some(period) = period {
            // A schedule, not a sleep per message: delays do not accumulate.
            tokio::time::sleep_until((start + period.mul_f64(i as f64)).into()).await;
        }
        let mut head = json!({"op": "pub", "id": i, "topic": args.topic, "stamp": args.stamp});
        if let Some(ct) = &args.ct {
            head["ct"] = ct.clone().into();
        }
        let frame = match (&file, &args.message) {
            (Some(bytes), _) => Message::binary(binary_frame(&head.to_string(), bytes)),
            (None, Some(text)) => {
                head["data"] = text.clone().into();
                Message::text(head.to_string())
            }
            (None, None) => unreachable!("clap requires a message or --file"),
        };
        socket
            .send(frame)
            .await
            .context("connection lost while publishing")?;
        // Surface a refusal as soon as it arrives rather than after the whole series.
        while let Some(incoming) = futures_util::FutureExt::now_or_never(client::next(&mut socket))
        {
            absorb(incoming?, &mut last_acked)?;
        }
    }
    // Wait until the server acknowledged every publish (ids 0..count).
    let deadline = tokio::time::sleep(Duration::from_secs(30));
    tokio::pin!(deadline);
    while last_acked != Some(args.count - 1) {
        let incoming = tokio::select! {
            next = client::next(&mut socket) => next?,
            _ = &mut deadline => bail!("no acknowledgement from the server within 30 s"),
        };
        absorb(incoming, &mut last_acked)?;
    }
    Ok(())
}

/// Notes an acknowledgement, or fails with the server's error or close. Acks arrive in order,
/// so the last one seen tells how far the server got.
fn absorb(incoming: Incoming, last_acked: &mut Option<u64>) -> anyhow::Result<()> {
    match incoming {
        Incoming::Control(reply) => {
            client::check(&reply)?;
            if reply["op"] == "ack" {
                *last_acked = reply["id"].as_u64();
            }
            Ok(())
        }
        Incoming::Message { .. } => Ok(()),
        Incoming::Closed(why) => bail!("the server closed the connection ({why})"),
    }
}

/// The binary publish frame: header length (u32, big-endian), JSON header, payload.
fn binary_frame(head: &str, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(4 + head.len() + payload.len());
    frame.extend_from_slice(&(head.len() as u32).to_be_bytes());
    frame.extend_from_slice(head.as_bytes());
    frame.extend_from_slice(payload);
    frame
}
