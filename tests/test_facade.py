"""The pacer is a container of units, not a facade (issue 31; scrapy_polite/pacer.py): components take the units
they use from it (as Scrapy's components take ``crawler.stats``), and none of its methods or properties forwards to
one unit.

Two kinds of test: a scan of :class:`~scrapy_polite.pacer.Pacer`'s source for a forward (with a negative control:
the scan finds the forwards the facade had), and what the pacer itself answers (the table's clock it wires, the
effective interval of several units), each with its other case. No crawl runs: the pacer is built on Scrapy's test
crawler and a memory or stand-in store.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import scrapy
from scrapy.utils.test import get_crawler

from scrapy_polite import pacer as pacer_module
from scrapy_polite.pacer import Pacer
from scrapy_polite.policy import HostState
from scrapy_polite.settings import PoliteConfig
from scrapy_polite.stores import MemoryStore
from tests.test_capabilities import NOW, PlainStore, ServerClockedStore

#: The pacer's units (its docstring names them).
UNITS = ("config", "policy", "store", "table", "guard", "sync", "report", "lifecycle", "booker", "recorder",
         "retries", "resolution", "events", "unpinned")


def forwards(source: str) -> list[str]:
    """The methods and properties of the classes in ``source`` whose body (its docstring aside) is one statement
    that reads or calls a member of one unit: ``return self.<unit>.<name>...``, ``self.<unit>.<name>(...)``."""
    found = []
    for cls in (node for node in ast.walk(ast.parse(textwrap.dedent(source))) if isinstance(node, ast.ClassDef)):
        for fn in cls.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = [stmt for stmt in fn.body if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))]
            if len(body) != 1 or not isinstance(body[0], (ast.Return, ast.Expr)) or body[0].value is None:
                continue
            value = body[0].value
            while isinstance(value, (ast.Await, ast.Call)):
                value = value.value if isinstance(value, ast.Await) else value.func
            if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Attribute)
                    and isinstance(value.value.value, ast.Name) and value.value.value.id == "self"
                    and value.value.attr in UNITS):
                found.append(fn.name)
    return found


def test_the_pacer_forwards_nothing():
    source = inspect.getsource(pacer_module)
    assert "class Pacer" in source
    assert forwards(source) == []


def test_negative_control_the_scan_finds_the_facades_forwards():
    facade = '''
    class Pacer:
        @property
        def max_idle_wait(self) -> float:
            """POLITE_MAX_IDLE_WAIT."""
            return self.config.max_idle_wait

        def inc(self, key: str, count: float = 1) -> None:
            self.report.inc(key, count)

        async def due(self, host: str) -> float:
            return await self.booker.due(host)

        def check(self) -> None:
            if self.failed is not None:
                raise self.failed

        def effective_interval(self, host, request=None):
            counters = self.report.hosts.get(host)
            return self.policy.effective_interval(counters, self.booker.override(host, request))
    '''
    assert forwards(facade) == ["max_idle_wait", "inc", "due"]


def _pacer(settings: dict[str, object] | None = None, store: object | None = None) -> Pacer:
    crawler = get_crawler(settings_dict={"POLITE_STORE": "memory://", **(settings or {})})
    backend = store if store is not None else MemoryStore(clock=lambda: NOW)
    return Pacer(crawler, PoliteConfig.from_settings(crawler.settings), backend.open_async(),  # type: ignore[attr-defined]
                 clock=lambda: NOW)


@pytest.mark.parametrize(("store_class", "offset"), [(PlainStore, 0.0), (ServerClockedStore, 100.0)])
def test_the_table_clock_conversions(store_class, offset):
    """The pacer wires the table's clock: an embedded table's is this process's; a server's (100 s behind) is
    converted both ways."""
    pacer = _pacer(store=store_class())
    try:
        pacer.sync.observe(pacer.store.store.now())  # what every store call does with the table's now
        assert pacer.sync.server_clock is (offset != 0.0)
        assert pacer.sync.to_store(NOW + 30) == pytest.approx(NOW + 30 - offset)
        assert pacer.sync.to_local(pacer.sync.to_store(NOW + 30)) == pytest.approx(NOW + 30)
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
        pacer.report.counters("a.example").state = HostState(next_allowed=NOW, crawl_delay=11.0, updated=NOW)
        assert pacer.effective_interval("a.example", slower) == 11.0  # a published Crawl-delay wins
        assert pacer.effective_interval("b.example") == 2.0  # another host keeps the base interval
    finally:
        pacer.close()
