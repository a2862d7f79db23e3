"""Image throughput through herald with one Python publisher and one lossless Python subscriber:
images/s for side² × 2-byte images, the load of seed 001 (VBDS) and of `herald bench --kind
images`.

    taskset -c 1 python bench/throughput.py --spawn --acked     # herald pinned to core 0
    python bench/throughput.py --url ws://127.0.0.1:8080/ws     # a running herald

The publisher is a child process, as a camera's program would be, publishing the same buffer;
the subscriber (this process) is `lossless` with a window of `--window` images. Two flows:

- `--acked`: the publisher publishes each image once the subscriber has the previous one (the
  subscriber tells it over a pipe): VBDS's acknowledged flow, and the flow of `herald bench
  --kind images`, so the two compare on the same load.
- without it: the publisher publishes back to back, and herald's lossless window holds it to
  the subscriber's pace (with window 1, each image waits for the previous one to be handled).

Each size runs for `--seconds`; images/s is counted at the subscriber between its first and last
image, and every image is checked for its size and its place in the sequence (nothing lost).
With `--uvloop` both processes run on uvloop's event loop (the package's `uvloop` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import herald_client


async def publish(url: str, side: int, seconds: float, acked: bool) -> None:
    """The publisher process: the same buffer for `seconds` (with `acked`, each once the
    subscriber has the previous one: a byte on stdin), then the count and the CPU seconds it
    spent publishing."""
    payload = memoryview(os.urandom(side * side * 2))
    receipts = asyncio.StreamReader()
    if acked:
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(receipts), sys.stdin)
    async with herald_client.connect(url) as pub:
        cpu = time.process_time()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        published = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await pub.publish(f"bench/images/{side}", payload, ack=False)
            published += 1
            if acked:
                await receipts.readexactly(1)
        await pub.ping()  # everything sent has reached herald
        cpu = time.process_time() - cpu
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print(published, cpu, faults, flush=True)


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds (user and system) process `pid` has used so far, from /proc; 0 without it."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_size(
    url: str, side: int, seconds: float, window: int, acked: bool, uvloop: bool, herald_pid: int | None
) -> dict[str, float]:
    size = side * side * 2
    async with herald_client.connect(url) as h:
        sub = await h.subscribe(f"bench/images/{side}", policy="lossless", window=window)
        publisher = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--publisher",
            "--url",
            url,
            "--sizes",
            str(side),
            "--seconds",
            str(seconds),
            *(["--acked"] if acked else []),
            *(["--uvloop"] if uvloop else []),
            stdout=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.PIPE,
        )
        assert publisher.stdout is not None and publisher.stdin is not None
        receipts = publisher.stdin
        # The subscriber iterates as an application would (`async for`), in a task of its own;
        # this one waits for the publisher's report (how many it sent) or its failure.
        received, first, last, prev_seq = 0, 0.0, 0.0, -1
        bad: str | None = None

        async def consume() -> None:
            nonlocal received, first, last, prev_seq, bad
            async for m in sub:
                now = time.monotonic()
                if m.size != size or (prev_seq >= 0 and m.seq != prev_seq + 1):
                    bad = f"{side}²: image seq {m.seq} of {m.size} bytes after seq {prev_seq}"
                    return
                prev_seq = m.seq
                received += 1
                if acked:
                    receipts.write(b"1")
                if received == 1:
                    first = now
                last = now

        cpu = time.process_time()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        herald_cpu = cpu_seconds(herald_pid)
        consumer = asyncio.ensure_future(consume())
        report = (await publisher.stdout.read()).split()
        if await publisher.wait() != 0 or len(report) != 3:
            consumer.cancel()
            raise SystemExit(f"{side}²: the publisher failed ({publisher.returncode})")
        # The rest arrive, or the run fails: an image lost, or none for 10 s.
        waited, seen = 0.0, received
        while received < int(report[0]) and not consumer.done() and waited < 10:
            await asyncio.sleep(0.005)
            waited = 0.0 if received > seen else waited + 0.005
            seen = received
        consumer.cancel()
        if bad is not None or received < int(report[0]):
            raise SystemExit(bad or f"{side}²: {received} of {int(report[0])} images arrived")
        cpu = time.process_time() - cpu
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        herald_cpu = cpu_seconds(herald_pid) - herald_cpu
    rate = (received - 1) / (last - first) if received > 1 and last > first else 0.0
    return {
        "side": side,
        "window": window,
        "acked": acked,
        "bytes": size,
        "images": received,
        "images_per_s": rate,
        "mb_per_s": rate * size / 1e6,
        # CPU the client spends per image: what bounds the rate on an idle core.
        "subscriber_cpu_ms": cpu / received * 1e3,
        "publisher_cpu_ms": float(report[1]) / received * 1e3,
        # Minor page faults per image: memory the allocator handed back to the kernel and took again.
        "subscriber_faults": faults / received,
        "publisher_faults": int(report[2]) / received,
        # herald's CPU per image (with --spawn), in clock ticks of 10 ms: a rough figure.
        "herald_cpu_ms": herald_cpu / received * 1e3,
    }


def spawn_herald(cpu: str | None) -> tuple[subprocess.Popen[bytes], str, tempfile.TemporaryDirectory[str]]:
    binary = os.environ.get("HERALD_BIN", "/tmp/herald-bin/herald")
    tmp = tempfile.TemporaryDirectory(prefix="herald-throughput-")
    config = os.path.join(tmp.name, "herald.toml")
    with open(config, "w") as f:
        # As bench/scenarios/vbds-images.toml: room for a few large images queued, and no
        # per-connection byte rate limit (a loopback publisher of 2048² images exceeds it).
        f.write("max_outbound_bytes = 134217728\n[limits]\nmax_bytes_per_sec = 0\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [binary, "serve", "--listen", f"127.0.0.1:{port}", "--config", config]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpu, *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit("herald did not start") from None
            time.sleep(0.05)
    return proc, f"ws://127.0.0.1:{port}/ws", tmp


async def main(args: argparse.Namespace) -> None:
    if args.publisher:
        await publish(args.url, args.sizes[0], args.seconds, args.acked)
        return
    proc = None
    url = args.url
    if args.spawn:
        proc, url, tmp = spawn_herald(args.herald_cpu)
    try:
        results = []
        for window, side in [(w, s) for w in args.window for s in args.sizes]:
            r = await run_size(
                url, side, args.seconds, window, args.acked, args.uvloop, proc.pid if proc is not None else None
            )
            results.append(r)
            print(
                f"{'acked, ' * args.acked}window {window}, {side}² × 2 bytes: "
                f"{r['images_per_s']:.1f} images/s, {r['mb_per_s']:.0f} MB/s "
                f"({r['images']:.0f} images; client CPU per image: subscriber {r['subscriber_cpu_ms']:.2f} ms, "
                f"publisher {r['publisher_cpu_ms']:.2f} ms; page faults per image: subscriber "
                f"{r['subscriber_faults']:.0f}, publisher {r['publisher_faults']:.0f}; herald CPU per image "
                f"{r['herald_cpu_ms']:.2f} ms)",
                flush=True,
            )
        if args.json:
            print(json.dumps(results))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
            tmp.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("HERALD_URL", "ws://127.0.0.1:8080/ws"))
    parser.add_argument("--spawn", action="store_true", help="start herald (HERALD_BIN) for the run")
    parser.add_argument("--herald-cpu", default="0", help="with --spawn: pin herald to this CPU (taskset)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 512, 1024, 2048], help="image sides")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per size")
    parser.add_argument(
        "--window", type=int, nargs="+", default=[1], help="the subscriber's lossless window, images (several: each)"
    )
    parser.add_argument(
        "--acked", action="store_true", help="publish each image once the subscriber has the previous one"
    )
    parser.add_argument("--uvloop", action="store_true", help="run both processes on uvloop's event loop")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--publisher", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.run(main(args))
    else:
        asyncio.run(main(args))
    sys.exit(0)
