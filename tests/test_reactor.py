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


def _clock_sleep(clock: Clock):
    from twisted.internet.task import deferLater

    return lambda seconds: deferLater(clock, seconds, lambda: None)


def test_a_sliced_sleep_waits_its_whole_time_and_ends_when_stopped():
    """``sleep_until``: a wait in slices of at most 1 s that lasts its whole time while nothing stops it (the control),
    and fails with the stop's error within a slice of it (the crawl's close, docs/spec.md §5)."""
    from scrapy_polite.crawl.reactor import sleep_until

    clock, stop = Clock(), []
    sleep = sleep_until(lambda: stop[0] if stop else None, _clock_sleep(clock))
    outcome: list[object] = []
    sleep(2.5).addBoth(outcome.append)
    clock.pump([0.25] * 9)
    assert outcome == [], "still waiting"
    clock.pump([0.25])
    assert outcome == [None], "the whole 2.5 s, not a slice more"
    outcome.clear()
    sleep(3600).addBoth(outcome.append)
    clock.pump([0.5] * 20)
    assert outcome == []
    stop.append(RuntimeError("closing"))
    clock.advance(0.999)
    assert outcome == [], "within the slice under way"
    clock.advance(0.001)
    assert len(outcome) == 1 and outcome[0].check(RuntimeError), outcome
    outcome.clear()
    sleep(5).addBoth(outcome.append)  # stopped already: fails at once
    assert len(outcome) == 1 and outcome[0].check(RuntimeError), outcome
