"""Shared test set-up.

* Makes the package (and ``tests.support``) importable from a source checkout: the package is not installed
  in the test venv, and pytest's default (``prepend``) import mode only puts ``tests/`` on ``sys.path``.
* ``store``: each embedded pace table in turn (memory, SQLite in a temporary file); a module may define its own.
* ``arrival_server``: a factory fixture of loopback :class:`tests.support.server.ArrivalServer` instances,
  all stopped at the end of the test.
* An illegal move of a request's lifecycle raises (:data:`scrapy_polite.crawl.lifecycle.STRICT`).
* Hypothesis profiles for the property and fuzz tests (tests/test_properties.py, tests/test_fuzz.py):
  ``ci`` (the default: a bounded, derandomised run — the same examples every run, no example database) and
  ``fuzz`` (``HYPOTHESIS_PROFILE=fuzz``: many more random examples, for a long fuzzing session; every
  crasher it finds becomes an ``@example`` or a regular test).

"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True, database=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=20_000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# An illegal move of a request's lifecycle raises in tests (a crawl counts and logs it: scrapy_polite/crawl/lifecycle.py).
import scrapy_polite.crawl.lifecycle  # noqa: E402

scrapy_polite.crawl.lifecycle.STRICT = True


@pytest.fixture(autouse=True)
def fresh_memory_table():
    """Each test starts as a new process would: no ``memory://`` table open (one a test left open, never closed, is
    not shared with the next test's crawls)."""
    from scrapy_polite.stores.memory import MemoryStore

    MemoryStore._process = None
    yield
    MemoryStore._process = None


@pytest.fixture
def arrival_server():
    """``arrival_server(address="127.0.0.1", **kwargs)`` starts an ArrivalServer; all are stopped afterwards."""
    from tests.support.server import ArrivalServer

    servers = []

    def start(address: str = "127.0.0.1", **kwargs):
        srv = ArrivalServer(address, **kwargs)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    """Each embedded backend in turn, closed afterwards: a test that takes ``store`` runs against both."""
    from scrapy_polite.stores import MemoryStore, SQLiteStore

    s = MemoryStore() if request.param == "memory" else SQLiteStore(str(tmp_path / "pace.sqlite3"))
    yield s
    s.close()
