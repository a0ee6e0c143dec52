"""Crash safety: a crawl killed with ``kill -9`` at random moments, and restarted (docs/spec.md §5, §6).

Four loopback hosts (127.0.6.1-4, 12 pages each) answer each request ``429`` + ``Retry-After: 2`` or ``3``
a quarter of the time (a seeded random choice), else ``200``. The crawl (``tests/support/kill_crawl.py``: the
add-on, a SQLite pace table, ``JOBDIR``, Scrapy's retries) runs in its own process, 50 times over, each
time stopped at a random moment 0.05-1.8 s after it was started (up to 1.2 s past the longest start-up seen,
on a slow machine), from Python's start-up, through opening the pace table and resuming the held requests,
to the crawl itself, and killed: ``SIGSTOP`` freezes it at
that moment, the test reads what is on disk, then ``SIGKILL`` ends it — a ``kill -9`` that the test can
observe. After each kill:

* the pace table opens (``SQLiteStore``) and ``PRAGMA integrity_check`` is ``ok``;
* every row read at the moment of the kill is still there, its ``next_allowed`` (the committed backoff or
  ``Retry-After`` window) and ``throttled_at`` not earlier: a committed backoff survives the kill; across
  the runs no host's ``next_allowed`` ever moves back;
* every request the process held at the moment of the kill — by its own log of what it held and handed out
  again (kill_crawl.py's probe) — is under ``JOBDIR`` after it (``scrapy_polite.crawl.held.read_held``), in order,
  and the next run takes over exactly those (``polite/deferred/resumed``): none of the held requests is lost;
* the server-side arrival log: no request of a run starts before the ``next_allowed`` its host had in the
  table when the run started — no request lands inside a committed ``Retry-After`` window or backoff.

Each run issues a random half of the URLs that the servers have not yet answered with a 200 and that are
not held under ``JOBDIR`` (Scrapy's own queue of pending requests is not kill-safe, see kill_crawl.py; the
half kept back makes later runs send fresh requests to hosts inside a committed window, which only the
pace table can hold back). A last run issues all of them and is not killed: it ends with reason ``finished``, every URL has been answered 200 and nothing is left held.
About 70 s on two cores. ``POLITE_CRASH_SEED`` replays one sequence of kill moments and answers.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from scrapy_polite.crawl.held import HELD_DIR, read_held
from scrapy_polite.stores.sqlite import Recovery, SQLiteStore
from tests.support.server import Reply, page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITERATIONS = 50
HOSTS = [f"127.0.6.{i}" for i in range(1, 5)]
PAGES = 12
#: Lower-bound tolerance (seconds): clock granularity only (the child and the servers share one clock).
TOL = 0.02
#: POLITE_HOST_INTERVAL of the crawl (tests/support/kill_crawl.py).
HOST_INTERVAL = 0.2
#: Arrivals logged this soon after a run started belong to the run before (its last request, still in the
#: socket when it was killed): no crawl process can send a request this soon after it was started.
START_MARGIN = 0.1

Row = tuple[float, int, float, int, float, float]  # next_allowed, consec, crawl_delay, ok_seen, throttled_at, updated


def table(path: str) -> dict[str, Row] | None:
    """The host rows of the pace table (``ip:`` rows left out); {} before it exists; None when it cannot be
    read right now (the frozen process holds a lock that readers must wait for)."""
    if not os.path.exists(path):
        return {}
    try:
        db = sqlite3.connect(path, timeout=0.5)
        try:
            if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'hosts'").fetchone():
                return {}
            rows = db.execute("SELECT host, next_allowed, consec, crawl_delay, ok_seen, throttled_at, updated "
                              "FROM hosts WHERE host NOT LIKE 'ip:%'").fetchall()
        finally:
            db.close()
    except sqlite3.OperationalError:
        return None
    return {row[0]: tuple(row[1:]) for row in rows}  # type: ignore[misc]


def marks(path: str) -> set[int] | None:
    """The processes whose "running" mark is in the table (docs/spec.md §6, "After a crash"); None when it
    cannot be read right now."""
    if not os.path.exists(path):
        return set()
    try:
        db = sqlite3.connect(path, timeout=0.5)
        try:
            if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'openers'").fetchone():
                return set()
            return {row[0] for row in db.execute("SELECT pid FROM openers")}
        finally:
            db.close()
    except sqlite3.OperationalError:
        return None


Held = dict[str, list[str]]  # host -> the URLs held, in the order they come back


def held(jobdir: str) -> Held | None:
    """The requests held under JOBDIR; None when a file cannot be read right now."""
    found: Held = {}
    try:
        for host, _, request in read_held(jobdir):
            found.setdefault(host, []).append(request["url"])
    except sqlite3.OperationalError:
        return None
    return found


def expected_held(before: Held, log_path: str) -> Held:
    """What the process held, by its probe log (kill_crawl.py): what it resumed, plus each ``H host url``
    line, minus the first of its host for each ``R host`` line."""
    queues = {host: list(urls) for host, urls in before.items()}
    popped: dict[str, int] = {}
    try:
        with open(log_path) as f:
            lines = f.read().split("\n")[:-1]  # every complete line (each was one write)
    except OSError:
        lines = []
    for line in lines:
        kind, host, *rest = line.split(" ")
        if kind == "H":
            queues.setdefault(host, []).append(rest[0])
        else:
            popped[host] = popped.get(host, 0) + 1
    return {host: urls[popped.get(host, 0):] for host, urls in queues.items() if urls[popped.get(host, 0):]}


def check_none_lost(expected: Held, on_disk: Held, where: str) -> int:
    """Every request the process held is on disk, in order. The disk may have one more at a host's head
    (killed between the ``R`` line and the pop) and one more at its tail (between the write and the ``H``
    line), nothing else."""
    for host in set(expected) | set(on_disk):
        want, got = expected.get(host, []), on_disk.get(host, [])
        ok = any(got[head:len(got) - tail] == want for head in (0, 1) for tail in (0, 1) if head + tail <= len(got))
        assert ok, f"{where}: {host} held {want} at the kill, JOBDIR has {got}"
    return sum(len(urls) for urls in expected.values())


class Throttling:
    """The servers' handler: 429 + Retry-After 2 or 3 a quarter of the time, else a page (seeded)."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.lock = threading.Lock()

    def __call__(self, info: Any, count: int) -> Reply:
        with self.lock:
            throttle = self.random.random() < 0.25
            retry_after = self.random.choice(["2", "3"])
        return Reply.throttle(429, retry_after) if throttle else page(info.path)


def spawn(tmp_path: Any, run: int, urls: list[str], store: str, jobdir: str) -> tuple[subprocess.Popen[bytes], str, str]:
    config = tmp_path / f"run-{run}.json"
    report = str(tmp_path / f"report-{run}.json")
    log_path = str(tmp_path / f"held-{run}.log")
    config.write_text(json.dumps({"urls": urls, "store": f"sqlite:///{store}", "jobdir": jobdir, "report": report,
                                  "log": log_path}))
    log = open(tmp_path / f"run-{run}.log", "wb")  # noqa: SIM115 (closed by the caller through the process)
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.kill_crawl", str(config)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, report, log_path


def read_report(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError):
        return None


def check_store_opens(path: str, where: str) -> Recovery | None:
    """The table opens whole; what its opening found of an unclean stop (and repaired: the crash window)."""
    if not os.path.exists(path):
        return None  # killed before the crawl created it
    store = SQLiteStore(path, mark=True)  # as a crawl opens it; migrates and takes the write lock: raises StoreError if it cannot
    recovery = store.recovery
    store.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", f"{where}: the pace table is damaged"
    finally:
        db.close()
    return recovery


def check_survives(before: dict[str, Row], after: dict[str, Row], where: str) -> None:
    """Every row of ``before`` is in ``after`` with a next_allowed and throttled_at no earlier."""
    for host, row in before.items():
        assert host in after, f"{where}: the row of {host} was lost"
        assert after[host][0] >= row[0], f"{where}: {host}'s next_allowed moved back: {row} -> {after[host]}"
        assert after[host][4] >= row[4], f"{where}: {host}'s throttle was lost: {row} -> {after[host]}"


def check_arrivals(servers: list[Any], start: float, end: float, baseline: dict[str, Row], where: str) -> int:
    """No arrival of the run (started in [start, end)) starts before its host's committed next_allowed.

    Returns how many hosts had a committed window still open when the run's first request reached any
    host (the check had something to catch)."""
    binding = 0
    runs = [a for srv in servers for a in srv.arrivals() if start <= a.start < end]
    first = min((a.start for a in runs), default=end)
    for srv in servers:
        committed = baseline.get(srv.address)
        arrivals = [a for a in srv.arrivals() if start <= a.start < end]
        before = [a.start for a in srv.arrivals() if a.start < start]
        if arrivals and before:  # the last request the server saw before the run, then the run's first
            gap = min(a.start for a in arrivals) - max(before)
            assert gap >= HOST_INTERVAL - TOL, (
                f"{where}: {srv.address} got the run's first request {gap:.3f} s after the last one it saw, "
                f"sooner than its interval ({HOST_INTERVAL} s)")
        if committed is not None and committed[0] > first:
            binding += 1
        for a in arrivals:
            if committed is not None:
                assert a.start >= committed[0] - TOL, (
                    f"{where}: {a.path} reached {srv.address} at {a.start:.3f}, {committed[0] - a.start:.3f} s "
                    f"before the next_allowed committed before the run ({committed[0]:.3f})")
    return binding


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_kill_9_at_random_moments_loses_no_backoff_and_no_held_request(arrival_server, tmp_path):
    seed = int(os.environ.get("POLITE_CRASH_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    handler = Throttling(seed)
    servers = [arrival_server(address) for address in HOSTS]
    for srv in servers:
        srv.route("/*", handler)
    urls = [srv.url(f"/p/{i}") for srv in servers for i in range(PAGES)]
    store = str(tmp_path / "pace.sqlite3")
    jobdir = str(tmp_path / "job")
    os.makedirs(jobdir)
    baseline: dict[str, Row] = {}  # the table as the next run finds it
    held_before: Held = {}  # what the next run finds under JOBDIR
    seen: dict[str, int] = {"killed_in_startup": 0, "reports": 0, "held_at_kill": 0, "unreadable_at_kill": 0,
                            "open_windows_at_restart": 0, "unclean_found": 0}
    startup = 0.0  # the longest time a run took to open its spider: kills land before and after it
    for run in range(ITERATIONS + 1):
        where = f"run {run} (POLITE_CRASH_SEED={seed})"
        answered = {f"http://{a.host}:{srv.port}{a.path}" for srv in servers for a in srv.arrivals()
                    if a.status == 200}
        waiting = {url for host_urls in held_before.values() for url in host_urls}
        todo = [url for url in urls if url not in answered and url not in waiting]
        final = run == ITERATIONS
        if not final:  # keep some back, so that later runs send fresh requests into committed windows
            todo = [url for url in todo if rng.random() < 0.5]
        started = time.time()
        proc, report_path, log_path = spawn(tmp_path, run, todo, store, jobdir)
        if final:
            assert proc.wait(timeout=90) == 0, f"{where}: the last crawl failed (see {tmp_path}/run-{run}.log)"
            ended = time.time()
        else:
            if run == 0:  # the first run learns how long start-up takes here (a loaded machine: seconds)
                while read_report(report_path) is None and proc.poll() is None and time.time() - started < 60:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 1.2))
            else:
                time.sleep(rng.uniform(0.05, max(1.8, startup + 1.2)))
            proc.send_signal(signal.SIGSTOP)
            ended = time.time()
            at_kill, held_at_kill, marks_at_kill = table(store), held(jobdir), marks(store)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        report = read_report(report_path)
        if report is not None and not final:  # the report was first written when the spider opened
            startup = max(startup, os.path.getmtime(report_path) - started)
        elif not final:  # killed before its spider opened: start-up takes at least that long (a loaded machine)
            startup = max(startup, ended - started)

        recovery = check_store_opens(store, where)
        if final:
            assert recovery is None, f"{where}: a clean stop was taken for a crash ({recovery})"
        elif marks_at_kill is not None:  # the crash window (docs/spec.md §6, "After a crash")
            left = proc.pid in marks_at_kill
            assert left == (recovery is not None and proc.pid in recovery.pids), (
                f"{where}: mark at the kill: {left}, found at the next opening: {recovery}")
            seen["unclean_found"] += left
        after = table(store)
        assert after is not None, f"{where}: the pace table cannot be read after the kill"
        held_after = held(jobdir)
        assert held_after is not None, f"{where}: the held requests cannot be read after the kill"
        check_survives(baseline, after, where)
        if not final:
            if at_kill is not None:
                check_survives(at_kill, after, where + ", at the kill")
            if held_at_kill is not None:
                assert held_after == held_at_kill, f"{where}: held requests changed by the kill"
            else:
                seen["unreadable_at_kill"] += 1
            seen["held_at_kill"] += check_none_lost(expected_held(held_before, log_path), held_after, where)
        resumed = sum(len(host_urls) for host_urls in held_before.values())
        if report is not None:
            seen["reports"] += 1
            assert report["resumed"] == resumed, (
                f"{where}: {resumed} requests were held under JOBDIR, the run resumed {report['resumed']}")
        else:
            seen["killed_in_startup"] += 1
        seen["open_windows_at_restart"] += check_arrivals(servers, started + START_MARGIN, ended + START_MARGIN,
                                                          baseline, where)
        baseline, held_before = after, held_after

    assert report is not None and report.get("finish_reason") == "finished", report
    answered = {f"http://{a.host}:{srv.port}{a.path}" for srv in servers for a in srv.arrivals() if a.status == 200}
    assert answered == set(urls), f"never answered 200: {sorted(set(urls) - answered)} (seed {seed})"
    assert held_before == {} and not os.listdir(os.path.join(jobdir, HELD_DIR)), "requests left held at the end"
    # The test must have met both kinds of moment — a crawl killed before its spider opened, and one killed
    # with requests held — and restarts whose hosts were still inside a committed window (else it proves
    # little).
    assert seen["killed_in_startup"] > 0 and seen["reports"] > 0 and seen["held_at_kill"] > 0, (seen, seed)
    assert seen["open_windows_at_restart"] > 0 and seen["unclean_found"] > 0, (seen, seed)
    print(f"kill -9 loop: seed {seed}, {seen}")
