"""Addresses are resolved at booking (docs/spec.md §3): when a request is next in line for its host, before
each booking transaction — never when it merely enters the middleware, never while it is deferred.

The glue units on the fake clock of tests/test_glue.py, with a resolution that counts its calls and can
change its answer between them; then one real crawl against a local DNS server whose answers alternate
between an allowed and a refused address with TTL 0 (the issue's finding: ten requests entering together
used to share one answer).
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted

from scrapy_polite.crawl.seams import Defer, Go
from scrapy_polite.resolver import BlockedHost
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.dns_server import dns_server  # noqa: F401  (a fixture)
from tests.test_e2e_addresses import guarded_connects, same_port_servers  # noqa: F401  (a fixture)
from tests.test_glue import A1, A2, T0, FakeResolution, book, glue, inline, request, respond, settle, task


class CountingResolution(FakeResolution):
    """A fake resolution that logs each call (``calls``: the hosts, in order) and answers from a table
    the test may change between calls; a host mapped to ``"blocked"`` raises :class:`BlockedHost`."""

    def __init__(self, table: dict[str, Any]) -> None:
        super().__init__(table)
        self.calls: list[str] = []

    async def addresses(self, request: Any, host: str) -> list[str] | None:
        self.calls.append(host)
        answer = self.table.get(host)
        if answer == "blocked":
            raise BlockedHost(host, ["10.0.0.1"])
        return list(answer) if answer is not None else None


def counting_glue(table: dict[str, Any], **kwargs: Any) -> Any:
    g = glue(**kwargs)
    resolution = CountingResolution(table)
    g.resolution = resolution
    g.booker.resolution = resolution  # type: ignore[assignment]
    return g


def test_a_request_deferred_for_the_line_does_not_resolve():
    g = counting_glue({"a.example": [A1]}, settings={"POLITE_IP_INTERVAL": 0})
    r1, r2 = request("http://a.example/1"), request("http://a.example/2")
    assert book(g, r1) == Go(sent_at=T0, address=A1)
    assert book(g, r2) == Defer(due=None, reason="line")
    assert g.resolution.calls == ["a.example"], "the deferred request resolved"
    respond(g, r1)
    g.clock.advance(1.0)
    # It comes back, is next in line: now it resolves, once.
    assert book(g, r2) == Go(sent_at=T0 + 1.0, address=A1)
    assert g.resolution.calls == ["a.example", "a.example"]


def test_a_throttled_host_defers_without_a_lookup_each_time_it_comes_back():
    """Another process throttled the host. Its first request here resolves and books: the booking finds the backoff
    and defers it. The next ones defer on that row (docs/spec.md §5, "The early deferral"): no lookup, no
    transaction. Negative control: with the row forgotten, a request resolves and books again."""
    g = counting_glue({"t.example": [A1]})
    g.store.update("t.example", lambda s, now: (_throttled(now), None))
    transactions = []
    update_many = g.store.update_many
    g.store.update_many = lambda keys, fn: (transactions.append(keys), update_many(keys, fn))[1]  # type: ignore
    for i in range(3):
        assert book(g, request(f"http://t.example/{i}")) == Defer(due=T0 + 300, reason="throttled")
    assert g.resolution.calls == ["t.example"] and len(transactions) == 1
    g.report.hosts.clear()
    assert book(g, request("http://t.example/x")) == Defer(due=T0 + 300, reason="throttled")
    assert g.resolution.calls == ["t.example"] * 2 and len(transactions) == 2
    # The table's row still answers the early deferral's read (robots.txt not known yet) without a lookup.
    assert inline(g.booker.early_due(request("http://t.example/"), "t.example")) == T0 + 300
    assert g.resolution.calls == ["t.example"] * 2


def _throttled(now: float) -> Any:
    from scrapy_polite.policy import HostState

    return HostState(next_allowed=now + 300, consec=3, throttled_at=now)


def test_each_booking_uses_the_answer_of_its_own_moment():
    g = counting_glue({"a.example": [A1]}, settings={"POLITE_IP_INTERVAL": 0})
    r1 = request("http://a.example/1")
    assert book(g, r1) == Go(sent_at=T0, address=A1)
    respond(g, r1)
    g.resolution.table["a.example"] = [A2]  # the answer changed (TTL expired) before the next booking
    g.clock.advance(1.0)
    assert book(g, r2 := request("http://a.example/2")) == Go(sent_at=T0 + 1.0, address=A2)
    respond(g, r2)
    # A refused answer refuses only the request whose booking met it, and frees the line.
    g.resolution.table["a.example"] = "blocked"
    g.clock.advance(1.0)
    with pytest.raises(BlockedHost):
        inline(g.booker.before_request(r3 := request("http://a.example/3"), "a.example"))
    assert not g.lines.busy("a.example") and not g.lines.holds("a.example", r3)
    g.resolution.table["a.example"] = [A1]
    assert book(g, request("http://a.example/4")) == Go(sent_at=T0 + 2.0, address=A1)


@pytest_twisted.ensureDeferred
async def test_a_request_waiting_in_line_resolves_again_before_its_booking():
    """A request that waits (it cannot be deferred) resolves again after the wait: the transaction after the
    wait uses a fresh answer, not the one from before it."""
    g = counting_glue({"a.example": [A1]}, owns=False, sleep="hand", settings={"POLITE_IP_INTERVAL": 0})
    r1, r2 = request("http://a.example/1"), request("http://a.example/2")
    assert book(g, r1) == Go(sent_at=T0, address=A1)
    respond(g, r1)  # the host is due at T0 + 1
    waiting = task(g.booker.before_request(r2, "a.example"))
    await settle()
    assert not waiting.called and g.sleep.calls == [1.0]
    assert g.resolution.calls == ["a.example", "a.example"]
    g.resolution.table["a.example"] = [A2]
    g.sleep.wake()
    assert await waiting == Go(sent_at=T0 + 1.0, address=A2)
    assert g.resolution.calls == ["a.example"] * 3


def test_a_burst_request_resolves_at_its_decision_and_not_when_it_defers():
    from scrapy_polite.policy import HostState

    g = counting_glue({"a.example": [A1]})
    g.store.update("a.example", lambda s, now: (HostState(next_allowed=T0 + 5, consec=1), None))
    assert book(g, request("http://a.example/", polite_burst=True)) == Defer(due=T0 + 5, reason="throttled")
    assert g.resolution.calls == []
    g.clock.advance(5)
    g.resolution.table["a.example"] = [A2]
    assert book(g, request("http://a.example/", polite_burst=True)) == Go(sent_at=T0 + 5, address=A2)
    assert g.resolution.calls == ["a.example"]


# --------------------------------------------------------------------------------------------------
# A real crawl: alternating answers, TTL 0, ten start URLs of one host


class _Spider(ListSpider):
    name = "alternating"


@pytest_twisted.ensureDeferred
async def test_alternating_public_and_internal_answers_refuse_only_the_bookings_that_met_internal(
        same_port_servers, dns_server):  # noqa: F811
    """flip.test answers the refused 127.0.0.1 first, then the allowed 127.0.0.2, alternating, with TTL 0;
    ten start URLs enter together. Each booking resolves on its own: the five that met 127.0.0.2 are
    fetched, the five that met 127.0.0.1 are refused, and nothing reaches 127.0.0.1. (Resolved on entry, one
    shared internal answer refused all ten.)"""
    good, victim = same_port_servers("127.0.0.2", "127.0.0.1")
    port = good.port
    answers: list[str] = []

    def flip(n: int, qtype: str) -> list[tuple[str, int]]:
        if qtype != "A":
            return []
        address = "127.0.0.1" if n % 2 == 0 else "127.0.0.2"
        answers.append(address)
        return [(address, 0)]

    dns_srv = dns_server({"flip.test": flip})
    settings = polite_settings(
        POLITE_ALLOWED_NETWORKS=["127.0.0.2/32"], POLITE_DNS_NAMESERVERS=[dns_srv.address],
        POLITE_DNS_MIN_TTL=0, POLITE_DNS_TIMEOUT=2.0, POLITE_HOST_INTERVAL=0.0, POLITE_IP_INTERVAL=0,
        ROBOTSTXT_OBEY=False, CONCURRENT_REQUESTS=16, CONCURRENT_REQUESTS_PER_DOMAIN=16)
    urls = [f"http://flip.test:{port}/p/{i}" for i in range(10)]
    with guarded_connects() as connects:
        crawler = await run_crawl(_Spider, settings, urls=urls, timeout=60)
    spider = crawler.spider
    assert victim.arrivals() == [], "a request reached the internal address"
    assert {h for h, _ in connects} <= {"127.0.0.2"}, connects
    # One lookup per booking: ten, alternating, and the requests that met the allowed answer were fetched.
    assert dns_srv.lookups("flip.test") == 10, dns_srv.queries
    assert answers.count("127.0.0.2") == 5
    assert len(spider.fetched) == 5, (spider.fetched, spider.failed)
    assert {f.ip for f in spider.fetched} == {"127.0.0.2"}
    assert len(spider.failed) == 5 and {f.error for f in spider.failed} == {"BlockedHost"}
    assert sorted(a.path for a in good.arrivals()) == sorted(f.url.split(f":{port}")[1] for f in spider.fetched)
    assert crawler.stats.get_value("polite/blocked/private_address") == 5
