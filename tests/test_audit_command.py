"""``scrapy polite audit`` on stored logs (README "Auditing a crawl"; docs/spec.md §8): exit 1 and the rule named
for a log with one violation of each kind, 0 at the exact boundary, 2 with a clear message (never a traceback)
for a log that is truncated, incomplete, corrupt or empty — in SQLite files, and in Redis."""

from __future__ import annotations

import io
import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import succeed

from scrapy_polite.clock import ClockSync
from scrapy_polite.commands import EXIT_BAD_LOG, EXIT_OK, EXIT_STORE, EXIT_VIOLATED, run_command
from scrapy_polite.reports.events import EventLog
from scrapy_polite.stores import Event, MemoryStore, SQLiteStore, StoreOptions, open_store, table_name
from tests.support.audit_log import T0, Log
from tests.support.redis_server import redis_url, unique_prefix  # noqa: F401

LOOPBACK = {"POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"]}


def audit_cli(uri: str, *extra: str, settings: dict[str, Any] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_command(["audit", "--store", uri, *extra], LOOPBACK if settings is None else settings, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def sqlite_log(tmp_path: Path, log: Log, **kwargs: Any) -> str:
    store = SQLiteStore(str(tmp_path / "pace.sqlite3"), **kwargs)
    store.append_events(log.events)
    store.close()
    return store.uri


def one_of_each() -> dict[str, Log]:
    """A log with exactly one violation of each kind (and the events around it that make it one)."""
    logs: dict[str, Log] = {}
    log = logs["interval"] = Log()
    log.book(0.0)
    log.book(0.5)
    log = logs["retry_after"] = Log()
    log.book(0.0)
    log.respond(0.2, status=429, due=3.2, retry_after=3.0, reason="throttle", steps=1)
    log.book(2.0)
    log = logs["quota"] = Log()
    log.book(0.0)
    log.respond(0.2, due=5.2, hold=5.0)
    log.book(1.5)
    log = logs["backoff"] = Log()
    log.book(0.0)
    log.respond(0.2, status=503, due=2.2, reason="throttle", steps=1)
    log.book(1.5)
    log = logs["crawl_delay"] = Log()
    log.book(0.0)
    log.add(0.2, "robots_delay", delay=4.0, due=T0 + 4.2)
    log.book(4.2)
    log.book(6.0)
    log = logs["ip_interval"] = Log()
    log.book(0.0, "a.example", ip_interval=2.0)
    log.book(1.0, "b.example", ip_interval=2.0)
    log = logs["address"] = Log()
    log.book(0.0, address="192.168.1.20")
    return logs


@pytest.mark.parametrize("kind", list(one_of_each()))
def test_a_log_with_one_violation_fails_naming_it(tmp_path, kind):
    uri = sqlite_log(tmp_path, one_of_each()[kind])
    code, out, err = audit_cli(uri)
    assert code == EXIT_VIOLATED, out + err
    flagged = [line for line in out.splitlines() if line.startswith("VIOLATION")]
    assert len(flagged) == 1 and flagged[0].startswith(f"VIOLATION {kind} ("), out
    assert out.splitlines()[-1] == f"FAILED: 1 violation (1 {kind})"
    code, out, _ = audit_cli(uri, "--json")
    data = json.loads(out)
    assert code == EXIT_VIOLATED and [v["kind"] for v in data["violations"]] == [kind]
    assert data["violations"][0]["second"]["kind"] == "booking"


def test_requests_exactly_at_every_boundary_pass(tmp_path):
    log = Log()
    log.book(0.0, ip_interval=1.0)
    log.book(1.0, ip_interval=1.0)
    log.respond(1.2, status=429, due=4.2, retry_after=3.0, reason="throttle", steps=1, address="127.0.0.2",
                ip_interval=1.0)
    log.book(4.2, ip_interval=1.0)
    log.add(4.5, "robots_delay", delay=2.0, due=T0 + 6.5)
    log.book(6.5, interval=2.0, ip_interval=1.0)
    log.book(8.5, interval=2.0, ip_interval=1.0)
    log.add(9.0, "refusal", host="internal.example", reason="non_public")  # refused, never requested
    code, out, err = audit_cli(sqlite_log(tmp_path, log))
    assert code == EXIT_OK, out + err
    assert out.splitlines()[-1] == "OK: no violation in 5 requests to 1 host"  # (the refused host is not one)


def test_a_log_trimmed_by_its_cap_is_refused_with_the_fix(tmp_path):
    log = Log()
    for i in range(6):
        log.book(float(i))
    uri = sqlite_log(tmp_path, log, events_max=4)  # the oldest two are deleted
    code, out, err = audit_cli(uri)
    assert code == EXIT_BAD_LOG and out == ""
    assert err.startswith(f"scrapy polite audit: the event log of {uri} cannot be audited: the log is truncated: "
                          "the first 2 events of m:1 are missing")
    assert "--since" in err and "Traceback" not in err
    code, out, _ = audit_cli(uri, "--since", f"@{T0 + 2}")
    assert code == EXIT_OK, out


def test_a_log_with_a_row_that_is_not_a_number_is_refused(tmp_path):
    log = Log()
    log.book(0.0)
    uri = sqlite_log(tmp_path, log)
    with sqlite3.connect(tmp_path / "pace.sqlite3") as db:
        db.execute("INSERT INTO events (at, kind, host, delay, source, seq) VALUES (?, 'booking', 'a.example', "
                   "'soon', 'm:1', 1)", (T0 + 1,))
    code, out, err = audit_cli(uri)
    assert code == EXIT_BAD_LOG, out
    assert "the booking event of a.example from m:1 #1 has delay = 'soon', not a number of seconds" in err


def test_a_database_file_cut_short_is_a_clear_error(tmp_path):
    log = Log()
    for i in range(3000):
        log.book(float(i), url=f"http://a.example/{'x' * 200}/{i}")
    uri = sqlite_log(tmp_path, log)
    path = tmp_path / "pace.sqlite3"
    size = path.stat().st_size
    assert size > 100_000 and not (tmp_path / "pace.sqlite3-wal").exists()
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    code, out, err = audit_cli(uri)
    assert code == EXIT_BAD_LOG, out + err
    assert err.startswith("scrapy polite audit: ") and "malformed" in err and "Traceback" not in err


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path):
    path = tmp_path / "pace.sqlite3"
    path.write_bytes(b"this is not a pace table\n" * 200)
    code, _, err = audit_cli(f"sqlite:///{path}")
    assert code == EXIT_BAD_LOG and "not a database" in err and "Traceback" not in err
    # the other verbs keep their own status for an unusable store
    assert run_command(["hosts", "--store", f"sqlite:///{path}"], err=io.StringIO()) == EXIT_STORE


def test_an_empty_log_cannot_be_vouched_for(tmp_path):
    uri = sqlite_log(tmp_path, Log())
    code, _, err = audit_cli(uri)
    assert code == EXIT_BAD_LOG and "no events to audit" in err and "POLITE_EVENT_LOG off" in err
    log = Log()
    log.book(0.0)
    code, _, err = audit_cli(sqlite_log(tmp_path, log), "--since", "2099-01-01")  # a window with none
    assert code == EXIT_BAD_LOG and "nothing crawled in that window" in err and "POLITE_EVENT_LOG off" not in err


def test_an_older_sqlite_log_is_migrated_and_audited_from_its_due_times(tmp_path):
    """A file of schema 3 (before the audit's columns) opens, its events keep their values and the audit says
    what it cannot check; the other verbs still read it."""
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript("""
            CREATE TABLE hosts (host TEXT PRIMARY KEY, next_allowed REAL NOT NULL, consec INTEGER NOT NULL,
                crawl_delay REAL NOT NULL, ok_seen INTEGER NOT NULL, throttled_at REAL NOT NULL, updated REAL NOT NULL,
                ratelimit_interval REAL NOT NULL DEFAULT 0, ratelimit_until REAL NOT NULL DEFAULT 0) WITHOUT ROWID;
            CREATE TABLE events (id INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL, host TEXT NOT NULL,
                url TEXT, status INTEGER, delay REAL, due REAL, reason TEXT, retry_after REAL, steps INTEGER,
                address TEXT, started REAL, source TEXT NOT NULL);
            PRAGMA user_version = 3;
        """)
        db.executemany("INSERT INTO events (at, kind, host, url, delay, due, address, source) VALUES "
                       "(?, 'booking', 'a.example', ?, 1.0, ?, '127.0.0.2', 'm:1')",
                       [(T0 + i, f"http://a.example/{i}", T0 + i + 1) for i in range(3)])
    code, out, err = audit_cli(f"sqlite:///{path}")
    assert code == EXIT_OK, out + err
    assert "note: 3 requests were logged before the interval in force was recorded" in out
    assert "note: the log predates event numbers" in out
    store = open_store(f"sqlite:///{path}")
    try:
        assert [e.delay for e in store.events()] == [1.0, 1.0, 1.0]
        assert {e.interval for e in store.events()} == {None}
    finally:
        store.close()
    assert run_command(["show", "a.example", "--store", f"sqlite:///{path}"], out=io.StringIO()) == EXIT_OK


def test_since_needs_the_audit_verb_and_audit_takes_no_host(tmp_path):
    uri = sqlite_log(tmp_path, one_of_each()["interval"])
    err = io.StringIO()
    assert run_command(["audit", "a.example", "--store", uri], err=err) == 2 and "no positional" in err.getvalue()
    assert run_command(["audit", "--throttled", "--store", uri], err=io.StringIO()) == 2


# --------------------------------------------------------------------------------------------------
# Redis: the same verdicts; an entry of an older log readable, a garbled one refused


def test_redis_logs_are_audited_and_a_garbled_entry_is_refused(redis_url):  # noqa: F811
    import redis  # noqa: PLC0415  (the optional extra)

    prefix = unique_prefix("audit")
    settings = {**LOOPBACK, "POLITE_STORE_PREFIX": prefix}
    store = open_store(redis_url, StoreOptions(prefix=prefix))
    client = redis.Redis.from_url(redis_url)
    try:
        store.append_events(one_of_each()["retry_after"].events)
        code, out, err = audit_cli(redis_url, settings=settings)
        assert code == EXIT_VIOLATED and "VIOLATION retry_after" in out, out + err
        stream = f"{prefix}{{pace}}#events"
        old = Event(T0 + 9, "booking", "b.example", "http://b.example/", None, 1.0, T0 + 10, None, None, None,
                    "127.0.0.3", None, "m:2")
        client.xadd(stream, {"e": json.dumps(list(old)[:13])})  # the 13 fields of a log before the audit's
        assert [e for e in store.events() if e.host == "b.example"] == [old]
        client.xadd(stream, {"e": "{not json"})
        code, out, err = audit_cli(redis_url, settings=settings)
        assert code == EXIT_BAD_LOG and out == "", out
        assert "holds an entry that cannot be read" in err and "Traceback" not in err
    finally:
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()
        store.close()


# --------------------------------------------------------------------------------------------------
# The numbers the audit counts on (Event.seq)


class _Writer:
    def __init__(self, uri: str, prefix: str = "") -> None:
        self.uri, self.prefix, self.events = uri, prefix, []

    def append_events(self, events):
        self.events.extend(events)
        return succeed(None)


class _Async:
    """A backend behind an AsyncStore-like writer (``.store``), as the crawl's event log sees it."""

    def __init__(self, store: Any) -> None:
        self.store, self.uri = store, store.uri

    def append_events(self, events):
        self.store.append_events(events)
        return succeed(None)


def _log(writer: Any) -> EventLog:
    """The log the pacer builds: named by its backend's table (:func:`~scrapy_polite.stores.table_name`)."""
    return EventLog(writer, ClockSync(lambda: T0), source="m:1", table=table_name(getattr(writer, "store", writer)))


def test_crawlers_of_one_process_on_one_table_share_one_numbering():
    uri = f"sqlite:///{uuid.uuid4().hex}.sqlite3"
    one, two, other = _Writer(uri), _Writer(uri), _Writer(uri, prefix="other:")
    logs = [_log(one), _log(two), _log(other), _log(_Writer(uri)), _log(_Async(MemoryStore())),
            _log(_Async(MemoryStore()))]
    for log in logs * 2:
        log.refusal("a.example", None, "non_public")
        log.flush()
    # Each log's first event is preceded by its "opened" one.
    assert [e.seq for e in one.events] == [0, 1, 6] and [e.seq for e in two.events] == [2, 3, 7]
    assert [e.seq for e in other.events] == [0, 1, 2]  # another prefix: another table
    numbers = sorted(e.seq for w in (one, two, logs[3].writer) for e in w.events)
    assert numbers == list(range(9))  # one source, one table: no gap, no repeat
    for log in logs[4:]:  # a memory table numbers its own events
        assert [e.seq for e in log.writer.store.events()] == [0, 1, 2]


def test_a_window_reads_every_opening_and_a_window_of_closes_alone_is_empty(tmp_path):
    """``audit --since``: the store's openings before the window still count, so a crawler killed in the window is
    named (exit 2, ``OPEN:``); a window holding only a log's close has nothing crawled to vouch for (review). The
    same log audited whole, closed, is OK (the control)."""
    log = Log()
    log.add(0.0, "opened", "")
    log.book(0.0)
    log.book(10.0)
    uri = sqlite_log(tmp_path, log)
    since = "@" + str(T0 + 5.0)
    code, out, _ = audit_cli(uri, "--since", since)
    assert code == EXIT_BAD_LOG and "OPEN: m:1 did not close its event log" in out, out
    log.add(11.0, "closed", "")
    (tmp_path / "closed").mkdir()
    closed = sqlite_log(tmp_path / "closed", log)
    assert audit_cli(closed, "--since", since)[0] == EXIT_OK
    code, _, err = audit_cli(closed, "--since", "@" + str(T0 + 10.5))
    assert code == EXIT_BAD_LOG and "nothing crawled in that window" in err
    # (review) a batch written twice where it had landed (the event log writes a failed batch again): its opening
    # counts once, or the window would name a closed process as open
    (tmp_path / "twice").mkdir()
    twice = SQLiteStore(str(tmp_path / "twice" / "pace.sqlite3"))
    twice.append_events(log.events[:2])
    twice.append_events(log.events)
    twice.close()
    assert audit_cli(twice.uri)[0] == EXIT_OK
    assert audit_cli(twice.uri, "--since", since)[0] == EXIT_OK
