"""This worker's side of the shared frontier (docs/spec.md §5, "The shared frontier"; docs/guides/many-crawlers.md):
what :class:`~scrapy_polite.scheduler.PoliteScheduler` does with a scrapy-redis scheduler.

* it **takes** from the frontier (:class:`~scrapy_polite.frontier.leases.RedisFrontier`) only while the requests in
  its downloader plus those it holds for its lines are fewer than ``CONCURRENT_REQUESTS``;
* it **renews** its leases every second (every third of ``POLITE_LEASE_TIME`` if shorter) on a thread, which
  also returns the leases of workers that stopped renewing, and pokes the engine when something is due;
* when idle, it **decides whether to stay open** for what the frontier holds (:meth:`SharedWorker.wait`):
  whatever its idle window, it does not close while a worker that stopped renewing leases requests;
* at **close**, it gives back what it leases and logs what waits in Redis and what other workers lease.

It logs its worker id (``<hostname>-<pid>-<random>``) at start, the id the leases in Redis and
``scrapy polite hosts`` name.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from twisted.internet import task

from .._compat import wake_engine
from ..crawl.reactor import call_later, installed_reactor
from ..stores.redis.client import transient
from .leases import RedisFrontier
from .report import FrontierState, WorkerLeases, beat_period

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from ..crawl.seams import SharedFrontier
    from ..pacer import Pacer

logger = logging.getLogger(__name__)

__all__ = ["SharedWorker", "stopped_leasers"]


def stopped_leasers(state: FrontierState, since: float, lease_time: float) -> list[WorkerLeases]:
    """The other workers that lease requests and have not renewed since ``since`` (the Redis server's clock,
    epoch s): stopped renewing, as far as a worker that decided to close at ``since`` can tell (a live worker
    renews every beat). A worker whose renewal was not recorded (an earlier version of the add-on) is judged
    by its deadline less ``lease_time`` (s)."""
    def renewed_at(w: WorkerLeases) -> float:
        return w.renewed_at if w.renewed_at is not None else w.deadline - lease_time

    return [w for w in state.elsewhere if renewed_at(w) <= since]


class SharedWorker:
    """One worker of a shared frontier (see the module docstring).

    Args:
        crawler: the crawler (its engine's downloader, its stats).
        pacer: the crawler's pacer, of which it takes the report (stats) and the lifecycle (blocked hosts, the
            claim of a request taken for a held host).
        frontier: the frontier (:class:`~scrapy_polite.frontier.leases.RedisFrontier`).
        inner: scrapy-redis's scheduler (its own ``next_request`` for a queue class of its own, ``persist``).
    """

    def __init__(self, crawler: Crawler, pacer: Pacer, frontier: SharedFrontier, inner: Any) -> None:
        self.crawler = crawler
        self.report = pacer.report
        self.lifecycle = pacer.lifecycle
        self.frontier = frontier
        frontier.outage = self.unreachable  # its background writes' failures too: one WARNING per outage
        self.inner = inner
        self._cap = crawler.settings.getint("CONCURRENT_REQUESTS")
        self._period = beat_period(frontier.lease_time)
        self._beat = task.LoopingCall(self._heartbeat)
        self._beat.clock = installed_reactor()
        self._beating = False
        #: A call to the frontier failed and no renewal succeeded since (an outage): the next failures at DEBUG.
        self._unreachable = False
        self._closing = False
        #: The Redis server's moment at which this worker, idle, found nothing but other workers' leases to
        #: stay open for (None: not deciding; it took something since): see :meth:`wait`.
        self._closing_since: float | None = None
        self._recheck: Any = None  # the timer of the idle check that follows that moment
        self._waited_for: set[str] = set()  # workers whose leases it said it waits for (logged once each)

    @classmethod
    def open(cls, crawler: Crawler, pacer: Pacer, inner: Any, spider: Spider) -> SharedWorker:
        """Join the frontier of ``spider`` in scrapy-redis's Redis (blocking: one round trip, which also returns
        the leases of dead workers), start renewing, and log this worker's id. Its key and lease time are
        ``POLITE_FRONTIER_KEY`` and ``POLITE_LEASE_TIME`` (docs/spec.md §5, "The shared frontier")."""
        config = pacer.config
        frontier = RedisFrontier(inner.server, inner.queue, spider, config.frontier_key % {"spider": spider.name},
                                 config.lease_time, pacer.report.inc)
        frontier.renew()
        worker = cls(crawler, pacer, frontier, inner)
        worker._beat.start(worker._period, now=False)
        logger.info("scrapy-polite: shared frontier worker %s (pid %d) of %s (scrapy-redis): held and in-flight "
                    "requests live in Redis, leased for %g s", frontier.worker, os.getpid(), frontier.key,
                    config.lease_time)
        return worker

    # -- taking -------------------------------------------------------------------------------------------

    def in_hand(self, held: int) -> int:
        """The requests this worker has taken and not sent: those in its downloader (Scrapy's
        ``Downloader.active``, waits in line included) and ``held``, those it holds for its lines."""
        engine = getattr(self.crawler, "engine", None)
        active = getattr(getattr(engine, "downloader", None), "active", None)
        return (len(active) if active is not None else 0) + held

    def take(self, held_hosts: set[str], held: int) -> Request | None:
        """The next request (returned, due held, then scrapy-redis's queue), leased; None while this worker has
        ``CONCURRENT_REQUESTS`` in hand (``held``: the requests it holds for its lines, of ``held_hosts``):
        a worker never takes more than it can send (docs/spec.md §5, "In hand is bounded")."""
        frontier = self.frontier
        if 0 < self._cap <= self.in_hand(held):
            self.report.inc("frontier/full")
            return None
        try:
            found = frontier.take(self.lifecycle.blocked_hosts() | held_hosts, queue=frontier.mode != "none")
            if found is None:
                if frontier.mode != "none":
                    return None
                request: Request | None = self.inner.next_request()  # a queue class of its own: pop, then lease
                if request is not None:
                    try:
                        frontier.lease(request)
                    except Exception as exc:  # popped already: it goes unleased rather than lost
                        self.unreachable("leasing a request taken", exc)
                return request
        except Exception as exc:
            # Redis unreachable: nothing is taken until it answers (the engine asks again, the beat pokes it).
            self.unreachable("taking a request", exc)
            return None
        request, host = found
        if host is not None:
            self.lifecycle.release(request, host)  # it claims its host until it is booked or leaves
        elif self.crawler.stats is not None:  # as scrapy-redis's next_request counts it
            self.crawler.stats.inc_value("scheduler/dequeued/redis")
        return request

    def unreachable(self, doing: str, exc: BaseException) -> None:
        """A call to the frontier failed while ``doing`` something: logged at WARNING for the first of an outage (the
        beat comes every second, the engine asks for requests more often), at DEBUG until a renewal succeeds.

        Raises:
            exc: itself, when it does not say Redis is unreachable right now (:func:`transient`).
        """
        if not transient(exc):
            raise exc
        log = logger.debug if self._unreachable else logger.warning
        self._unreachable = True
        log("scrapy-polite: the shared frontier cannot be reached (%s): %s", doing, exc)

    def pending(self, inner: Any) -> bool:
        """Whether scrapy-redis's scheduler ``inner`` has requests pending; True while the frontier cannot be reached
        (a Redis outage: the spider must not close as idle, and Scrapy's engine, which asks on every heartbeat, gets
        no error), logged once per outage (:meth:`unreachable`)."""
        try:
            return bool(inner.has_pending_requests())
        except Exception as exc:
            self.unreachable("counting the requests pending", exc)
            return True

    def busy(self) -> None:
        """The scheduler handed a request out: a later idle check starts its decision to close again."""
        self._closing_since = None

    # -- idle -----------------------------------------------------------------------------------------------

    def wait(self, window: float) -> float | None:
        """Seconds this idle worker stays open for the shared frontier (docs/spec.md §5, "Idle"), None when
        nothing there keeps it (it may close). It stays for:

        * a returned request, or a held host due within ``window`` (s: ``MAX_IDLE_TIME_BEFORE_CLOSE``, else
          ``POLITE_MAX_IDLE_WAIT``): until it may take it;
        * other workers' leases when ``POLITE_LEASE_TIME`` ≤ ``window`` (they would come back within it if
          their worker died): the lease time;
        * whatever ``window``, the leases of a worker that has not renewed since this one found nothing else
          to stay for: until they come back, at most ``POLITE_LEASE_TIME`` after that worker's last renewal.
          The first idle check that finds only other workers' leases notes that moment (the server's clock)
          and stays one beat, then checks again: a worker that renewed meanwhile is alive and its requests are
          its own (this worker may close, and a later decision starts afresh); one that did not has stopped
          renewing (killed, frozen): this worker stays until its leases come back (any worker's renewal
          returns them, ``polite/lease/expired``) and crawls them, or until that worker renews again.

        Reads Redis (blocking, one round trip, as scrapy-redis's own idle check does).
        """
        state = self.frontier.renew()
        self._wake_if_due(state)
        wait = state.takeable_in
        if wait is not None and wait <= window:
            self._closing_since = None
            return wait
        if state.others_leased and self.frontier.lease_time <= window:
            return self.frontier.lease_time
        if not state.elsewhere:
            self._closing_since = None
            return None
        if self._closing_since is None:
            self._closing_since = state.now
            if self._recheck is None or not self._recheck.active():
                self._recheck = call_later(2 * self._period, self._poke_engine)
            return self._period
        stopped = stopped_leasers(state, self._closing_since, self.frontier.lease_time)
        if not stopped:  # every worker that leases requests renewed since: alive, its requests are its own
            self._closing_since = None  # a later decision (scrapy-redis's window kept it open) starts afresh
            return None
        for w in stopped:
            if w.worker not in self._waited_for and not w.renewing(self.frontier.lease_time):
                self._waited_for.add(w.worker)
                logger.info("scrapy-polite: %d requests are leased by worker %s, which stopped renewing its leases"
                            "%s; this worker stays open until they come back to the shared frontier %s (in %.0f s "
                            "at most) and crawls them, whatever its idle window", w.leases, w.worker,
                            "" if w.renewed_ago is None else f" {w.renewed_ago:.1f} s ago", self.frontier.key,
                            w.back_in)
        return min(w.back_in for w in stopped)

    # -- the beat -------------------------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        """Renew this worker's leases and return dead workers' (on a thread); poke the engine when something
        in the shared frontier is due."""
        if self._beating:
            return
        self._beating = True
        d = self.frontier.renew_soon()

        def done(result: Any) -> None:
            self._beating = False
            if self._unreachable:
                self._unreachable = False
                logger.info("scrapy-polite: this worker's leases in the shared frontier are renewed again")
            if isinstance(result, FrontierState):
                self._wake_if_due(result)

        def failed(failure: Any) -> None:
            self._beating = False
            self.unreachable("renewing this worker's leases", failure.value)

        d.addCallbacks(done, failed)

    def _poke_engine(self) -> None:
        if not self._closing:
            wake_engine(self.crawler)

    def _wake_if_due(self, state: FrontierState) -> None:
        if not self._closing and state.takeable_in == 0.0:
            wake_engine(self.crawler)

    # -- close ----------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """The crawl closes: stop renewing and checking (the leases are given back by :meth:`close`)."""
        self._closing = True
        if self._recheck is not None and self._recheck.active():
            self._recheck.cancel()
        if self._beat.running:
            self._beat.stop()

    def close(self, local: int) -> None:
        """Give back every request this worker leases (``local`` of them held for its lines; held ones are in
        Redis: not lost), log what waits in the shared frontier and what other workers still lease (counted
        in ``polite/frontier/leased_elsewhere_at_close``), and clear the frontier with
        ``SCHEDULER_PERSIST = False`` (blocking: run it on a thread, after :meth:`SharedFrontier.settle
        <scrapy_polite.crawl.seams.SharedFrontier.settle>`)."""
        frontier = self.frontier
        returned = frontier.release()
        stats = self.crawler.stats
        if returned and stats is not None:
            stats.set_value("polite/frontier/returned_at_close", returned)
        if returned:
            logger.info("scrapy-polite: %d requests this worker had taken (%d held for its lines) were given back "
                        "to the shared frontier %s for the other workers", returned, local, frontier.key)
        logger.info("scrapy-polite: worker %s closes. %s", frontier.worker, frontier.describe())
        elsewhere = frontier.state.others_leased  # describe() read it
        if elsewhere and stats is not None:
            stats.set_value("polite/frontier/leased_elsewhere_at_close", elsewhere)
        if not getattr(self.inner, "persist", True):  # SCHEDULER_PERSIST = False: scrapy-redis flushes too
            frontier.clear()
