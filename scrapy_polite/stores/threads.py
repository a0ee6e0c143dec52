"""The threads of the async tables (docs/spec.md §6, "Never blocking the crawl"), parts each table composes:

* :class:`CallPool` — a table's thread pool, started when first needed; each call's result reaches the
  reactor's thread in call order;
* :class:`Stepper` — the updates of a stepped store (:class:`~scrapy_polite.stores.base.SteppedStore`) run
  step by step: each step on a pool, the wait after a lost race on the reactor's clock (``callLater``), so a
  contended row never holds a thread while it waits (docs/spec.md §6, "Redis: contention");
* :func:`close_off_reactor` — the blocking part of a table's close on a thread of the reactor's pool.

None of them knows a backend: each is handed callables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet import defer, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from .base import Again, StoreClosed, StoreError, UpdateSteps

__all__ = ["CallPool", "Stepper", "close_off_reactor"]

T = TypeVar("T")


class CallPool:
    """A table's thread pool of ``threads`` threads, started when first needed (a crawl refused at its start
    never starts one) and stopped by the table's close (:meth:`detach`, then ``ThreadPool.stop``), or by the
    reactor's shutdown when the table was not closed first (Scrapy's forced shutdown, a second Ctrl-C: a
    thread left running would keep the process from exiting).

    Args:
        reactor: the Twisted reactor the results are delivered on.
        threads: the most calls that run at once (>= 1).
        name: the threads' name.
        idle: called on the reactor's thread once no call is left on the pool, after the last one's result
            was delivered (SQLite's table then runs the calls it held behind them).

    Attributes:
        queued: calls on the pool not yet delivered.
    """

    def __init__(self, reactor: Any, threads: int = 1, *, name: str = "scrapy-polite-store",
                 idle: Callable[[], None] | None = None) -> None:
        self._reactor = reactor
        self._threads = max(1, threads)
        self._name = name
        self._idle = idle
        self._pool: ThreadPool | None = None
        self._detached = False
        self._shutdown_trigger: Any = None
        self.queued = 0

    def run(self, fn: Callable[..., T], *args: Any) -> defer.Deferred[T]:
        """``fn(*args)`` on the pool; its result (or failure) delivered on the reactor's thread, each caller
        seeing its result before any call held behind it runs. A failed Deferred (:class:`StoreClosed`) once
        the pool was detached."""
        if self._detached:
            return defer.fail(StoreClosed("scrapy-polite's pace table is closed: its threads are stopped"))
        pool = self._started()
        self.queued += 1
        result_d: defer.Deferred[T] = defer.Deferred()

        def done(result: Any) -> None:
            self.queued -= 1
            if isinstance(result, Failure):
                result_d.errback(result)
            else:
                result_d.callback(result)
            if not self.queued and self._idle is not None:
                self._idle()

        threads.deferToThreadPool(self._reactor, pool, fn, *args).addBoth(done)
        return result_d

    def run_aside(self, fn: Callable[..., T], *args: Any) -> defer.Deferred[T]:
        """``fn(*args)`` on the pool, not counted among the calls in :attr:`queued` (the table's calls do not
        wait for it: SQLite's checkpoint while the crawl's writes go on, its event log's batches, a stepped
        update's steps); the Deferred fires on the reactor's thread, nothing else runs after it. Failed once the
        pool was detached."""
        if self._detached:
            return defer.fail(StoreClosed("scrapy-polite's pace table is closed: its threads are stopped"))
        return threads.deferToThreadPool(self._reactor, self._started(), fn, *args)

    def _started(self) -> ThreadPool:
        if self._pool is None:
            self._pool = ThreadPool(minthreads=1, maxthreads=self._threads, name=self._name)
            self._pool.start()
            self._shutdown_trigger = self._reactor.addSystemEventTrigger("during", "shutdown", self._at_shutdown)
        return self._pool

    def detach(self) -> ThreadPool | None:
        """On the reactor's thread, at the table's close: take the pool out of use (a later :meth:`run`
        fails) and hand it over for ``stop()`` (None: it never started)."""
        self._detached = True
        pool, self._pool = self._pool, None
        trigger, self._shutdown_trigger = self._shutdown_trigger, None
        if trigger is not None:
            self._reactor.removeSystemEventTrigger(trigger)
        return pool

    def _at_shutdown(self) -> None:
        """The reactor shuts down with the table still open: stop the pool (its calls under way end first)."""
        self._shutdown_trigger = None
        self._detached = True
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()


class Stepper:
    """Runs updates given as :class:`~scrapy_polite.stores.base.UpdateSteps`: each step on ``pool``, the
    wait an :class:`~scrapy_polite.stores.base.Again` asks for on the reactor's clock, so no thread waits
    (docs/spec.md §6, "Redis: contention"). :meth:`stop` (the table's close) fails the updates still
    waiting for their next step.

    Args:
        reactor: the Twisted reactor (its ``callLater``).
        pool: where the steps run.
        closed_error: the error of an update stopped by the close.
    """

    def __init__(self, reactor: Any, pool: CallPool, closed_error: Callable[[], StoreError]) -> None:
        self._reactor = reactor
        self._pool = pool
        self._closed_error = closed_error
        self._stopped = False
        #: Updates waiting on the reactor's clock for their next step: timer → result.
        self._waiting: dict[Any, defer.Deferred[Any]] = {}

    def run(self, steps: UpdateSteps[T]) -> defer.Deferred[T]:
        """The update's result once a step returns it; its first step queued now."""
        result_d: defer.Deferred[T] = defer.Deferred()
        self._step(steps, result_d)
        return result_d

    def _step(self, steps: UpdateSteps[Any], result_d: defer.Deferred[Any]) -> None:
        if self._stopped:  # closed while the update waited for its next step
            result_d.errback(self._closed_error())
            return
        d: defer.Deferred[Any] = self._pool.run_aside(steps.step)  # (each step is delivered alone: no order to keep)
        d.addCallbacks(self._stepped, result_d.errback, callbackArgs=(steps, result_d))

    def _stepped(self, out: Any, steps: UpdateSteps[Any], result_d: defer.Deferred[Any]) -> None:
        """A step is done: the update's result, or its next step now (behind the calls already queued) or
        after the delay it asked for (on the reactor's clock: no thread waits)."""
        if not isinstance(out, Again):
            result_d.callback(out)
            return
        if self._stopped:  # closed while the step ran: no next step, no timer left after the close
            result_d.errback(self._closed_error())
            return
        if out.delay <= 0:
            self._step(steps, result_d)
            return
        timer: Any = None

        def due() -> None:
            self._waiting.pop(timer, None)
            self._step(steps, result_d)

        timer = self._reactor.callLater(out.delay, due)
        self._waiting[timer] = result_d

    def stop(self) -> None:
        """On the reactor's thread, at the close: every update waiting for its next step is stopped (its timer
        cancelled) and fails; a step still running fails when it returns :class:`Again`."""
        self._stopped = True
        waiting, self._waiting = self._waiting, {}
        for timer, result_d in waiting.items():
            if timer.active():
                timer.cancel()
            result_d.errback(self._closed_error())


def close_off_reactor(reactor: Any, finish: Callable[[], None]) -> defer.Deferred[None]:
    """Run ``finish`` (the blocking part of a table's close: joining its threads, closing its connections)
    on a thread of the reactor's pool; a Deferred that fires when it is done (its error, if any). Blocking
    when the reactor is not running (nothing to keep responsive, and its pool may be gone)."""
    if not getattr(reactor, "running", False):
        try:
            finish()
        except Exception:
            return defer.fail()  # the caller's Deferred carries the error
        return defer.succeed(None)
    d: defer.Deferred[None] = threads.deferToThreadPool(reactor, reactor.getThreadPool(), finish)
    return d
