"""What the Redis store tests share (tests/test_redis_store.py, test_redis_cluster.py, test_redis_sharded.py):
update functions, a write script that loses its replies, the cross-process no-lost-update run, the resend
check, and a cluster client fixture.

* :func:`bump`, :func:`bump_both`: a one-row update and a booking's shape (host and address rows).
* :class:`LoseReplies`: wraps a store's write script, runs it and then loses the reply ``times`` times.
* :func:`run_booking_processes` and :func:`expected_counts`: :data:`PROCESSES` processes booking the same
  rows at once through one URL (every layout and deployment), and the counts none of them may lose.
* :func:`check_a_retry_after_unavailable_is_applied_once`: an update applied but whose reply was lost twice
  (so it raised ``StoreUnavailable``), then retried: applied once, whatever another writer did meanwhile.
* the ``cluster`` fixture (import it: ``from tests.support.redis_updates import cluster``): a
  ``RedisCluster`` client on the session's cluster, for the checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from scrapy_polite.policy import HostState
from scrapy_polite.stores import StoreOptions, StoreUnavailable, open_store
from tests.support.redis_cluster import node_ports

__all__ = ["PROCESSES", "ROOT", "WORKER", "LoseReplies", "bump", "bump_both",
           "check_a_retry_after_unavailable_is_applied_once", "cluster", "expected_counts", "run_booking_processes"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bump(old: HostState | None, now: float) -> tuple[HostState, int]:
    """One row's update: ``consec`` + 1; the result is the old count."""
    old = old or HostState()
    return replace(old, consec=old.consec + 1, updated=now), old.consec


def bump_both(states: dict[str, HostState | None], now: float) -> tuple[dict[str, HostState], int]:
    """A booking's shape: the host's and the address's rows in one update; the result is the host's old count."""
    host, ip = sorted(states)
    old = states[host] or HostState()
    return ({host: replace(old, consec=old.consec + 1, updated=now),
             ip: replace(states[ip] or HostState(), consec=(states[ip] or HostState()).consec + 1, updated=now)},
            old.consec)


class LoseReplies:
    """Wraps the write script: runs it, then loses the reply (the connection dropped) ``times`` times."""

    def __init__(self, script: Any, times: int) -> None:
        self.script, self.times, self.sent = script, times, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.sent += 1
        result = self.script(*args, **kwargs)
        if self.times:
            self.times -= 1
            raise redis.ConnectionError("Connection lost (simulated) after the write was applied")
        return result


def check_a_retry_after_unavailable_is_applied_once(s: Any, other: Any = None) -> None:
    """``s``'s update of ``a.example`` is applied but its reply is lost twice (the store's resend too), so it
    raises ``StoreUnavailable``; ``other`` (when given) then writes the row; the retry with the same function
    returns the first result and applies nothing. Negative control: another function is another update."""
    s.update("a.example", bump)
    s.scripts.write = LoseReplies(s.scripts.write, times=2)

    def once(old: HostState | None, now: float) -> tuple[HostState, int]:
        return bump(old, now)

    with pytest.raises(StoreUnavailable):
        s.update("a.example", once)  # applied, but we could not know
    assert s.get("a.example").consec == 2
    others = 0
    if other is not None:
        other.update("a.example", bump)  # another writer overwrites the row meanwhile
        others = 1
    assert s.update("a.example", once) == 1  # the retry (same fn) returns the first result
    assert (other or s).get("a.example").consec == 2 + others  # 1 + the lost one (+ the other's): no double
    # Negative control: another update function is another update.
    assert s.update("a.example", bump) == 2 + others
    assert s.get("a.example").consec == 3 + others


#: One of the processes of :func:`run_booking_processes`: waits for the go file, then makes ``updates``
#: bookings over 5 hosts and 2 addresses (``update_many`` of a host and an address row, as a booking does).
WORKER = textwrap.dedent("""
    import os, sys, time
    from dataclasses import replace
    sys.path.insert(0, {root!r})
    from scrapy_polite.policy import HostState
    from scrapy_polite.stores import StoreOptions
    from scrapy_polite.stores.redis import RedisStore

    url, prefix, go, updates = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = RedisStore(url, StoreOptions(prefix=prefix))
    deadline = time.monotonic() + 60
    while not os.path.exists(go):  # start together, for the most contention
        if time.monotonic() > deadline:
            sys.exit("never told to go")
        time.sleep(0.001)

    def bump(state):
        state = state or HostState()
        return replace(state, consec=state.consec + 1)

    for i in range(updates):
        host, ip = "h%d.example" % (i % 5), "ip:192.0.2.%d" % (i % 2)
        # Host and address rows in one transaction, as a booking does.
        store.update_many([host, ip], lambda states, now: ({{host: bump(states[host]), ip: bump(states[ip])}}, None))
    store.close()
""")

#: Processes of :func:`run_booking_processes`.
PROCESSES = 8


def run_booking_processes(url: str, prefix: str, tmp_path: Path, updates: int) -> tuple[dict[str, int], list[str]]:
    """:data:`PROCESSES` processes of :data:`WORKER` on the table at ``url`` under ``prefix``, started together;
    returns each row's ``consec`` once they all ended (each must exit 0) and the rows' Redis keys."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=ROOT))
    go = tmp_path / "go"
    workers = [subprocess.Popen([sys.executable, str(script), url, prefix, str(go), str(updates)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for _ in range(PROCESSES)]
    time.sleep(1.0)  # let them all connect
    go.write_text("go")
    for worker in workers:
        _, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err.decode(errors="replace")
    s = open_store(url, StoreOptions(prefix=prefix))
    try:
        counts = {key: state.consec for key, state in s.items()}
        names = [s.keys.row(key) for key in counts]
    finally:
        s.close()
    return counts, names


def expected_counts(updates: int) -> dict[str, int]:
    """The rows' counts after :func:`run_booking_processes` when no update was lost."""
    total = PROCESSES * updates
    return {**{f"h{i}.example": total // 5 for i in range(5)}, "ip:192.0.2.0": total // 2, "ip:192.0.2.1": total // 2}


@pytest.fixture
def cluster(redis_cluster_url: str) -> Iterator[RedisCluster]:
    """A cluster client (for the checks), on the session's cluster."""
    host, port = node_ports(redis_cluster_url)[0]
    client = RedisCluster(host=host, port=port)
    yield client
    client.close()
