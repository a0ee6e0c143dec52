"""The timeline (``scrapy polite timeline``, scrapy_polite/reports/timeline.py) of a real crawl against loopback servers,
rendered in a real headless Chromium (Debian's ``chromium``, driven by tests/support/chromium.py; ``.ci/run``
installs it when missing): the HTML page, and the standalone SVG image.

The crawl has a healthy host, a host that throttles once (429 with Retry-After, then deferrals), a host whose
robots.txt publishes a Crawl-delay, and a host with a non-public address (refused). Its event log must hold
every host and every kind of event; the timeline drawn from it must have a row per host, open in Chromium with
no console error and no network request, show the URL, status and delay chosen when a mark is hovered, and
its screenshot (saved next to the HTML) must not be blank. The standalone SVG (``-o timeline.svg``) must be
well-formed XML with a row per host and a ``<title>`` tooltip on every mark, draw in Chromium on its own with no
error and no request, and not be blank. Negative controls prove the checks can fail: a page that logs an error
and loads a remote image is caught, a blank page's screenshot is judged blank, and a PNG is refused (exit 2)
without touching the store.

Chromium is never optional here: a missing browser fails the test (with the command that installs it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import defer

from scrapy_polite.reports.timeline import OUTCOME_COLOURS, timeline_html, timeline_svg
from scrapy_polite.stores import SQLiteStore
from tests.support.chromium import Chromium, find_chromium
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.png import read_png
from tests.support.server import Reply, page, sequence

ROOT = Path(__file__).resolve().parent.parent


def chromium() -> Chromium:
    binary = find_chromium()
    if binary is None:
        pytest.fail("headless Chromium is needed for this test and was not found: apt-get install -y chromium "
                    "(.ci/run installs it), or set POLITE_CHROMIUM to the browser's path")
    return Chromium(binary)


def not_blank(png: bytes) -> tuple[bool, str]:
    """A screenshot shows something: big enough, at least 3 % of its pixels not near-white, 8+ colours."""
    image = read_png(png)
    drawn = image.share(lambda p: min(p) < 235)
    colours = len(image.colours())
    ok = image.width >= 600 and image.height >= 150 and drawn >= 0.03 and colours >= 8
    return ok, f"{image.width}x{image.height}, {drawn:.1%} drawn, {colours} colours"


def polite(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return subprocess.run([sys.executable, "-m", "scrapy", "polite", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def crawled(tmp_path_factory):
    """One real crawl into a SQLite pace table: ``(store uri, path, hosts of the crawl, crawler stats)``."""
    return pytest_twisted.blockon(defer.ensureDeferred(_crawl(tmp_path_factory.mktemp("timeline"))))


async def _crawl(tmp: Path):
    from tests.support.server import ArrivalServer

    healthy, throttling, robots = ArrivalServer("127.0.0.2"), ArrivalServer("127.0.0.3"), ArrivalServer("127.0.0.4")
    try:
        healthy.site(4)
        throttling.site(4)
        throttling.route("/p/1", sequence(Reply.throttle(429, "1"), page("p1")))
        robots.site(3)
        robots.route("/robots.txt", Reply.robots("User-agent: *\nCrawl-delay: 0.6\n"))
        path = tmp / "pace.sqlite3"
        settings = polite_settings(
            POLITE_STORE=f"sqlite:///{path}", POLITE_HOST_INTERVAL=0.2, POLITE_IP_INTERVAL=0,
            POLITE_ALLOWED_NETWORKS=["127.0.0.0/8"], ROBOTSTXT_OBEY=True, RETRY_ENABLED=True, RETRY_TIMES=3,
            LOG_LEVEL="INFO")
        urls = [healthy.url("/"), throttling.url("/"), robots.url("/"), "http://10.0.0.1/private"]
        crawler = await run_crawl(ListSpider, settings, urls=urls, follow=True, timeout=90)
        hosts = {"127.0.0.2", "127.0.0.3", "127.0.0.4", "10.0.0.1"}
        return f"sqlite:///{path}", path, hosts, crawler.stats.get_stats()
    finally:
        for srv in (healthy, throttling, robots):
            srv.stop()


def test_the_event_log_of_the_crawl_has_every_host_and_every_kind(crawled):
    uri, path, hosts, stats = crawled
    store = SQLiteStore(str(path))
    try:
        events = store.events(limit=10**6)
    finally:
        store.close()
    assert {e.host for e in events} == hosts | {""}  # (the log's opening and closing: a process's, no host's)
    assert [e.kind for e in events if not e.host] == ["opened", "closed"]
    kinds = {(e.host, e.kind) for e in events}
    for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        assert (host, "booking") in kinds and (host, "response") in kinds, host
    assert ("127.0.0.3", "backoff") in kinds and ("127.0.0.3", "deferral") in kinds
    assert ("127.0.0.4", "robots_delay") in kinds
    assert ("10.0.0.1", "refusal") in kinds
    assert ("127.0.0.2", "backoff") not in kinds  # negative control: the healthy host never backed off
    backoff = next(e for e in events if e.kind == "backoff")
    assert backoff.status == 429 and backoff.retry_after == 1.0 and backoff.reason == "429" and backoff.steps == 1
    assert backoff.due is not None and backoff.due >= backoff.at + 1.0  # the Retry-After window
    response = next(e for e in events if e.kind == "response" and e.status == 429)
    assert response.delay >= 1.0 and response.started is not None and response.started <= response.at
    assert response.url.endswith("/p/1")
    deferral = next(e for e in events if e.kind == "deferral" and e.reason == "throttled")
    assert deferral.host == "127.0.0.3" and deferral.at >= backoff.at - 0.05  # the 429'd page, held until due
    robots = next(e for e in events if e.kind == "robots_delay")
    assert robots.delay == 0.6
    refusals = [e for e in events if e.kind == "refusal"]
    assert {e.reason for e in refusals} == {"non_public"} and "http://10.0.0.1/private" in {e.url for e in refusals}
    # One booking per request the crawl sent (robots.txt included), each answered by one response.
    bookings = [e for e in events if e.kind == "booking"]
    answered = [e for e in events if e.kind in ("response", "failure")]
    assert len(bookings) == stats["polite/requests"] == len(answered)
    assert {e.at for e in bookings} == {e.started for e in answered}
    assert all(e.source == events[0].source and e.source.endswith(f":{os.getpid()}") for e in events)


def test_the_timeline_renders_in_chromium_with_no_error_and_no_request(crawled, tmp_path):
    uri, path, hosts, _ = crawled
    result = polite("timeline", "--store", uri, "-o", str(tmp_path / "timeline.html"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert str(tmp_path / "timeline.html") in result.stdout
    document = (tmp_path / "timeline.html").read_text(encoding="utf-8")
    assert set(re.findall(r'<g class="row" data-host="([^"]*)"', document)) == hosts
    assert not re.search(r'(src|href)="(https?:)?//', document)  # nothing to fetch

    browser = chromium()
    report = browser.render(str(tmp_path / "timeline.html"), hover=".mark.throttle", evaluate=[
        "document.getElementById('tip').textContent",
        "getComputedStyle(document.getElementById('tip')).display",
        "Array.from(document.querySelectorAll('g.row')).map(function (g) { return g.dataset.host; })",
    ])
    assert report.console_errors == []
    assert report.external_requests == [] and report.requests == [report.url]
    tip, display, rows = report.evaluated
    assert display == "block"
    assert "/p/1" in tip and "429" in tip and "delay chosen" in tip and "Retry-After 1 s" in tip, tip
    assert set(rows) == hosts
    shot = tmp_path / "timeline.png"
    shot.write_bytes(report.screenshot)
    ok, how = not_blank(report.screenshot)
    assert ok, f"{shot}: {how}"
    image = read_png(report.screenshot)
    assert image.has_colour(OUTCOME_COLOURS["2xx"]) and image.has_colour(OUTCOME_COLOURS["throttle"])


SVG = "{http://www.w3.org/2000/svg}"


def test_the_timeline_as_a_standalone_svg_filtered_by_host(crawled, tmp_path):
    uri, _, _, _ = crawled
    result = polite("timeline", "--store", uri, "--host", "127.0.0.3", "--since", "1h", "-o",
                    str(tmp_path / "busy.svg"), "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["hosts"] == ["127.0.0.3"] and data["events"] > 0 and data["format"] == "svg"
    text = (tmp_path / "busy.svg").read_text(encoding="utf-8")
    root = ET.fromstring(text.encode("utf-8"))  # well-formed XML, or this raises
    assert root.tag == f"{SVG}svg" and root.get("width") and root.get("viewBox")
    assert [g.get("data-host") for g in root.iter(f"{SVG}g") if g.get("class") == "row"] == ["127.0.0.3"]
    marks = [e for e in root.iter(f"{SVG}rect") if (e.get("class") or "").startswith("mark")]
    assert marks and all(m.find(f"{SVG}title") is not None for m in marks)  # a native tooltip on every mark
    throttle = next(m for m in marks if "throttle" in (m.get("class") or ""))
    tip = throttle.find(f"{SVG}title").text
    assert "/p/1" in tip and "429" in tip and "Retry-After 1 s" in tip, tip
    assert "<script" not in text and not re.search(r'(src|href)="(https?:)?//', text)  # nothing runs, nothing to fetch
    # --format svg without -o writes timeline.svg; --format html wins over a .svg name.
    default = polite("timeline", "--store", uri, "--format", "svg", cwd=tmp_path)
    assert default.returncode == 0, default.stderr
    assert ET.parse(tmp_path / "timeline.svg").getroot().tag == f"{SVG}svg"
    # The whole log's SVG, opened on its own in Chromium: a row per host, no error, no request, not blank.
    report = chromium().render(str(tmp_path / "timeline.svg"), width=1400, height=100,
                               evaluate=["document.querySelectorAll('g.row').length"])
    assert report.console_errors == [] and report.external_requests == []
    assert report.evaluated == [4]
    ok, how = not_blank(report.screenshot)
    assert ok, how
    image = read_png(report.screenshot)
    assert image.has_colour(OUTCOME_COLOURS["2xx"]) and image.has_colour(OUTCOME_COLOURS["throttle"])
    forced = polite("timeline", "--store", uri, "--format", "html", "-o", str(tmp_path / "page.svg"), cwd=tmp_path)
    assert forced.returncode == 0 and (tmp_path / "page.svg").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    # Negative controls: a host without events, and a --since after everything, draw nothing (exit 1).
    missing = polite("timeline", "--store", uri, "--host", "nowhere.example", "-o", str(tmp_path / "x.html"),
                     cwd=tmp_path)
    assert missing.returncode == 1 and "nowhere.example" in missing.stderr
    assert not (tmp_path / "x.html").exists()
    later = polite("timeline", "--store", uri, "--since", "@9999999999", "-o", str(tmp_path / "y.html"), cwd=tmp_path)
    assert later.returncode == 1 and "no events" in later.stderr


def test_a_png_is_refused_with_the_svg_named(tmp_path):
    """PNG is not drawn any more: -o x.png is a usage error (exit 2) naming the .svg to write, before the store is
    opened (a missing store would be exit 3), and nothing is written; an unknown --format is refused too."""
    missing_store = f"sqlite:///{tmp_path / 'nowhere' / 'pace.sqlite3'}"
    png = polite("timeline", "--store", missing_store, "-o", str(tmp_path / "t.png"), cwd=tmp_path)
    assert png.returncode == 2, (png.returncode, png.stderr)
    assert "t.svg" in png.stderr and "Traceback" not in png.stderr
    assert not (tmp_path / "t.png").exists()
    fmt = polite("timeline", "--store", missing_store, "--format", "png", cwd=tmp_path)
    assert fmt.returncode == 2 and "png" in fmt.stderr
    # Negative control: the same missing store with an .svg output gets past the format and fails on the store.
    svg = polite("timeline", "--store", missing_store, "-o", str(tmp_path / "t.svg"), cwd=tmp_path)
    assert svg.returncode == 3, (svg.returncode, svg.stderr)


def test_the_svg_escapes_what_it_draws_and_an_empty_log_says_so():
    """Hosts and URLs with XML's special characters stay well-formed; no events is a picture that says so."""
    from scrapy_polite.stores.base import Event

    url = "http://a.example/?x=1&y=<2>&z=\"3\""
    events = [Event(at=100.0, kind="booking", host="a.example", url=url),
              Event(at=100.5, kind="response", host="a.example", url=url, status=200, started=100.0)]
    root = ET.fromstring(timeline_svg(events, title="t & <u>", store="sqlite:///x?a&b", now=200.0).encode())
    titles = [t.text or "" for t in root.iter(f"{SVG}title")]
    assert "t & <u>" in titles and any(url in t for t in titles)
    empty = ET.fromstring(timeline_svg([], store="memory://").encode())
    assert any("No events in memory://" in (t.text or "") for t in empty.iter(f"{SVG}text"))


def test_the_hosts_counted_are_the_hosts_crawled():
    """Trial: after a restore the timeline said "5 hosts" for 4, counting the table's ``restored`` event, which names
    no host; a host's own ``restored`` event counts it (control)."""
    from scrapy_polite.reports.timeline import hosts_of
    from scrapy_polite.stores.base import Event

    events = [Event(at=100.0, kind="booking", host="a.example"), Event(at=101.0, kind="restored", host=""),
              Event(at=102.0, kind="restored", host="b.example")]
    assert hosts_of(events) == ["a.example", "b.example"]


def test_negative_control_errors_and_requests_are_caught(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><p>bad</p><img src='http://192.0.2.1/x.png'>"
                   "<script>console.error('boom'); undefinedFunction();</script></body></html>", encoding="utf-8")
    report = chromium().render(str(bad))
    assert "http://192.0.2.1/x.png" in report.external_requests
    assert any("boom" in e for e in report.console_errors)
    assert any("undefinedFunction" in e for e in report.console_errors)


def test_negative_control_a_blank_page_is_judged_blank(tmp_path):
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")
    report = chromium().render(str(blank))
    assert report.console_errors == [] and report.external_requests == []
    ok, how = not_blank(report.screenshot)
    assert not ok, how
    # And the empty timeline (no events) is a page that says so, not an error.
    (tmp_path / "empty.html").write_text(timeline_html([]), encoding="utf-8")
    empty = chromium().render(str(tmp_path / "empty.html"), screenshot=False,
                              evaluate=["document.body.textContent"])
    assert "No events" in empty.evaluated[0] and empty.console_errors == []
