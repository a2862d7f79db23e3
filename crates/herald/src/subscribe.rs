//! `herald sub`: subscribe and print each message, one per line.

use crate::client::{self, Incoming};
use anyhow::bail;
use base64::Engine as _;
use clap::Args;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;

#[derive(Args)]
pub struct SubArgs {
    /// Topics or patterns (`*` one level, trailing `>` one or more), e.g. 'quotes/*/EURUSD'
    #[arg(required = true)]
    patterns: Vec<String>,
    /// Exit after this many messages
    #[arg(long, short = 'n')]
    count: Option<u64>,
    /// Print one JSON object per line: topic, seq, epoch, and data (text) or data_base64 (binary)
    #[arg(long)]
    json: bool,
    /// Print each message's topic before its payload
    #[arg(long, short)]
    verbose: bool,
    /// First receive the last value of every matching topic
    #[arg(long)]
    snapshot: bool,
    /// Write each message to a file in DIR, named `<topic with / as _>-<seq>.<ext>` (the
    /// extension from its content type), and print the file's path instead of the payload
    #[arg(long, value_name = "DIR")]
    save_dir: Option<PathBuf>,
    /// Run this shell command for each saved message, with the file's path as its last argument
    /// (and HERALD_TOPIC, HERALD_SEQ set); the next message waits for it
    #[arg(long, value_name = "CMD", requires = "save_dir")]
    exec: Option<String>,
    /// Slow-consumer policy: disconnect, drop, conflate or lossless (default: the server's)
    #[arg(long)]
    policy: Option<String>,
    /// With --policy conflate: at most this many messages per second per topic
    #[arg(long)]
    max_rate: Option<f64>,
    /// With --policy lossless: messages granted ahead (one more is granted after each message
    /// is handled, i.e. after --exec finished)
    #[arg(long)]
    window: Option<u64>,
    #[command(flatten)]
    server: client::ServerArgs,
}

pub async fn run(args: SubArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.save_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    }
    let mut socket = args.server.connect().await?;
    for (id, pattern) in args.patterns.iter().enumerate() {
        let mut request =
            json!({"op": "sub", "id": id, "topic": pattern, "snapshot": args.snapshot});
        if let Some(policy) = &args.policy {
            request["policy"] = policy.as_str().into();
        }
        if let Some(rate) = args.max_rate {
            request["max_rate"] = rate.into();
        }
        if let Some(window) = args.window {
            request["window"] = window.into();
        }
        client::send_json(&mut socket, &request).await?;
    }
    let lossless = args.policy.as_deref() == Some("lossless");
    let mut pending = args.patterns.len();
    let mut received = 0;
    let mut stdout = std::io::stdout().lock();
    while args.count.is_none_or(|n| received < n) {
        match client::next(&mut socket).await? {
            Incoming::Message {
                header,
                payload,
                binary,
            } => {
                match &args.save_dir {
                    Some(dir) => {
                        let path = crate::save::save(dir, &header, &payload, binary)?;
                        if let Some(command) = &args.exec {
                            crate::save::exec(command, &path, &header)?;
                        }
                        writeln!(stdout, "{}", path.display())?;
                        stdout.flush()?;
                    }
                    None => print_message(&mut stdout, &args, &header, &payload, binary)?,
                }
                received += 1;
                if lossless {
                    // Handled: grant one more to the subscription this topic came through.
                    let topic = header["topic"].as_str().unwrap_or_default();
                    if let Some(pattern) = args
                        .patterns
                        .iter()
                        .find(|p| herald_core::topic::matches(p, topic))
                    {
                        let credit = json!({"op": "credit", "topic": pattern, "n": 1});
                        client::send_json(&mut socket, &credit).await?;
                    }
                }
            }
            Incoming::Control(reply) => {
                client::check(&reply)?;
                match reply["op"].as_str() {
                    Some("subscribed") => pending = pending.saturating_sub(1),
                    Some("dropped") => eprintln!(
                        "herald: the server dropped {} message(s) on {} for this subscriber ({})",
                        reply["count"], reply["topic"], reply["reason"]
                    ),
                    _ => {}
                }
            }
            Incoming::Closed(why) => bail!("the server closed the connection ({why})"),
        }
    }
    let _ = pending;
    Ok(())
}

fn print_message(
    out: &mut impl Write,
    args: &SubArgs,
    header: &Value,
    payload: &[u8],
    binary: bool,
) -> anyhow::Result<()> {
    if args.json {
        let mut line =
            json!({"topic": header["topic"], "seq": header["seq"], "epoch": header["epoch"]});
        for key in ["ct", "ts"] {
            if !header[key].is_null() {
                line[key] = header[key].clone();
            }
        }
        if binary {
            line["data_base64"] = base64::engine::general_purpose::STANDARD
                .encode(payload)
                .into();
        } else {
            line["data"] = header["data"].clone();
        }
        writeln!(out, "{line}")?;
    } else {
        if args.verbose {
            write!(out, "{} ", header["topic"].as_str().unwrap_or_default())?;
        }
        out.write_all(payload)?;
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}
