"""Publishes FITS frames from files to herald, as binary messages with content type
`image/fits` (what a camera's acquisition software would do). Each file is memory-mapped and
handed to the client as a buffer: the client adds no copy of its own.

    python fits_publisher.py frames/*.fits --topic camera/1/raw --rate 5
    python fits_centroids.py 'camera/>'          # elsewhere: centroid each frame

A herald VBDS stream NAME is the topic `vbds/NAME` (docs/vbds.md), so `--topic vbds/NAME` feeds
VBDS clients too. URL and token default to HERALD_URL and HERALD_TOKEN.
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import os
import time

import herald_client


def map_file(path: str) -> mmap.mmap:
    """The file's bytes, mapped into memory: pages are read as the socket takes them, not here."""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


async def main(args: argparse.Namespace) -> None:
    async with herald_client.connect(args.url, token=args.token) as herald:
        rounds = 0
        while True:
            for path in args.files:
                started = time.monotonic()
                with map_file(path) as frame:
                    ack = await herald.publish(args.topic, frame, ct="image/fits", stamp=True)
                    size = len(frame)
                assert ack is not None
                print(f"{path}: {size} bytes as {args.topic} seq {ack.seq}", flush=True)
                if args.rate:
                    await asyncio.sleep(max(0.0, 1 / args.rate - (time.monotonic() - started)))
            rounds += 1
            if not args.loop or rounds == args.loop:
                return


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="FITS files to publish, in order")
    parser.add_argument("--url", default=os.environ.get("HERALD_URL", "ws://127.0.0.1:8080/ws"))
    parser.add_argument("--token", default=os.environ.get("HERALD_TOKEN"))
    parser.add_argument("--topic", default="camera/1/raw")
    parser.add_argument("--rate", type=float, default=0.0, help="frames per second (0: as fast as herald takes them)")
    parser.add_argument("--loop", type=int, default=0, help="publish the files this many times (0: once)")
    asyncio.run(main(parser.parse_args()))
