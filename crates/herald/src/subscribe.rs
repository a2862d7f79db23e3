//! `herald sub`: subscribe and print each message, one per line.

use crate::client::{self, Incoming};
use anyhow::bail;
use base64::Engine as _;
use clap::Args;
use serde_json::{json, Value};
use std::io::Write;

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
    /// herald's WebSocket URL
    #[arg(long, env = "HERALD_URL", default_value = "ws://127.0.0.1:8080/ws")]
    url: String,
    /// Token to present when herald has authentication on (see `herald token`)
    #[arg(long, env = "HERALD_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

pub async fn run(args: SubArgs) -> anyhow::Result<()> {
    let mut socket = client::connect(&args.url, args.token.as_deref()).await?;
    for (id, pattern) in args.patterns.iter().enumerate() {
        let request = json!({"op": "sub", "id": id, "topic": pattern, "snapshot": args.snapshot});
        client::send_json(&mut socket, &request).await?;
    }
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
                print_message(&mut stdout, &args, &header, &payload, binary)?;
                received += 1;
            }
            Incoming::Control(reply) => {
                client::check(&reply)?;
                match reply["op"].as_str() {
                    Some("subscribed") => pending = pending.saturating_sub(1),
                    Some("dropped") => eprintln!(
                        "herald: the server dropped {} message(s) on {} for this subscriber",
                        reply["count"], reply["topic"]
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
