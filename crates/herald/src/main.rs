//! `herald`: one binary that serves, publishes, subscribes and benchmarks.
//!
//! - `serve` ([`serve`]): run a herald node.
//! - `pub` ([`publish`]) and `sub` ([`subscribe`]): command-line clients in the style of
//!   `nats pub/sub` and `mosquitto_pub/sub`, over the native protocol ([`client`]).
//! - `token` ([`token`]): mint an HS256 token for a server with auth on.
//! - `bench`: the load generator and scenario runner (crate `herald-bench`).

mod allocator;
mod client;
mod publish;
mod save;
mod serve;
mod subscribe;
mod token;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: allocator::SplitBySize = allocator::SplitBySize;

#[derive(Parser)]
#[command(name = "herald", version, about = "A real-time web messaging router", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a herald node (in memory, on 127.0.0.1:8080 unless configured otherwise)
    Serve(Box<serve::ServeArgs>),
    /// Publish messages to a topic
    Pub(publish::PubArgs),
    /// Subscribe to topics or patterns and print what arrives
    Sub(subscribe::SubArgs),
    /// Print a signed HS256 token granting topic patterns (for servers with auth on)
    Token(token::TokenArgs),
    /// Run a load scenario against herald (see docs/bench.md)
    Bench(Box<herald_bench::BenchArgs>),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        // Sized by its configuration (`workers`): a runtime of its own.
        Command::Serve(args) => serve::run(*args),
        Command::Pub(args) => on_runtime(publish::run(args)),
        Command::Sub(args) => on_runtime(subscribe::run(args)),
        Command::Token(args) => token::run(args),
        Command::Bench(args) => on_runtime(async {
            // A stall of the bench's own counts as herald's latency, so the bench takes no
            // huge pages either. A server it spawns inherits this; `herald serve` then sets
            // its own from its configuration.
            if let Err(e) = herald_server::process::set_transparent_huge_pages(false) {
                eprintln!("herald bench: cannot turn transparent huge pages off: {e}");
            }
            herald_bench::run(*args).await
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("herald: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a client command or the bench on a runtime with a thread per core.
fn on_runtime(
    command: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().expect("cannot start the async runtime");
    runtime.block_on(command)
}
