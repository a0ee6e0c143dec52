"""The exit status of ``scrapy crawl`` (issue 16; docs/spec.md §7, README "When the crawl refuses to start"):
real ``scrapy crawl`` processes in a project that ``scrapy startproject`` wrote into a temporary directory.

* **Every refused start exits**, with status 1, within seconds, and one ERROR line, whatever the store: the
  default SQLite pace table (its store thread used to keep the refused process alive forever), memory, Redis.
  The project is exactly what ``scrapy startproject`` wrote; the add-on is enabled only in a spider's
  ``custom_settings``. Negative control: the add-on in ``settings.py``, the same crawl exits 0.
* **A crawl the add-on stopped exits 1**: a store error mid-crawl (a store that fails after a few writes),
  a Redis outage longer than ``POLITE_STORE_TIMEOUT``; one ERROR line, no "Error downloading" traceback.
  Negative controls: the same store that does not fail, Redis that stays up: exit 0.
* In a script, the same stop sets the runner's ``bootstrap_failed`` (Twisted's ``CrawlerRunner``; what
  ``scrapy crawl`` reads), and only that runner's.

Each subprocess has a timeout: a process that does not exit fails the test instead of hanging the suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import pytest_twisted

from tests.support.redis_server import RedisServer, redis_url, unique_prefix  # noqa: F401  (fixture)
from tests.support.server import Reply, RequestInfo, page

ROOT = Path(__file__).resolve().parent.parent

#: Seconds a refused crawl may take to exit (it takes about one: the interpreter's start and Scrapy's).
REFUSED_TIMEOUT = 60
#: Seconds a whole crawl may take (ten pages, DOWNLOAD_DELAY = 1 from the startproject template).
CRAWL_TIMEOUT = 120

ERROR_LINE = re.compile(r"^\S+ \S+ \[[^\]]+\] ERROR: ", re.MULTILINE)

SPIDERS = '''
import scrapy


class SpiderOnly(scrapy.Spider):
    """The add-on only in custom_settings: refused (the per-process resolver is not ours)."""

    name = "spider_only"
    start_urls = [{url!r}]
    custom_settings = {{"ADDONS": {{"scrapy_polite.Addon": 0}}}}

    def parse(self, response):
        pass


class Pages(scrapy.Spider):
    """Ten pages of one host (the add-on comes from settings.py)."""

    name = "pages"
    start_urls = [{url!r} + str(i) for i in range(10)]

    def parse(self, response):
        pass
'''

#: Appended to the startproject settings.py for a crawl that runs: the add-on in the project settings,
#: loopback allowed, fast pacing, the startproject template's DOWNLOAD_DELAY left in place.
RUNS = '''
ADDONS = {"scrapy_polite.Addon": 0}
POLITE_ALLOWED_NETWORKS = ["127.0.0.0/8"]
POLITE_HOST_INTERVAL = 0.0
POLITE_IP_INTERVAL = 0.0
ROBOTSTXT_OBEY = False
DOWNLOAD_DELAY = 0
TELNETCONSOLE_ENABLED = False
RETRY_ENABLED = False
'''

#: A pace table that fails after ``BREAK_AFTER`` bookings: a store error mid-crawl (POLITE_STORE = "breaking://").
BREAKING = '''
import os

from scrapy_polite.stores import MemoryStore, StoreError, register_store


class BreakingStore(MemoryStore):
    writes = 0

    def update_many(self, keys, fn):
        BreakingStore.writes += 1
        if BreakingStore.writes > int(os.environ["BREAK_AFTER"]):
            raise StoreError("scrapy-polite cannot write its pace table breaking://: the disk is full (a test). "
                             "Fix: free some space.")
        return super().update_many(keys, fn)


register_store("breaking", lambda uri, options: BreakingStore())
'''


def env(**extra: str) -> dict[str, str]:
    result = {**os.environ, **extra}
    result["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    result.pop("SCRAPY_SETTINGS_MODULE", None)
    return result


def startproject(tmp_path: Path, url: str, *, settings: str = "") -> Path:
    """``scrapy startproject started`` in ``tmp_path``, the spiders of :data:`SPIDERS` added, and ``settings``
    appended to its ``settings.py`` (nothing else changed)."""
    subprocess.run([sys.executable, "-m", "scrapy", "startproject", "started", str(tmp_path / "started")],
                   cwd=tmp_path, env=env(), check=True, capture_output=True, timeout=REFUSED_TIMEOUT)
    project = tmp_path / "started"
    (project / "started" / "spiders" / "polite.py").write_text(SPIDERS.format(url=url))
    if settings:
        with open(project / "started" / "settings.py", "a") as f:
            f.write(settings)
    return project


def scrapy_crawl(project: Path, spider: str, *args: str, timeout: float,
                 **extra_env: str) -> subprocess.CompletedProcess[str]:
    """``scrapy crawl spider`` in ``project``; fails the test if it has not exited after ``timeout`` s."""
    try:
        return subprocess.run([sys.executable, "-m", "scrapy", "crawl", spider, "-s", "LOG_LEVEL=INFO", *args],
                              cwd=project, env=env(**extra_env), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed it
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"scrapy crawl {spider} did not exit within {timeout} s:\n{(out + err)[-4000:]}")


def errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if ERROR_LINE.match(line)]


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------------------
# Refused at the start


@pytest.mark.parametrize("store", ["default", "memory", "redis"])
def test_a_refused_start_exits_1_at_once_with_every_store(tmp_path, arrival_server, request, store):
    """``scrapy startproject``'s project as it was written, the add-on only in the spider's custom_settings:
    refused, and the process exits (with the default SQLite table it used to wait forever for the store's
    thread, SIGTERM ignored)."""
    srv = arrival_server("127.0.0.41")
    project = startproject(tmp_path, srv.url("/"))
    args: list[str] = []
    if store == "memory":
        args = ["-s", "POLITE_STORE=memory://"]
    elif store == "redis":
        args = ["-s", f"POLITE_STORE={request.getfixturevalue('redis_url')}",
                "-s", f"POLITE_STORE_PREFIX={unique_prefix('refused')}"]
    started = time.monotonic()
    proc = scrapy_crawl(project, "spider_only", *args, timeout=REFUSED_TIMEOUT)
    out = output(proc)
    assert proc.returncode == 1, out[-4000:]
    lines = errors(proc)
    assert len(lines) == 1, "\n".join(lines) or out[-4000:]
    assert "scrapy-polite cannot start the crawl: " in lines[0] and "only in the spider's custom_settings" in lines[0]
    assert "Traceback" not in out, out[-4000:]
    assert srv.arrivals() == []
    if store == "default":  # the default pace table was opened (and so its store was started) before the refusal
        assert (project / ".scrapy" / "polite.sqlite3").exists()
        assert "pace table sqlite:///" in out
    assert time.monotonic() - started < REFUSED_TIMEOUT


def test_the_same_project_with_the_addon_in_settings_crawls_and_exits_0(tmp_path, arrival_server):
    """The negative control: the add-on in settings.py, the default SQLite pace table."""
    srv = arrival_server("127.0.0.41")
    project = startproject(tmp_path, srv.url("/"), settings=RUNS)
    proc = scrapy_crawl(project, "pages", timeout=CRAWL_TIMEOUT)
    assert proc.returncode == 0, output(proc)[-4000:]
    assert errors(proc) == []
    assert len(srv.arrivals()) == 10
    assert (project / ".scrapy" / "polite.sqlite3").exists()


def test_scrapy_shell_closes_its_pace_table_and_event_log(tmp_path, arrival_server):
    """``scrapy shell URL -c ...`` never closes its spider (its reactor runs in a daemon thread): the pace table and
    the event log are closed at the process's exit (trial: every shell left its log open, so ``scrapy polite audit``
    said NOT VOUCHED FOR, and the next command warned of an unclean stop). Negative control: the shell's own
    booking is in the log (the audit judged something)."""
    srv = arrival_server("127.0.0.41")
    project = startproject(tmp_path, srv.url("/"), settings=RUNS)
    shell = subprocess.run([sys.executable, "-m", "scrapy", "shell", srv.url("/one"), "-c", "response.status",
                            "-s", "LOG_LEVEL=INFO"], cwd=project, env=env(), capture_output=True, text=True,
                           timeout=CRAWL_TIMEOUT)
    assert shell.returncode == 0 and shell.stdout.strip() == "200", output(shell)[-4000:]
    assert len(srv.arrivals()) == 1
    audit = subprocess.run([sys.executable, "-m", "scrapy", "polite", "audit"], cwd=project, env=env(),
                           capture_output=True, text=True, timeout=CRAWL_TIMEOUT)
    assert audit.returncode == 0 and "OK" in audit.stdout and "1 request" in audit.stdout, output(audit)[-4000:]
    proc = scrapy_crawl(project, "pages", timeout=CRAWL_TIMEOUT)
    assert proc.returncode == 0 and "was not closed" not in output(proc), output(proc)[-4000:]


def test_a_crawl_that_fails_at_its_start_closes_its_pace_table(tmp_path, arrival_server):
    """Trial: a downloader middleware whose ``from_crawler`` raises fails the crawl after the add-on's extension had
    opened the default pace table, and no Scrapy signal follows: the table stayed open, so the next crawl warned that
    the failed one "was not closed … (an unclean stop …)". It is closed at the process's exit. The control: the failed
    crawl did open the table (its start-up line), and sent nothing."""
    srv = arrival_server("127.0.0.41")
    project = startproject(tmp_path, srv.url("/"), settings=RUNS)
    (project / "started" / "broken.py").write_text(
        "class Broken:\n    @classmethod\n    def from_crawler(cls, crawler):\n"
        "        raise RuntimeError('a broken middleware (a test)')\n")
    failed = scrapy_crawl(project, "pages", "-s", 'DOWNLOADER_MIDDLEWARES={"started.broken.Broken": 10}',
                          timeout=CRAWL_TIMEOUT)
    assert failed.returncode == 1 and "a broken middleware" in output(failed), output(failed)[-4000:]
    assert "pace table sqlite:///" in output(failed) and srv.arrivals() == [], output(failed)[-4000:]
    proc = scrapy_crawl(project, "pages", timeout=CRAWL_TIMEOUT)
    assert proc.returncode == 0 and "was not closed" not in output(proc), output(proc)[-4000:]
    assert len(srv.arrivals()) == 10


# --------------------------------------------------------------------------------------------------
# Stopped mid-crawl by the add-on


def assert_stopped_by_the_addon(proc: subprocess.CompletedProcess[str], *expected: str) -> str:
    """Exit 1, one ERROR line (containing ``expected``), no "Error downloading" and no traceback at INFO."""
    out = output(proc)
    assert proc.returncode == 1, out[-4000:]
    lines = errors(proc)
    assert len(lines) == 1, "\n".join(lines) or out[-4000:]
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Error downloading" not in out, out[-6000:]
    assert "Traceback" not in out, out[-6000:]
    assert "'finish_reason': 'polite_store_error'" in out, out[-4000:]
    return lines[0]


@pytest.mark.parametrize("break_after", [3, 1000])
def test_a_store_error_mid_crawl_exits_1(tmp_path, arrival_server, break_after):
    """The pace table fails at its 4th write: the crawl stops (polite_store_error) and exits 1. Negative
    control (1000): the same store that never fails crawls everything and exits 0."""
    srv = arrival_server("127.0.0.42")
    project = startproject(tmp_path, srv.url("/"), settings=RUNS + 'POLITE_STORE = "breaking://"\n' + BREAKING)
    proc = scrapy_crawl(project, "pages", timeout=CRAWL_TIMEOUT, BREAK_AFTER=str(break_after))
    if break_after == 1000:
        assert proc.returncode == 0, output(proc)[-4000:]
        assert errors(proc) == [] and len(srv.arrivals()) == 10
        return
    assert_stopped_by_the_addon(proc, "the disk is full (a test)", "Stopping the crawl")
    assert 1 <= len(srv.arrivals()) <= 3  # none after the failed booking (a booking is one or two writes)


@pytest.mark.parametrize("outage", [True, False])
def test_a_redis_outage_past_the_timeout_exits_1(tmp_path, arrival_server, outage):
    """Redis stops answering after the 3rd page and does not come back within POLITE_STORE_TIMEOUT (2 s): the
    spider closes with polite_store_error, one ERROR line, no "Error downloading" traceback, exit 1.
    Negative control: Redis stays up, the crawl finishes and exits 0."""
    with RedisServer() as redis_server:
        srv = arrival_server("127.0.0.43")
        seen = [0]
        stopped = threading.Event()

        def stop_at_3rd(info: RequestInfo, count: int) -> Reply:
            seen[0] += 1
            if outage and seen[0] == 3 and not stopped.is_set():
                redis_server.stop()
                stopped.set()
            return page(info.path)

        srv.route("/*", stop_at_3rd)
        settings = RUNS + f'POLITE_STORE = "{redis_server.url}"\nPOLITE_STORE_TIMEOUT = 2\n'
        project = startproject(tmp_path, srv.url("/"), settings=settings)
        proc = scrapy_crawl(project, "pages", timeout=CRAWL_TIMEOUT)
    if not outage:
        assert proc.returncode == 0, output(proc)[-4000:]
        assert errors(proc) == [] and len(srv.arrivals()) == 10
        return
    assert_stopped_by_the_addon(proc, "POLITE_STORE_TIMEOUT", "Stopping the crawl")
    assert len(srv.arrivals()) == 3  # none after Redis went away


# --------------------------------------------------------------------------------------------------
# In a script: the runner's bootstrap_failed (what scrapy crawl reads)


class _FailingAfter:
    """``POLITE_STORE = "failing-after-test://"``: a memory table whose writes fail after ``limit`` of them."""

    limit = 0

    @classmethod
    def open(cls, uri: str, options: object) -> object:
        from scrapy_polite.stores import MemoryStore, StoreError

        limit = cls.limit

        class Store(MemoryStore):
            writes = 0

            def update_many(self, keys, fn):
                Store.writes += 1
                if Store.writes > limit:
                    raise StoreError("scrapy-polite cannot write its pace table failing-after-test://: a test. Fix: none.")
                return super().update_many(keys, fn)

        return Store()


@pytest.mark.parametrize("limit", [2, 1000])
@pytest_twisted.ensureDeferred
async def test_a_crawl_stopped_by_the_addon_sets_its_runners_bootstrap_failed(arrival_server, limit):
    """A CrawlerRunner in this process (Twisted's, not scrapy crawl's AsyncCrawlerProcess): a store error mid-crawl
    sets ``bootstrap_failed``, which scrapy's commands turn into exit status 1; another runner is left alone.
    Negative control (1000): the same crawl that is not stopped leaves it False."""
    from scrapy.crawler import CrawlerRunner

    from scrapy_polite.stores import register_store
    from tests.support.crawl import TEST_SETTINGS, ListSpider, assert_no_illegal_moves

    srv = arrival_server("127.0.0.44")
    _FailingAfter.limit = limit
    register_store("failing-after-test", _FailingAfter.open)
    settings = {**TEST_SETTINGS, "ADDONS": {"scrapy_polite.Addon": 0}, "POLITE_STORE": "failing-after-test://",
                "POLITE_ALLOW_PRIVATE": True, "POLITE_HOST_INTERVAL": 0.0, "POLITE_IP_INTERVAL": 0.0}
    runner, bystander = CrawlerRunner(settings), CrawlerRunner(settings)
    crawler = runner.create_crawler(ListSpider)
    await runner.crawl(crawler, urls=[srv.url(f"/{i}") for i in range(6)])
    reason = crawler.stats.get_value("finish_reason")
    assert_no_illegal_moves(crawler.stats.get_stats(), "a crawl stopped by its table")
    assert not bystander.bootstrap_failed
    if limit == 1000:
        assert reason == "finished" and not runner.bootstrap_failed and len(srv.arrivals()) == 6
    else:
        assert reason == "polite_store_error" and runner.bootstrap_failed and len(srv.arrivals()) < 6
        assert crawler.spider is not None  # the crawl's results stay readable
