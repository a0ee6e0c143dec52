"""scrapy_polite.crawl.reactor's :func:`~scrapy_polite.crawl.reactor.next_turn_scheduler`: the reactor turn SQLite's group
commit waits for (docs/spec.md §6, "Group commit"). On the installed asyncio reactor it goes straight to the
asyncio loop (not Twisted's timer heap); any other reactor (a test's clock) keeps its own ``callLater(0)``."""

from __future__ import annotations

import asyncio

import pytest
import pytest_twisted
from scrapy.utils.reactor import is_asyncio_reactor_installed
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from scrapy_polite.crawl.reactor import next_turn_scheduler


async def _two_loop_passes() -> None:
    """Let the asyncio loop run every callback already scheduled for its next pass (and one more)."""
    for _ in range(2):
        await asyncio.sleep(0)


@pytest_twisted.ensureDeferred
async def test_next_turn_on_the_installed_asyncio_reactor_goes_straight_to_the_loop():
    from twisted.internet import reactor

    if not is_asyncio_reactor_installed():
        pytest.skip("needs the asyncio reactor (--reactor=asyncio, the suite's default)")
    ran: list[str] = []
    schedule = next_turn_scheduler(reactor)
    before = len(reactor.getDelayedCalls())
    done = schedule(ran.append, "a")
    cancelled = schedule(ran.append, "b")
    assert len(reactor.getDelayedCalls()) == before  # not on Twisted's timer heap
    assert ran == []  # not inline: on the next turn
    cancelled.cancel()
    await Deferred.fromFuture(asyncio.ensure_future(_two_loop_passes()))
    assert ran == ["a"]
    done.cancel()  # after its call ran: harmless (the SQLite store relies on it)
    cancelled.cancel()  # a second cancel: harmless
    schedule(ran.append, "c").cancel()
    await Deferred.fromFuture(asyncio.ensure_future(_two_loop_passes()))
    assert ran == ["a"]


def test_next_turn_on_another_reactor_is_its_call_later():
    # Negative control: a test's clock is not the installed reactor: the turn is its own timer.
    clock = Clock()
    ran: list[str] = []
    handle = next_turn_scheduler(clock)(ran.append, "a")
    assert len(clock.getDelayedCalls()) == 1 and ran == []
    clock.advance(0)
    assert ran == ["a"] and clock.getDelayedCalls() == []
    handle.cancel()  # after the call ran: harmless
