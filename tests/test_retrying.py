"""The glue of the package's throttle retries (scrapy_polite.crawl.retrying.ThrottleRetries), on fakes: which
responses it retries, the count in meta, the due time (the table's clock turned into this process's), and
the page given up once a throttled response whose budget was spent reaches the engine."""

from __future__ import annotations

from typing import Any

from scrapy import Request, signals
from scrapy.http import Response
from scrapy.signalmanager import SignalManager

from scrapy_polite.clock import ClockSync
from scrapy_polite.crawl import retrying as retrying_module
from scrapy_polite.crawl.retrying import RETRIES_META, ThrottleRetries
from scrapy_polite.policy import Decision, HostState, PacingPolicy
from scrapy_polite.reports.counters import Report

T0 = 2_000_000_000.0


class Stats:
    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def inc_value(self, key: str, count: float = 1) -> None:
        self.values[key] = self.values.get(key, 0) + count


def make(budget: int = 2, deferrable: bool = True, offset: float = 0.0) -> tuple[ThrottleRetries, Stats]:
    stats = Stats()
    clock = ClockSync(lambda: T0, server_clock=True)
    clock.observe(T0 - offset)  # the table's clock is `offset` s behind ours
    return ThrottleRetries(PacingPolicy(throttle_retries=budget), Report(stats), clock,
                           lambda request: deferrable), stats


def request(**meta: Any) -> Request:
    return Request("http://a.example/p", meta={"polite_host": "a.example", **meta})


THROTTLE = Decision(state=HostState(next_allowed=T0 + 5, consec=1), delay=5.0, throttle=True, counted=True)
SUCCESS = Decision(state=HostState(next_allowed=T0 + 1), delay=1.0, throttle=False, counted=False)


def test_a_throttle_is_retried_when_the_host_is_due_counting_in_meta():
    retries, stats = make(offset=3.0)
    r = request()
    assert retries.due(r, THROTTLE) == T0 + 5 + 3.0  # the table's next_allowed in this process's clock
    assert r.meta[RETRIES_META] == 1
    assert retries.due(r, THROTTLE) is not None and r.meta[RETRIES_META] == 2
    assert stats.values["polite/throttle/retries"] == 2
    assert stats.values["polite/deferrals/throttled"] == 2


def test_the_spent_budget_hands_the_response_on_and_the_page_is_given_up_when_it_arrives():
    retries, stats = make(budget=1)
    r = request(**{RETRIES_META: 1})
    assert retries.due(r, THROTTLE) is None
    assert "polite/throttle/given_up" not in stats.values  # not yet: Scrapy may still retry it
    retries.response_received(Response(r.url, status=429), r)
    assert stats.values["polite/throttle/given_up"] == 1
    assert retries.report.counters("a.example").given_up_urls == [r.url]
    retries.response_received(Response(r.url, status=429), r)  # counted once
    assert stats.values["polite/throttle/given_up"] == 1


def _receivers(manager: SignalManager) -> list[Any]:
    from pydispatch import dispatcher

    return list(dispatcher.liveReceivers(dispatcher.getAllReceivers(manager.sender, signals.response_received)))


def test_the_receiver_is_connected_only_while_a_handed_on_response_is_on_its_way(monkeypatch):
    """No ``response_received`` receiver while nothing is handed on (a crawl that gives nothing up pays none per
    response: issue 31); handing a response on connects it once; its arrival gives the page up and disconnects it
    one reactor turn later (not during the signal's dispatch). Negative control: while a second handed-on response
    is still on its way, the first one's arrival keeps the receiver."""
    turns: list[Any] = []
    monkeypatch.setattr(retrying_module, "call_later", lambda delay, fn: turns.append(fn))
    manager = SignalManager()
    retries, stats = make(budget=0)
    retries.attach(manager)
    assert len(_receivers(manager)) == 0
    r1, r2 = request(), Request("http://a.example/q", meta={"polite_host": "a.example"})
    assert retries.due(r1, THROTTLE) is None and retries.due(r2, THROTTLE) is None  # the budget is 0: handed on
    assert _receivers(manager) == [retries.response_received]  # connected once
    manager.send_catch_log(signals.response_received, response=Response(r1.url, status=429), request=r1)
    assert stats.values["polite/throttle/given_up"] == 1
    for fn in turns:
        fn()
    assert len(_receivers(manager)) == 1, "r2 is still on its way: the receiver stays"
    manager.send_catch_log(signals.response_received, response=Response(r2.url, status=429), request=r2)
    assert stats.values["polite/throttle/given_up"] == 2 and len(_receivers(manager)) == 1  # not during dispatch
    for fn in turns:
        fn()
    assert len(_receivers(manager)) == 0
    manager.send_catch_log(signals.response_received, response=Response(r1.url, status=429), request=r1)
    assert stats.values["polite/throttle/given_up"] == 2


def test_a_response_handed_on_while_the_disconnect_is_pending_keeps_the_receiver(monkeypatch):
    """The last handed-on response arrives (the disconnect is due on the next turn), and before that turn another
    one is handed on: the pending disconnect finds it on its way and keeps the receiver, and its page is given up
    when it arrives (a disconnect that did not look again would lose it)."""
    turns: list[Any] = []
    monkeypatch.setattr(retrying_module, "call_later", lambda delay, fn: turns.append(fn))
    manager = SignalManager()
    retries, stats = make(budget=0)
    retries.attach(manager)
    r1, r2 = request(), Request("http://a.example/q", meta={"polite_host": "a.example"})
    assert retries.due(r1, THROTTLE) is None
    manager.send_catch_log(signals.response_received, response=Response(r1.url, status=429), request=r1)
    assert turns, "the disconnect is pending"
    assert retries.due(r2, THROTTLE) is None  # handed on before the pending turn runs
    for fn in turns:
        fn()
    assert _receivers(manager) == [retries.response_received]
    manager.send_catch_log(signals.response_received, response=Response(r2.url, status=429), request=r2)
    assert stats.values["polite/throttle/given_up"] == 2


def test_a_response_of_a_request_never_handed_on_is_not_given_up():
    retries, stats = make()
    r = request()
    retries.response_received(Response(r.url, status=200), r)
    assert "polite/throttle/given_up" not in stats.values


def test_responses_left_to_scrapy():
    retries, stats = make()
    assert retries.due(request(), SUCCESS) is None  # not a throttle
    assert retries.due(request(), None) is None  # nothing recorded (the table failed)
    for exempt in (request(dont_retry=True), request(dont_pace=True), Request("http://a.example/p")):
        assert retries.due(exempt, THROTTLE) is None and RETRIES_META not in exempt.meta
    undeferrable, _ = make(deferrable=False)  # robots.txt, engine.download(): the scheduler cannot hold it
    assert undeferrable.due(request(), THROTTLE) is None
    assert stats.values == {}
