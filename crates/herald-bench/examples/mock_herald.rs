//! A test-only stand-in for herald, speaking just enough of docs/protocol.md for the bench:
//! `sub`, text and binary `pub` (with `stamp`), per-topic `seq`, `GET /healthz`.
//! Not herald: no wildcards, no history, no slow-consumer policy; one thread.
//!
//! It also carries the bench as a subcommand, so the bench can be run before the CLI wires it:
//!   cargo run --release -p herald-bench --example mock_herald -- bench SCENARIO --spawn
//! (`--spawn` then starts `mock_herald serve --listen …`, since it spawns its own executable.)

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::UnboundedSender;
use tokio_tungstenite::tungstenite::Message;

#[derive(Parser)]
enum Cli {
    /// Serve the mock protocol.
    Serve {
        #[arg(long)]
        listen: String,
    },
    /// Run the bench.
    Bench(Box<herald_bench::BenchArgs>),
}

#[derive(Default)]
struct Topic {
    seq: u64,
    subs: Vec<(u64, UnboundedSender<Message>)>,
}

type State = Rc<RefCell<HashMap<String, Topic>>>;

fn now_us() -> u64 {
    herald_bench::wire::now_us()
}

fn main() -> anyhow::Result<()> {
    match Cli::parse() {
        Cli::Bench(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?
            .block_on(herald_bench::run(*args)),
        Cli::Serve { listen } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, serve(listen))
        }
    }
}

async fn serve(listen: String) -> anyhow::Result<()> {
    let l = tokio::net::TcpListener::bind(&listen).await?;
    let state: State = Default::default();
    let mut next_id = 0u64;
    loop {
        let (mut s, _) = l.accept().await?;
        s.set_nodelay(true)?;
        next_id += 1;
        let (st, id) = (state.clone(), next_id);
        tokio::task::spawn_local(async move {
            let mut buf = [0u8; 16];
            let n = s.peek(&mut buf).await.unwrap_or(0);
            if buf[..n].starts_with(b"GET /healthz") {
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
                    )
                    .await;
                return;
            }
            if let Ok(ws) = tokio_tungstenite::accept_async(s).await {
                conn(ws, st, id).await;
            }
        });
    }
}

async fn conn(
    ws: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    state: State,
    id: u64,
) {
    let (mut sink, mut stream) = ws.split();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Message>();
    tokio::task::spawn_local(async move {
        while let Some(m) = rx.recv().await {
            if sink.feed(m).await.is_err() {
                return;
            }
            while let Ok(m) = rx.try_recv() {
                if sink.feed(m).await.is_err() {
                    return;
                }
            }
            if sink.flush().await.is_err() {
                return;
            }
        }
    });
    let mut mine: Vec<String> = vec![];
    while let Some(Ok(m)) = stream.next().await {
        match m {
            Message::Text(t) => {
                let ts = now_us();
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&t) else {
                    continue;
                };
                let topic = v["topic"].as_str().unwrap_or_default().to_string();
                match v["op"].as_str() {
                    Some("sub") => {
                        let mut s = state.borrow_mut();
                        let e = s.entry(topic.clone()).or_default();
                        if !e.subs.iter().any(|(i, _)| *i == id) {
                            e.subs.push((id, tx.clone()));
                            mine.push(topic.clone());
                        }
                        let _ = tx.send(Message::text(format!(
                            "{{\"op\":\"subscribed\",\"topic\":\"{topic}\",\"recovered\":true,\"replayed\":0}}"
                        )));
                    }
                    Some("pub") => {
                        let data = v["data"].as_str().unwrap_or_default();
                        let stamp = v["stamp"].as_bool().unwrap_or(false);
                        let mut s = state.borrow_mut();
                        let e = s.entry(topic.clone()).or_default();
                        e.seq += 1;
                        let mut out = serde_json::json!({"op":"msg","topic":topic,"seq":e.seq,"epoch":"mock","data":data});
                        if stamp {
                            out["ts"] = ts.into();
                        }
                        let frame = Message::text(out.to_string());
                        for (_, sub) in &e.subs {
                            let _ = sub.send(frame.clone());
                        }
                    }
                    _ => {}
                }
            }
            Message::Binary(b) => {
                let ts = now_us();
                if b.len() < 4 {
                    continue;
                }
                let hl = u32::from_be_bytes(b[..4].try_into().unwrap()) as usize;
                let Ok(h) = serde_json::from_slice::<serde_json::Value>(&b[4..4 + hl]) else {
                    continue;
                };
                let topic = h["topic"].as_str().unwrap_or_default().to_string();
                let stamp = h["stamp"].as_bool().unwrap_or(false);
                let mut s = state.borrow_mut();
                let e = s.entry(topic.clone()).or_default();
                e.seq += 1;
                let mut head =
                    serde_json::json!({"op":"msg","topic":topic,"seq":e.seq,"epoch":"mock"});
                if stamp {
                    head["ts"] = ts.into();
                }
                let head = head.to_string();
                let mut f = Vec::with_capacity(4 + head.len() + b.len() - 4 - hl);
                f.extend_from_slice(&(head.len() as u32).to_be_bytes());
                f.extend_from_slice(head.as_bytes());
                f.extend_from_slice(&b[4 + hl..]);
                let frame = Message::binary(f);
                for (_, sub) in &e.subs {
                    let _ = sub.send(frame.clone());
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    let mut s = state.borrow_mut();
    for t in mine {
        if let Some(e) = s.get_mut(&t) {
            e.subs.retain(|(i, _)| *i != id);
        }
    }
}
