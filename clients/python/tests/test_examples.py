"""The examples run against a real herald, and the package builds into an sdist and a wheel that
install into a fresh virtual environment and run the quote example."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
from astropy.io import fits
from conftest import Herald, run_async, within

import herald_client

PACKAGE = Path(__file__).resolve().parent.parent
EXAMPLES = PACKAGE / "examples"
# The examples run with the package from this source tree.
SOURCE_ENV = {**os.environ, "PYTHONPATH": str(PACKAGE / "src")}


async def expect_quotes(sub: herald_client.Subscription, n: int) -> None:
    for _ in range(n):
        m = await within(sub.__anext__(), 60)
        q = m.json()
        assert m.topic == f"quotes/fx/{q['pair']}" and q["bid"] < q["ask"] and m.ts is not None


@run_async()
async def test_quote_publisher(herald: Herald) -> None:
    async with herald_client.connect(herald.url) as h:
        sub = await h.subscribe("quotes/fx/*")
        out = subprocess.run(
            [sys.executable, str(EXAMPLES / "quote_publisher.py"), "--url", herald.url, "--count", "2", "--rate", "50"],
            capture_output=True,
            timeout=20,
            check=True,
            env=SOURCE_ENV,
        )
        assert len(out.stdout.decode().splitlines()) == 6
        await expect_quotes(sub, 6)


def star_field(stars: list[tuple[float, float, float]], seed: int) -> np.ndarray:
    """A 96×96 16-bit frame: Gaussian stars (x, y, peak) on a noisy background."""
    y, x = np.mgrid[0:96, 0:96]
    image = np.random.default_rng(seed).normal(200, 3, (96, 96))
    for sx, sy, peak in stars:
        image += peak * np.exp(-((x - sx) ** 2 + (y - sy) ** 2) / (2 * 1.3**2))
    return np.asarray(image.round(), dtype=">i2")


def wait_for_subscribers(server: Herald, n: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{server.http}/api/stats", timeout=2) as r:
            if json.load(r)["subscriptions"] >= n:
                return
        time.sleep(0.05)
    raise AssertionError("the example never subscribed")


def test_fits_publisher_and_centroid_subscriber(tmp_path: Path) -> None:
    frames = [[(30.4, 60.2, 3000.0), (70.0, 20.5, 1500.0)], [(48.7, 47.1, 2500.0)], [(10.5, 80.25, 4000.0)]]
    files = []
    for i, stars in enumerate(frames):
        path = tmp_path / f"frame{i}.fits"
        fits.PrimaryHDU(star_field(stars, i)).writeto(path)
        files.append(str(path))
    server = Herald()
    try:
        subscriber = subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLES / "fits_centroids.py"),
                "camera/>",
                "--url",
                server.url,
                "--json",
                "--count",
                str(len(frames)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=SOURCE_ENV,
        )
        try:
            wait_for_subscribers(server, 1)
            subprocess.run(
                [sys.executable, str(EXAMPLES / "fits_publisher.py"), *files, "--url", server.url],
                check=True,
                timeout=30,
                capture_output=True,
                env=SOURCE_ENV,
            )
            out, err = subscriber.communicate(timeout=60)
        finally:
            if subscriber.poll() is None:
                subscriber.kill()
                subscriber.wait()
        assert subscriber.returncode == 0, err.decode()
        reports = [json.loads(line) for line in out.decode().splitlines()]
        assert [r["seq"] for r in reports] == [1, 2, 3]
        for report, stars in zip(reports, frames, strict=True):
            found = report["stars"]
            assert len(found) == len(stars), report
            for star, (x, y, _) in zip(found, sorted(stars, key=lambda s: -s[2]), strict=True):
                assert abs(star["x"] - x) < 0.1 and abs(star["y"] - y) < 0.1, (star, x, y)
    finally:
        server.close()


@run_async(240)
async def test_sdist_and_wheel_install_into_a_fresh_venv_and_run_the_quote_example(herald: Herald) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dist = Path(tmp) / "dist"
        subprocess.run(
            [sys.executable, "-m", "build", "--outdir", str(dist), str(PACKAGE)],
            check=True,
            timeout=180,
            capture_output=True,
        )
        wheels = list(dist.glob("herald_client-*.whl"))
        sdists = list(dist.glob("herald_client-*.tar.gz"))
        assert len(wheels) == 1 and len(sdists) == 1
        with zipfile.ZipFile(wheels[0]) as whl:
            assert "herald_client/py.typed" in whl.namelist()
        with tarfile.open(sdists[0]) as sdist:
            names = sdist.getnames()
        assert any(n.endswith("examples/quote_publisher.py") for n in names)
        assert any(n.endswith("src/herald_client/py.typed") for n in names)

        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
        python = str(venv / "bin" / "python")
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", str(wheels[0])],
            check=True,
            timeout=120,
            capture_output=True,
        )
        async with herald_client.connect(herald.url) as h:
            sub = await h.subscribe("quotes/fx/*")
            # From outside the source tree, so only the installed package can be imported.
            out = subprocess.run(
                [python, str(EXAMPLES / "quote_publisher.py"), "--url", herald.url, "--count", "1"],
                capture_output=True,
                timeout=30,
                cwd=tmp,
                env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            )
            assert out.returncode == 0, out.stderr.decode()
            await expect_quotes(sub, 3)
