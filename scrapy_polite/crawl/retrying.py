"""The package's own retries of throttled pages (docs/spec.md §2, "A throttle is not a failure"; §5).

A response judged a throttle (docs/spec.md §2: a status of ``POLITE_THROTTLE_STATUSES``, or a 403 from a host
that already served us) to a paced request is not handed to the spider or to Scrapy's ``RetryMiddleware``:
the middleware sends the same request back to the :class:`~scrapy_polite.scheduler.PoliteScheduler`, which
holds it until its host is due (no duplicate for the dupe filter, no errback), up to
``POLITE_THROTTLE_RETRIES`` times (:meth:`PacingPolicy.retry_throttled
<scrapy_polite.policy.PacingPolicy.retry_throttled>`). ``RETRY_TIMES`` stays for real failures.
A throttled response handed on (the budget spent, or a request not ours to retry, robots.txt's among them) is marked
``dont_cache``: Scrapy's HTTP cache does not store it, and Scrapy's retries of it are sent, not read back (the mark is
dropped as the retry reaches the pacing middleware, so the cache may keep the retry's answer). Not while the cache
revalidates a stale entry (``meta['cached_response']``): its policy then decides, as without the add-on.

The count is kept in ``meta['polite_throttle_retries']``, so it survives a ``JOBDIR`` resume. Once the budget
is spent the response goes on as Scrapy would handle it (``RetryMiddleware`` may retry it, within
``RETRY_TIMES``); when a throttled response of such a page reaches the engine, the page is **given up**:
counted (``polite/throttle/given_up``) and named in the closing summary. ``polite/throttle/retries`` counts
the retries. The ``response_received`` receiver is connected only while such a response is on its way (a
crawl that gives nothing up pays no receiver per response: issue 31, point 7). Requests with ``dont_retry`` or
``dont_pace``, and requests the scheduler cannot hold (robots.txt, ``engine.download``), are left to Scrapy.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import signals

from ..clock import ClockSync
from ..policy import Decision, PacingPolicy
from ..reports.counters import Report
from ..vocabulary import DONT_PACE_META, HOST_META, THROTTLE_RETRIES_META, UNCACHED_META
from .reactor import call_later

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response
    from scrapy.signalmanager import SignalManager

logger = logging.getLogger(__name__)

__all__ = ["RETRIES_META", "ThrottleRetries"]

#: The request meta key that counts a page's throttle retries (set by the package; saved with ``JOBDIR``).
RETRIES_META = THROTTLE_RETRIES_META  # its name here since before the vocabulary module


class ThrottleRetries:
    """Decides, for each recorded response, whether the package retries its page (glue around the policy).

    Args:
        policy: the pacing rules (``retry_throttled``, ``throttle_retries``).
        report: counters and stats.
        clock: this process's clock and its offset to the table's (due times are the table's).
        can_defer: ``can_defer(request)``: the scheduler can hold the request.
    """

    def __init__(self, policy: PacingPolicy, report: Report, clock: ClockSync,
                 can_defer: Callable[[Request], bool]) -> None:
        self.policy = policy
        self.report = report
        self.clock = clock
        self.can_defer = can_defer
        #: Requests whose throttled response was handed on after the budget was spent (until it reaches the
        #: engine, or Scrapy's RetryMiddleware replaces it with a retry).
        self._handed_on: weakref.WeakSet[Any] = weakref.WeakSet()
        #: The crawler's signals (:meth:`attach`; None: not connected, a unit test calls the receiver itself).
        self._signals: SignalManager | None = None
        self._listening = False

    def attach(self, signal_manager: SignalManager) -> None:
        """Listen on ``signal_manager`` (the crawler's ``signals``) for ``response_received`` while a handed-on
        response is on its way (:meth:`response_received`), and only then."""
        self._signals = signal_manager

    def _listen(self, on: bool) -> None:
        """Connect (``on``) or disconnect the ``response_received`` receiver, once per change."""
        if self._signals is None or on is self._listening:
            return
        self._listening = on
        if on:
            self._signals.connect(self.response_received, signal=signals.response_received)
        else:
            self._signals.disconnect(self.response_received, signal=signals.response_received)

    def _quiet(self) -> None:
        """Disconnect the receiver if nothing handed on is on its way any more (a reactor turn after the last
        arrived: disconnecting during the signal's dispatch would skip the receiver after ours)."""
        if not self._handed_on:
            self._listen(False)

    def due(self, request: Request, decision: Decision | None) -> float | None:
        """When the request's page is to be retried (this process's epoch s), counting the retry; None when
        the response goes on to Scrapy (not a throttle, not ours to retry, or the budget is spent).

        Args:
            request: the request the response answers.
            decision: what the response's record decided (None: nothing was recorded).
        """
        if decision is None or not decision.throttle:
            return None
        meta = request.meta
        host = meta.get(HOST_META)
        ours = host is not None and not meta.get("dont_retry") and not meta.get(DONT_PACE_META) \
            and self.can_defer(request)
        retries = int(meta.get(RETRIES_META) or 0)
        if not (ours and self.policy.retry_throttled(throttle=True, retries=retries)):
            # Handed on: a throttle is not the page, and the HTTP cache does not keep it (trial: a 429 it stored
            # answered Scrapy's retries, and every later run; a robots.txt 503 stored held its host run after run).
            # Not while the cache revalidates a stale entry: its policy may answer with that entry instead (review).
            if not meta.get("dont_cache") and "cached_response" not in meta:
                meta["dont_cache"] = meta[UNCACHED_META] = True  # dropped at the next pass: its answer may be kept
            if ours:
                self._handed_on.add(request)
                self._listen(True)
            return None
        meta[RETRIES_META] = retries + 1
        self.report.inc("throttle/retries")
        due = self.clock.to_local(decision.state.next_allowed)
        self.report.deferred(meta[HOST_META], "throttled", request.url, due)
        logger.debug("Retrying %s (throttle retry %d of %d) when %s is due", request, retries + 1,
                     self.policy.throttle_retries, host)
        return due

    def response_received(self, response: Response, request: Request, spider: Any = None) -> None:
        """``response_received``: a throttled response whose retry budget was spent reached the engine (Scrapy
        did not retry it, or gave up too): the page is given up."""
        if request in self._handed_on:
            self._handed_on.discard(request)
            if "cached" not in response.flags:  # else the HTTP cache answered with the page it kept (a stale entry)
                self._given_up(request, response)
        if not self._handed_on and self._listening:  # nothing more on its way (retried by Scrapy, or arrived)
            call_later(0, self._quiet)

    def _given_up(self, request: Request, response: Response) -> None:
        """Count and log the page of ``request`` as given up (its throttled ``response`` reached the engine)."""
        host = request.meta.get(HOST_META) or "?"
        self.report.gave_up(host, request.url)
        logger.warning("scrapy-polite gave up %s after %d throttle retries (POLITE_THROTTLE_RETRIES): "
                       "%s kept answering %d", request.url, self.policy.throttle_retries, host, response.status)
