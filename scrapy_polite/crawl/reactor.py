"""Small helpers for code that runs on the Twisted reactor: awaiting Deferreds, sleeping without blocking."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

from scrapy.utils.asyncio import CallLaterResult
from scrapy.utils.asyncio import call_later as asyncio_call_later
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.reactor import is_asyncio_reactor_installed, is_reactor_installed
from twisted.internet import defer
from twisted.internet.task import deferLater
from twisted.python.failure import Failure

__all__ = ["await_deferred", "installed_reactor", "reactor_sleep", "sleep_until", "call_later", "next_turn_scheduler"]

T = TypeVar("T")


def installed_reactor() -> Any:
    """The running Twisted reactor. Imported on call: importing ``twisted.internet.reactor`` at module
    load would install the default reactor before Scrapy installs the one ``TWISTED_REACTOR`` names."""
    from twisted.internet import reactor  # noqa: PLC0415 - must not install a reactor at import time

    return reactor


async def await_deferred(d: defer.Deferred[T]) -> T:
    """Await a Deferred under both the asyncio and the plain Twisted reactor.

    A Deferred that has already fired (an inline store call, a cached DNS answer) is read directly,
    without a round trip through the event loop; a failure is raised as its exception.
    """
    if d.called and not d.paused and not isinstance(d.result, defer.Deferred):
        result = d.result
        if isinstance(result, Failure):
            d.addErrback(lambda _failure: None)  # handled here: no "Unhandled error in Deferred"
            result.raiseException()
        # Deferred.result is untyped; once fired without a Failure it is a T (no cast(): one call less per await).
        return result  # type: ignore[return-value]
    return await maybe_deferred_to_future(d)


def reactor_sleep(seconds: float) -> defer.Deferred[None]:
    """A Deferred that fires after ``seconds`` without blocking the reactor."""
    return deferLater(installed_reactor(), seconds, lambda: None)


def sleep_until(stopped: Callable[[], BaseException | None],
                sleep: Callable[[float], defer.Deferred[None]] = reactor_sleep,
                slice_: float = 1.0) -> Callable[[float], defer.Deferred[None]]:
    """``sleep``, in slices of at most ``slice_`` seconds, that fails with the exception ``stopped()`` returns (None:
    go on), asked before each slice and after the last: a wait that something ends before its time (the crawl's
    close: a request waiting in the downloader for its host, docs/spec.md §5)."""
    @defer.inlineCallbacks
    def sleep_sliced(seconds: float) -> Generator[defer.Deferred[None], None, None]:
        while True:
            exc = stopped()
            if exc is not None:
                raise exc
            if seconds <= 0:
                return
            step = min(seconds, slice_)
            yield sleep(step)
            seconds -= step

    return sleep_sliced


def call_later(seconds: float, fn: Any, *args: Any) -> Any:
    """``reactor.callLater(seconds, fn, *args)``; the ``IDelayedCall``."""
    return installed_reactor().callLater(seconds, fn, *args)


def next_turn_scheduler(reactor: Any) -> Callable[..., CallLaterResult]:
    """A function ``schedule(fn, *args)`` that calls ``fn(*args)`` on ``reactor``'s next turn, and returns a
    :class:`scrapy.utils.asyncio.CallLaterResult` (its ``cancel()`` is harmless once the call ran).

    On the installed asyncio reactor the call goes straight to the asyncio loop (Scrapy's
    :func:`scrapy.utils.asyncio.call_later` with a delay of 0), which skips Twisted's own timer heap and its
    rescheduling of the loop's timer on every call: the SQLite store's group commit schedules one such turn
    per group (docs/spec.md §6, "Group commit"). Any other reactor (a test's ``task.Clock``, the default
    reactor) gets ``reactor.callLater(0, ...)``.
    """
    if is_reactor_installed() and reactor is installed_reactor() and is_asyncio_reactor_installed():
        def on_loop(fn: Callable[..., object], *args: Any) -> CallLaterResult:
            return asyncio_call_later(0, fn, *args)

        return on_loop

    def on_reactor(fn: Callable[..., object], *args: Any) -> CallLaterResult:
        return CallLaterResult.from_twisted(reactor.callLater(0, fn, *args))

    return on_reactor
