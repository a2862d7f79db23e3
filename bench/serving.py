"""`herald serve` for the bench's Python tools (kept_memory.py, request_cost.py): a free
loopback port, and a server that listens before the tool goes on and stops when it is done."""

import contextlib
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(command, port, **popen):
    """Runs `command`, a server that will listen on 127.0.0.1:`port`, until the block ends;
    the block starts once it listens (at most 10 s). `popen`: passed to `subprocess.Popen`."""
    server = subprocess.Popen(command, **popen)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(
                f"{command[0]} did not listen on port {port} within 10 s"
            )
        yield server
    finally:
        server.terminate()
        server.wait(timeout=10)
