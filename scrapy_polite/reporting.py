"""What one crawl saw, per host: the counters behind the closing summary, the example's table and the
``polite/...`` stats (README, "Stats")."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HostCounters", "Report"]


@dataclass
class HostCounters:
    """What one host saw in this crawl.

    Attributes:
        requests: paced requests booked; waits / wait_seconds: waits in line and their seconds;
        deferrals / deferral_reasons: requests deferred, by reason; throttles: responses judged a throttle;
        backoff_steps: throttles that took a new step; statuses: status (or failure name) → count;
        crawl_delay: the delay (s) the host's robots.txt published, or None.
    """

    requests: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    deferrals: int = 0
    deferral_reasons: Counter[str] = field(default_factory=Counter)
    throttles: int = 0
    backoff_steps: int = 0
    statuses: Counter[Any] = field(default_factory=Counter)
    crawl_delay: float | None = None


class Report:
    """Per-host counters and ``polite/...`` stats of one crawler.

    Args:
        stats: the crawler's stats collector (None: counters only).
    """

    def __init__(self, stats: Any) -> None:
        self.stats = stats
        self.hosts: dict[str, HostCounters] = {}

    def counters(self, host: str) -> HostCounters:
        """The host's counters (created on first use)."""
        c = self.hosts.get(host)
        if c is None:
            c = self.hosts[host] = HostCounters()
        return c

    def inc(self, key: str, count: float = 1) -> None:
        """Add ``count`` to the stat ``polite/<key>``."""
        if self.stats is not None:
            self.stats.inc_value(f"polite/{key}", count)

    def booked(self, host: str) -> None:
        """A paced request was booked on ``host``."""
        self.counters(host).requests += 1
        self.inc("requests")

    def waited(self, host: str, seconds: float) -> None:
        """A request of ``host`` waits ``seconds`` in line."""
        counters = self.counters(host)
        counters.waits += 1
        counters.wait_seconds += seconds
        self.inc("waits")
        self.inc("wait_seconds", seconds)

    def deferred(self, host: str, reason: str) -> None:
        """A request of ``host`` was deferred for ``reason``."""
        counters = self.counters(host)
        counters.deferrals += 1
        counters.deferral_reasons[reason] += 1
        self.inc("deferrals")
        self.inc(f"deferrals/{reason}")

    def host_report(self) -> dict[str, dict[str, Any]]:
        """Per host: ``requests``, ``waits``, ``wait_seconds``, ``deferrals`` (total) and
        ``deferral_reasons`` (``throttled``, ``crawl_delay``, ``line``, ``ip_line`` -> count), ``throttles``,
        ``backoff_steps``, ``statuses`` (status or failure name -> count), ``crawl_delay`` (seconds or None)."""
        return {
            host: {
                "requests": c.requests, "waits": c.waits, "wait_seconds": round(c.wait_seconds, 3),
                "deferrals": c.deferrals, "deferral_reasons": dict(c.deferral_reasons),
                "throttles": c.throttles, "backoff_steps": c.backoff_steps,
                "statuses": dict(c.statuses), "crawl_delay": c.crawl_delay,
            }
            for host, c in sorted(self.hosts.items())
        }
