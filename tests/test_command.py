"""``scrapy polite show|reset|expire``: the operator command on a real SQLite pace table."""

from __future__ import annotations

import subprocess
import sys
import time

from scrapy_polite.policy import HostState
from scrapy_polite.stores import open_store


def _scrapy(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scrapy", "polite", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_show_reset_keeps_crawl_delay_and_expire(tmp_path):
    uri = f"sqlite:///{tmp_path}/pace.sqlite3"
    store = open_store(uri)
    now = time.time()
    store.update("slow.example", lambda s, now_: (HostState(next_allowed=now + 500, consec=3, crawl_delay=7.0,
                                                      ok_seen=True, updated=now), None))
    store.update("old.example", lambda s, now_: (HostState(next_allowed=1.0, updated=1.0), None))
    store.close()

    shown = _scrapy("show", "--store", uri, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "slow.example" in shown.stdout and "old.example" in shown.stdout
    assert "7 s" in shown.stdout

    reset = _scrapy("reset", "SLOW.example.", "missing.example", "--store", uri, cwd=tmp_path)
    assert reset.returncode == 0, reset.stderr
    assert "slow.example: reset" in reset.stdout
    assert "missing.example: not in the table" in reset.stdout
    store = open_store(uri)
    state = store.get("slow.example")
    assert state is not None and state.consec == 0 and state.next_allowed == 0.0 and not state.ok_seen
    assert state.crawl_delay == 7.0  # the host's number is not ours to forget (docs/spec.md §2)
    assert store.get("missing.example") is None  # a reset never creates a row
    store.close()

    expired = _scrapy("expire", "--store", uri, cwd=tmp_path)
    assert expired.returncode == 0, expired.stderr
    assert "expired 1 rows" in expired.stdout
    store = open_store(uri)
    assert [k for k, _ in store.items()] == ["slow.example"]
    store.close()


def test_unusable_store_is_reported(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    result = _scrapy("show", "--store", f"sqlite:///{tmp_path}/file/pace.sqlite3", cwd=tmp_path)
    assert result.returncode == 1
    assert "Fix:" in result.stdout
