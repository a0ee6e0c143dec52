"""End-to-end: ``scrapy polite audit`` on the record of a real crawl (docs/spec.md §8, README "Auditing a crawl").

A real Scrapy crawl of two loopback hosts with the default store (SQLite, in the project's data directory): one
host answers its first request ``429, Retry-After: 1``, the other publishes ``Crawl-delay: 0.8`` in robots.txt.
The audit of the crawl's log passes (exit 0), counts what the servers saw, and shows the throttle honoured; the
same log audited under the public-address rules alone fails, naming the loopback addresses (negative control).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest_twisted

from scrapy_polite.audit.words import ADDRESS_RULES_NOTE
from scrapy_polite.commands import EXIT_OK, EXIT_VIOLATED, run_command
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.server import Reply, scripted

ROOT = Path(__file__).resolve().parent.parent


def settings(**overrides: Any) -> dict[str, Any]:
    """The default store (no POLITE_STORE: ``polite.sqlite3`` in the project's data directory)."""
    s = polite_settings(POLITE_HOST_INTERVAL=0.3, POLITE_IP_INTERVAL=0.2, ROBOTSTXT_OBEY=True, **overrides)
    del s["POLITE_STORE"]
    return s


def cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return subprocess.run([sys.executable, "-m", "scrapy", "polite", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest_twisted.ensureDeferred
async def test_the_log_of_a_real_crawl_passes_the_audit(arrival_server, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the default store lives in the working directory's project data
    busy = arrival_server("127.0.19.1")
    busy.route("/robots.txt", Reply.not_found())
    busy.route("/p/*", scripted(Reply.throttle(429, "1"), then=Reply.text("ok")))
    slow = arrival_server("127.0.19.2")
    slow.route("/robots.txt", Reply.robots("User-agent: *\nCrawl-delay: 0.8\n"))
    slow.route("/p/*", Reply.text("ok"))
    urls = [s.url(f"/p/{i}") for s in (busy, slow) for i in range(4)]
    crawler = await run_crawl(ListSpider, settings(), urls=urls, timeout=60)
    assert sorted(f.status for f in crawler.spider.fetched) == [200] * 8
    assert list(tmp_path.rglob("polite.sqlite3")), "the crawl used the default SQLite store"

    code = run_command(["audit", "--json"], settings())
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    report = json.loads(out)
    assert report["ok"] and report["violations"] == [] and report["notes"] == []
    hosts = {h["host"]: h for h in report["hosts"]}
    # Every request the servers saw is in the record (robots.txt included), and nothing else.
    assert hosts["127.0.19.1"]["requests"] == len(busy.arrivals()) == 6  # robots.txt, 429, 4 pages
    assert hosts["127.0.19.2"]["requests"] == len(slow.arrivals()) == 5
    (throttle,) = hosts["127.0.19.1"]["throttles"]
    assert throttle["cause"] == "429" and throttle["retry_after"] == 1.0
    assert throttle["honoured"] >= throttle["held"] >= 1.0
    assert hosts["127.0.19.1"]["smallest_gap"] >= hosts["127.0.19.1"]["interval"] >= 0.3
    assert hosts["127.0.19.2"]["smallest_gap"] >= hosts["127.0.19.2"]["interval"] >= 0.8  # the Crawl-delay
    addresses = {a["address"]: a for a in report["addresses"]}
    assert set(addresses) == {"127.0.19.1", "127.0.19.2"} and all(a["allowed"] for a in addresses.values())
    assert all(a["smallest_gap"] >= a["interval"] == 0.2 for a in addresses.values())

    # The real command, in words: one line per host and per address, exit 0.
    result = cli("audit", "-s", "POLITE_ALLOWED_NETWORKS=127.0.0.0/8", cwd=tmp_path)
    assert result.returncode == EXIT_OK, result.stderr
    lines = result.stdout.splitlines()
    busy_line = next(line for line in lines if line.startswith("host 127.0.19.1:"))
    assert "6 requests" in busy_line and "1 throttle (429, Retry-After 1 s: held 1." in busy_line
    assert busy_line.endswith(", ok")
    assert any(line.startswith("address 127.0.19.2: 5 requests (127.0.19.2)") for line in lines)
    assert lines[-1] == "OK: no violation in 11 requests to 2 hosts"

    # Negative control: the same record under the public-address rules alone names every loopback request.
    public_only = {k: v for k, v in settings().items() if k != "POLITE_ALLOWED_NETWORKS"}
    code = run_command(["audit"], public_only)
    out = capsys.readouterr().out
    assert code == EXIT_VIOLATED, out
    flagged = [line for line in out.splitlines() if line.startswith("VIOLATION address")]
    assert len(flagged) == 11 and out.splitlines()[-1] == "FAILED: 11 violations (11 address)"
    assert "127.0.19.1 contacted, not allowed by the public-address rules" in flagged[0]
    assert out.splitlines()[-2] == ADDRESS_RULES_NOTE  # how to audit with the crawl's own rules
    assert ADDRESS_RULES_NOTE not in lines  # (not when every address was allowed)
