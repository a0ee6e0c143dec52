"""The lines of one process (docs/spec.md §5): at most one paced request per host, and one per address,
is in line or in flight at a time; the others wait for the line or are deferred."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twisted.internet import defer

__all__ = ["Line", "Lines"]


@dataclass
class Line:
    """One host's or address's line.

    Attributes:
        holder: the request in line or in flight (None: free).
        freed: Deferreds fired when the line is freed (requests waiting for it).
        recording: the Deferred of the holder's response record, awaited before the line is freed.
    """

    holder: Any = None
    freed: list[defer.Deferred[None]] = field(default_factory=list)
    recording: defer.Deferred[Any] | None = None


class Lines:
    """Every line of the process, by key (host keys and ``ip:`` keys share one namespace).

    Also tracks, per address, the hosts deferred until its line frees (:meth:`wait_on_addresses`) and
    the one request waiting for the address's budget (:attr:`ip_waiter`).
    """

    def __init__(self) -> None:
        self._lines: dict[str, Line] = {}
        self._waiting_hosts: dict[str, set[str]] = {}
        #: ``ip:`` key → the request waiting in line for that address's budget (one at most).
        self.ip_waiter: dict[str, Any] = {}

    def line(self, key: str) -> Line:
        """The key's line (created on first use)."""
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = Line()
        return line

    def busy(self, key: str) -> bool:
        """Some request holds the key's line."""
        line = self._lines.get(key)
        return line is not None and line.holder is not None

    def holds(self, key: str, request: Any) -> bool:
        """``request`` holds the key's line."""
        line = self._lines.get(key)
        return line is not None and line.holder is request

    def has_live_waiters(self, keys: list[str]) -> bool:
        """Some request is waiting for one of these lines to free."""
        return any(not d.called for key in keys for d in self.line(key).freed)

    def wait_for(self, keys: list[str]) -> defer.Deferred[None]:
        """A Deferred that fires when any of the lines of ``keys`` is freed."""
        d: defer.Deferred[None] = defer.Deferred()
        for key in keys:
            self.line(key).freed.append(d)
        return d

    def free(self, key: str, request: Any) -> bool:
        """Free the key's line if ``request`` holds it and wake its waiters; True when it did."""
        line = self._lines.get(key)
        if line is None or line.holder is not request:
            return False
        line.holder = None
        line.recording = None
        waiters, line.freed = line.freed, []
        for d in waiters:
            if not d.called:
                d.callback(None)
        return True

    def wait_on_addresses(self, host: str, keys: list[str]) -> None:
        """``host`` was deferred until one of these address lines frees."""
        for key in keys:
            self._waiting_hosts.setdefault(key, set()).add(host)

    def hosts_waiting_on(self, key: str) -> set[str]:
        """The hosts deferred until the address line ``key`` freed (forgotten once returned)."""
        return self._waiting_hosts.pop(key, set())
