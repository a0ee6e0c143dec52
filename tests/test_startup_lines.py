"""What the crawl says at start (issue 19, "Smaller things seen on the way"):

* the leftover-settings warning names only Scrapy pacing settings actually in force, with the fix for where
  each was set (``-s`` on the command line, the spider's ``custom_settings``, ``settings.py``), and includes
  ``CONCURRENT_REQUESTS_PER_DOMAIN``;
* the "starts in backoff" line names only hosts this crawl can touch at start, any other one when the crawl
  first meets it (never a host it never touches), and does not call the table's writer "an earlier run".
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest_twisted
from scrapy import Spider
from scrapy.settings import Settings

from scrapy_polite.extension import PoliteExtension, crawl_can_touch
from scrapy_polite.policy import HostState
from scrapy_polite.reports.counters import Report
from scrapy_polite.reports.summary import format_start_backoffs
from scrapy_polite.startup import leftover_settings_warning

T0 = 1_800_000_000.0


def settings(project=None, cmdline=None, spider=None) -> Settings:
    s = Settings()
    s.setdict(project or {}, priority="project")
    s.setdict(spider or {}, priority="spider")
    s.setdict(cmdline or {}, priority="cmdline")
    return s


# --------------------------------------------------------------------------------------------------
# Leftover settings


def test_nothing_in_force_means_no_warning():
    assert leftover_settings_warning(settings()) is None
    # negative controls: explicitly off is not a leftover, nor is a zero delay
    assert leftover_settings_warning(settings({"AUTOTHROTTLE_ENABLED": False, "DOWNLOAD_DELAY": 0})) is None


def test_only_the_settings_in_force_are_named():
    text = leftover_settings_warning(settings({"DOWNLOAD_DELAY": 1, "AUTOTHROTTLE_ENABLED": False}))
    assert text is not None
    assert text.startswith("scrapy-polite: DOWNLOAD_DELAY=1 still applies on top of scrapy-polite's pacing")
    assert "AUTOTHROTTLE" not in text  # the issue: "AUTOTHROTTLE_ENABLED=False still apply"
    assert "remove DOWNLOAD_DELAY from settings.py" in text


def test_the_startproject_template_lines_are_all_named():
    text = leftover_settings_warning(settings({"DOWNLOAD_DELAY": 1, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}))
    assert text is not None
    assert "DOWNLOAD_DELAY=1, CONCURRENT_REQUESTS_PER_DOMAIN=1 still apply" in text
    assert "remove DOWNLOAD_DELAY, CONCURRENT_REQUESTS_PER_DOMAIN from settings.py" in text
    assert "(the startproject template sets DOWNLOAD_DELAY = 1 and CONCURRENT_REQUESTS_PER_DOMAIN = 1)" in text


def test_autothrottle_alone_in_settings_py_gets_no_word_on_the_startproject_template():
    """Trial: the note on the template's lines followed AutoThrottle alone, which the template does not set."""
    text = leftover_settings_warning(settings({"AUTOTHROTTLE_ENABLED": True}))
    assert text is not None and "remove AUTOTHROTTLE_ENABLED from settings.py unless" in text
    assert "template" not in text


def test_a_command_line_setting_is_to_be_dropped_from_the_command_line():
    text = leftover_settings_warning(settings(cmdline={"DOWNLOAD_DELAY": "2.5"}))
    assert text is not None
    assert "drop -s DOWNLOAD_DELAY=2.5 from the command line" in text
    assert "settings.py" not in text  # the issue: "remove them from settings.py" for a -s setting


def test_each_setting_gets_the_fix_for_where_it_was_set():
    text = leftover_settings_warning(settings({"DOWNLOAD_DELAY": 1}, cmdline={"AUTOTHROTTLE_ENABLED": "1"},
                                              spider={"CONCURRENT_REQUESTS_PER_DOMAIN": 2}))
    assert text is not None
    assert "drop -s AUTOTHROTTLE_ENABLED=True from the command line" in text
    assert "remove CONCURRENT_REQUESTS_PER_DOMAIN from the spider's custom_settings" in text
    assert "remove DOWNLOAD_DELAY from settings.py" in text


def test_concurrent_requests_per_domain_at_its_default_is_no_leftover():
    assert leftover_settings_warning(Settings()) is None  # Scrapy's default 8, priority "default"


# --------------------------------------------------------------------------------------------------
# Hosts that start in backoff


class Plain(Spider):
    name = "plain"


def test_which_hosts_a_crawl_can_touch():
    assert crawl_can_touch(Plain()) is None  # names no host: any may be met
    starts = crawl_can_touch(Plain(start_urls=["http://A.example/x"]))
    assert starts is not None and starts("a.example") and not starts("b.example")
    offsite = crawl_can_touch(Plain(allowed_domains=["example.org"], start_urls=["http://a.example/"]))
    assert offsite is not None
    assert offsite("example.org") and offsite("www.example.org") and offsite("a.example")
    assert not offsite("badexample.org") and not offsite("other.net")  # negative controls


def test_a_host_not_listed_at_start_is_named_when_first_met_and_never_otherwise():
    clock = [T0]
    report = Report(None, lambda: clock[0])
    named: list[str] = []
    report.on_first_touch = named.append
    for host in ("met.example", "never.example"):
        report.starts_in_backoff(host, HostState(next_allowed=T0 + 60, consec=2, updated=T0 - 1), announce=True)
    report.deferred("met.example", "throttled", "http://met.example/", T0 + 60)
    report.deferred("met.example", "throttled", "http://met.example/2", T0 + 60)
    report.booked("other.example")
    assert named == ["met.example"]  # once, and never the host the crawl does not touch


@pytest_twisted.ensureDeferred
async def test_a_host_whose_requests_were_resumed_held_is_listed_at_start(caplog):
    """Trial: a ``JOBDIR`` resume holding requests only for a host in backoff, which its spider cannot otherwise
    touch (``allowed_domains``), never named it: its held requests make it a host the crawl touches. Control: a host
    in backoff neither held nor touchable is not listed at start."""
    report = Report(None, lambda: T0)
    rows = [(host, HostState(next_allowed=T0 + 60, consec=2, updated=T0 - 1)) for host in ("held.example", "x.example")]

    async def hosts_in_backoff() -> tuple[float, list[tuple[str, HostState]]]:
        return 0.0, rows

    scheduler = SimpleNamespace(held_hosts=lambda: [("held.example", 3, T0 + 60)])
    ext = PoliteExtension.__new__(PoliteExtension)
    ext.crawler, ext.report = SimpleNamespace(settings=Settings()), report
    ext.pacer = SimpleNamespace(hosts_in_backoff=hosts_in_backoff, clock=lambda: T0, booker=SimpleNamespace(
        scheduler=scheduler), store=SimpleNamespace(uri="sqlite:///x"))
    with caplog.at_level(logging.INFO, logger="scrapy_polite.extension"):
        await ext._list_start_backoffs(Plain(allowed_domains=["other.org"]))
    lines = [r.getMessage() for r in caplog.records if "starts in backoff" in r.getMessage()]
    assert len(lines) == 1 and "held.example" in lines[0] and "x.example" not in lines[0], lines


def test_the_start_line_does_not_call_the_tables_writer_an_earlier_run():
    report = Report(None, lambda: T0)
    report.starts_in_backoff("a.example", HostState(next_allowed=T0 + 30, consec=3, updated=T0 - 1))
    line = format_start_backoffs(report.hosts, now=T0, store_uri="sqlite:///x")
    assert line is not None
    assert "a.example (3 backoff steps already in the pace table) due in 30.0 s" in line
    assert "earlier run" not in line
    assert line.endswith("to forget the backoff: scrapy polite reset a.example")
    # Trial H: a JOBDIR resume said only "1 backoff step" where the row knows the Retry-After that set it.
    report.starts_in_backoff("b.example", HostState(next_allowed=T0 + 20, consec=1, run_retry_after=20.0))
    line = format_start_backoffs(report.hosts, now=T0, store_uri="sqlite:///x")
    assert line is not None and "b.example (Retry-After 20 s; 1 backoff step already in the pace table)" in line
