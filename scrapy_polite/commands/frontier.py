"""The shared frontier's part of ``scrapy polite hosts`` (docs/spec.md §5, "The shared frontier"): what waits in
Redis per host, and what each worker leases.
"""

from __future__ import annotations

import importlib
from typing import IO, Any

from ..frontier.report import waiting_in_redis
from ..reports.words import format_table, plural
from ..settings import PoliteConfig

__all__ = ["print_shared_frontier"]


def print_shared_frontier(settings: Any, config: PoliteConfig, out: IO[str], err: IO[str]) -> None:
    """With scrapy-redis's scheduler in the settings (``SCHEDULER`` or ``POLITE_SCHEDULER_BASE``) and the
    shared frontier on, list what waits in Redis per host, and what each worker leases (renewing or not, and
    when the leases of one that stopped renewing come back) (docs/spec.md §5, "The shared frontier"); a
    Redis that cannot be reached is reported on ``err`` (the pace table's listing stands)."""
    names = {str(settings.get("SCHEDULER") or ""), str(config.scheduler_base)}
    if not config.shared_frontier or not any(n.startswith("scrapy_redis.") for n in names):
        return
    try:
        connection = importlib.import_module("scrapy_redis.connection")  # the optional extra
        server = connection.from_settings(settings)
        frontiers = waiting_in_redis(server, config.frontier_key)
    except Exception as exc:  # ImportError without the extra, a RedisError: the listing above stands
        print(f"shared frontier: cannot be read ({exc})", file=err)
        return
    for key, returned, hosts, workers in frontiers:
        held = sum(count for _, count, _ in hosts)
        leased = sum(w.leases for w in workers)
        print(f"shared frontier {key}: {plural(held, 'request')} held in Redis, {returned} returned, "
              f"{leased} leased by {plural(len(workers), 'worker')}", file=out)
        if hosts:
            print(format_table([("host", "held", "due in"),
                                *((host, str(count), f"{max(0.0, due):.0f} s") for host, count, due in hosts)]),
                  file=out)
        if workers:
            print(format_table([("worker", "leased", "last renewal", "state"),
                                *((w.worker, str(w.leases),
                                   "-" if w.renewed_ago is None else f"{w.renewed_ago:.0f} s ago",
                                   "renewing" if w.renewing(config.lease_time)
                                   else f"stopped renewing: its requests come back in {w.back_in:.0f} s")
                                  for w in workers)]), file=out)
