#!/usr/bin/env python3
"""What a message kept in history costs herald in memory: `herald serve`'s RSS growth divided
by the messages it came to keep.

For each case, herald starts with every topic keeping its last KEEP messages (and no byte or
age bound that could cut them); one publisher sends a message to each of TOPICS topics, then
KEEP - 1 more rounds, each round confirmed by an acknowledged publish. RSS is read after the
first round (topics, connections and buffers made) and after the last. With a subscriber on
every topic, each kept message has also been delivered: it was encoded, and holds its frame
until the next message of its topic is recorded. History's bounds (`max_bytes`, the per-subject retained limit) count a message's wire size
instead: payload, topic, epoch and 64 bytes (docs/configuration.md, "History rules").

    bench/kept_memory.py [--bin HERALD] [--topics N] [--keep K]
                         [--size BYTES ...] [--kind text|binary ...] [--subscribed yes|no ...]

Defaults: target/release/herald, 2,000 topics, 32 kept, and every case of payloads of 50 and
10,000 bytes, text and binary, with and without a subscriber. Needs the `websockets` package
(tests/python/requirements.txt). Prints a Markdown table.
"""

import argparse
import asyncio
import itertools
import json
import os
import struct
import tempfile

import websockets
from serving import free_port, serving

HERE = os.path.dirname(os.path.abspath(__file__))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


async def publish_round(pub, topics, kind, payload):
    """One message to every topic, then an acknowledged one: herald has taken them all."""
    for t in range(topics):
        if kind == "text":
            await pub.send(
                json.dumps({"op": "pub", "topic": f"t/{t}", "data": payload})
            )
        else:
            head = json.dumps({"op": "pub", "topic": f"t/{t}"}).encode()
            await pub.send(struct.pack(">I", len(head)) + head + payload)
    await pub.send(json.dumps({"op": "pub", "id": 1, "topic": "sync", "data": ""}))
    while True:
        reply = json.loads(await pub.recv())
        if reply.get("op") == "ack":
            return
        if reply.get("op") == "error":
            raise RuntimeError(f"herald refused a publish: {reply}")


async def fill(url, pid, topics, keep, size, kind, subscribed):
    """Fills the histories; returns herald's RSS (KiB) after the first round and after the last."""
    drainer = None
    if subscribed:
        sub = await websockets.connect(url, max_size=None)
        await sub.send(json.dumps({"op": "sub", "id": 1, "topic": "t/>"}))
        await sub.recv()

        async def drain():
            async for _ in sub:
                pass

        drainer = asyncio.create_task(drain())
    pub = await websockets.connect(url, max_size=None)
    payload = "x" * size if kind == "text" else bytes(size)
    await publish_round(pub, topics, kind, payload)
    await asyncio.sleep(1)
    before = rss_kib(pid)
    for _ in range(keep - 1):
        await publish_round(pub, topics, kind, payload)
    await asyncio.sleep(1)
    after = rss_kib(pid)
    await pub.close()
    if drainer:
        drainer.cancel()
    return before, after


def measure(binary, topics, keep, size, kind, subscribed, scratch):
    """One case on a herald of its own: RSS before, after, and the messages added between."""
    port = free_port()
    config = os.path.join(scratch, f"herald-{port}.toml")
    with open(config, "w") as f:
        f.write("[limits]\nmax_messages_per_sec = 0\nmax_bytes_per_sec = 0\n\n")
        f.write(f'[[history]]\npattern = ">"\nmax_messages = {keep}\n')
        f.write("max_bytes = 1073741824\nmax_age_secs = 3600\n")
    command = [binary, "serve", "--listen", f"127.0.0.1:{port}", "--config", config]
    with serving(command + ["--log", "error"], port) as server:
        url = f"ws://127.0.0.1:{port}/ws"
        before, after = asyncio.run(
            fill(url, server.pid, topics, keep, size, kind, subscribed)
        )
    return before, after, topics * (keep - 1)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--bin", default=os.path.join(HERE, "..", "target", "release", "herald")
    )
    ap.add_argument("--topics", type=int, default=2000)
    ap.add_argument("--keep", type=int, default=32)
    ap.add_argument("--size", type=int, nargs="+", default=[50, 10000])
    ap.add_argument(
        "--kind", choices=["text", "binary"], nargs="+", default=["text", "binary"]
    )
    ap.add_argument(
        "--subscribed", choices=["yes", "no"], nargs="+", default=["no", "yes"]
    )
    a = ap.parse_args()
    if not os.access(a.bin, os.X_OK):
        ap.error(
            f"no herald binary at {a.bin} (cargo build --release -p herald, or --bin)"
        )
    if a.keep < 2 or a.topics < 1:
        ap.error("--keep must be at least 2 and --topics at least 1")
    print(
        f"\n{a.topics:,} topics keeping {a.keep} messages each; RSS growth over the last {a.keep - 1} rounds\n"
    )
    print(
        "| payload | kind | subscriber | RSS before → after (KiB) | bytes per kept message | beyond the payload |"
    )
    print("|---:|---|---|---|---:|---:|")
    with tempfile.TemporaryDirectory() as scratch:
        for size, kind, subscribed in itertools.product(a.size, a.kind, a.subscribed):
            before, after, kept = measure(
                a.bin, a.topics, a.keep, size, kind, subscribed == "yes", scratch
            )
            per = (after - before) * 1024 / kept
            print(
                f"| {size:,} | {kind} | {subscribed} | {before:,} → {after:,} | {per:,.0f} | {per - size:,.0f} |"
            )


if __name__ == "__main__":
    main()
