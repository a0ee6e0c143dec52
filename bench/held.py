"""Benchmark: the memory of a crawl that holds 100,000 requests of one throttled host.

Usage::

    python bench/held.py [--requests 100000] [--max-in-memory 10000] [--jobdir]

Runs ``tests/support/held_crawl.py`` (one loopback host answers its first request ``429`` + ``Retry-After:
3600``; every other request is deferred and held; the crawl's RSS is sampled every 0.05 s) in fresh processes:

* with ``POLITE_MAX_HELD_IN_MEMORY = --max-in-memory`` (the default, 10,000): the requests beyond it wait
  on disk;
* the negative control: the bound above ``--requests`` (all held in memory);
* with ``--jobdir``, also under ``JOBDIR`` (every held request written to ``JOBDIR/polite_held`` as it is held).

Printed for each: the RSS at 0, 10 %, 25 %, 50 %, 75 % and 100 % of the requests held, the growth from 25 %
to 100 % per 1,000 held requests, and how long the crawl took. About a minute on two cores (three with
``--jobdir``: Scrapy's own ``JOBDIR`` queue then writes every request to disk too).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(requests: int, bound: int, jobdir: str | None = None) -> dict[str, object]:
    command = [sys.executable, "-m", "tests.support.held_crawl", "--requests", str(requests),
               "--max-in-memory", str(bound)]
    if jobdir:
        command += ["--jobdir", jobdir]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the crawl failed:\n{out.stderr[-3000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def report(label: str, result: dict[str, object], requests: int) -> None:
    samples: list[list[int]] = result["samples"]  # type: ignore[assignment]
    stats: dict[str, object] = result["stats"]  # type: ignore[assignment]

    def at(fraction: float) -> list[int]:
        return next((s for s in samples if s[0] >= fraction * requests * 0.999), samples[-1])

    points = [at(f) for f in (0, 0.1, 0.25, 0.5, 0.75, 1.0)]
    start, end = at(0.25), points[-1]
    growth = (end[1] - start[1]) / max(1.0, (end[0] - start[0]) / 1000)
    print(f"{label}")
    print("  held:    " + "".join(f"{p[0]:>9,}" for p in points))
    print("  RSS MB:  " + "".join(f"{p[1] / 1e6:>9.1f}" for p in points))
    print(f"  growth from 25 % to 100 % held: {growth / 1e3:.1f} KB per 1,000 held requests;  on disk: "
          f"{stats.get('polite/deferred/spilled', 0):,};  crawl {result['seconds']:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--max-in-memory", type=int, default=10_000)
    parser.add_argument("--jobdir", action="store_true", help="also run under JOBDIR")
    args = parser.parse_args()
    n = args.requests
    print(f"{n:,} requests of one throttled host, all held (RSS of the crawl process)\n")
    report(f"POLITE_MAX_HELD_IN_MEMORY = {args.max_in_memory:,}", run(n, args.max_in_memory), n)
    report(f"negative control: POLITE_MAX_HELD_IN_MEMORY = {n + 1:,} (all in memory)", run(n, n + 1), n)
    if args.jobdir:
        with tempfile.TemporaryDirectory(prefix="polite-held-") as jobdir:
            report("JOBDIR (every held request on disk)", run(n, args.max_in_memory, jobdir), n)


if __name__ == "__main__":
    main()
