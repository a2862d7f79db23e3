"""What requests whose cost could grow with the number of topics cost herald: with N topics
`t<i mod 1000>/<i>`, the median of 5 snapshots of `zz/none/>` (matches nothing), `*/none`
(a leading wildcard, matches nothing) and `t5/*` (N/1000 topics), of 5 resubscribes to `>`
from a cursor after which 10 topics were published (a client back from a short drop), and of 5
`GET /api/topics?limit=10`. herald is pinned to core 0.

Usage: python3 bench/request_cost.py HERALD_BIN [N]   (N defaults to 200000)
"""

import asyncio
import json
import subprocess
import sys
import time

import requests
from serving import free_port, serving
from websockets.asyncio.client import connect

BIN = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000


async def measure(port):
    url = f"ws://127.0.0.1:{port}/ws"
    async with connect(url, max_size=None) as pub:
        for i in range(N):
            await pub.send(json.dumps({"op": "pub", "topic": f"t{i % 1000}/{i}", "data": "x"}))
        await pub.send(json.dumps({"op": "ping", "id": 1}))
        while json.loads(await pub.recv()).get("op") != "pong":
            pass
    async with connect(url, max_size=None) as ws:
        for pattern in ["zz/none/>", "*/none", "t5/*"]:
            times = []
            for k in range(5):
                t = time.perf_counter()
                await ws.send(
                    json.dumps({"op": "sub", "id": k, "topic": pattern, "snapshot": True})
                )
                reply = json.loads(await ws.recv())
                for _ in range(reply.get("replayed", 0)):
                    await ws.recv()
                times.append((time.perf_counter() - t) * 1000)
                await ws.send(json.dumps({"op": "unsub", "topic": pattern}))
                await ws.recv()
            times.sort()
            print(
                f"{pattern:12} snapshot median {times[2]:8.2f} ms  (replayed {reply.get('replayed', 0)})"
            )
        times = []
        for k in range(5):
            await ws.send(json.dumps({"op": "sub", "id": "c", "topic": ">"}))
            cursor = json.loads(await ws.recv())["cursor"]
            await ws.send(json.dumps({"op": "unsub", "topic": ">"}))
            await ws.recv()
            for i in range(10):
                await ws.send(json.dumps({"op": "pub", "topic": f"t{i}/{k}", "data": "y"}))
            t = time.perf_counter()
            await ws.send(json.dumps({"op": "sub", "id": k, "topic": ">", "cursor": cursor}))
            reply = json.loads(await ws.recv())
            while reply.get("op") != "subscribed":
                reply = json.loads(await ws.recv())
            for _ in range(reply.get("replayed", 0)):
                await ws.recv()
            times.append((time.perf_counter() - t) * 1000)
            await ws.send(json.dumps({"op": "unsub", "topic": ">"}))
            await ws.recv()
        times.sort()
        print(
            f"{'>':12} from a cursor median {times[2]:8.2f} ms  (replayed {reply.get('replayed', 0)})"
        )


def list_topics(port):
    times = []
    for _ in range(5):
        t = time.perf_counter()
        r = requests.get(f"http://127.0.0.1:{port}/api/topics?limit=10", timeout=60)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    print(f"/api/topics?limit=10 median {times[2]:8.2f} ms ({len(r.json()['topics'])} listed)")


port = free_port()
command = ["taskset", "-c", "0", BIN, "serve", "--listen", f"127.0.0.1:{port}"]
with serving(command, port, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
    asyncio.run(measure(port))
    list_topics(port)
