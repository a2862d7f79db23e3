#!/usr/bin/env python3
"""Where each server's CPU went, from `perf` samples of interleaved rounds: every sample is put
in one bucket by the call stack it was taken in, and the table gives each run's samples per
bucket, the medians over the rounds, and the ratios of the first server to the second.

Buckets, the first that matches a sample's stack:
  send   writing to sockets (sendmsg, write, writev) and what the kernel does inside: on
         loopback that includes the receiving socket's processing, in the same call
  read   reading from sockets (recvfrom, read, readv)
  wait   epoll_wait, including sleeping and being woken in it
  fault  page faults
  other system calls
  user   the server's own code and its libraries
  other kernel  interrupts and the rest

Both servers do the same work in the same window (the load is a fixed rate), so sample counts
compare directly: at 2,999 Hz, one sample is a third of a millisecond of CPU.

Reads DIR/r<round>-<name>.perf.txt, written by `perf script -F ip,sym,dso` (as
bench/profile-pairs.sh names them):

    bench/profile_buckets.py --out DIR --rounds R FIRST SECOND
"""

import argparse
import collections
import os
import statistics

BUCKETS = [
    ("send", {"__sys_sendmsg", "ksys_write", "do_writev", "__sys_sendto"}),
    ("read", {"__sys_recvfrom", "ksys_read", "do_readv", "__sys_recvmsg"}),
    ("wait", {"do_epoll_wait"}),
    ("fault", {"asm_exc_page_fault"}),
    ("other system calls", {"entry_SYSCALL_64_after_hwframe", "do_syscall_64"}),
]
NAMES = [b for b, _ in BUCKETS] + ["user", "other kernel"]


def bucket(stack):
    """The bucket of one sample; `stack` is (symbol, object) pairs, the sampled frame first."""
    symbols = {s for s, _ in stack}
    for name, keys in BUCKETS:
        if symbols & keys:
            return name
    return "other kernel" if "kernel" in stack[0][1] else "user"


def count(path):
    counts = collections.Counter()
    stack = []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip()
            if not line:
                if stack:
                    counts[bucket(stack)] += 1
                stack = []
            elif line[0] in " \t":
                parts = line.split()
                if len(parts) >= 3:
                    stack.append((parts[1].split("+")[0], parts[-1]))
    if stack:
        counts[bucket(stack)] += 1
    return counts


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("first")
    ap.add_argument("second")
    a = ap.parse_args()
    runs = {}
    print(f"\nSamples per bucket; profiles in {a.out}\n")
    print("| run | round | all | " + " | ".join(NAMES) + " |")
    print("|---|---:|---:|" + "---:|" * len(NAMES))
    for name in (a.first, a.second):
        runs[name] = []
        for r in range(1, a.rounds + 1):
            path = os.path.join(a.out, f"r{r}-{name}.perf.txt")
            if not os.path.exists(path):
                continue
            c = count(path)
            c["all"] = sum(c.values())
            runs[name].append(c)
            print(
                f"| {name} | {r} | {c['all']:,} | "
                + " | ".join(f"{c[b]:,}" for b in NAMES)
                + " |"
            )
    if not runs[a.first] or not runs[a.second]:
        print("\nno profile for one of the two: no medians")
        return
    med = {
        n: {b: statistics.median(c[b] for c in cs) for b in ["all"] + NAMES}
        for n, cs in runs.items()
    }
    print(f"\nMedians over the rounds, and {a.first} / {a.second}:\n")
    print("| | all | " + " | ".join(NAMES) + " |")
    print("|---|---:|" + "---:|" * len(NAMES))
    for n in (a.first, a.second):
        print(
            f"| {n} | {med[n]['all']:,.0f} | "
            + " | ".join(f"{med[n][b]:,.0f}" for b in NAMES)
            + " |"
        )
    ratio = lambda b: (
        "-" if not med[a.second][b] else f"{med[a.first][b] / med[a.second][b]:.2f}×"
    )
    print(
        f"| {a.first} / {a.second} | {ratio('all')} | "
        + " | ".join(ratio(b) for b in NAMES)
        + " |"
    )
    extra = med[a.first]["all"] - med[a.second]["all"]
    if extra > 0:
        share = lambda b: f"{(med[a.first][b] - med[a.second][b]) / extra:+.0%}"
        print(
            f"| share of {a.first}'s extra | 100% | "
            + " | ".join(share(b) for b in NAMES)
            + " |"
        )


if __name__ == "__main__":
    main()
