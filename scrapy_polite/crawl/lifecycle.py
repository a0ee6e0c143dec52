"""The one owner of a paced request's life inside a process (docs/spec.md §5, "The request lifecycle").

Every paced request moves through explicit stages, and only this module moves it:

* ``held`` — the :class:`~scrapy_polite.scheduler.PoliteScheduler` keeps it out of the downloader;
* ``released`` — the scheduler handed it to the engine; until it reaches the booking (or leaves) it
  *claims* its host, so the host's next held or new request waits for it;
* ``waiting`` — it reached the pacing middleware and waits for its host's line, its address's line or its
  booking;
* ``booked`` / ``in flight`` — it holds its host's line (and its address's line) and is being sent;
* ``finished`` — its response or download failure was handled;
* ``dropped`` — it left without a download: ``IgnoreRequest`` from any component (``RobotsTxtMiddleware``,
  ``OffsiteMiddleware``, a project's middleware), a response made by a middleware or the HTTP cache, a
  request returned in its place, the engine closing.

**The rule** (what used to be owned by no one): whatever way a request leaves a stage, the lines and the
claim it held are freed and every host waiting on them is woken. A host is parked only while its line is
actually taken, its claim is out, or an address line it waits for is taken (:meth:`Lifecycle.parkable`).

The explicit exits are called by the middleware and the booking; :meth:`Lifecycle.reconcile` is the
backstop for any path that bypasses them (a middleware that returns a Request in place of ours, one after
ours that swallows the exception): a request holding a line or a claim that the downloader no longer has
(Scrapy's ``Downloader.active``) has left, and is dropped (``polite/lifecycle/reclaimed``).

Lines are *taken*, never assigned (:meth:`Lifecycle.take`): after any await, a line is re-checked and the
request waits again if another took it meanwhile.

Each request's place is one :class:`Paced` record, and every move checks the stage it leaves
(:data:`ENTERED_FROM`): an illegal move is counted (``polite/lifecycle/illegal``) and logged, and raises
:class:`IllegalMove` where :data:`STRICT` is on (the tests). A request that has ended may start a new pass (held
again for a throttle retry, or sent again by a project's middleware).
"""

from __future__ import annotations

import enum
import logging
import weakref
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any
from weakref import ref

from twisted.internet import defer

__all__ = ["ENTERED_FROM", "IN_DOWNLOADER", "Hold", "IllegalMove", "Stage", "Lifecycle", "Line", "Paced"]

logger = logging.getLogger(__name__)


class Stage(str, enum.Enum):
    """The stages of a paced request (docs/spec.md §5, "The request lifecycle")."""

    HELD = "held"
    RELEASED = "released"
    WAITING = "waiting"
    BOOKED = "booked"
    IN_FLIGHT = "in flight"
    FINISHED = "finished"
    DROPPED = "dropped"


#: The stages a request has left the process's pacing in.
ENDED = frozenset({Stage.FINISHED, Stage.DROPPED})

#: The stages of a request the engine has (handed out by the scheduler, not ended): one the scheduler is given
#: again in one of them left by a path no middleware of ours saw.
IN_DOWNLOADER = frozenset({Stage.RELEASED, Stage.WAITING, Stage.BOOKED, Stage.IN_FLIGHT})

#: The stages each stage may be entered from (None: a request this lifecycle has not seen; an ended request may
#: begin a new pass). ``finished`` and ``dropped`` are entered from any stage (:meth:`Lifecycle.end`).
ENTERED_FROM: dict[Stage, frozenset[Stage | None]] = {
    Stage.HELD: frozenset({None, Stage.RELEASED, Stage.WAITING, Stage.BOOKED, Stage.IN_FLIGHT, *ENDED}),
    Stage.RELEASED: frozenset({None, Stage.HELD, *ENDED}),
    Stage.WAITING: frozenset({None, Stage.RELEASED, *ENDED}),
    Stage.BOOKED: frozenset({Stage.WAITING}),
    Stage.IN_FLIGHT: frozenset({Stage.WAITING, Stage.BOOKED}),
}

#: Raise :class:`IllegalMove` on an illegal move instead of counting and logging it (tests/conftest.py turns it on).
STRICT = False


class IllegalMove(AssertionError):
    """A request was moved to a stage it may not enter from the one it was in (:data:`ENTERED_FROM`)."""


@dataclass(slots=True)
class Paced:
    """One paced request's place in its life (like Scrapy's download ``Slot``, one record per request).

    Attributes:
        stage: where it is now.
        host: the host key it was held, released or booked for (None: not known yet).
        claimed: the host whose claim it holds (released by the scheduler, not arrived yet), or None.
        had_turn: it was held once, so it is handed out in its host's turn (a full downloader does not send it back
            again: docs/spec.md §5, "A full downloader").
    """

    stage: Stage | None = None
    host: str | None = None
    claimed: str | None = None
    had_turn: bool = False


@dataclass(slots=True)
class Hold:
    """The in-flight hold a booking of this process took on the pace table's rows (docs/spec.md §3, "In
    flight"): released by the request's record, or by its end without one.

    Attributes:
        token: the hold's token in the rows (``HostState.held_by``).
        keys: the rows held (the host's key, and the ``ip:`` key of the address it was booked on), each with the
            interval (seconds) its release keeps it free of requests after an end without an answer.
    """

    token: int
    keys: dict[str, float]


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


class Lifecycle:
    """The stages, lines and claims of every paced request of one crawler (docs/spec.md §5).

    Host keys and ``ip:`` keys share one namespace of lines. Nothing here waits on the reactor except the
    Deferreds handed out by :meth:`wait_for`; nothing reads a clock.

    Args:
        wake: ``wake(host)``, called when something that held the host back is gone (the scheduler then
            hands out the host's next held request as soon as it is due); None until a scheduler attaches.
        inc: ``inc(stat_key, count)``, adds ``count`` to ``polite/<stat_key>``.
        ended: ``ended(request)``, called when a request leaves the process's pacing (``finished`` or
            ``dropped``); None until a scheduler attaches.
    """

    def __init__(self, wake: Callable[[str], None] | None = None,
                 inc: Callable[[str, float], None] | None = None,
                 ended: Callable[[Any], None] | None = None) -> None:
        self.wake = wake
        #: ``ended(request)``, called once when a request leaves (finished or dropped): the home of held
        #: requests ends its lease (:class:`~scrapy_polite.frontier.leases.RedisFrontier`); None: nothing to tell.
        self.ended = ended
        self._inc = inc
        self._lines: dict[str, Line] = {}
        self._claims: dict[str, Any] = {}  # host → its released request on its way to the booking
        self._waiting_hosts: dict[str, set[str]] = {}  # ip: key → hosts deferred until it frees
        #: request → its place (freed with the request). Read through :attr:`_rows`, the map's own dict (CPython's
        #: ``WeakKeyDictionary.data``, keyed by weak references): ``_rows.get(ref(request))`` answers as
        #: ``_paced.get(request)`` does, without a Python-level call, several times per page; written through the map.
        self._paced: weakref.WeakKeyDictionary[Any, Paced] = weakref.WeakKeyDictionary()
        self._rows: dict[weakref.ref[Any], Paced] = vars(self._paced)["data"]
        self._illegal_seen: set[tuple[Stage | None, Stage]] = set()
        self._budget_waiters: dict[str, Any] = {}  # ip: key → the request waiting for its budget
        self._holds: dict[Any, Hold] = {}  # request → the in-flight hold its booking took in the table

    # -- what is known -----------------------------------------------------------------------------------

    def stage(self, request: Any) -> Stage | None:
        """The request's stage (None: never seen, or garbage-collected)."""
        paced = self._rows.get(ref(request))
        return paced.stage if paced is not None else None

    def host_of(self, request: Any) -> str | None:
        """The host key the request was held, released or booked for (None: unknown)."""
        paced = self._rows.get(ref(request))
        return paced.host if paced is not None else None

    def busy(self, key: str) -> bool:
        """Some request holds the key's line."""
        line = self._lines.get(key)
        return line is not None and line.holder is not None

    def holds(self, key: str, request: Any) -> bool:
        """``request`` holds the key's line."""
        line = self._lines.get(key)
        return line is not None and line.holder is request

    def had_turn(self, request: Any) -> bool:
        """``request`` was held once (:attr:`Paced.had_turn`)."""
        paced = self._rows.get(ref(request))
        return paced is not None and paced.had_turn

    def blocked(self, host: str) -> bool:
        """The host's next held request must wait: its line is taken or its claim is out."""
        line = self._lines.get(host)  # busy(host), inline: asked for every held host the scheduler looks at
        return host in self._claims or (line is not None and line.holder is not None)

    def parkable(self, host: str) -> bool:
        """The host may wait "until its line frees": something that will wake it holds it back (its line,
        its claim, or a taken address line it was deferred on). A host that is not parkable is due now."""
        if self.blocked(host):
            return True
        return any(host in hosts and self.busy(key) for key, hosts in self._waiting_hosts.items())

    def blocked_hosts(self) -> set[str]:
        """Every host whose next held request must wait (:meth:`blocked`): its line is taken or its claim
        is out. Bounded by the lines and claims in use."""
        hosts = {key for key, line in self._lines.items() if line.holder is not None and not key.startswith("ip:")}
        hosts.update(self._claims)
        return hosts

    def lines_kept(self) -> int:
        """How many lines are kept (taken, or with requests waiting for them): bounded by the lines in use."""
        return len(self._lines)

    def holders(self) -> list[tuple[str, Any]]:
        """``(key, request)`` for every taken line and every claim (key ``claim:<host>``)."""
        out = [(key, line.holder) for key, line in self._lines.items() if line.holder is not None]
        out.extend((f"claim:{host}", request) for host, request in self._claims.items())
        return out

    # -- the scheduler's moves ----------------------------------------------------------------------------

    def held(self, request: Any, host: str, address_key: str | None = None) -> None:
        """``request`` is held by the scheduler (deferred, or resumed from disk): it gives up its claim and
        any line it still held (its address's: ``address_key``), and whatever waited on those is woken."""
        paced = self._checked(request, Stage.HELD)
        paced.host = host
        self._free(request, host, address_key)
        paced.stage, paced.had_turn = Stage.HELD, True

    def release(self, request: Any, host: str) -> None:
        """The scheduler handed ``request`` to the engine: it claims its host until it reaches the booking
        (:meth:`arrive`) or leaves (:meth:`end`)."""
        paced = self._move(request, Stage.RELEASED, host)
        self._claims[host] = request  # the scheduler releases a host only when it is not blocked()
        paced.claimed = host  # ended by this host, whatever host the request arrives for

    # -- the middleware's and the booking's moves -----------------------------------------------------

    def arrive(self, request: Any, host: str, *, take_line: bool = False) -> bool:
        """``request`` reached the pacing middleware for ``host``: its claim (if any) is over; it now waits
        for its line or its booking. ``take_line``: it takes the host's line first if it is free (:meth:`take`),
        so the host stays blocked from the claim to the line and nothing is woken for it. Otherwise the host is
        woken when nothing blocks it any more (:meth:`blocked`). True when the request holds the host's line."""
        paced = self._move(request, Stage.WAITING, host)
        taken = take_line and self.take(host, request)
        if paced.claimed is not None:
            self._end_claim(paced.claimed, request)
        return taken

    def take(self, key: str, request: Any) -> bool:
        """Take the key's line for ``request`` if it is free (or already its own); True when it holds it.
        Never assigns over another holder (docs/spec.md §5: lines are taken, never assigned)."""
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = Line()
        if line.holder is None:
            line.holder = request
            return True
        return line.holder is request

    def booked(self, request: Any, hold: Hold | None = None) -> None:
        """``request`` is booked in the table, holding ``hold`` (None: none); it may still wait for its address's line
        (docs/spec.md §5)."""
        self._move(request, Stage.BOOKED)
        if hold is not None:
            self._holds[request] = hold

    def sent(self, request: Any, hold: Hold | None = None) -> None:
        """``request`` goes to the download handler (``in flight``), holding ``hold`` in the table (None: its
        booking held no row)."""
        self._move(request, Stage.IN_FLIGHT)
        if hold is not None:
            self._holds[request] = hold

    def take_hold(self, request: Any) -> Hold | None:
        """The in-flight hold of ``request``, now the caller's to release (its record, or the release of an end
        without one); None when it holds none, or it was taken already."""
        return self._holds.pop(request, None)

    def hold_tokens(self) -> set[int]:
        """The tokens of the in-flight holds this process's requests took and have not released (a restored table
        gets back only these: docs/spec.md §6, "A table that comes back empty")."""
        return {hold.token for hold in self._holds.values()}

    def take_holds(self) -> list[Hold]:
        """Every hold still taken (the crawl's close releases them: nothing this process started outlives it)."""
        holds, self._holds = list(self._holds.values()), {}
        return holds

    def has_live_waiters(self, keys: Iterable[str]) -> bool:
        """Some request is waiting for one of these lines to free."""
        return any(not d.called for key in keys if (line := self._lines.get(key)) is not None for d in line.freed)

    def wait_for(self, keys: Iterable[str]) -> defer.Deferred[None]:
        """A Deferred that fires when any of the lines of ``keys`` is freed (the waiter must then
        :meth:`take` it: another may have been first)."""
        d: defer.Deferred[None] = defer.Deferred()
        for key in keys:
            line = self._lines.get(key)
            if line is None:
                line = self._lines[key] = Line()
            line.freed = [w for w in line.freed if not w.called]  # a wait on several lines fired by another
            line.freed.append(d)
        return d

    def wait_for_budget(self, key: str, request: Any) -> bool:
        """``request`` waits in line for the budget of the address ``key`` (docs/spec.md §5: one request per
        address waits, the next defers); False when another request already waits for it (this one is not
        registered: it defers, or waits unregistered when it cannot be deferred)."""
        waiter = self._budget_waiters.get(key)
        if waiter is not None and waiter is not request:
            return False
        self._budget_waiters[key] = request
        return True

    def end_budget_wait(self, key: str, request: Any) -> None:
        """``request`` no longer waits for the address's budget (idempotent; another's wait is kept)."""
        if self._budget_waiters.get(key) is request:
            del self._budget_waiters[key]

    def wait_on_addresses(self, host: str, keys: Iterable[str]) -> None:
        """``host`` is deferred until one of these address lines frees (each is taken now)."""
        for key in keys:
            self._waiting_hosts.setdefault(key, set()).add(host)

    def set_recording(self, host: str, request: Any, recording: defer.Deferred[Any]) -> bool:
        """Attach the response record of ``request`` to its host's line (awaited before the line is
        freed); False when it does not hold the line."""
        line = self._lines.get(host)
        if line is None or line.holder is not request:
            return False
        line.recording = recording
        return True

    def take_recording(self, host: str, request: Any) -> defer.Deferred[Any] | None:
        """The response record attached to the host's line by its holder ``request`` (detached), or None."""
        line = self._lines.get(host)
        if line is None or line.holder is not request:
            return None
        recording, line.recording = line.recording, None
        return recording

    def free(self, request: Any, host: str | None, address_key: str | None = None) -> None:
        """``request`` gives up its host's line, its address's line (``address_key``) and its claim, when it
        holds them (idempotent); whatever waited on them is woken. Its stage is not changed (it is deferred,
        or ends next)."""
        host = host if host is not None else self.host_of(request)
        if host is None:
            return
        self._free(request, host, address_key)

    def end(self, request: Any, host: str | None = None, address_key: str | None = None, *,
            dropped: bool = False) -> None:
        """``request`` leaves the process's pacing (``finished``; ``dropped`` when it left without a
        download): everything it held is freed and its waiters woken (idempotent)."""
        host = host if host is not None else self.host_of(request)
        if host is not None:
            self._free(request, host, address_key)
        paced = self._rows.get(ref(request))
        if paced is None:
            paced = self._paced[request] = Paced(host=host)
        if paced.stage not in ENDED:
            paced.stage = Stage.DROPPED if dropped else Stage.FINISHED
            if self.ended is not None:
                self.ended(request)

    # -- the backstop ----------------------------------------------------------------------------------

    def reconcile(self, active: Collection[Any] | None,
                  release: Callable[[Any], None] | None = None) -> int:
        """End every request that holds a line or a claim but is no longer in the downloader (``active``:
        Scrapy's ``Downloader.active``; None: unknown, nothing is done): it left by a path that bypassed the
        middleware (docs/spec.md §5). ``release(request)`` is called first for each (the booking's release:
        it unpins the request's address). Returns how many were ended, and adds them to
        ``polite/lifecycle/reclaimed``."""
        if active is None:
            return 0
        # holders() no longer in the downloader nor held by the scheduler (loops: no call of their own, once a second)
        gone: list[tuple[str, Any]] = []
        for key, line in self._lines.items():
            if line.holder is not None and line.holder not in active and self.stage(line.holder) != Stage.HELD:
                gone.append((key, line.holder))
        for host, request in self._claims.items():
            if request not in active and self.stage(request) != Stage.HELD:
                gone.append((f"claim:{host}", request))
        ended = 0
        seen: set[int] = set()
        for key, request in gone:
            if id(request) in seen:
                continue
            seen.add(id(request))
            ended += 1
            logger.debug("scrapy-polite: %s left without passing the pacing middleware (%s); freeing it",
                         request, key)
            if release is not None:
                release(request)
            if key.startswith("claim:"):
                self._end_claim(key[len("claim:"):], request)
            for line_key, line in list(self._lines.items()):
                if line.holder is request:
                    self._free_line(line_key, request)
            self.end(request, dropped=True)
        if ended and self._inc is not None:
            self._inc("lifecycle/reclaimed", ended)
        return ended

    # -- internals -------------------------------------------------------------------------------------

    def _move(self, request: Any, stage: Stage, host: str | None = None) -> Paced:
        """Move ``request`` to ``stage`` (for ``host``, when given), checked (:meth:`_checked`)."""
        paced = self._rows.get(ref(request))
        if paced is None:  # first seen (the scheduler's release of a new request)
            paced = self._paced[request] = Paced()
        if paced.stage not in ENTERED_FROM[stage]:  # an illegal move: counted and logged
            self._checked(request, stage)
        paced.stage = stage
        if host is not None:
            paced.host = host
        return paced

    def _checked(self, request: Any, stage: Stage) -> Paced:
        """The record of ``request``, about to enter ``stage``, checked against the stage it leaves
        (:data:`ENTERED_FROM`): an illegal move is counted and logged (the first of each kind at WARNING) and raises
        :class:`IllegalMove` when :data:`STRICT`; else it is made all the same (the request's lines stay owned)."""
        paced = self._rows.get(ref(request))
        if paced is None:
            paced = self._paced[request] = Paced()
        if paced.stage not in ENTERED_FROM[stage]:
            move = (paced.stage, stage)
            if self._inc is not None:
                self._inc("lifecycle/illegal", 1)
            log = logger.debug if move in self._illegal_seen else logger.warning
            self._illegal_seen.add(move)
            log("scrapy-polite: %s moved from %s to %s, which the request lifecycle does not allow (docs/spec.md §5)",
                request, paced.stage.value if paced.stage is not None else "nowhere", stage.value)
            if STRICT:
                raise IllegalMove(f"{request} moved from {paced.stage} to {stage}")
        return paced

    def _end_claim(self, host: str, request: Any) -> None:
        paced = self._rows.get(ref(request))
        if paced is not None:
            paced.claimed = None
        if self._claims.get(host) is request:
            del self._claims[host]
            line = self._lines.get(host)
            if line is None or line.holder is None:  # a taken line wakes the host when it frees (_free_line)
                self._wake(host)

    def _free(self, request: Any, host: str, address_key: str | None = None) -> None:
        paced = self._rows.get(ref(request))
        if paced is not None and paced.claimed is not None:
            self._end_claim(paced.claimed, request)
        self._free_line(host, request)
        if address_key is not None:
            self._free_line(address_key, request)

    def _free_line(self, key: str, request: Any) -> bool:
        """Free the key's line if ``request`` holds it and wake its waiters (the requests waiting for it, the
        hosts deferred on it, and the host itself for a host's line); True when it did."""
        line = self._lines.get(key)
        if line is None or line.holder is not request:
            return False
        line.holder = None
        line.recording = None
        waiters, line.freed = ([d for d in line.freed if not d.called] if line.freed else line.freed), []
        del self._lines[key]  # bounded by the lines in use, not by every host ever seen
        for d in waiters:  # each waiter takes the line (or another) when it runs: a new Line then
            if not d.called:
                d.callback(None)
        for waiting in self._waiting_hosts.pop(key, ()):
            self._wake(waiting)
        if not key.startswith("ip:"):
            self._wake(key)
        return True

    def _wake(self, host: str) -> None:
        if self.wake is not None:
            self.wake(host)
