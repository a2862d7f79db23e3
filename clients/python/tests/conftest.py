"""Fixtures: a real `herald serve` on a free loopback port (the binary from HERALD_BIN), a TCP
proxy in front of it whose connections a test can cut, and a time bound for every test body."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import pytest

HERALD_BIN = os.environ.get("HERALD_BIN", "/tmp/herald-bin/herald")
STEP = 5.0  # seconds for any single wait on the network
BUDGET = 30.0  # seconds for a whole test body


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Herald:
    """One `herald serve` process on 127.0.0.1; `restart()` keeps the port."""

    def __init__(self, *args: str, config: str = "") -> None:
        if not os.access(HERALD_BIN, os.X_OK):
            pytest.fail(f"no herald binary at {HERALD_BIN}: set HERALD_BIN (cargo build --release -p herald)")
        self.dir = tempfile.TemporaryDirectory(prefix="herald-pytest-")
        self.args = list(args)
        if config:
            path = os.path.join(self.dir.name, "herald.toml")
            with open(path, "w") as f:
                f.write(config)
            self.args += ["--config", path]
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}/ws"
        self.http = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(self.dir.name, "herald.log")
        self.start()

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child process owns it)
        self.proc = subprocess.Popen(
            [HERALD_BIN, "serve", "--listen", f"127.0.0.1:{self.port}", *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"herald exited early ({self.proc.returncode}):\n{self.output()}")
            try:
                with urllib.request.urlopen(f"{self.http}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        pytest.fail(f"herald did not answer /healthz within 10 s:\n{self.output()}")

    def stop(self) -> None:
        """SIGTERM to the process this fixture started (by its PID), SIGKILL after 10 s."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def output(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def token(self, secret_file: str, *args: str) -> str:
        """A token minted by `herald token` (docs/security.md)."""
        out = subprocess.run(
            [HERALD_BIN, "token", "--secret-file", secret_file, *args],
            capture_output=True,
            check=True,
            timeout=10,
        )
        return out.stdout.decode().strip()

    def close(self) -> None:
        self.stop()
        self.dir.cleanup()


@pytest.fixture(scope="module")
def herald() -> Iterator[Herald]:
    server = Herald()
    yield server
    server.close()


@pytest.fixture
def fresh_herald() -> Iterator[Herald]:
    server = Herald()
    yield server
    server.close()


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of herald: `cut()` aborts every connection through it
    (the client sees its socket die, herald sees the peer go); while `refuse` is set, new
    connections are aborted at once."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.server: asyncio.Server | None = None
        self.links: set[asyncio.StreamWriter] = set()
        self.refuse = False

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.links |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.links -= {writer, up_writer}

    def cut(self) -> None:
        for w in list(self.links):
            w.transport.abort()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def run_async(
    budget: float = BUDGET,
) -> Callable[[Callable[..., Coroutine[Any, Any, None]]], Callable[..., None]]:
    """Runs an `async def` test to completion within `budget` seconds, on uvloop's event loop
    with HERALD_TEST_LOOP=uvloop, else on asyncio's."""

    def decorate(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            run = asyncio.run
            if os.environ.get("HERALD_TEST_LOOP") == "uvloop":
                import uvloop

                run = uvloop.run
            run(asyncio.wait_for(fn(*args, **kwargs), budget))

        return wrapper

    return decorate


async def within(aw: Awaitable[Any], timeout: float = STEP) -> Any:
    return await asyncio.wait_for(aw, timeout)
