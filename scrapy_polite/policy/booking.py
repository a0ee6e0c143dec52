"""The booking step (docs/spec.md §3), which :class:`~scrapy_polite.policy.PacingPolicy` inherits from
:class:`BookingRules`: a request booked on its host and one of its addresses (:meth:`~BookingRules.book`, with
:meth:`~BookingRules.reserve`), the in-flight hold of the rows it booked (docs/spec.md §3, "In flight":
:meth:`~BookingRules.held_until`, :meth:`~BookingRules.release_hold`, :meth:`~BookingRules.finish_address`),
and a row written back into a table that came back empty (:meth:`~BookingRules.restore`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from .robots import current_entries, merge_origin_delays
from .state import NEVER_SEEN, Booking, HostState, replace

__all__ = ["BookingRules", "HOLD_POLL"]

#: The shortest (s) between two tries of a booking kept out by another process's in-flight hold (docs/spec.md §3,
#: "In flight"); a try comes one interval of the held row later, at least this.
HOLD_POLL = 0.05


class BookingRules:
    """The booking step's rules, a part of :class:`~scrapy_polite.policy.PacingPolicy` (it inherits them):
    methods only, reading the policy's settings and its interval and quota rules."""

    max_wait: float
    ratelimit_headers: bool
    in_flight_hold: ClassVar[bool]

    if TYPE_CHECKING:  # PacingPolicy's own rules, and QuotaRules'
        def effective_interval(self, state: HostState | None, override: float | None = None) -> float: ...

        def quota_booking(self, state: HostState, *, now: float) -> tuple[HostState, float | None]: ...

    def book(self, host: HostState | None, addresses: Mapping[str, HostState | None], *, now: float,
             floor: float = 0.0, ip_interval: float = 0.0, hold: tuple[int, float] | None = None) -> Booking:
        """The booking step of docs/spec.md §3 (the reference's ``reserve``), run inside one store transaction.

        Of the host's addresses (the mapping's order is the order of preference) the one free first is chosen, a
        row held in flight being free only at its hold's bound (:meth:`held_until`); ties go to the first. Free
        now, one request is taken from the host's announced quota (:meth:`quota_booking`; a spent one books
        nothing and holds the host, :meth:`_quota_spent`), and the host is booked for ``max(effective interval,
        floor)`` seconds, the address for ``ip_interval``, both held with ``hold`` until the request's outcome
        releases them (docs/spec.md §3, "In flight"). A row held keeps the caller out for :meth:`_poll` seconds.

        Args:
            host: the host's row (None: never seen).
            addresses: address → its ``ip:`` row (None: never booked); empty: pace by host only.
            now: the store's clock, epoch seconds.
            floor: seconds, the request's per-host, per-spider or per-request interval (0: none).
            ip_interval: ``POLITE_IP_INTERVAL``, seconds between two requests to one address.
            hold: ``(token, download_timeout)``: the hold's token (an int ≠ 0, unique to this booking) and the
                request's download timeout (seconds > 0); None: hold nothing (a booking that is not sent as one
                request, e.g. a test of the interval alone).

        Returns:
            A :class:`~scrapy_polite.policy.Booking`; ``writes`` holds the rows to store (host key ``""`` is the
            host's row, other keys are addresses) — empty when nothing was booked or every interval is zero.
        """
        host_at, host_held = self.held_until(host, now)
        host_free = max(now, host_at)
        free_at, address, held = host_free, None, host_held
        for candidate, ip_state in addresses.items():
            ip_at, ip_held = self.held_until(ip_state, now)
            at = max(host_free, ip_at)
            if address is None or at < free_at:
                free_at, address = at, candidate
                held = (host_held and at == host_free) or (ip_held and at == ip_at)
        if free_at > now:
            poll = self._poll(host, floor, ip_interval, host_row=host_held and free_at == host_free) if held else 0.0
            return Booking(booked=False, host=host, start=free_at, host_free=host_free, address=address, held=held,
                           poll=poll)
        counted, held_until = self.quota_booking(host or NEVER_SEEN, now=now)
        if held_until is not None:  # the announced quota is spent: the host is held (docs/spec.md §2)
            return self._quota_spent(counted, held_until, now=now, address=address)
        writes: dict[str, HostState] = {}
        eff = self.effective_interval(host, floor)  # floor >= 0: an override of 0 changes nothing
        holding = hold is not None and self.in_flight_hold
        token, timeout = hold if hold is not None else (0, 0.0)
        # A zero interval books nothing in the future: no row needs writing for it, unless the host announces
        # a quota (its bookings are counted: the serial, ``booked``, grows with every one).
        if eff > 0 or (self.ratelimit_headers and host is not None and _announces_quota(host)):
            row = self.reserve(counted, start=now, interval=eff)
            if holding and eff > 0:
                row = replace(row, held_until=now + timeout + eff, held_by=token)
            writes[""] = row
        if address is not None and ip_interval > 0:
            row = self.reserve(addresses[address], start=now, interval=ip_interval)
            if holding:
                row = replace(row, held_until=now + timeout + ip_interval, held_by=token)
            writes[address] = row
        return Booking(booked=True, host=writes.get("", host), start=now, host_free=host_free,
                       address=address, writes=writes, interval=eff)

    def _poll(self, host: HostState | None, floor: float, ip_interval: float, *, host_row: bool) -> float:
        """Seconds after which a booking kept out by a hold asks again (docs/spec.md §3, "In flight"): one
        interval of the held row (the host's when ``host_row``, else the address's), never before its release,
        at least :data:`HOLD_POLL`, at most ``max_wait``."""
        poll = self.effective_interval(host, floor) if host_row else ip_interval
        return min(max(poll, HOLD_POLL), self.max_wait)

    @staticmethod
    def _quota_spent(counted: HostState, until: float, *, now: float, address: str | None) -> Booking:
        """Not booked: the host's announced quota is spent (:meth:`quota_booking`, its row ``counted``) and no
        booking goes before ``until`` (epoch s); before the quota's reset, the host is held until then
        (docs/spec.md §2, "Quota booking")."""
        if counted.quota_reset > now:
            counted = replace(counted, ratelimit_until=max(counted.ratelimit_until, until),
                              next_allowed=max(counted.next_allowed, until))
        return Booking(booked=False, host=counted, start=until, host_free=until, address=address)

    @staticmethod
    def reserve(state: HostState | None, *, start: float, interval: float) -> HostState:
        """Book a request starting at ``start``: no other request (in any process) may start within
        ``interval`` seconds of it (docs/spec.md §3, the reference's ``reserve``)."""
        old = state or NEVER_SEEN
        return replace(old, next_allowed=max(old.next_allowed, start + interval), updated=start)

    def held_until(self, state: HostState | None, now: float) -> tuple[float, bool]:
        """When the row frees (epoch s, the table's clock), and whether an in-flight hold decides it: a row held
        by a request in flight (``held_until > now``) frees at the hold's bound at the latest, and sooner when
        the request's outcome releases it (docs/spec.md §3, "In flight"). Holds are ignored while
        :attr:`in_flight_hold` is off (a test's negative control)."""
        if state is None:
            return 0.0, False
        if self.in_flight_hold and state.held_until > now and state.held_until > state.next_allowed:
            return state.held_until, True
        return state.next_allowed, False

    @staticmethod
    def release_hold(state: HostState | None, token: int | None, *, end: float | None = None,
                     interval: float = 0.0) -> HostState | None:
        """The row with the in-flight hold of booking ``token`` released (docs/spec.md §3, "In flight"), or None
        when the row is not held by that booking (a later booking's hold is never released: nothing to write).

        Args:
            state: the row.
            token: the booking's hold token (None or 0: none).
            end: epoch seconds at which the request ended without a recorded answer (it was dropped after its
                booking, or failed before the server answered): the row is then also kept free of requests
                until ``end + interval``, as after an answer. None: the caller's record set ``next_allowed``.
            interval: seconds, the row's interval (with ``end``).
        """
        if state is None or not token or state.held_by != token:
            return None
        if end is None:
            return replace(state, held_until=0.0, held_by=0)
        return replace(state, held_until=0.0, held_by=0, next_allowed=max(state.next_allowed, end + interval),
                       updated=end)

    @staticmethod
    def finish_address(state: HostState | None, *, end: float, ip_interval: float, hold: int | None = None
                       ) -> HostState:
        """An address's row after a response from it ended at ``end`` (epoch s): the reference's
        ``finish``, ``next_allowed >= end + ip_interval`` (docs/spec.md §3), and the in-flight hold of booking
        ``hold`` released (if it is still that booking's). Never shortens a recorded ``next_allowed``."""
        old = state or NEVER_SEEN
        if hold and old.held_by == hold:
            return replace(old, next_allowed=max(old.next_allowed, end + ip_interval), updated=end,
                           held_until=0.0, held_by=0)
        return replace(old, next_allowed=max(old.next_allowed, end + ip_interval), updated=end)

    @staticmethod
    def restore(current: HostState | None, known: HostState) -> HostState:
        """A row written back into a table that came back empty (docs/spec.md §6, "A table that comes back
        empty"): what this process knew of it (``known``, the last it read or wrote), merged with what the
        table holds now (``current``: None, or a row another process wrote or restored since). Only more
        waiting can follow: every hold and backoff as long as the longer of the two, every published number
        (Crawl-delay, each origin's, an announced quota's interval) the larger, the quota's count from the later-counted
        response, the in-flight hold of the later booking."""
        if current is None:
            return known
        crawl_delay = max(current.crawl_delay, known.crawl_delay)
        newer, older = (known, current) if known.quota_serial > current.quota_serial else (current, known)
        held = known if known.held_until > current.held_until else current
        adaptive = known if known.updated > current.updated else current
        return replace(
            current, next_allowed=max(current.next_allowed, known.next_allowed),
            consec=max(current.consec, known.consec),
            crawl_delay=crawl_delay,
            origin_delays=merge_origin_delays(current_entries(current.origin_delays, current.crawl_delay),
                                              current_entries(known.origin_delays, known.crawl_delay), crawl_delay),
            ok_seen=current.ok_seen or known.ok_seen,
            throttled_at=max(current.throttled_at, known.throttled_at), updated=max(current.updated, known.updated),
            ratelimit_interval=max(current.ratelimit_interval, known.ratelimit_interval),
            ratelimit_until=max(current.ratelimit_until, known.ratelimit_until), quota_left=newer.quota_left,
            quota_reset=newer.quota_reset, quota_limit=newer.quota_limit or older.quota_limit,
            quota_window=newer.quota_window or older.quota_window, quota_serial=newer.quota_serial,
            booked=max(current.booked, known.booked), latency=adaptive.latency,
            strain=max(current.strain, known.strain),
            run_retry_after=max(current.run_retry_after, known.run_retry_after),
            held_until=held.held_until, held_by=held.held_by)


def _announces_quota(state: HostState) -> bool:
    """The host has announced a quota (an interval, a remaining count or a quota's size) at some point."""
    return state.ratelimit_interval > 0 or state.quota_left >= 0 or state.quota_limit > 0 or state.booked > 0
