"""The ``scrapy check`` contracts (README, "Contracts"), through the real ``scrapy check`` command on a
Scrapy project written into a temporary directory: each contract passes on a good callback and fails, with
its message, on a bad one; a contract request still deferred when the check ends fails the check.

Every server is a loopback :class:`~tests.support.server.ArrivalServer` of this process; the project
allows loopback with ``POLITE_ALLOWED_NETWORKS`` and keeps its pace table in the temporary directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scrapy_polite.clock import process_clock
from scrapy_polite.policy import HostState
from scrapy_polite.stores import open_store
from tests.support.server import Reply

ROOT = Path(__file__).resolve().parent.parent

SPIDERS = '''
import scrapy


class Good(scrapy.Spider):
    name = "good"
    crawl_delay = 2

    def parse(self, response):
        """Every contract holds: paced at >= 2 s (the spider's crawl_delay), a loopback address the project
        allows, and the request it returns is paced.

        @url {a}/
        @polite_delay 2
        @public_only
        @paced_requests
        """
        yield scrapy.Request("{a}/next")


class RobotsDelay(scrapy.Spider):
    name = "robots_delay"

    def parse(self, response):
        """Paced at >= 2 s only because the host's robots.txt says Crawl-delay: 2.

        @url {r}/
        @polite_delay 2
        """


class SlowClaim(scrapy.Spider):
    name = "slow_claim"

    def parse(self, response):
        """Claims 5 s, but nothing slows the host below POLITE_HOST_INTERVAL (1 s).

        @url {a}/claim
        @polite_delay 5
        """


class Unpaced(scrapy.Spider):
    name = "unpaced"

    def parse(self, response):
        """Returns an unpaced request and one to a non-public IP literal.

        @url {a}/unpaced
        @paced_requests
        """
        yield scrapy.Request("{a}/free", meta={{"dont_pace": True}})
        yield scrapy.Request("http://10.1.2.3/internal")
        yield scrapy.Request("{a}/fine")


class Wide(scrapy.Spider):
    name = "wide"
    custom_settings = {{"POLITE_ALLOW_PRIVATE": True}}

    def parse(self, response):
        """POLITE_ALLOW_PRIVATE lets the crawl reach any address: not public-only.

        @url {a}/wide
        @public_only
        """


class Private(scrapy.Spider):
    name = "private"

    def parse(self, response):
        """private.test has only a non-public address (10.1.2.3): refused, never fetched.

        @url http://private.test:{port}/
        @public_only
        """


class Deferred(scrapy.Spider):
    name = "deferred"

    def parse(self, response):
        """Its host is in backoff in the pace table.

        @url {d}/
        @polite_delay 1
        """
'''

SETTINGS = '''
BOT_NAME = "checked"
SPIDER_MODULES = ["checked.spiders"]
ADDONS = {{"scrapy_polite.Addon": 0}}
ROBOTSTXT_OBEY = True
POLITE_ALLOWED_NETWORKS = ["127.0.0.0/8"]
POLITE_DNS_OVERRIDES = {{"private.test": ["10.1.2.3"]}}
POLITE_STORE = "sqlite:///{store}"
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
RETRY_ENABLED = False
'''


@pytest.fixture
def project(tmp_path, arrival_server):
    """A Scrapy project whose spiders carry the contracts; ``(path, servers, store URI)``."""
    a = arrival_server("127.0.0.21")
    r = arrival_server("127.0.0.22")
    r.route("/robots.txt", Reply.robots("User-agent: *\nCrawl-delay: 2\n"))
    d = arrival_server("127.0.0.23")
    store = tmp_path / "pace.sqlite3"
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = checked.settings\n")
    package = tmp_path / "checked"
    (package / "spiders").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(SETTINGS.format(store=store))
    (package / "spiders" / "__init__.py").write_text("")
    (package / "spiders" / "contracted.py").write_text(textwrap.dedent(SPIDERS).format(
        a=a.url("").rstrip("/"), r=r.url("").rstrip("/"), d=d.url("").rstrip("/"), port=a.port))
    return tmp_path, {"a": a, "r": r, "d": d}, f"sqlite:///{store}"


def scrapy(cwd: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return subprocess.run([sys.executable, "-m", "scrapy", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def check(cwd: Path, spider: str, *args: str) -> tuple[int, str]:
    proc = scrapy(cwd, "check", spider, *args)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_contracts_are_listed_as_soon_as_the_addon_is_enabled(project):
    cwd, _, _ = project
    proc = scrapy(cwd, "check", "--list")
    assert proc.returncode == 0, proc.stderr
    for name in ("good", "robots_delay", "slow_claim", "unpaced", "wide", "private", "deferred"):
        assert name in proc.stdout


def test_a_misconfiguration_is_one_error_line_under_scrapy_check(project):
    """``scrapy check`` turns logging off: the refusal's one line goes to standard error (trial: it printed only
    "Ran 0 contracts ... OK" and exited 1). Negative control: the same check with a valid interval passes."""
    cwd, servers, _ = project
    code, out = check(cwd, "good", "-s", "POLITE_HOST_INTERVAL=-1")
    assert code == 1, out
    lines = [line for line in out.splitlines() if "scrapy-polite cannot start the crawl" in line]
    assert len(lines) == 1 and lines[0].startswith("ERROR: ") and "POLITE_HOST_INTERVAL" in lines[0], out
    assert servers["a"].arrivals() == []
    code, out = check(cwd, "good", "-s", "POLITE_HOST_INTERVAL=1")
    assert code == 0 and "cannot start" not in out, out


def test_good_callback_passes_every_contract(project):
    cwd, servers, _ = project
    code, out = check(cwd, "good")
    assert code == 0, out
    assert "Ran 3 contracts" in out and "OK" in out, out
    assert [a.path for a in servers["a"].arrivals() if a.path != "/robots.txt"] == ["/"]  # a real request


def test_polite_delay_counts_the_robots_crawl_delay(project):
    cwd, servers, _ = project
    code, out = check(cwd, "robots_delay")
    assert code == 0, out
    assert "Ran 1 contract" in out, out
    assert [a.path for a in servers["r"].arrivals()] == ["/robots.txt", "/"]  # robots.txt read first


def test_polite_delay_fails_with_the_actual_interval_and_its_source(project):
    cwd, _, _ = project
    code, out = check(cwd, "slow_claim")
    assert code == 1, out
    assert "FAIL: [slow_claim] parse (@polite_delay pre-hook)" in out, out
    assert "127.0.0.21 is paced at an interval of 1 s (from POLITE_HOST_INTERVAL), less than 5 s" in out, out


def test_paced_requests_fails_on_unpaced_and_non_public_requests(project):
    cwd, _, _ = project
    code, out = check(cwd, "unpaced")
    assert code == 1, out
    assert "FAIL: [unpaced] parse (@paced_requests post-hook)" in out, out
    assert "2 of the requests returned are not paced or not public" in out, out
    assert "/free has meta['dont_pace']" in out and "targets the non-public address 10.1.2.3" in out, out
    assert "/fine" not in out.split("not paced or not public")[1].splitlines()[0]


def test_public_only_fails_when_private_addresses_are_allowed(project):
    cwd, _, _ = project
    code, out = check(cwd, "wide")
    assert code == 1, out
    assert "FAIL: [wide] parse (@public_only pre-hook)" in out, out
    assert "POLITE_ALLOW_PRIVATE = True" in out, out


def test_public_only_fails_on_a_host_with_only_non_public_addresses(project):
    cwd, servers, _ = project
    code, out = check(cwd, "private")
    assert code == 1, out
    assert "ERROR: [private] parse (errback)" in out, out
    assert "BlockedHost" in out and "private.test" in out and "10.1.2.3" in out, out
    assert servers["a"].arrivals() == []  # nothing was sent anywhere


def test_a_contract_request_still_deferred_fails_the_check_and_passes_after_a_reset(project):
    cwd, servers, uri = project
    store = open_store(uri)
    now = process_clock()
    store.update("127.0.0.23", lambda s, n: (HostState(next_allowed=n + 3600, consec=3, updated=n), None))
    store.close()
    code, out = check(cwd, "deferred", "-s", "POLITE_MAX_IDLE_WAIT=1")
    assert code == 1, out
    assert "ERROR: [deferred] parse (errback)" in out, out
    assert "ContractRequestDeferred" in out and "was still deferred when the check ended" in out, out
    assert "127.0.0.23 is backing off after 3 backoff steps already in the pace table, due in" in out, out
    assert "scrapy polite reset 127.0.0.23" in out, out
    assert "OK" not in out.splitlines()[-1]
    assert servers["d"].arrivals() == []
    # The negative control: the command the message names clears the backoff, and the check passes.
    reset = scrapy(cwd, "polite", "reset", "127.0.0.23")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    code, out = check(cwd, "deferred", "-s", "POLITE_MAX_IDLE_WAIT=1")
    assert code == 0, out
    assert "Ran 1 contract" in out, out
    assert process_clock() - now < 60
