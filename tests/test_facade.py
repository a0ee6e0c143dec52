"""The pacer is the facade (docs/spec.md §5; scrapy_polite/pacer.py): the middleware, the extension, the
scheduler, the contracts and the example project use its methods and properties, never the units behind it.

Two kinds of test: a scan of the package's source for a reach through the pacer into a unit (with a negative
control: the scan finds the reach-throughs this facade replaced), and the facade's answers checked against the
units it stands for (settings, the table's clock, the effective interval), each with its other case.
No crawl runs: the pacer is built on Scrapy's test crawler and a memory or stand-in store.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import scrapy
from scrapy.utils.test import get_crawler

from scrapy_polite.pacer import FrontierOptions, Pacer
from scrapy_polite.policy import HostState
from scrapy_polite.settings import PoliteConfig
from scrapy_polite.stores import MemoryStore
from tests.test_capabilities import NOW, PlainStore, ServerClockedStore

ROOT = Path(__file__).resolve().parent.parent

#: The units behind the pacer (its docstring names them): no other module may reach through one of them.
UNITS = ("config", "policy", "store", "table", "guard", "sync", "report", "lifecycle", "booker", "recorder",
         "retries", "resolution", "events", "unpinned")
REACH = re.compile(r"\bpacer\.(?:" + "|".join(UNITS) + r"|_\w+)\b")


def reaches(text: str) -> list[str]:
    return [match.group(0) for match in REACH.finditer(text)]


def test_no_module_reaches_through_the_pacer():
    sources = [*(ROOT / "scrapy_polite").rglob("*.py"), *(ROOT / "example_project").rglob("*.py")]
    assert len(sources) > 20
    found = {str(path.relative_to(ROOT)): hits for path in sources if path.name != "pacer.py"
             and (hits := reaches(path.read_text(encoding="utf-8")))}
    assert found == {}


def test_negative_control_the_scan_finds_a_reach_through():
    before = [  # the lines this facade replaced (scheduler, extension, contracts)
        "self._held.push(host, request, None if due is None else self.pacer.sync.to_store(due))",
        "if earliest is not None and wait > self.pacer.config.max_idle_wait:",
        "line = format_progress(self.pacer.report, self.held_hosts(), now=self.pacer.clock(), idle=idle,",
        "sources = [(pacer.policy.host_interval, 'POLITE_HOST_INTERVAL')]",
        "backend = self.pacer._backend",
    ]
    assert [len(reaches(line)) for line in before] == [1, 1, 1, 1, 1]
    assert reaches("self.pacer.max_idle_wait; pacer.to_store(due); pacer.host_interval; pacer.hosts") == []


def _pacer(settings: dict[str, object] | None = None, store: object | None = None) -> Pacer:
    crawler = get_crawler(settings_dict={"POLITE_STORE": "memory://", **(settings or {})})
    backend = store if store is not None else MemoryStore(clock=lambda: NOW)
    return Pacer(crawler, PoliteConfig.from_settings(crawler.settings), backend.open_async(),  # type: ignore[attr-defined]
                 clock=lambda: NOW)


def test_the_settings_the_callers_need():
    pacer = _pacer({"POLITE_MAX_IDLE_WAIT": 42, "POLITE_MAX_HELD_IN_MEMORY": 7, "POLITE_HOST_INTERVAL": 3,
                    "POLITE_HOST_DELAYS": {"Slow.Example": 9}, "POLITE_SHARED_FRONTIER": False})
    try:
        assert (pacer.max_idle_wait, pacer.max_held_in_memory, pacer.host_interval) == (42.0, 7, 3.0)
        assert pacer.host_delay("slow.example") == 9.0 and pacer.host_delay("other.example") is None
        assert pacer.scheduler_base == PoliteConfig.from_settings({}).scheduler_base
        assert pacer.shared_frontier is None and not pacer.adaptive_enabled
    finally:
        pacer.close()


def test_negative_control_the_settings_turned_on():
    pacer = _pacer({"POLITE_SHARED_FRONTIER": True, "POLITE_FRONTIER_KEY": "f:%(spider)s", "POLITE_LEASE_TIME": 12,
                    "POLITE_ADAPTIVE": True})
    try:
        assert pacer.shared_frontier == FrontierOptions(key="f:%(spider)s", lease_time=12.0)
        assert pacer.adaptive_enabled
    finally:
        pacer.close()


@pytest.mark.parametrize(("store_class", "offset"), [(PlainStore, 0.0), (ServerClockedStore, 100.0)])
def test_the_table_clock_conversions(store_class, offset):
    """An embedded table's clock is this process's; a server's (100 s behind) is converted both ways."""
    pacer = _pacer(store=store_class())
    try:
        pacer.sync.observe(pacer.store.store.now())  # what every store call does with the table's now
        assert pacer.to_store(NOW + 30) == pytest.approx(NOW + 30 - offset)
        assert pacer.to_local(pacer.to_store(NOW + 30)) == pytest.approx(NOW + 30)
    finally:
        pacer.close()


def test_the_effective_interval_is_the_policys_with_every_override():
    pacer = _pacer({"POLITE_HOST_INTERVAL": 2, "POLITE_HOST_DELAYS": {"delayed.example": 5}})
    try:
        request = scrapy.Request("https://a.example/")
        assert pacer.effective_interval("a.example", request) == 2.0
        assert pacer.effective_interval("delayed.example", scrapy.Request("https://delayed.example/")) == 5.0
        slower = scrapy.Request("https://a.example/", meta={"polite_delay": 8})
        assert pacer.effective_interval("a.example", slower) == 8.0
        pacer.counters("a.example").state = HostState(next_allowed=NOW, crawl_delay=11.0, updated=NOW)
        assert pacer.effective_interval("a.example", slower) == 11.0  # a published Crawl-delay wins
        assert pacer.effective_interval("b.example") == 2.0  # another host keeps the base interval
    finally:
        pacer.close()
