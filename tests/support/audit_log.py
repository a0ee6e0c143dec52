"""Event logs as a crawl writes them, built by hand for the audit's tests (tests/test_audit.py,
tests/test_audit_command.py): each event numbered as its process numbers it (``Event.seq``)."""

from __future__ import annotations

from typing import Any

from scrapy_polite.stores import Event

__all__ = ["Log", "T0", "throttled"]

T0 = 1_800_000_000.0


class Log:
    """Builds a log as one process writes it: numbered 0, 1, 2, ..."""

    def __init__(self, source: str = "m:1") -> None:
        self.source = source
        self.events: list[Event] = []
        self.numbered = 0  # the events of ``source`` so far

    def add(self, at: float, kind: str, host: str = "a.example", **fields: Any) -> Event:
        event = Event(T0 + at, kind, host, **{"source": self.source, "seq": self.numbered, **fields})
        if event.source == self.source:
            self.numbered += 1
        self.events.append(event)
        return event

    def book(self, at: float, host: str = "a.example", *, interval: float = 1.0, address: str = "127.0.0.2",
             ip_interval: float = 0.0, **fields: Any) -> Event:
        fields.setdefault("url", f"http://{host}/{len(self.events)}")
        return self.add(at, "booking", host, delay=interval,
                        due=T0 + at + interval, address=address, interval=interval, ip_interval=ip_interval,
                        **fields)

    def respond(self, at: float, host: str = "a.example", *, status: int = 200, due: float, **fields: Any) -> Event:
        fields.setdefault("url", f"http://{host}/r")
        return self.add(at, "response", host, status=status, delay=due - at, due=T0 + due, **fields)

    def throttle(self, at: float, retry_after: float, host: str = "a.example", **fields: Any) -> Event:
        """A 429 response at ``at`` with ``Retry-After: retry_after`` (seconds), which holds the host until
        ``at + retry_after`` (its first backoff step)."""
        return self.respond(at, host, status=429, due=at + retry_after, retry_after=retry_after, reason="throttle",
                            steps=1, **fields)


def throttled(retry_after: float) -> tuple[Log, Event]:
    """A log whose first request (at 0) is answered 429 with ``Retry-After: retry_after`` at 0.2 s; the log and
    the throttle."""
    log = Log()
    log.book(0.0)
    return log, log.throttle(0.2, retry_after)
