"""What the crawl tells its user at INFO (issue 9): the hosts that start in backoff, the progress line on
``LOGSTATS_INTERVAL``, and the closing summary in README's words ("Stats").

The formatting is pure (:mod:`scrapy_polite.reports.summary`, on a :class:`~scrapy_polite.reports.counters.Report` with a
fake clock); the start-up and progress lines are also checked on real crawls against loopback servers,
each with its negative control (the same crawl without a host in backoff).
"""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_twisted
from scrapy.settings import Settings

from scrapy_polite.clock import process_clock
from scrapy_polite.extension import PoliteExtension
from scrapy_polite.frontier.worker import SharedWorker
from scrapy_polite.policy import Decision, HostState
from scrapy_polite.reports.counters import Report, Span
from scrapy_polite.reports.summary import HeldHost, format_progress, format_summary
from scrapy_polite.reports.words import format_duration
from scrapy_polite.scheduler import PoliteScheduler
from scrapy_polite.stores import open_store
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.scheduler_pacer import SchedulerPacer
from tests.support.server import Reply, scripted
from tests.test_frontier import DownQueue, FlakyFrontier

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def report() -> tuple[Report, Clock]:
    clock = Clock()
    return Report(None, clock), clock


def throttle(report: Report, host: str, *, at: float, due: float, steps: int, label: str = "429",
             retry_after: float | None = None) -> None:
    counters = report.counters(host)
    counters.throttles += 1
    counters.backoff_steps += 1
    state = HostState(next_allowed=due, consec=steps, updated=at)
    report.recorded(host, Decision(state=state, delay=due - at, throttle=True, counted=True), label=label,
                    retry_after=retry_after)


# --------------------------------------------------------------------------------------------------
# Span and words


def test_span_counts_overlapping_intervals_once():
    span = Span()
    span.add(0, 10)
    span.add(5, 12)  # overlaps: extends
    span.add(20, 25)  # a gap
    assert span.seconds() == 17
    assert span.seconds(until=22) == 14  # the last interval only up to the end
    empty = Span()
    empty.add(3, 3)
    assert empty.seconds() == 0


def test_span_takes_intervals_in_any_order_and_unions_spans():
    span = Span()
    span.add(20, 25)
    span.add(0, 5)  # before everything so far
    span.add(4, 21)  # bridges both
    span.add(30, 31)
    assert span.intervals() == [(0, 25), (30, 31)]
    assert span.seconds() == 26 and span.seconds(until=10) == 10
    other = Span()
    other.add(24, 30)
    assert Span.union([span, other]).intervals() == [(0, 31)]
    disjoint = Span()  # negative control: apart, nothing is merged
    disjoint.add(40, 41)
    assert Span.union([span, disjoint]).seconds() == 27


def test_durations_read_as_a_person_would():
    assert [format_duration(s) for s in (0.44, 12.0, 250.4, 7300)] == ["0.4 s", "12.0 s", "4 m 10 s", "2 h 1 m"]


# --------------------------------------------------------------------------------------------------
# The summary


def test_turn_waits_are_kept_apart_from_deferrals_caused_by_throttling_or_a_long_crawl_delay():
    rep, clock = report()
    for _ in range(3):
        rep.booked("healthy.example")
        rep.waited("healthy.example", 1.0)  # its turn: the host is not backing off
        clock.t += 1.0
    rep.deferred("healthy.example", "line")
    rep.deferred("healthy.example", "ip_line")
    throttle(rep, "busy.example", at=clock.t, due=clock.t + 30, steps=1, retry_after=30)
    rep.deferred("busy.example", "throttled")
    rep.deferred("busy.example", "throttled")
    rep.waited("busy.example", 5.0)  # a request that could not be deferred waits the backoff out
    rep.deferred("slow.example", "crawl_delay")
    clock.t += 10
    text = format_summary(rep, now=clock.t)
    rows = {line.split()[0]: line for line in text.splitlines()[2:]}
    # healthy: 3 waits in line + 2 held for a busy line = 5 turn waits, nothing deferred
    assert re.search(r"healthy\.example +3 +0 +0 +0 +- +5 \(3\.0 s\) +- +-$", rows["healthy.example"]), text
    # busy: its backoff is not a turn wait; its deferrals say why
    assert re.search(r"busy\.example +0 +0 +1 +1 +10\.0 s +- +2 throttled +-$", rows["busy.example"]), text
    assert rows["slow.example"].rstrip().endswith("1 Crawl-delay        -") or "1 Crawl-delay" in rows["slow.example"]
    header = text.splitlines()[1].split("  ")
    assert [h.strip() for h in header if h.strip()] == ["host", "requests", "given up", "throttles",
                                                        "backoff steps", "backing off", "turn waits",
                                                        "deferred", "refused"]
    assert "3 deferred (1 Crawl-delay, 2 throttled)" in text.splitlines()[0]
    assert "5 turn waits" in text.splitlines()[0]
    assert rep.counters("busy.example").throttle_cause == "429, Retry-After 30 s"


def test_a_spent_quota_is_named_rate_limit_and_is_not_a_turn_wait():
    rep, clock = report()
    rep.booked("quota.example")
    rep.deferred("quota.example", "ratelimit")
    rep.deferred("quota.example", "ratelimit")
    rep.deferred("other.example", "line")  # negative control: a busy line stays a turn wait
    clock.t += 5
    text = format_summary(rep, now=clock.t)
    rows = {line.split()[0]: line for line in text.splitlines()[2:]}
    assert "2 rate limit" in rows["quota.example"], text
    assert "ratelimit" not in text, text
    assert "2 deferred (2 rate limit)" in text.splitlines()[0], text
    assert "rate limit" not in rows["other.example"], text


def test_totals_never_add_per_host_times_into_more_than_the_crawl():
    """Ten hosts waiting in line at the same time for 10 s, and backing off at the same time, in a 10 s crawl:
    the totals say 10 s, not 100 s (the per-host rows keep their own 10 s)."""
    rep, clock = report()
    for i in range(10):
        rep.waited(f"h{i}.example", 10.0)
    for i in range(10, 20):
        throttle(rep, f"h{i}.example", at=T0, due=T0 + 10, steps=1)
    clock.t = T0 + 10
    first = format_summary(rep, now=clock.t).splitlines()[0]
    assert "20 hosts in 10.0 s" in first
    assert "backing off during 10.0 s of the crawl" in first
    assert "10 turn waits (held out of the downloader or in line; some request in line during 10.0 s of the crawl)" in first
    assert "100.0 s" not in first and "1 m 40 s" not in first


def test_backing_off_includes_the_backoff_after_a_success_that_leaves_steps():
    """docs/spec.md §2: a success takes one step off; with steps left, its delay is still a backoff."""
    rep, clock = report()
    throttle(rep, "busy.example", at=T0, due=T0 + 2, steps=3, retry_after=2)  # Retry-After 2 s, 3 steps
    ok = HostState(next_allowed=T0 + 2.1 + 4, consec=2, ok_seen=True, updated=T0 + 2.1)
    rep.recorded("busy.example", Decision(state=ok, delay=4.0, throttle=False, counted=True))
    done = HostState(next_allowed=T0 + 7, consec=0, ok_seen=True, updated=T0 + 6.5)  # negative control:
    rep.recorded("busy.example", Decision(state=done, delay=0.5, throttle=False, counted=True))  # 0 steps left
    clock.t = T0 + 10
    text = format_summary(rep, now=clock.t)
    row = [line for line in text.splitlines() if line.startswith("  busy.example")][0]
    assert re.search(r" 6\.0 s ", row), text  # 2 s of Retry-After + 4 s after the 200; not the last 0.5 s
    assert "backing off during 6.0 s of the crawl" in text.splitlines()[0], text


def test_a_host_only_in_backoff_from_an_earlier_run_is_not_in_the_summary():
    rep, clock = report()
    earlier = HostState(next_allowed=T0 + 600, consec=4, updated=T0 - 5)
    rep.starts_in_backoff("old.example", earlier)
    rep.booked("fresh.example")
    clock.t = T0 + 15
    text = format_summary(rep, now=clock.t)
    assert "old.example" not in text, text
    assert text.splitlines()[0].startswith("scrapy-polite summary: 1 host in 15.0 s"), text
    assert "backing off during 0.0 s of the crawl" in text.splitlines()[0], text
    # negative control: once this crawl defers one of its requests, the host and its backoff are in it
    rep.deferred("old.example", "throttled")
    text = format_summary(rep, now=clock.t)
    assert re.search(r"old\.example +0 +0 +0 +0 +15\.0 s .*1 throttled", text), text
    assert "2 hosts in 15.0 s" in text and "backing off during 15.0 s of the crawl" in text, text


def test_refusals_and_pages_given_up_are_in_the_summary():
    rep, clock = report()
    rep.refused("lan.example", "non_public")
    rep.refused("lan.example", "non_public")
    rep.gave_up("busy.example", "http://busy.example/a")
    clock.t += 1
    text = format_summary(rep, now=clock.t, unhosted={"no_host": 1, "invalid_host": 2})
    first = text.splitlines()[0]
    assert "1 page given up" in first
    assert "5 refused (2 invalid host, 1 no host, 2 non-public)" in first  # (trial: invalid hosts were left out)
    assert re.search(r"lan\.example .* 2 non-public$", text, re.MULTILINE), text
    assert "given up on busy.example: http://busy.example/a" in text
    assert rep.stats is None  # counters only (no stats collector)


def test_a_healthy_crawl_has_nothing_deferred_or_refused():
    """The negative control of the above: the words a healthy crawl gets."""
    rep, clock = report()
    rep.booked("a.example")
    clock.t += 2
    first = format_summary(rep, now=clock.t).splitlines()[0]
    assert "1 request, 0 pages given up, 0 throttles (0 backoff steps), 0 deferred, 0 refused" in first


# --------------------------------------------------------------------------------------------------
# The progress line


def test_progress_names_what_is_held_and_what_is_due_next():
    rep, clock = report()
    throttle(rep, "busy.example", at=T0, due=T0 + 250, steps=2, label="503")
    held = [HeldHost("busy.example", 4, T0 + 250), HeldHost("other.example", 1, float("inf"))]
    line = format_progress(rep, held, now=clock.t, idle=False)
    assert line is not None
    assert line.startswith("scrapy-polite: 5 requests held, 1 host in backoff; next due: busy.example in 4 m 10 s")
    assert "(503; 2 backoff steps); to forgive a host: scrapy polite reset busy.example" in line
    # everything else done, only the backoff left: say so, with host, cause and due
    only = format_progress(rep, held[:1], now=clock.t, idle=True)
    assert only is not None
    assert only.startswith("scrapy-polite: only waiting for held requests: busy.example (backing off after "
                           "503; 2 backoff steps, 4 held) due in 4 m 10 s (at ")
    assert only.endswith("; to forgive a host: scrapy polite reset busy.example")
    # trial: a table no other process can reach (memory://) named a command that could not reach it
    alone = format_progress(rep, held[:1], now=clock.t, idle=True, forgive=False)
    assert alone is not None and alone.startswith("scrapy-polite: only waiting") and "forgive" not in alone
    # negative controls: nothing held and nobody backing off -> nothing to say; a host due now -> not "only"
    assert format_progress(Report(None, clock), [], now=clock.t, idle=True) is None
    due_now = format_progress(rep, [HeldHost("busy.example", 1, T0)], now=clock.t, idle=True)
    assert due_now is not None and "only waiting" not in due_now


def test_progress_leaves_out_a_host_in_backoff_from_the_table_that_the_crawl_has_not_met():
    """Trial H: a crawl of one host, its requests held for their turn, said "1 host in backoff; next due:
    127.0.0.2 … scrapy polite reset 127.0.0.2", a host another crawl had left in backoff and this one never touched
    (the start line rightly left it out). Control: once the crawl meets it (a deferral), it is named."""
    rep, clock = report()
    rep.starts_in_backoff("other.example", HostState(next_allowed=T0 + 30, consec=1, updated=T0), announce=True)
    held = [HeldHost("mine.example", 2, float("inf"))]
    line = format_progress(rep, held, now=clock.t, idle=False)
    assert line == "scrapy-polite: 2 requests held, 0 hosts in backoff", line
    assert format_progress(rep, [], now=clock.t, idle=True) is None
    # (review) a host this crawl holds requests of is its business, met or not
    holding = format_progress(rep, [HeldHost("other.example", 2, T0 + 5)], now=clock.t, idle=False)
    assert holding is not None and "1 host in backoff; next due: other.example in 30.0 s" in holding, holding
    rep.deferred("other.example", "throttled", due=T0 + 30)
    met = format_progress(rep, held, now=clock.t, idle=False)
    assert met is not None and "1 host in backoff; next due: other.example in 30.0 s" in met, met
    assert "scrapy polite reset other.example" in met


def test_progress_names_another_process_s_request_in_flight_and_the_hold_s_bound():
    """A host kept out by another process's in-flight hold (a killed process's lasts until its bound: a trial's
    restart waited 2 m 41 s while every line said "its turn ... due now"): the lines say why and until when at the
    latest. The control: a hold that has ended is not named."""
    rep, clock = report()
    rep.counters("slow.example").held_elsewhere_until = clock.t + 161
    held = [HeldHost("slow.example", 1, clock.t + 2)]
    words = "a request of another process in flight: held until its answer, at the latest in 2 m 41 s"
    only = format_progress(rep, held, now=clock.t, idle=True)
    assert only is not None and f"slow.example ({words}" in only, only
    busy = format_progress(rep, held, now=clock.t, idle=False)
    assert busy is not None and f"next due: slow.example in 2.0 s (at 08:00:02) ({words}" in busy, busy
    later = format_progress(rep, held, now=clock.t + 200, idle=True)
    assert later is not None and "another process" not in later


def test_progress_names_a_wait_for_another_process_with_nothing_held():
    """Trial: a crawl restarted after a process was killed mid-download; its robots.txt (which cannot leave the
    downloader) waited for the dead process's hold, nothing held, no backoff: no line for a whole download timeout.
    Now the line names the host and the hold's bound. The controls: once the host is booked, and once the bound has
    passed, nothing is said."""
    rep, clock = report()
    rep.counters("slow.example").held_elsewhere_until = clock.t + 19
    line = format_progress(rep, [], now=clock.t, idle=False)
    assert line == ("scrapy-polite: waiting for slow.example (a request of another process in flight: held until its "
                    "answer, at the latest in 19.0 s (at 08:00:19))"), line
    assert format_progress(rep, [], now=clock.t + 20, idle=False) is None
    rep.booked("slow.example")
    assert format_progress(rep, [], now=clock.t, idle=False) is None


def test_progress_names_the_reason_the_host_was_deferred_for():
    """A host deferred for an operator's delay this process has no row of (trial: ``scrapy polite crawl-delay a.test
    120``, then ``scrapy fetch`` said "its turn" while its event said "deferred (Crawl-delay)"). The control: a host
    deferred only for its line is waiting its turn: ordinary pacing, not "only waiting" (trial H: a healthy one-host
    crawl at 60 pages/min read as stalled), unless another host waits for something else."""
    rep, clock = report()
    held = [HeldHost("slow.example", 1, clock.t + 119)]
    rep.deferred("slow.example", "line")
    line = format_progress(rep, held, now=clock.t, idle=True)
    assert line is not None and line.startswith(
        "scrapy-polite: 1 request held, 0 hosts in backoff; next due: slow.example in 1 m 59 s"), line
    rep.deferred("other.example", "crawl_delay", due=clock.t + 200)
    both = format_progress(rep, [*held, HeldHost("other.example", 2, clock.t + 200)], now=clock.t, idle=True)
    assert both is not None and "only waiting" in both and "slow.example (its turn, 1 held)" in both, both
    rep.deferred("slow.example", "crawl_delay", due=clock.t + 119)
    line = format_progress(rep, held, now=clock.t, idle=True)
    assert line is not None and "slow.example (Crawl-delay, 1 held)" in line, line


def test_the_progress_line_goes_on_when_the_frontier_cannot_be_asked(caplog):
    """Fleet trial: ``has_pending_requests`` raised through scrapy-redis during a Redis outage, the progress line
    logged an ERROR with a traceback, and its timer stopped for the rest of the crawl. The line is logged (it cannot
    say the crawl is idle), no ERROR. Once the scheduler has closed, no line."""
    rep, clock = report()
    throttle(rep, "busy.example", at=clock.t, due=clock.t + 30, steps=1)
    ext = PoliteExtension.__new__(PoliteExtension)
    ext.crawler = SimpleNamespace(engine=None, settings=Settings())
    ext.report = rep
    pacer = SchedulerPacer()
    crawler = SimpleNamespace(settings=Settings({"CONCURRENT_REQUESTS": 16}), stats=None, engine=None)
    scheduler = PoliteScheduler(crawler, DownQueue(), pacer)  # type: ignore[arg-type]
    scheduler.shared = SharedWorker(crawler, pacer, FlakyFrontier(), inner=None)  # type: ignore[arg-type]
    ext.pacer = SimpleNamespace(booker=SimpleNamespace(scheduler=scheduler, scheduler_closed=False), clock=clock,
                                 store=SimpleNamespace(store=None))
    with caplog.at_level(logging.DEBUG, logger="scrapy_polite.extension"):
        ext.log_progress()
    lines = [r for r in caplog.records if r.name == "scrapy_polite.extension"]
    assert [r.levelno for r in lines if r.levelno >= logging.INFO] == [logging.INFO], lines
    assert "1 host in backoff" in lines[-1].getMessage()
    caplog.clear()  # (review) without the add-on's scheduler (its parts wired by hand), the line is still logged
    ext.pacer.booker.scheduler = None
    with caplog.at_level(logging.DEBUG, logger="scrapy_polite.extension"):
        ext.log_progress()
    assert ["1 host in backoff" in r.getMessage() for r in caplog.records] == [True]
    caplog.clear()  # the scheduler closed (it reported what it left): a line now would say "0 requests held" (trial)
    ext.pacer.booker.scheduler_closed = True
    with caplog.at_level(logging.DEBUG, logger="scrapy_polite.extension"):
        ext.log_progress()
    assert not [r for r in caplog.records if r.name == "scrapy_polite.extension"]


# --------------------------------------------------------------------------------------------------
# On real crawls


def backoff_table(tmp_path: Any, host: str | None, *, seconds: float) -> str:
    uri = f"sqlite:///{tmp_path}/pace.sqlite3"
    store = open_store(uri)
    if host is not None:
        store.update(host, lambda s, now: (HostState(next_allowed=now + seconds, consec=2, updated=now), None))
    store.close()
    return uri


def polite_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "scrapy_polite.extension" and r.levelno == logging.INFO]


@pytest.mark.parametrize("in_backoff", [True, False], ids=["in_backoff", "negative_control"])
@pytest_twisted.ensureDeferred
async def test_startup_and_progress_lines_at_info_when_a_host_is_in_backoff(tmp_path, arrival_server, caplog,
                                                                            in_backoff):
    srv = arrival_server("127.0.0.41")
    written = process_clock()
    # 4 s: the crawl's start-up (seconds on a loaded machine) must not use up the backoff before the table is read
    uri = backoff_table(tmp_path, "127.0.0.41" if in_backoff else None, seconds=4.0)
    caplog.set_level(logging.INFO)
    crawler = await run_crawl(ListSpider, polite_settings(POLITE_STORE=uri, LOGSTATS_INTERVAL=0.5,
                                                          POLITE_HOST_INTERVAL=0.2, POLITE_IP_INTERVAL=0.2),
                              urls=[srv.url("/"), srv.url("/a")], timeout=30)
    assert sorted(crawler.spider.statuses()) == [200, 200]
    lines = polite_lines(caplog)
    start = [line for line in lines if "in backoff from the pace table" in line]
    only = [line for line in lines if "only waiting for held requests" in line]
    summary = [line for line in lines if line.startswith("scrapy-polite summary:")]
    assert len(summary) == 1
    if not in_backoff:
        assert start == [] and only == [], lines
        assert not any("in backoff;" in line and "0 hosts in backoff" not in line for line in lines), lines
        return
    assert len(start) == 1, lines  # listed once
    assert ("1 host starts in backoff from the pace table " + uri.replace("sqlite:///", "sqlite:///")) in start[0]
    assert "127.0.0.41 (2 backoff steps already in the pace table) due in " in start[0]
    assert "earlier run" not in start[0]  # the table cannot say whether its writer still runs
    assert start[0].endswith("to forget the backoff: scrapy polite reset 127.0.0.41"), start[0]
    assert only, lines
    assert re.match(r"scrapy-polite: only waiting for held requests: 127\.0\.0\.41 \(backing off after 2 "
                    r"backoff steps already in the pace table, \d held\) due in \d\.\d s \(at \d\d:\d\d:\d\d\); "
                    r"to forgive a host: scrapy polite reset 127\.0\.0\.41$", only[0]), only
    # the requests went only once the backoff was over
    assert min(a.start for a in srv.arrivals()) >= written + 4.0 - 0.05
    backing = float(re.search(r"backing off during (\d+\.\d) s", summary[0]).group(1))  # type: ignore[union-attr]
    crawl = float(re.search(r"1 host in (\d+\.\d) s", summary[0]).group(1))  # type: ignore[union-attr]
    assert 0.3 <= backing <= crawl, summary  # the table's backoff, then the steps still left after a success


@pytest_twisted.ensureDeferred
async def test_the_summary_of_a_real_crawl(arrival_server, caplog):
    """A healthy host, a throttling one and one with only non-public addresses: the summary's rows say what
    each host went through, in README's words."""
    healthy = arrival_server("127.0.0.42")
    busy = arrival_server("127.0.0.43")
    busy.route("/*", scripted(Reply.throttle(429, retry_after=1), then=Reply.html("<html>ok</html>")))
    caplog.set_level(logging.INFO)
    settings = polite_settings(POLITE_HOST_INTERVAL=0.3, POLITE_IP_INTERVAL=0.0,
                               POLITE_DNS_OVERRIDES={"lan.test": ["10.0.0.7"]}, RETRY_ENABLED=True,
                               RETRY_TIMES=3)
    started = process_clock()
    crawler = await run_crawl(ListSpider, settings, timeout=60,
                              urls=[healthy.url("/1"), healthy.url("/2"), healthy.url("/3"),
                                    busy.url("/x"), "http://lan.test/"])
    elapsed = process_clock() - started
    summary = [line for line in polite_lines(caplog) if line.startswith("scrapy-polite summary:")]
    assert len(summary) == 1
    text = summary[0]
    rows = {line.split()[0]: line for line in text.splitlines()[2:] if line.startswith("  ")}
    assert re.search(r"^  127\.0\.0\.42 +3 +0 +0 +0 +- +\d+ \(\d+\.\d s\) +- +-$", rows["127.0.0.42"], re.M), text
    assert re.search(r"^  127\.0\.0\.43 +2 +0 +1 +1 +1\.\d s +.* throttled +-$", rows["127.0.0.43"], re.M), text
    assert rows["lan.test"].rstrip().endswith("1 non-public"), text
    first = text.splitlines()[0]
    assert "1 refused (1 non-public)" in first
    crawl_seconds = float(re.search(r"hosts in (\d+\.\d) s", first).group(1))  # type: ignore[union-attr]
    assert crawl_seconds <= elapsed + 0.1
    backing = float(re.search(r"backing off during (\d+\.\d) s", first).group(1))  # type: ignore[union-attr]
    assert 0.9 <= backing <= crawl_seconds
    assert crawler.stats.get_value("polite/blocked/private_address") == 1


def test_a_span_keeps_bounded_memory_and_its_total_over_a_long_crawl():
    span = Span()
    for i in range(5 * Span.KEPT):  # waits in line that never overlap, one per second
        span.add(i, i + 0.5)
    assert len(span.intervals()) == Span.KEPT
    assert span.seconds() == pytest.approx(5 * Span.KEPT * 0.5)
    span.add(0, 10)  # reaches back into folded time: never counted twice
    assert span.seconds() == pytest.approx(5 * Span.KEPT * 0.5)
    other = Span()  # negative control: a short span keeps every interval
    other.add(0, 1)
    other.add(2, 3)
    assert other.intervals() == [(0, 1), (2, 3)]
