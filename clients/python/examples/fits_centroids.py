"""Subscribes to FITS images on herald and computes the centroids of the stars in each, with
astropy and photutils: what VBDS's Python centroid client does, against herald's topics.

    python fits_centroids.py 'camera/>'
    python fits_centroids.py 'vbds/guider' --json --count 10

The subscription is `lossless` with a window of `--window` images: herald never sends more than
the client has room for, and every image is processed (a publisher waits for this consumer).
The client grants credit for an image once its centroids are computed. The computation runs in
a worker thread so that the connection keeps answering herald while it runs. URL and token
default to HERALD_URL and HERALD_TOKEN.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import time
from typing import Any

import numpy as np
from astropy.io import fits
from astropy.stats import sigma_clipped_stats
from photutils.detection import DAOStarFinder

import herald_client


def centroids(frame: bytes, fwhm: float, threshold: float) -> list[dict[str, float]]:
    """The stars of a FITS image (primary HDU), brightest first: centroid x, y (0-based pixels,
    numpy order) and flux above the sigma-clipped background."""
    with fits.open(io.BytesIO(frame)) as hdul:
        data = np.asarray(hdul[0].data, dtype=np.float64)
    _, median, std = sigma_clipped_stats(data, sigma=3.0)
    sources: Any = DAOStarFinder(fwhm=fwhm, threshold=threshold * std)(data - median)
    if sources is None:
        return []
    # photutils 3 names the columns x_centroid/y_centroid; earlier versions xcentroid/ycentroid.
    x, y = ("x_centroid", "y_centroid") if "x_centroid" in sources.colnames else ("xcentroid", "ycentroid")
    stars = [{"x": float(s[x]), "y": float(s[y]), "flux": float(s["flux"])} for s in sources]
    return sorted(stars, key=lambda s: -s["flux"])


async def main(args: argparse.Namespace) -> None:
    async with herald_client.connect(args.url, token=args.token) as herald:
        sub = await herald.subscribe(args.pattern, policy="lossless", window=args.window)
        done = 0
        while True:
            try:
                async for m in sub:
                    started = time.monotonic()
                    stars = await asyncio.to_thread(centroids, bytes(m.payload), args.fwhm, args.threshold)
                    ms = (time.monotonic() - started) * 1000
                    if args.json:
                        print(json.dumps({"topic": m.topic, "seq": m.seq, "stars": stars, "ms": round(ms, 1)}))
                    else:
                        where = ", ".join(f"({s['x']:.2f}, {s['y']:.2f})" for s in stars[:3])
                        print(f"{m.topic} seq {m.seq}: {len(stars)} stars, brightest at {where} [{ms:.0f} ms]")
                    sys.stdout.flush()
                    done += 1
                    if done == args.count:
                        return
            except herald_client.GapError as gap:
                print(f"images lost while disconnected: {gap}", file=sys.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pattern", nargs="?", default="camera/>", help="topic pattern (default camera/>)")
    parser.add_argument("--url", default=os.environ.get("HERALD_URL", "ws://127.0.0.1:8080/ws"))
    parser.add_argument("--token", default=os.environ.get("HERALD_TOKEN"))
    parser.add_argument("--window", type=int, default=2, help="images herald may send ahead (default 2)")
    parser.add_argument("--fwhm", type=float, default=3.0, help="stars' full width at half maximum, pixels")
    parser.add_argument("--threshold", type=float, default=5.0, help="detection threshold, in background sigmas")
    parser.add_argument("--count", type=int, default=0, help="stop after this many images (0: never)")
    parser.add_argument("--json", action="store_true", help="one JSON object per image")
    asyncio.run(main(parser.parse_args()))
