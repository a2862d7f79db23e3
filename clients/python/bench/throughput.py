"""Image throughput through herald with one Python publisher and one lossless Python subscriber:
images/s for side² × 2-byte images, the load of seed 001 (VBDS) and of `herald bench --kind
images`.

    taskset -c 1 python bench/throughput.py --spawn --acked     # herald pinned to core 0
    python bench/throughput.py --url ws://127.0.0.1:8080/ws     # a running herald

The publisher publishes the same buffer over a connection of its own; the subscriber is
`lossless` with a window of `--window` images and iterates its subscription (`async for`) as an
application would. By default both are in this process, on one event loop, as herald's Rust bench
runs its publisher and subscriber in one process. With `--processes 2` the publisher is a child
process, as a camera's program would be: two interpreters, and a pipe between them for `--acked`.
Two flows:

- `--acked`: the publisher publishes each image once the subscriber has the previous one: VBDS's
  acknowledged flow, and the flow of `herald bench --kind images`, so the two compare on the same
  load.
- without it: the publisher publishes back to back, and herald's lossless window holds it to
  the subscriber's pace (with window 1, each image waits for the previous one to be handled).

Each size runs for `--seconds`; images/s is counted at the subscriber between its first and last
image, and every image is checked for its size and its place in the sequence (nothing lost).
With `--uvloop` the event loop (both processes' with `--processes 2`) is uvloop's (the package's
`uvloop` extra).
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
from collections.abc import Awaitable, Callable

import herald_client

# Seconds without an image before a run is failed.
STALL = 10.0


def image(side: int) -> memoryview:
    """An image of side² × 2 random bytes."""
    return memoryview(os.urandom(side * side * 2))


async def publish_images(
    pub: herald_client.Client,
    side: int,
    payload: memoryview,
    seconds: float,
    receipt: Callable[[int], Awaitable[object]] | None,
) -> int:
    """Publishes `payload` for `seconds`, with `receipt` each once `receipt(n)` returned for the
    `n` published before it (the subscriber has them); how many it published, all of them at
    herald when it returns."""
    topic = f"bench/images/{side}"
    published = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await pub.publish(topic, payload, ack=False)
        published += 1
        if receipt is not None:
            await receipt(published)
    await pub.ping()
    return published


async def publisher_process(url: str, side: int, seconds: float, acked: bool) -> None:
    """The publisher's child process (`--processes 2`), told of each image the subscriber has by
    a byte on stdin: prints how many it published, and its CPU seconds and minor page faults."""
    receipts = asyncio.StreamReader()
    if acked:
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(receipts), sys.stdin)
    payload = image(side)
    async with herald_client.connect(url) as pub:
        cpu = time.process_time()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        published = await publish_images(
            pub, side, payload, seconds, (lambda _: receipts.readexactly(1)) if acked else None
        )
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


class Subscriber:
    """The lossless subscriber: iterates its subscription in a task, checks each image's size and
    place in the sequence, counts it (with the times of the first and the last) and calls
    `on_image`."""

    def __init__(self, sub: herald_client.Subscription, side: int, on_image: Callable[[], None]) -> None:
        self.images = 0
        self.first = 0.0
        self.last = 0.0
        self.bad: str | None = None
        self._sub = sub
        self._side = side
        self._on_image = on_image
        self.task = asyncio.ensure_future(self._consume())

    async def _consume(self) -> None:
        size = self._side * self._side * 2
        prev_seq = -1
        async for m in self._sub:
            now = time.monotonic()
            if m.size != size or (prev_seq >= 0 and m.seq != prev_seq + 1):
                self.bad = f"{self._side}²: image seq {m.seq} of {m.size} bytes after seq {prev_seq}"
                return
            prev_seq = m.seq
            self.images += 1
            self._on_image()
            if self.images == 1:
                self.first = now
            self.last = now

    async def finish(self, published: int) -> None:
        """Waits for the rest of the `published` images, or fails the run: an image lost, or
        none for `STALL` seconds."""
        waited, seen = 0.0, self.images
        while self.images < published and not self.task.done() and waited < STALL:
            await asyncio.sleep(0.005)
            waited = 0.0 if self.images > seen else waited + 0.005
            seen = self.images
        self.task.cancel()
        if self.bad is not None or self.images < published:
            raise SystemExit(self.bad or f"{self._side}²: {self.images} of {published} images arrived")


async def in_process(
    url: str, sub: herald_client.Subscription, side: int, payload: memoryview, seconds: float, acked: bool
) -> Subscriber:
    """Runs the publisher on this event loop, beside the subscriber (the default)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] | None = None

    def wake() -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def receipt(n: int) -> None:
        nonlocal waiter
        while subscriber.images < n and not subscriber.task.done():
            waiter = loop.create_future()
            await waiter

    subscriber = Subscriber(sub, side, wake)
    subscriber.task.add_done_callback(lambda _: wake())
    async with herald_client.connect(url) as pub:
        try:
            published = await asyncio.wait_for(
                publish_images(pub, side, payload, seconds, receipt if acked else None), seconds + STALL
            )
        except asyncio.TimeoutError:
            raise SystemExit(f"{side}²: the subscriber stopped receiving ({subscriber.images} images)") from None
    await subscriber.finish(published)
    return subscriber


async def child_process(
    url: str, sub: herald_client.Subscription, side: int, seconds: float, acked: bool, uvloop: bool
) -> tuple[Subscriber, float, int]:
    """Runs the publisher as a child process (`--processes 2`); also its CPU seconds and page
    faults."""
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
    subscriber = Subscriber(sub, side, (lambda: receipts.write(b"1")) if acked else (lambda: None))
    report = (await publisher.stdout.read()).split()
    if await publisher.wait() != 0 or len(report) != 3:
        subscriber.task.cancel()
        raise SystemExit(f"{side}²: the publisher failed ({publisher.returncode})")
    await subscriber.finish(int(report[0]))
    return subscriber, float(report[1]), int(report[2])


async def run_size(
    url: str,
    side: int,
    seconds: float,
    window: int,
    acked: bool,
    uvloop: bool,
    processes: int,
    herald_pid: int | None,
) -> dict[str, float | None]:
    size = side * side * 2
    async with herald_client.connect(url) as h:
        sub = await h.subscribe(f"bench/images/{side}", policy="lossless", window=window)
        # The in-process publisher's image, made before the CPU is counted (as the child makes its own).
        payload = image(side) if processes == 1 else memoryview(b"")
        cpu = time.process_time()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        herald_cpu = cpu_seconds(herald_pid)
        if processes == 1:
            got = await in_process(url, sub, side, payload, seconds, acked)
            pub_cpu, pub_faults = 0.0, 0
        else:
            got, pub_cpu, pub_faults = await child_process(url, sub, side, seconds, acked, uvloop)
        cpu = time.process_time() - cpu
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        herald_cpu = cpu_seconds(herald_pid) - herald_cpu
    n = got.images
    rate = (n - 1) / (got.last - got.first) if n > 1 and got.last > got.first else 0.0
    return {
        "side": side,
        "window": window,
        "acked": acked,
        "processes": processes,
        "bytes": size,
        "images": n,
        "images_per_s": rate,
        "mb_per_s": rate * size / 1e6,
        # CPU the client spends per image, publisher and subscriber together (with --processes 2
        # also each apart): what bounds the rate on an idle core.
        "client_cpu_ms": (cpu + pub_cpu) / n * 1e3,
        "subscriber_cpu_ms": cpu / n * 1e3 if processes == 2 else None,
        "publisher_cpu_ms": pub_cpu / n * 1e3 if processes == 2 else None,
        # Minor page faults per image: memory the allocator handed back to the kernel and took again.
        "client_faults": (faults + pub_faults) / n,
        # herald's CPU per image (with --spawn), in clock ticks of 10 ms: a rough figure.
        "herald_cpu_ms": herald_cpu / n * 1e3,
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
        await publisher_process(args.url, args.sizes[0], args.seconds, args.acked)
        return
    proc = None
    url = args.url
    if args.spawn:
        proc, url, tmp = spawn_herald(args.herald_cpu)
    try:
        results = []
        for window, side in [(w, s) for w in args.window for s in args.sizes]:
            r = await run_size(
                url,
                side,
                args.seconds,
                window,
                args.acked,
                args.uvloop,
                args.processes,
                proc.pid if proc is not None else None,
            )
            results.append(r)
            apart = (
                f" (subscriber {r['subscriber_cpu_ms']:.2f}, publisher {r['publisher_cpu_ms']:.2f})"
                if args.processes == 2
                else ""
            )
            print(
                f"{'acked, ' * args.acked}window {window}, {side}² × 2 bytes: "
                f"{r['images_per_s']:.1f} images/s, {r['mb_per_s']:.0f} MB/s "
                f"({r['images']:.0f} images; client CPU per image {r['client_cpu_ms']:.2f} ms{apart}; "
                f"page faults per image {r['client_faults']:.0f}; herald CPU per image {r['herald_cpu_ms']:.2f} ms)",
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
    parser.add_argument(
        "--processes",
        type=int,
        choices=[1, 2],
        default=1,
        help="1: publisher and subscriber on one event loop; 2: the publisher in a child process",
    )
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop's event loop")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--publisher", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.run(main(args))
    else:
        asyncio.run(main(args))
    sys.exit(0)
