"""Publishes FX quotes to herald: a random walk per currency pair, as JSON on `quotes/fx/<PAIR>`,
stamped by herald with its receive time.

    python quote_publisher.py --count 100 --rate 10
    herald sub 'quotes/fx/*'          # elsewhere: watch them arrive

URL and token default to HERALD_URL and HERALD_TOKEN, like the `herald` CLI.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random

import herald_client

PAIRS = {"EURUSD": 1.0842, "GBPUSD": 1.2650, "USDJPY": 151.20}


async def main(args: argparse.Namespace) -> None:
    prices = dict(PAIRS)
    async with herald_client.connect(args.url, token=args.token) as herald:
        sent = 0
        while args.count == 0 or sent < args.count:
            for pair, price in prices.items():
                price *= 1 + random.gauss(0, 0.0002)
                prices[pair] = price
                spread = price * 0.00005
                quote = {"pair": pair, "bid": round(price - spread, 5), "ask": round(price + spread, 5)}
                ack = await herald.publish(f"{args.prefix}/{pair}", quote, stamp=True)
                assert ack is not None
                print(f"{pair} {quote['bid']:.5f}/{quote['ask']:.5f} seq {ack.seq}", flush=True)
            sent += 1
            await asyncio.sleep(1 / args.rate)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("HERALD_URL", "ws://127.0.0.1:8080/ws"))
    parser.add_argument("--token", default=os.environ.get("HERALD_TOKEN"))
    parser.add_argument("--prefix", default="quotes/fx", help="topic prefix (default quotes/fx)")
    parser.add_argument("--count", type=int, default=0, help="rounds of quotes to send (0: until Ctrl-C)")
    parser.add_argument("--rate", type=float, default=2.0, help="rounds per second (default 2)")
    asyncio.run(main(parser.parse_args()))
