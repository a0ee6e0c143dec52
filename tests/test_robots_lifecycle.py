"""The robots.txt lifecycle's pure state machine (:mod:`scrapy_polite.policy.robots`: ``decide``, ``answered``,
``classify_status``, ``reask_floor``, ``truncate``), a Hypothesis state machine whose invariants are
RFC 9309's, and the add-on's installation of :class:`~scrapy_polite.robotstxt.PoliteRobotsTxtMiddleware` in place
of Scrapy's (docs/spec.md §5, "The robots.txt lifecycle"). Each rule has its negative control beside it; the crawls
are in tests/test_e2e_robots.py."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import pytest
import pytest_twisted
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Request
from scrapy.robotstxt import PythonRobotParser
from scrapy.settings import Settings
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler
from twisted.internet.error import ConnectionRefusedError, TimeoutError

from scrapy_polite.addon import Addon, _install_robots_middleware
from scrapy_polite.pacer import discard_pacer
from scrapy_polite.policy import robots as robots_module
from scrapy_polite.policy.robots import (
    ALLOW_ALL,
    ROBOTS_MAX_BYTES,
    ROBOTS_TTL,
    Answer,
    Apply,
    Fetch,
    Hold,
    RobotsState,
    Rules,
    Wait,
    answered,
    classify_status,
    decide,
    fetching,
    reask_floor,
    truncate,
)
from scrapy_polite.resolver import DNSServerFailure, HostNotFound
from scrapy_polite.robotstxt import PoliteRobotsTxtMiddleware, answer_of_failure

RULES = Rules(parser="rules")  # any object: the machine never looks inside


# -- decide ---------------------------------------------------------------------------------------------------


def test_an_unknown_origin_asks_and_a_fetching_one_waits():
    assert decide(None, 0.0) == Fetch()
    assert decide(fetching(None), 0.0) == Wait()


@pytest.mark.parametrize("phase", ["parsed", "unavailable"])
def test_rules_apply_until_they_are_24_hours_old_then_are_asked_again(phase):
    state = answered(fetching(None), Answer(phase, rules=RULES if phase == "parsed" else ALLOW_ALL), 100.0, 0.0)
    assert state is not None and state.expires_at == 100.0 + ROBOTS_TTL
    assert decide(state, 100.0 + ROBOTS_TTL - 0.001) == Apply(RULES if phase == "parsed" else ALLOW_ALL)
    assert decide(state, 100.0 + ROBOTS_TTL) == Fetch(expired=True)  # the negative control: one moment later


def test_an_unreachable_robots_txt_holds_until_it_is_asked_again():
    state = answered(fetching(None), Answer("unreachable", cause="503"), 10.0, 12.5)
    assert state == RobotsState("unreachable", retry_at=12.5, since=10.0, failures=1, cause="503")
    assert state.holds
    assert decide(state, 12.4) == Hold(until=12.5, since=10.0)
    assert decide(state, 12.5) == Fetch()  # the negative control: at retry_at it asks


def test_an_unreachable_re_ask_keeps_the_rules_read_before():
    """RFC 9309 §2.4: the cached copy may be used while robots.txt is unreachable; the negative control is the
    test above (nothing read before: held)."""
    parsed = answered(fetching(None), Answer("parsed", rules=RULES), 0.0, 0.0)
    again = answered(fetching(parsed), Answer("unreachable", cause="TimeoutError"), ROBOTS_TTL + 1, ROBOTS_TTL + 3)
    assert again is not None and again.rules == RULES and not again.holds
    assert decide(again, ROBOTS_TTL + 2) == Apply(RULES)
    assert decide(again, ROBOTS_TTL + 3) == Fetch()


def test_an_unreachable_spell_counts_its_answers_and_keeps_its_start():
    state = None
    for i, t in enumerate([1.0, 2.0, 4.0]):
        state = answered(fetching(state), Answer("unreachable", cause="500"), t, t + 1)
        assert state is not None and state.failures == i + 1 and state.since == 1.0
    state = answered(fetching(state), Answer("parsed", rules=RULES), 9.0, 0.0)
    assert state == RobotsState("parsed", rules=RULES, expires_at=9.0 + ROBOTS_TTL)  # the spell is over


def test_an_answer_no_server_gave_forgets_the_origin():
    assert answered(fetching(None), Answer("none", cause="HostNotFound"), 1.0, 1.0) is None


def test_retry_at_is_never_in_the_past():
    state = answered(fetching(None), Answer("unreachable", cause="503"), 10.0, 5.0)
    assert state is not None and state.retry_at == 10.0


# -- classifying answers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("status, kind", [
    (200, "parsed"), (203, "parsed"), (299, "parsed"),
    (300, "unavailable"), (301, "unavailable"), (304, "unavailable"),  # a redirect not followed (§2.3.1.2)
    (400, "unavailable"), (401, "unavailable"), (403, "unavailable"), (404, "unavailable"), (410, "unavailable"),
    (428, "unavailable"), (430, "unavailable"), (499, "unavailable"),
    (429, "unreachable"),  # a throttle, not "unavailable": the negative control of the 4xx rows
    (500, "unreachable"), (502, "unreachable"), (503, "unreachable"), (504, "unreachable"), (599, "unreachable"),
    (100, "unreachable"), (199, "unreachable"), (600, "unreachable"),
])
def test_statuses_are_read_as_rfc_9309_says(status, kind):
    assert classify_status(status) == kind


@pytest.mark.parametrize("exc, kind", [
    (TimeoutError(), "unreachable"), (ConnectionRefusedError(), "unreachable"),
    (DNSServerFailure("SERVFAIL"), "unreachable"), (RuntimeError("TLS"), "unreachable"),
    (IgnoreRequest("refused"), "none"), (HostNotFound("NXDOMAIN"), "none"),
])
def test_failures_are_unreachable_unless_no_server_was_asked(exc, kind):
    answer = answer_of_failure(exc)
    assert answer.kind == kind and answer.cause == type(exc).__name__


# -- the re-ask's floor, truncation --------------------------------------------------------------------


def test_the_re_ask_floor_doubles_up_to_the_cap():
    assert [reask_floor(n, 1.0, 10.0) for n in range(6)] == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert reask_floor(10_000, 1.0, 300.0) == 300.0  # no overflow


def test_truncate_keeps_500_kib_to_the_last_line_break():
    assert truncate(b"a\nb", 10) == b"a\nb"
    body = b"x" * (ROBOTS_MAX_BYTES - 3) + b"ab\ncd\n"
    assert truncate(body) == b"x" * (ROBOTS_MAX_BYTES - 3) + b"ab\n"  # the last whole line within the limit
    exact = b"y" * (ROBOTS_MAX_BYTES - 1) + b"\n"
    assert truncate(exact + b"z\n") == exact and truncate(exact) == exact
    assert truncate(b"z" * (ROBOTS_MAX_BYTES + 5)) == b"z" * ROBOTS_MAX_BYTES  # one endless line: cut at the limit


# -- the state machine against RFC 9309 ----------------------------------------------------------------------------


class RobotsMachine(RuleBasedStateMachine):
    """One origin over time: requests arrive, robots.txt answers, the clock moves. A model of what was read
    (``read_at``, ``read_rules``) and of the spell checks every decision against RFC 9309."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.state: RobotsState | None = None
        self.in_flight = False
        self.read_at: float | None = None  # when rules (or "unavailable") were last read
        self.read_rules: Rules | None = None
        self.unreachable = False  # the last answer was "unreachable"
        self.retry_at = 0.0

    @rule(dt=st.floats(min_value=0.0, max_value=2 * ROBOTS_TTL, allow_nan=False))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule()
    def a_request_comes(self) -> None:
        action = robots_module.decide(self.state, self.now)  # through the module: the control below swaps it
        if isinstance(action, Apply):
            assert not self.in_flight
            assert self.read_at is not None and action.rules == self.read_rules, "allowed without rules read"
            if not self.unreachable:
                assert self.now - self.read_at < ROBOTS_TTL, "rules older than 24 h used"
            else:
                assert self.now < self.retry_at, "a due re-ask skipped"
        elif isinstance(action, Fetch):
            assert not self.in_flight, "two robots.txt requests out at once"
            assert action.expired == (not self.unreachable and self.read_at is not None)
            self.state = fetching(self.state)
            self.in_flight = True
        elif isinstance(action, Wait):
            assert self.in_flight
        else:
            assert isinstance(action, Hold)
            assert self.unreachable and self.read_rules is None, "held with rules to apply"
            assert action.until == self.retry_at > self.now

    @precondition(lambda self: self.in_flight)
    @rule(kind=st.sampled_from(["parsed", "unavailable", "unreachable", "none"]),
          wait=st.floats(min_value=0.0, max_value=1000.0, allow_nan=False))
    def robots_txt_answers(self, kind: str, wait: float) -> None:
        rules = RULES if kind == "parsed" else ALLOW_ALL if kind == "unavailable" else None
        self.state = answered(self.state, Answer(kind, rules=rules, cause="x"), self.now,  # type: ignore[arg-type]
                              self.now + wait)
        self.in_flight = False
        if kind in ("parsed", "unavailable"):
            self.read_at, self.read_rules, self.unreachable = self.now, rules, False
        elif kind == "unreachable":
            self.unreachable, self.retry_at = True, self.now + wait
        else:  # forgotten: asked again by the next request
            self.read_at, self.read_rules, self.unreachable = None, None, False

    @invariant()
    def fetching_iff_a_request_is_out(self) -> None:
        assert (self.state is not None and self.state.phase == "fetching") == self.in_flight

    @invariant()
    def held_only_when_nothing_was_read(self) -> None:
        if self.state is not None and self.state.holds:
            assert self.read_rules is None and self.unreachable
            assert self.state.since is not None and self.state.since <= self.now


TestRobotsMachine = RobotsMachine.TestCase


@pytest.mark.parametrize("name, broken", [
    # Scrapy's reading: an unreachable robots.txt allows everything.
    ("unreachable allows all", lambda state, now: Apply(ALLOW_ALL) if state is not None
     and state.phase == "unreachable" and now < state.retry_at else decide(state, now)),
    # Rules cached for the whole crawl.
    ("rules never expire", lambda state, now: Apply(state.rules or ALLOW_ALL) if state is not None
     and state.phase in ("parsed", "unavailable") else decide(state, now)),
])
def test_the_machine_catches_a_broken_decision(monkeypatch, name, broken):
    """The negative control of the state machine: a ``decide`` with either defect fails it."""
    monkeypatch.setattr(robots_module, "decide", broken)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(RobotsMachine, settings=hypothesis_settings(max_examples=300, database=None))


# -- the add-on puts the middleware in place of Scrapy's ------------------------------------------------------------

SCRAPY = "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware"


class OwnRobots(RobotsTxtMiddleware):
    """A project's own subclass of Scrapy's middleware."""


class OurSubclass(PoliteRobotsTxtMiddleware):
    """A project's subclass of ours."""


def robots_middlewares(project: dict, *, obey: bool = True) -> dict[type, int]:
    """The robots.txt middlewares in force after the add-on's update, with their priorities."""
    settings = Settings({"DOWNLOADER_MIDDLEWARES": project, "ROBOTSTXT_OBEY": obey})
    _install_robots_middleware(settings)
    merged = settings.getwithbase("DOWNLOADER_MIDDLEWARES")
    priorities = {load_object(k) if isinstance(k, str) else k: v for k, v in merged.items()}
    return {cls: priorities[cls] for cls in map(lambda c: load_object(c) if isinstance(c, str) else c,
                                                 build_component_list(merged))
            if issubclass(cls, RobotsTxtMiddleware)}


def test_the_add_on_replaces_scrapy_s_middleware_at_its_priority():
    assert robots_middlewares({}) == {PoliteRobotsTxtMiddleware: 100}
    assert robots_middlewares({SCRAPY: 120}) == {PoliteRobotsTxtMiddleware: 120}
    assert robots_middlewares({RobotsTxtMiddleware: 90}) == {PoliteRobotsTxtMiddleware: 90}


def test_the_add_on_leaves_robots_txt_alone_when_the_project_decided():
    """The negative controls: disabled stays disabled, the opt-out keeps Scrapy's, a subclass of ours is kept."""
    assert robots_middlewares({SCRAPY: None}) == {}
    assert robots_middlewares({PoliteRobotsTxtMiddleware: None}) == {RobotsTxtMiddleware: 100}
    assert robots_middlewares({OurSubclass: 100}) == {OurSubclass: 100}


def test_a_project_s_own_robots_middleware_is_kept_with_a_warning(caplog):
    caplog.set_level(logging.WARNING, logger="scrapy_polite.addon")
    assert robots_middlewares({SCRAPY: None, OwnRobots: 100}) == {OwnRobots: 100}
    assert any("robots.txt is handled by" in r.getMessage() and "OwnRobots" in r.getMessage() for r in caplog.records)
    caplog.clear()
    assert robots_middlewares({SCRAPY: None, OwnRobots: 100}, obey=False) == {OwnRobots: 100}
    assert not caplog.records  # the negative control: robots.txt not obeyed, nothing to say


@pytest.mark.parametrize("project,obey,early", [
    ({}, True, False),  # ours in place: it decides the early deferral
    ({OurSubclass: 100}, True, False),
    ({PoliteRobotsTxtMiddleware: None}, True, True),  # the opt-out keeps Scrapy's
    ({SCRAPY: None, OwnRobots: 100}, True, True),  # a project's own subclass of Scrapy's
    ({SCRAPY: None, OwnRobots: 100}, False, False),  # robots.txt not obeyed: nothing waits for it
    ({SCRAPY: None}, True, False),  # robots.txt handling disabled
], ids=["ours", "subclass-of-ours", "opt-out", "own-subclass", "not-obeyed", "disabled"])
def test_the_early_defer_middleware_is_installed_only_where_robots_txt_is_not_ours(project, obey, early):
    """docs/spec.md §5, "The early deferral": a robots.txt middleware other than ours makes requests wait for
    robots.txt without deferring them first, so the add-on puts PoliteEarlyDeferMiddleware at 50 before it."""
    settings = Settings({"DOWNLOADER_MIDDLEWARES": project, "ROBOTSTXT_OBEY": obey, "POLITE_STORE": "memory://"})
    Addon().update_settings(settings)
    merged = settings.getwithbase("DOWNLOADER_MIDDLEWARES")
    assert (merged.get("scrapy_polite.middleware.PoliteEarlyDeferMiddleware") == 50) is early


def test_the_add_on_installs_it_through_update_settings():
    settings = Settings({"ROBOTSTXT_OBEY": True, "POLITE_STORE": "memory://"})
    Addon().update_settings(settings)
    merged = settings.getwithbase("DOWNLOADER_MIDDLEWARES")
    assert PoliteRobotsTxtMiddleware in build_component_list(merged)
    assert SCRAPY not in build_component_list(merged) and RobotsTxtMiddleware not in build_component_list(merged)
    disabled = Settings({"ROBOTSTXT_OBEY": True, "POLITE_ENABLED": False})
    Addon().update_settings(disabled)  # the negative control: with the add-on off, Scrapy's stays
    assert SCRAPY in build_component_list(disabled.getwithbase("DOWNLOADER_MIDDLEWARES"))


def test_the_middleware_keeps_robotstxt_parser_and_obey():
    crawler = get_crawler(settings_dict={"ROBOTSTXT_OBEY": True, "POLITE_STORE": "memory://",
                                         "POLITE_ALLOW_PRIVATE": True,
                                         "ROBOTSTXT_PARSER": "scrapy.robotstxt.PythonRobotParser"})
    try:
        middleware = PoliteRobotsTxtMiddleware.from_crawler(crawler)
        assert middleware._parserimpl is PythonRobotParser and middleware.pacer is not None
    finally:
        discard_pacer(crawler)
    from scrapy.exceptions import NotConfigured

    with pytest.raises(NotConfigured):  # ROBOTSTXT_OBEY = False: Scrapy's rule
        PoliteRobotsTxtMiddleware.from_crawler(get_crawler(settings_dict={"ROBOTSTXT_OBEY": False}))


@pytest.mark.parametrize("parser", ["scrapy.robotstxt.PythonRobotParser", "scrapy.robotstxt.ProtegoRobotParser"])
def test_the_delay_is_read_with_protego_whatever_parses_the_rules(parser):
    """``ROBOTSTXT_PARSER`` decides the rules; the delay is read with Protego from the same body (docs/spec.md §5):
    urllib's parser reads no ``2.5`` (only whole seconds), no ``Request-rate``. Its own reading is the control."""
    from scrapy.http import Response

    from scrapy_polite.policy.robots import robots_delay

    crawler = get_crawler(settings_dict={"ROBOTSTXT_OBEY": True, "POLITE_STORE": "memory://",
                                         "POLITE_ALLOW_PRIVATE": True, "ROBOTSTXT_PARSER": parser})
    body = b"User-agent: *\nCrawl-delay: 2.5\nRequest-rate: 1/10s\nDisallow: /private/\n"
    try:
        middleware = PoliteRobotsTxtMiddleware.from_crawler(crawler)
        answer = middleware._answer(Response("http://example.com/robots.txt", body=body), redirected_too_often=False)
    finally:
        discard_pacer(crawler)
    rules = answer.rules.parser
    assert robots_delay(rules, "mybot") == 10.0
    assert not rules.allowed("http://example.com/private/x", "mybot")  # the rules are still the chosen parser's
    if parser.endswith("PythonRobotParser"):
        assert robots_delay(rules.rp, "mybot") is None  # urllib's own reading loses both


def test_parse_robots_delay_reads_past_a_byte_order_mark():
    from scrapy_polite.policy.robots import parse_robots_delay

    body = b"User-agent: *\nCrawl-delay: 5\n"
    assert parse_robots_delay(b"\xef\xbb\xbf" + body, "mybot") == parse_robots_delay(body, "mybot") == 5.0
    assert parse_robots_delay("\ufeff" + body.decode(), "mybot") == 5.0


def test_constants_meet_rfc_9309():
    from scrapy_polite.policy.robots import ROBOTS_MAX_REDIRECTS

    assert ROBOTS_TTL <= 24 * 3600 and ROBOTS_MAX_BYTES >= 500 * 1024 and ROBOTS_MAX_REDIRECTS >= 5
    assert not math.isinf(ROBOTS_TTL)


# -- the words: progress line and summary ---------------------------------------------------------------------------


def test_the_progress_line_and_the_summary_name_an_unreachable_robots_txt():
    from scrapy_polite.reports.counters import Report
    from scrapy_polite.reports.summary import HeldHost, format_progress, format_summary

    t = [1_800_000_000.0]
    report = Report(None, lambda: t[0])
    report.deferred("down.example", "robots_unreachable", "http://down.example/a", t[0] + 4)
    report.robots_unreachable("down.example", t[0], "503")
    report.deferred("slow.example", "crawl_delay", "http://slow.example/a", t[0] + 4)
    t[0] += 12
    held = [HeldHost("down.example", 3, t[0] + 4), HeldHost("slow.example", 2, t[0] + 4)]
    busy = format_progress(report, held, now=t[0], idle=False)
    assert busy is not None and "5 requests held (3 for robots.txt unreachable: down.example)" in busy
    idle = format_progress(report, held, now=t[0], idle=True)
    assert idle is not None and "down.example (robots.txt unreachable (503) for 12.0 s, 3 held)" in idle
    summary = format_summary(report, now=t[0])
    assert "2 deferred (1 Crawl-delay, 1 robots.txt unreachable)" in summary
    assert "down.example: robots.txt unreachable (503) for 12.0 s at close" in summary
    # The negative control: once robots.txt answered, neither line names it.
    report.robots_unreachable("down.example", None)
    assert "robots.txt unreachable:" not in (format_progress(report, held, now=t[0], idle=False) or "")
    assert "at close" not in format_summary(report, now=t[0])


# -- a request the scheduler cannot hold waits ------------------------------------------------------------------------


class ScriptedEngine:
    """Answers each robots.txt request with the next of ``statuses`` (the last one for ever)."""

    def __init__(self, *statuses: int, body: bytes = b"User-agent: *\nDisallow: /private\n") -> None:
        self.statuses, self.body, self.asked = list(statuses), body, []

    async def download_async(self, request):  # noqa: ANN001, ANN201 - Scrapy's engine's signature
        from scrapy.http import TextResponse

        self.asked.append(time.monotonic())
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return TextResponse(request.url, status=status, body=self.body if status == 200 else b"<p>busy</p>",
                            request=request)


def as_the_downloader_runs_it(middleware: PoliteRobotsTxtMiddleware, request: Request) -> object:
    """``process_request`` run as the downloader runs it (an asyncio task under the asyncio reactor)."""
    from scrapy.utils.defer import deferred_from_coro

    return deferred_from_coro(middleware.process_request(request))


def waiting_middleware(engine: ScriptedEngine, **settings: object) -> PoliteRobotsTxtMiddleware:
    crawler = get_crawler(settings_dict={"ROBOTSTXT_OBEY": True, "POLITE_STORE": "memory://",
                                         "POLITE_ALLOW_PRIVATE": True, "POLITE_HOST_INTERVAL": 0.2, **settings})
    crawler.engine = engine  # type: ignore[assignment]
    return PoliteRobotsTxtMiddleware.from_crawler(crawler)


@pytest_twisted.ensureDeferred
async def test_a_request_the_scheduler_cannot_hold_waits_for_robots_txt_then_is_judged():
    """No PoliteScheduler hands the request out (``engine.download()``, a project without the add-on's scheduler):
    robots.txt answers 503, so the request waits — it is neither sent nor dropped — until robots.txt is asked again
    (0.2 s later: the interval) and answers; then its rules judge it (disallowed), and the next request goes."""
    engine = ScriptedEngine(503, 200)
    middleware = waiting_middleware(engine)
    try:
        with pytest.raises(IgnoreRequest, match="Forbidden by robots.txt"):
            await as_the_downloader_runs_it(middleware, Request("http://h.example/private/1"))
        assert len(engine.asked) == 2 and engine.asked[1] - engine.asked[0] >= 0.2 - 0.02
        assert await as_the_downloader_runs_it(middleware, Request("http://h.example/a")) is None
        assert len(engine.asked) == 2
    finally:
        discard_pacer(middleware.crawler)


@pytest_twisted.ensureDeferred
async def test_a_waiting_request_is_dropped_once_robots_txt_was_unreachable_past_the_idle_wait():
    """The same with a robots.txt that stays 503 and ``POLITE_MAX_IDLE_WAIT = 0.5``: the request waits through
    the re-asks (0.2 s, 0.4 s after each), then is dropped (``polite/robots/given_up``) — not sent."""
    engine = ScriptedEngine(503)
    middleware = waiting_middleware(engine, POLITE_MAX_IDLE_WAIT=0.5)
    try:
        with pytest.raises(IgnoreRequest, match="unreachable for longer than POLITE_MAX_IDLE_WAIT"):
            await as_the_downloader_runs_it(middleware, Request("http://h.example/a"))
        assert len(engine.asked) >= 2
        assert middleware.crawler.stats.get_value("polite/robots/given_up") == 1
        assert middleware.crawler.stats.get_value("polite/robots/unreachable") == len(engine.asked)
    finally:
        discard_pacer(middleware.crawler)


# -- the early deferral (docs/spec.md §5) -----------------------------------------------------------------------------


class HoldingScheduler:
    """Stands in for PoliteScheduler: owns every request, records what it is asked to hold."""

    def __init__(self) -> None:
        self.held: list[tuple[str, str, float | None]] = []

    def owns(self, request: Request) -> bool:
        return True

    def hold(self, request: Request, host: str, due: float | None, *, reason: Any = None) -> None:
        self.held.append((request.url, host, due))


def early_middleware(engine: ScriptedEngine, reads: list) -> tuple[PoliteRobotsTxtMiddleware, HoldingScheduler]:
    """A robots.txt middleware whose scheduler holds requests and whose table reads (``Booker.early_due``) wait
    until the test answers them: each read is a Deferred appended to ``reads``."""
    from scrapy.utils.defer import maybe_deferred_to_future
    from twisted.internet.defer import Deferred

    middleware = waiting_middleware(engine)
    scheduler = HoldingScheduler()
    booker = middleware.pacer.booker
    booker.scheduler = scheduler  # type: ignore[assignment]

    async def early_due(request: Request, host: str, unless: Any = None) -> float | None:
        reads.append(Deferred())
        due = await maybe_deferred_to_future(reads[-1])
        return None if due is None or (unless is not None and unless()) else due

    booker.early_due = early_due  # type: ignore[method-assign]
    return middleware, scheduler


async def turns(n: int = 3) -> None:
    """Let the reactor run ``n`` turns (the downloader's tasks start, answered reads go on)."""
    from twisted.internet import reactor, task

    for _ in range(n):
        await task.deferLater(reactor, 0, lambda: None)


@pytest_twisted.ensureDeferred
async def test_a_request_about_to_wait_for_robots_txt_of_a_host_that_should_defer_is_held_unasked():
    """The table says the host is due later: the request is handed to the scheduler with that moment, and
    robots.txt is not asked (it would wait out the backoff in line beside the request). Negative control: a host
    that need not defer (the read answers None) goes on: robots.txt is asked and judges the request."""
    engine, reads = ScriptedEngine(200), []
    middleware, scheduler = early_middleware(engine, reads)
    try:
        held = as_the_downloader_runs_it(middleware, Request("http://h.example/a"))
        await turns()
        reads[0].callback(1234.0)
        request = await held
        assert request is not None and request.url == "http://h.example/a"
        assert scheduler.held == [("http://h.example/a", "h.example", 1234.0)] and engine.asked == []
        going = as_the_downloader_runs_it(middleware, Request("http://h.example/b"))
        await turns()
        reads[1].callback(None)
        assert await going is None and len(engine.asked) == 1
    finally:
        discard_pacer(middleware.crawler)


@pytest_twisted.ensureDeferred
async def test_requests_whose_reads_cross_robots_txt_being_asked_ask_it_once():
    """Two requests of one origin read the table while robots.txt is not known; the first read answers, its request
    asks robots.txt; the second's answers after that: it waits for the same robots.txt, which is asked once.
    Fails when a request acts on what it decided before its read (the origin was "unknown": it asks again)."""
    engine, reads = ScriptedEngine(200), []
    middleware, scheduler = early_middleware(engine, reads)
    try:
        first = as_the_downloader_runs_it(middleware, Request("http://h.example/a"))
        second = as_the_downloader_runs_it(middleware, Request("http://h.example/b"))
        await turns()
        assert len(reads) == 2
        reads[0].callback(None)
        await turns()  # the first request asks robots.txt
        reads[1].callback(None)
        assert await first is None and await second is None
        assert len(engine.asked) == 1 and scheduler.held == []
    finally:
        discard_pacer(middleware.crawler)


@pytest_twisted.ensureDeferred
async def test_a_request_arriving_while_robots_txt_is_asked_is_held_when_its_host_should_defer():
    """robots.txt is being asked (its answer not in yet) when a second request of the origin comes: the table now
    says the host is due later (another process throttled it), so that request is held, not left waiting for
    robots.txt; robots.txt is asked once. Negative control: the first request, whose read said go, waits for the
    answer and is judged by it."""
    from scrapy.utils.defer import maybe_deferred_to_future
    from twisted.internet.defer import Deferred

    answer: Deferred = Deferred()

    class SlowEngine(ScriptedEngine):
        async def download_async(self, request):  # noqa: ANN001, ANN201
            await maybe_deferred_to_future(answer)
            return await super().download_async(request)

    engine, reads = SlowEngine(200), []
    middleware, scheduler = early_middleware(engine, reads)
    try:
        first = as_the_downloader_runs_it(middleware, Request("http://h.example/a"))
        await turns()
        reads[0].callback(None)
        await turns()  # robots.txt asked, its answer held back
        second = as_the_downloader_runs_it(middleware, Request("http://h.example/b"))
        await turns()
        reads[1].callback(99.0)
        await turns()
        assert second.called, "the request waits for robots.txt instead of being held"
        held = await second
        assert held is not None and scheduler.held == [("http://h.example/b", "h.example", 99.0)]
        answer.callback(None)
        assert await first is None and len(engine.asked) == 1 and len(reads) == 2
    finally:
        discard_pacer(middleware.crawler)


@pytest.mark.parametrize(("status", "flags", "meta", "stored"), [
    (503, ["cached"], {}, True),  # a 503 the HTTP cache kept answered the request: the server was not asked
    (429, ["cached"], {}, True),
    (500, ["cached"], {}, True),
    (200, ["cached"], {}, False),  # control: stored rules are an answer
    (404, ["cached"], {}, False),  # control: stored "unavailable" too
    (503, [], {}, False),  # control: the server's own 503
    (503, ["cached"], {"cached_response": object()}, False),  # a stale entry revalidated: the server answered 5xx
])
def test_a_robots_txt_error_from_the_http_cache_is_asked_again(status, flags, meta, stored):
    """docs/guides/robots.md: a 5xx or 429 robots.txt answer the HTTP cache stored is not the server's answer now."""
    from scrapy.http import Response

    from scrapy_polite.robotstxt import _stored_error

    request = Request("http://a.example/robots.txt", meta=meta)
    assert _stored_error(request, Response(request.url, status=status, flags=flags, request=request)) is stored
