"""Booking a request before it is sent (docs/spec.md §3, §5): the host's line, the addresses' lines, the
booking transaction, and the choice between go, wait in line and defer.

The durations are decided by :class:`~scrapy_polite.policy.PacingPolicy` (``book``, ``defer_verdict``);
this module only orders the steps and waits without blocking the reactor.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredList

from ..clock import ClockSync
from ..policy import Booking, HostState, PacingPolicy, ip_key
from ..reports.counters import Report
from ..settings import PoliteConfig
from ..stores import ManyUpdateFn, Snapshot, StoreError
from ..vocabulary import BURST_META, DELAY_META, HOST_META, INVALID_DELAY_META, IP_META, DeferralReason, parse_seconds
from .lifecycle import Hold, Lifecycle
from .outage import DeferredStore
from .reactor import await_deferred
from .resolution import Resolution
from .seams import Closing, Defer, Go, HoldingScheduler

if TYPE_CHECKING:
    from scrapy import Request

logger = logging.getLogger(__name__)

__all__ = ["Booker", "booking_update"]

#: ``DOWNLOAD_TIMEOUT``'s default in Scrapy (seconds): the hold's bound when no valid timeout is known.
DEFAULT_TIMEOUT = 180.0
#: Seconds: a request that would wait in line at least this long while the downloader is full and others wait to
#: enter it is deferred until its turn instead (docs/spec.md §5, "A full downloader"); a shorter wait is waited.
CROWDED_WAIT = 0.1
#: How many addresses' last budget deferrals are kept before those past are swept (:func:`stagger`).
STAGGER_SWEEP = 1024


def _timeout(value: Any) -> float | None:
    """A download timeout (seconds > 0, finite) from a setting or ``meta['download_timeout']``, or None (the
    booking takes a finite float > 0 as it is, without this call)."""
    seconds = parse_seconds(value)
    return seconds if seconds else None


def booking_update(policy: PacingPolicy, host: str, addresses: list[str], floor: float, ip_interval: float,
                   hold: tuple[int, float] | None = None) -> tuple[list[str], ManyUpdateFn[tuple[Booking, float]]]:
    """The booking transaction of one request (docs/spec.md §3): the keys to read (the host's row, then the
    ``ip:`` row of each of ``addresses``) and the update function to run on them with
    :meth:`~scrapy_polite.stores.PaceStore.update_many`, whose result is ``(booking, the store's now)``.

    Args:
        policy: the pacing rules (:meth:`PacingPolicy.book <scrapy_polite.policy.PacingPolicy.book>`).
        host: the host key.
        addresses: the addresses the request may be booked on, in order of preference (their lines free).
        floor: seconds, the request's interval override (0: none).
        ip_interval: ``POLITE_IP_INTERVAL``, seconds.
        hold: ``(token, download timeout in seconds)``: hold the booked rows while the request is in flight
            (docs/spec.md §3, "In flight"); None: hold nothing.

    Raises:
        ValueError: an address is not an IP address.
    """
    # Loops, not comprehensions: each comprehension is a call of its own (Python < 3.12), on every booking.
    keys: dict[str, str] = {}
    for a in addresses:
        keys[a] = ip_key(a)

    def fn(states: dict[str, HostState | None], now: float) -> tuple[dict[str, HostState],
                                                                     tuple[Booking, float]]:
        rows: dict[str, HostState | None] = {}
        for a, k in keys.items():
            rows[a] = states[k]
        booking = policy.book(states[host], rows, now=now, floor=floor, ip_interval=ip_interval, hold=hold)
        writes: dict[str, HostState] = {}
        for a, state in booking.writes.items():
            writes[host if a == "" else keys[a]] = state
        return writes, (booking, now)

    return [host, *keys.values()], fn


def _hold_of(booking: Booking, host: str, token: int, ip_interval: float) -> Hold | None:
    """The in-flight hold ``booking`` took (the rows it wrote with ``token``, each with the interval its release
    keeps free: the host's, ``ip_interval`` seconds for an address), or None (docs/spec.md §3, "In flight")."""
    keys: dict[str, float] = {}
    for key, row in booking.writes.items():  # a loop: no call of a comprehension's own per booking
        if row.held_by == token:
            keys[host if key == "" else ip_key(key)] = booking.interval if key == "" else ip_interval
    return Hold(token, keys) if keys else None


def stagger(slots: dict[str, float], key: str, start: float, interval: float, now: float) -> float:
    """The due time (the table's clock, s) of a request deferred for the budget of the address ``key``, free at
    ``start``: ``interval`` s (``POLITE_IP_INTERVAL`` over the host's addresses) after the last one deferred for it
    (``slots``: key → its due), so the requests deferred for one address come back one by one, not all at once to
    be deferred again (docs/spec.md §5)."""
    last = slots.get(key)
    due = start if last is None or last + interval <= start else last + interval
    if len(slots) >= STAGGER_SWEEP and key not in slots:
        for old in [k for k, at in slots.items() if at < now]:
            del slots[old]
    slots[key] = due
    return due


class Booker:
    """Books the requests of one crawler on their hosts and addresses.

    Args:
        config: the validated settings.
        store: the pace table.
        lifecycle: the owner of the process's requests, lines and claims (docs/spec.md §5).
        resolution: resolution and pinning.
        report: counters and stats.
        clock: this process's clock (epoch s) and its offset to the table's clock.
        sleep: ``sleep(seconds) -> Deferred`` that never blocks the reactor.
        on_store_error: called with a :class:`~scrapy_polite.stores.StoreError` (stops the crawl).
        download_timeout: ``DOWNLOAD_TIMEOUT``, seconds: with the row's interval, the bound of a booking's in-flight
            hold when the request sets no ``download_timeout`` of its own (docs/spec.md §3, "In flight").
    """

    def __init__(self, config: PoliteConfig, store: DeferredStore, lifecycle: Lifecycle, resolution: Resolution,
                 report: Report, clock: ClockSync, sleep: Callable[[float], Deferred[None]],
                 on_store_error: Callable[[StoreError], None], download_timeout: float = DEFAULT_TIMEOUT) -> None:
        self.config = config
        self.policy: PacingPolicy = config.policy
        self.store = store
        self.lifecycle = lifecycle
        self.resolution = resolution
        self.report = report
        self.clock = clock
        self.sleep = sleep
        self.on_store_error = on_store_error
        self.scheduler: HoldingScheduler | None = None
        self.scheduler_closed = False  # a scheduler was attached and has closed (nothing held any more)
        self.spider_delay: float | None = None
        self._warned_no_scheduler = False
        self.download_timeout = _timeout(download_timeout) or DEFAULT_TIMEOUT
        self._releasing: set[Deferred[Any]] = set()  # in-flight holds' releases being written (awaited at close)
        # Hold tokens: random in their high bits (another process's tokens differ), counted in the low ones.
        self._tokens = itertools.count((int.from_bytes(os.urandom(4), "big") << 30) | 1)
        self._budget_slots: dict[str, float] = {}  # ip: key → the due of its last budget deferral (stagger)

    def attach(self, scheduler: HoldingScheduler | None) -> None:
        """Wire the scheduler that holds deferrals, at its open (None at its close); the lifecycle wakes it."""
        self.scheduler_closed = scheduler is None and (self.scheduler is not None or self.scheduler_closed)
        self.scheduler = scheduler
        self.lifecycle.wake, self.lifecycle.ended = ((scheduler.wake, scheduler.ended) if scheduler is not None
                                                     else (None, None))

    # -- inputs -----------------------------------------------------------------------------------------

    def override(self, host: str, request: Request | None = None) -> float | None:
        """The largest per-host (``POLITE_HOST_DELAYS``), per-spider (``crawl_delay`` attribute) and
        per-request (``meta['polite_delay']``) interval for this request, seconds, or None (docs/spec.md §5).
        An invalid ``polite_delay`` is ignored, logged and counted once (``polite/invalid_meta``)."""
        host_delay = self.config.host_delays.get(host) if self.config.host_delays else None
        meta = request.meta if request is not None else None
        if host_delay is None and self.spider_delay is None and (meta is None or DELAY_META not in meta):
            return None  # the usual case, without building the list below (called several times per request)
        values = [v for v in (host_delay, self.spider_delay) if v is not None]
        if request is not None and meta is not None and DELAY_META in meta:
            if (value := parse_seconds(raw := meta[DELAY_META])) is not None:
                values.append(value)
            elif not request.meta.get(INVALID_DELAY_META):
                request.meta[INVALID_DELAY_META] = True
                self.report.inc("invalid_meta")
                logger.warning("Ignoring meta['polite_delay']=%r of %s: not a number of seconds >= 0",
                               raw, request)
        return max(values) if values else None

    def can_defer(self, request: Request) -> bool:
        """Whether the request can leave the downloader: only requests our scheduler handed out can be
        held and re-injected (a request from ``engine.download()``, e.g. robots.txt, must wait)."""
        if self.scheduler is None:
            if not self._warned_no_scheduler:
                self._warned_no_scheduler = True
                logger.warning(
                    "scrapy-polite: SCHEDULER is not scrapy_polite.scheduler.PoliteScheduler, so throttled "
                    "hosts cannot be deferred: their requests wait in the downloader instead (still paced). "
                    "Enable the add-on (ADDONS = {'scrapy_polite.Addon': 0}) to get deferral.")
            return False
        return self.scheduler.owns(request)

    # -- the steps --------------------------------------------------------------------------------------

    def defer(self, host: str, due: float | None, reason: DeferralReason, request: Request | None = None) -> Defer:
        """Count a deferral of ``host`` (of ``request``, if known); ``due``: this process's clock, or None."""
        self.report.deferred(host, reason, request.url if request is not None else None, due)
        return Defer(due=due, reason=reason)

    def _leave(self, request: Request, host: str, due: float | None, reason: DeferralReason) -> Defer:
        """:meth:`release` ``request`` and :meth:`defer` it until ``due`` (the table's clock; None: its line frees)."""
        self.release(request, host)
        return self.defer(host, None if due is None else self.clock.to_local(due), reason, request)

    async def _read(self, host: str) -> Snapshot:
        try:
            snapshot = await await_deferred(self.store.read([host]))
        except StoreError as exc:
            self.on_store_error(exc)
            raise
        self.clock.observe(snapshot.now)
        return snapshot

    async def _wait(self, host: str, seconds: float, request: Request | None = None) -> None:
        if seconds <= 0:
            return
        self.report.waited(host, seconds)
        self.report.events.wait(host, request.url if request is not None else None, seconds)
        await await_deferred(self.sleep(seconds))

    async def before_request(self, request: Request, host: str) -> Go | Defer:
        """Book the request on its host and one of its addresses: :class:`Go` once it may be sent,
        :class:`Defer` when it must leave the downloader. Waits without blocking the reactor.

        Raises:
            BlockedHost: (an ``IgnoreRequest``) every address of the host is non-public.
            DNSLookupError: the host cannot be resolved (NXDOMAIN, SERVFAIL, timeout).
            StoreError: the pace table cannot be read or written (the crawl is being stopped).
        """
        scheduler = self.scheduler  # can_defer(request), without its call when a scheduler holds requests
        deferrable = scheduler.owns(request) if scheduler is not None else self.can_defer(request)
        override, burst = self.override(host, request), bool(request.meta.get(BURST_META))
        behind = deferrable and scheduler is not None and scheduler.behind(request, host)  # asked while it claims
        taken = self.lifecycle.arrive(request, host, take_line=not burst)  # from its claim to its line in one move
        try:  # the early deferral, on the row this process knows (docs/spec.md §5): no lookup, no booking
            if deferrable:
                known = self.policy.defer_verdict(self.report.known(host), self.clock.store_now(), override=override)
                if known is not None:
                    return self._leave(request, host, known.due, known.reason)
            if burst:
                return await self._burst(request, host, override, deferrable)
            if behind:
                return self._leave(request, host, None, "line")  # behind its host's held ones, in order (§5)
            while not (taken or self.lifecycle.take(host, request)):  # never assigned: re-checked after each wait
                if deferrable:
                    return self.defer(host, None, "line", request)
                await await_deferred(self.lifecycle.wait_for([host]))
            return await self._book(request, host, override, deferrable)
        except BaseException as exc:
            self.release(request, host)
            if deferrable and isinstance(exc, Closing):  # the close began while it waited: held (JOBDIR keeps it)
                return self.defer(host, self.clock.clock(), "turn", request)
            raise

    async def _burst(self, request: Request, host: str, override: float | None, deferrable: bool) -> Go | Defer:
        """A burst request skips the interval unless its host should defer (docs/spec.md §5, burst)."""
        while True:
            # The decision answers for the host's mood at this moment, before the read: a throttle
            # recorded later makes this request's response stale (docs/spec.md §2) and, if it has not been sent
            # yet, sends it back to be deferred (Recorder.throttled_since).
            decided_at = self.clock.clock()
            snapshot = await self._read(host)
            verdict = self.policy.defer_verdict(snapshot.states[host], snapshot.now, override=override)
            if verdict is None:
                break
            if deferrable:
                return self.defer(host, self.clock.to_local(verdict.due), verdict.reason, request)
            await self._wait(host, self.policy.wait(snapshot.states[host], snapshot.now), request)
        addresses = await self.resolution.addresses(request, host)  # resolved at the decision (docs/spec.md §3)
        self.report.inc("burst")
        self.lifecycle.sent(request)
        self.report.counters(host).requests += 1
        go = Go(sent_at=decided_at - self.clock.offset, address=addresses[0] if addresses else None)
        self.report.events.booking(host, request.url, at=go.sent_at, due=None, address=go.address, reason="burst")
        return go

    async def _book(self, request: Request, host: str, override: float | None, deferrable: bool) -> Go | Defer:
        lifecycle = self.lifecycle
        floor = self.policy.effective_interval(None, override)
        ip_interval = self.config.ip_interval
        while True:
            # Resolved here, next in line for its host and before each booking transaction: every booking uses an
            # answer no older than its TTL, and a deferred request resolves only when it comes back (docs/spec.md §3).
            addresses = await self.resolution.addresses(request, host)
            ip_paced = bool(addresses) and ip_interval > 0
            all_addresses = addresses or []
            free = [a for a in all_addresses if not lifecycle.busy(ip_key(a))] if ip_paced else []
            if ip_paced and not free:  # every address has a request of ours in flight
                keys = [ip_key(a) for a in all_addresses]
                if deferrable and lifecycle.has_live_waiters(keys):
                    self.release(request, host)
                    lifecycle.wait_on_addresses(host, keys)
                    return self.defer(host, None, "ip_line", request)
                await await_deferred(lifecycle.wait_for(keys))
                continue
            timeout = request.meta.get("download_timeout")  # a float > 0 as a rule (DownloadTimeoutMiddleware's)
            hold = (next(self._tokens), timeout if type(timeout) is float and 0.0 < timeout < math.inf
                    else _timeout(timeout) or self.download_timeout)
            booking, now = await self._transact(host, free, floor, ip_interval, hold)
            if booking.booked:
                address = booking.address or (all_addresses[0] if all_addresses else None)
                return await self._go(request, host, booking, now, address, ip_paced, hold[0])
            verdict = self.policy.defer_verdict(booking.host, now, override=override)
            if verdict is not None and deferrable:
                self.report.know(host, booking.host)
                return self._leave(request, host, verdict.due, verdict.reason)
            if booking.held:
                # Another process's request in flight (§3 "In flight"), or one of ours that took the address's line
                # while this transaction waited: ask again one interval later, out of the downloader if it can leave.
                ours = ip_paced and any(lifecycle.busy(ip_key(a)) for a in free)
                if not ours:
                    self.report.inc("held_in_flight")
                    self.report.counters(host).held_elsewhere_until = self.clock.to_local(booking.start)
                if deferrable:
                    return self._leave(request, host, now + booking.poll, "ip_line" if ours else "line")
                await self._wait(host, booking.poll, request)
                continue
            if deferrable and booking.start - now >= CROWDED_WAIT and booking.start <= booking.host_free \
                    and self.scheduler is not None and self.scheduler.crowded(request):
                # Its host's turn (not an address's budget), waited out of a full downloader, once (§5).
                return self._leave(request, host, booking.start, "turn")
            # Waiting for an address's budget (not the host's): one request per address waits in line,
            # the next defers until that moment (docs/spec.md §5).
            waiting_key = ip_key(booking.address) if booking.address is not None else None
            if waiting_key is not None and booking.start > booking.host_free:
                if not lifecycle.wait_for_budget(waiting_key, request) and deferrable:
                    return self._leave(request, host, stagger(self._budget_slots, waiting_key, booking.start,
                                                              ip_interval / len(all_addresses), now), "ip_line")
            else:
                waiting_key = None
            try:
                await self._wait(host, min(booking.start - now, self.policy.max_wait), request)
            finally:
                if waiting_key is not None:
                    lifecycle.end_budget_wait(waiting_key, request)

    async def _go(self, request: Request, host: str, booking: Booking, now: float, address: str | None,
                  ip_paced: bool, token: int) -> Go:
        """The booked request leaves for ``address``, once its address's line is its own when ``ip_paced``."""
        lifecycle = self.lifecycle
        hold = _hold_of(booking, host, token, self.config.ip_interval)
        if ip_paced and address is not None:
            # The transaction was awaited: another request of ours may have taken the address's
            # line meanwhile. The booking stands (the table spaced it after every earlier one);
            # the request waits until the line is its own (docs/spec.md §5).
            lifecycle.booked(request, hold)
            if not lifecycle.take(key := ip_key(address), request):
                self.report.inc("ip_line/retaken")
                while not lifecycle.take(key, request):
                    await await_deferred(lifecycle.wait_for([key]))
                now = await self._address_free(host, key, request)
        lifecycle.sent(request, hold)
        self.report.booked(host)
        self.report.events.booking(host, request.url, at=now, address=address,
                                   due=booking.host.next_allowed if booking.host is not None else None,
                                   interval=booking.interval,
                                   ip_interval=self.config.ip_interval if booking.address is not None else 0.0)
        return Go(sent_at=now, address=address, serial=booking.host.booked if booking.host is not None else None)

    async def _address_free(self, host: str, key: str, request: Request) -> float:
        """After waiting for the address's line: the other request's finish moved the address to its end
        plus ``POLITE_IP_INTERVAL`` (docs/spec.md §3), so wait for that moment too; returns the store's time
        the request goes at (its ``polite_sent_at``)."""
        while True:
            snapshot = await self._read(key)
            state = snapshot.states[key]
            ahead = (state.next_allowed if state is not None else 0.0) - snapshot.now
            if ahead <= 0:
                return snapshot.now
            await self._wait(host, min(ahead, self.policy.max_wait), request)

    async def _transact(self, host: str, addresses: list[str], floor: float, ip_interval: float,
                        hold: tuple[int, float] | None = None) -> tuple[Booking, float]:
        """One booking transaction over the host's row and the rows of ``addresses``."""
        keys, fn = booking_update(self.policy, host, addresses, floor, ip_interval, hold)
        try:
            booking, now = await await_deferred(self.store.update_many(keys, fn))
        except StoreError as exc:
            self.on_store_error(exc)
            raise
        self.clock.observe(now)
        return booking, now

    # -- after the request ------------------------------------------------------------------------------

    def release_holds(self) -> Deferred[Any] | None:
        """Release every hold still taken, and wait for the releases under way (the crawl's close: requests
        cancelled in flight leave none behind). None when there is nothing to wait for."""
        holds = self.lifecycle.take_holds()
        if holds:
            self._release_holds(holds)
        pending = list(self._releasing)
        return DeferredList(pending, consumeErrors=True) if pending else None

    def _release_holds(self, holds: list[Hold]) -> Deferred[Any]:
        release = self.policy.release_hold
        tokens = {key: (hold.token, interval) for hold in holds for key, interval in hold.keys.items()}

        def fn(states: dict[str, HostState | None], now: float) -> tuple[dict[str, HostState], int]:
            writes = {}
            for key, (token, interval) in tokens.items():
                row = release(states[key], token, end=now, interval=interval)
                if row is not None:
                    writes[key] = row
            return writes, len(writes)

        d = self.store.update_many(list(tokens), fn)
        d.addErrback(lambda failure: logger.debug("scrapy-polite: could not release the in-flight holds %s (they end "
                                                  "at their bound): %s", sorted(tokens), failure.value))
        if not d.called:
            self._releasing.add(d)
            d.addBoth(_discard, self._releasing, d)
        return d

    def release(self, request: Request, host: str | None = None) -> None:
        """Free the host's line, the line of the address it was booked on and its claim, if ``request``
        holds them (idempotent); release its in-flight hold in the table if it still has one; unpin it; the
        lifecycle wakes what waited on them (docs/spec.md §5)."""
        host = host or request.meta.get(HOST_META) or self.lifecycle.host_of(request)
        if host is not None:
            self.lifecycle.free(request, host, self._let_go(request, host))

    def _let_go(self, request: Request, host: str) -> str | None:
        """Release the in-flight hold of ``request`` if its record did not (it ended without an answer: each row free
        of requests one interval after now, docs/spec.md §3, "In flight"; a failed write is logged, the hold then ends
        at its bound), and unpin it. Returns the key of its address's line, or None."""
        hold = self.lifecycle.take_hold(request)  # as a rule its record took it: None
        if hold is not None:
            self._release_holds([hold])
        address = request.meta.get(IP_META)
        if not address:
            return None
        self.resolution.unpin(request, host)
        return ip_key(address)

    def held(self, request: Request, host: str) -> None:
        """``request`` is held by the scheduler: :meth:`release`, and its stage is ``held``, in one move of the
        lifecycle (docs/spec.md §5)."""
        self.lifecycle.held(request, host, self._let_go(request, host))

    def end(self, request: Request, host: str | None = None, *, dropped: bool = False) -> None:
        """``request`` leaves the process's pacing: :meth:`release`, then its stage is ``finished`` (or
        ``dropped``: it left without a download), in one move of the lifecycle."""
        host = host or request.meta.get(HOST_META) or self.lifecycle.host_of(request)
        self.lifecycle.end(request, host, self._let_go(request, host) if host is not None else None, dropped=dropped)

    async def early_due(self, request: Request, host: str, unless: Callable[[], bool] | None = None) -> float | None:
        """When a request of a host that should defer now (docs/spec.md §2) may come back (this process's clock, epoch
        s), counting the deferral; None when it need not defer, or ``unless()`` (then asked) is True."""
        snapshot = await self._read(host)
        verdict = self.policy.defer_verdict(snapshot.states[host], snapshot.now,
                                            override=self.override(host, request))
        if verdict is None or (unless is not None and unless()):
            return None
        due = self.clock.to_local(verdict.due)
        self.defer(host, due, verdict.reason, request)
        return due

    async def due(self, host: str) -> float:
        """When the host may be requested next (this process's clock, epoch s; now when it is free)."""
        snapshot = await self._read(host)
        state = snapshot.states[host]
        return self.clock.to_local(max(snapshot.now, state.next_allowed if state is not None else 0.0))


def _discard(result: Any, pending: set[Deferred[Any]], d: Deferred[Any]) -> Any:
    """``d`` fired: it is no longer pending (passes ``result`` on)."""
    pending.discard(d)
    return result
