"""Errors a user can act on (issue 9): a configuration that cannot run safely or an invalid setting stops
``scrapy crawl`` before any request, with **one** ERROR line naming the problem and the fix, the traceback
only at DEBUG, and a non-zero exit status. Through the real ``scrapy crawl`` on a project written into a
temporary directory, against a loopback :class:`~tests.support.server.ArrivalServer` that must see nothing.
The project uses the default pace table (SQLite in the project's ``.scrapy/``), as a user's does: a store
that started anything before the refusal must not keep the process alive (issue 16; every store, and
``scrapy startproject``'s own project: tests/test_exit_status.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stores import write_sqlite_file

ROOT = Path(__file__).resolve().parent.parent

SETTINGS = '''
BOT_NAME = "started"
SPIDER_MODULES = ["started.spiders"]
{addons}
POLITE_ALLOWED_NETWORKS = ["127.0.0.0/8"]
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
RETRY_ENABLED = False
'''

SPIDERS = '''
import scrapy


class Plain(scrapy.Spider):
    name = "plain"
    start_urls = ["{url}"]

    def parse(self, response):
        pass


class SpiderOnly(Plain):
    name = "spider_only"
    custom_settings = {{"ADDONS": {{"scrapy_polite.Addon": 0}}}}


class BadDelay(Plain):
    name = "bad_delay"
    crawl_delay = -1


class GoodDelay(Plain):
    name = "good_delay"
    crawl_delay = "0.1"


class OwnHandler(Plain):
    name = "own_handler"
    custom_settings = {{"DOWNLOAD_HANDLERS": {{"http": "myproject.handlers.OwnHandler"}}}}
'''

ERROR_LINE = re.compile(r"^\S+ \S+ \[[^\]]+\] ERROR: ", re.MULTILINE)


def make_project(path: Path, url: str, *, addons: bool) -> Path:
    (path / "scrapy.cfg").write_text("[settings]\ndefault = started.settings\n")
    package = path / "started"
    (package / "spiders").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "spiders" / "__init__.py").write_text("")
    (package / "settings.py").write_text(SETTINGS.format(
        addons='ADDONS = {"scrapy_polite.Addon": 0}' if addons else ""))
    (package / "spiders" / "spiders.py").write_text(SPIDERS.format(url=url))
    return path


def crawl(cwd: Path, spider: str, *args: str, level: str = "INFO") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return subprocess.run([sys.executable, "-m", "scrapy", "crawl", spider, "-s", f"LOG_LEVEL={level}", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if ERROR_LINE.match(line)]


@pytest.fixture
def server(arrival_server):
    return arrival_server("127.0.0.31")


def assert_refused(proc: subprocess.CompletedProcess[str], server, *expected: str) -> str:
    """Exit status 1, exactly one ERROR line (containing ``expected``), no traceback, nothing sent."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    lines = errors(proc)
    assert len(lines) == 1, "\n".join(lines) or out
    assert "scrapy-polite cannot start the crawl: " in lines[0]
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Traceback" not in out, out
    assert "Task exception was never retrieved" not in out and "Unhandled error" not in out, out
    assert server.arrivals() == [], "a request was sent"
    return lines[0]


def test_a_valid_crawl_exits_0_without_errors(tmp_path, server):
    """The negative control: the same project and spider, nothing wrong."""
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), "plain")
    assert proc.returncode == 0, proc.stderr
    assert errors(proc) == []
    assert [a.path for a in server.arrivals()] == ["/"]
    # The start-up line names each scheme's mode (README, "Download handlers").
    assert "scrapy-polite: address rules per scheme: http: pinned (http11), https: pinned (http11)" in proc.stderr


def test_addon_only_in_custom_settings(tmp_path, server):
    proc = crawl(make_project(tmp_path, server.url("/"), addons=False), "spider_only")
    assert_refused(proc, server, "enabled only in the spider's custom_settings",
                   "Fix: move ADDONS = {'scrapy_polite.Addon': 0} to the project settings")


def test_invalid_setting_on_the_command_line(tmp_path, server):
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), "plain", "-s", "POLITE_HOST_INTERVAL=-1")
    assert_refused(proc, server, "POLITE_HOST_INTERVAL must be a finite number of seconds >= 0, got '-1'",
                   "(POLITE_HOST_INTERVAL is set on the command line (-s)). Fix: give POLITE_HOST_INTERVAL a value "
                   "as the error says, or remove it to use its default (1.0).")


def test_invalid_dns_setting(tmp_path, server):
    """A DNS setting is read by the per-process resolver, before the crawl: still one line, no traceback."""
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), "plain", "-s", "POLITE_DNS_TIMEOUT=0")
    assert_refused(proc, server, "POLITE_DNS_TIMEOUT")


@pytest.mark.parametrize("scheduler, says", [
    ("no.such.Scheduler", "cannot be loaded"),
    ("collections.OrderedDict", "is not a scheduler: it lacks Scrapy's scheduler interface"),
])
def test_a_scheduler_that_cannot_be_loaded(tmp_path, server, scheduler, says):
    """Trial: a SCHEDULER naming no class (the add-on wraps it) failed inside the engine, with two tracebacks and no
    ERROR line of ours; one naming a class that is not a scheduler failed every request and the crawl exited 0. Both
    are refused before the crawl, as Scrapy refuses its own, naming SCHEDULER and where it was set (trial: the line
    said POLITE_SCHEDULER_BASE "is set by an add-on")."""
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), "plain", "-s", f"SCHEDULER={scheduler}")
    assert_refused(proc, server, f"SCHEDULER {scheduler!r} (the scheduler scrapy-polite wraps, moved to "
                                 f"POLITE_SCHEDULER_BASE) {says}", "(SCHEDULER is set on the command line (-s))")


def test_a_lower_case_typo_says_where_it_was_set(tmp_path, server):
    """Trial: ``-s polite_host_interval=2`` (Scrapy's names are case-sensitive) was refused, but the line said where
    its close match POLITE_HOST_INTERVAL was set (the project settings), not where the typo was. The control: the
    close match is named too."""
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), "plain", "-s", "polite_host_interval=2")
    assert_refused(proc, server, "polite_host_interval is not a scrapy-polite setting (did you mean "
                                 "POLITE_HOST_INTERVAL?)", "(polite_host_interval is set on the command line (-s))")


def test_a_database_of_another_application_as_the_pace_table(tmp_path, server):
    """Trial: a crawl pointed at another application's SQLite file (a table ``t``) added the pace table's tables to
    it; one whose file held a ``hosts`` table of its own was refused with the fix "make the folder writable", as was
    a folder. Each is refused naming what is wrong, and the file is left as it was. The control: the same project
    on an empty file crawls, and makes it its table."""
    project = make_project(tmp_path, server.url("/"), addons=True)
    other = tmp_path / "app.sqlite3"
    before = write_sqlite_file(other, "CREATE TABLE hosts (id INTEGER PRIMARY KEY, name TEXT)")
    proc = crawl(project, "plain", "-s", f"POLITE_STORE=sqlite:///{other}")
    assert_refused(proc, server, f"sqlite:///{other}: the file is not a scrapy-polite pace table",
                   "Fix: point POLITE_STORE to another file")
    assert other.read_bytes() == before
    folder = tmp_path / "folder.sqlite3"
    folder.mkdir()
    proc = crawl(project, "plain", "-s", f"POLITE_STORE=sqlite:///{folder}")
    assert_refused(proc, server, f"{folder} is a directory, not a file")
    empty = tmp_path / "empty.sqlite3"
    empty.write_bytes(b"")
    proc = crawl(project, "plain", "-s", f"POLITE_STORE=sqlite:///{empty}")
    assert proc.returncode == 0 and errors(proc) == [], proc.stderr
    assert [a.path for a in server.arrivals()] == ["/"]
    assert empty.stat().st_size > 0


def test_unsafe_handler(tmp_path, server):
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), "own_handler")
    assert_refused(proc, server, "myproject.handlers.OwnHandler", "Remove that DOWNLOAD_HANDLERS entry")


def test_the_traceback_is_logged_at_debug(tmp_path, server):
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), "plain", "-s", "POLITE_HOST_INTERVAL=-1",
                 level="DEBUG")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert len(errors(proc)) == 1, out
    debug = out.split("DEBUG: scrapy-polite: the crawl was refused here", 1)
    assert len(debug) == 2, out
    assert debug[1].lstrip("\n").startswith("Traceback (most recent call last):"), out
    assert "Task exception was never retrieved" not in out


def test_an_invalid_polite_enabled_is_refused(tmp_path, server):
    """``POLITE_ENABLED`` is read in one place (:func:`~scrapy_polite.settings.polite_enabled`): a value Scrapy's
    ``getbool`` refuses stops the crawl with one line naming it, also in ``update_pre_crawler_settings`` (which
    reads it first and used to let Scrapy's bare ValueError out as a traceback)."""
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), "plain", "-s", "POLITE_ENABLED=yes")
    assert_refused(proc, server, "POLITE_ENABLED must be a boolean", "got 'yes'",
                   "(POLITE_ENABLED is set on the command line (-s))")


@pytest.mark.parametrize("where", ["cmdline", "settings.py"])
@pytest.mark.parametrize("setting, component", [
    ("DOWNLOADER_MIDDLEWARES", "scrapy_polite.middleware.PoliteDownloaderMiddleware"),
    ("EXTENSIONS", "scrapy_polite.extension.PoliteExtension"),
])
def test_a_component_of_the_addon_disabled_is_refused(tmp_path, server, setting, component, where):
    """Trial: with the add-on's downloader middleware set to None every request went unpaced (0.00 s apart) without
    a word; with its extension set to None the spider closed with its deferred requests not crawled. Either is a
    misconfiguration, on the command line or in settings.py (review: the add-on's own entry overwrote settings.py's
    None). (The negative control: ``test_a_disabled_addon_does_not_refuse``, the same with the add-on off.)"""
    project = make_project(tmp_path, server.url("/"), addons=True)
    if where == "cmdline":
        proc = crawl(project, "plain", "-s", f'{setting}={{"{component}": null}}')
    else:
        with open(project / "started" / "settings.py", "a") as f:
            f.write(f'{setting} = {{"{component}": None}}\n')
        proc = crawl(project, "plain")
    source = "on the command line (-s)" if where == "cmdline" else "in the project settings (settings.py)"
    assert_refused(proc, server, f"{setting} disables scrapy-polite's {component.rsplit('.', 1)[1]}",
                   f"({setting} is set {source})", "POLITE_ENABLED = False")


@pytest.mark.parametrize("spider", ["bad_delay", "good_delay"])
def test_an_invalid_spider_crawl_delay_is_refused(tmp_path, server, spider):
    """Trial: ``crawl_delay = -1`` logged an ERROR line and the crawl then ran at the default pace, exit status 0. It is
    refused as an invalid setting is. The control: ``crawl_delay = "0.1"`` (a number of seconds as a string) runs."""
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), spider)
    if spider == "good_delay":
        assert proc.returncode == 0 and errors(proc) == [], proc.stderr
        assert [a.path for a in server.arrivals()] == ["/"]
        return
    assert_refused(proc, server, "BadDelay.crawl_delay must be a number of seconds >= 0, got -1. Fix:")


def test_scrapy_shell_reads_the_spider_s_crawl_delay(tmp_path, server):
    """``scrapy shell`` builds the extension before the spider (review: its ``crawl_delay`` was ignored there): read
    when the spider opens."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    code = "print('DELAY', __import__('scrapy_polite.pacer').pacer.find_pacer(crawler).booker.spider_delay)"
    proc = subprocess.run([sys.executable, "-m", "scrapy", "shell", "--spider", "good_delay", server.url("/"), "-c",
                           code], cwd=make_project(tmp_path, server.url("/"), addons=True), env=env,
                          capture_output=True, text=True, timeout=60)
    assert "DELAY 0.1" in proc.stdout, proc.stdout + proc.stderr


def test_a_disabled_addon_does_not_refuse(tmp_path, server):
    """POLITE_ENABLED = False turns everything off, the checks included."""
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), "plain", "-s", "POLITE_ENABLED=False",
                 "-s", "POLITE_HOST_INTERVAL=-1", "-s",
                 'DOWNLOADER_MIDDLEWARES={"scrapy_polite.middleware.PoliteDownloaderMiddleware": null}')
    assert proc.returncode == 0, proc.stderr
    assert errors(proc) == []
    assert [a.path for a in server.arrivals()] == ["/"]
    assert "address rules per scheme" not in proc.stderr  # off: no handler modes either


def test_adaptive_pacing_with_autothrottle_is_refused(tmp_path, server):
    """Two pacers on response times, one unaware of the other (docs/spec.md §2, "Adaptive pacing")."""
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), "plain", "-s", "POLITE_ADAPTIVE=True",
                 "-s", "AUTOTHROTTLE_ENABLED=True")
    assert_refused(proc, server, "POLITE_ADAPTIVE and AUTOTHROTTLE_ENABLED are both on",
                   "AUTOTHROTTLE_ENABLED = False", "POLITE_ADAPTIVE_WITH_AUTOTHROTTLE = True")


def test_adaptive_pacing_with_autothrottle_when_told_runs_and_warns(tmp_path, server):
    """The negative control: told to run both, the crawl runs (exit 0), and a WARNING says to turn AutoThrottle off."""
    proc = crawl(make_project(tmp_path, server.url("/"), addons=True), "plain", "-s", "POLITE_ADAPTIVE=True",
                 "-s", "AUTOTHROTTLE_ENABLED=True", "-s", "POLITE_ADAPTIVE_WITH_AUTOTHROTTLE=True")
    assert proc.returncode == 0, proc.stderr
    assert errors(proc) == []
    assert "POLITE_ADAPTIVE and AutoThrottle both pace this crawl" in proc.stderr
    assert [a.path for a in server.arrivals()] == ["/"]


def test_a_setting_error_gets_one_fix_part(caplog):
    """An error naming a POLITE_* setting without a fix of its own gets one (its default named); an error with its
    own ``Fix:`` keeps only that one (the negative control)."""
    import logging

    from scrapy.exceptions import NotConfigured

    from scrapy_polite.startup import refuse_to_start

    with caplog.at_level(logging.ERROR, logger="scrapy_polite.startup"):
        refuse_to_start(ValueError("POLITE_MAX_WAIT must be > 0 seconds, got 0"))
        refuse_to_start(NotConfigured("POLITE_ADAPTIVE and AutoThrottle both pace. Fix: turn one off"))
    first, second = (r.getMessage() for r in caplog.records)
    assert first.endswith("got 0. Fix: give POLITE_MAX_WAIT a value as the error says, or remove it to use its "
                          "default (60.0).")
    assert second.count("Fix:") == 1 and second.endswith("Fix: turn one off")
