"""``scrapy polite`` (scrapy_polite/commands/): every verb's output, as a table and as JSON, and its exit status,
on prepared SQLite and memory pace tables, errors included.

Each verb runs in this process (:func:`~scrapy_polite.commands.run_command`, parsed as Scrapy parses it) on
both backends — the memory table is handed over as an object, the SQLite one is opened from its URI like the
real command — and the real ``scrapy polite`` (a subprocess) runs on the SQLite table for every verb and every
exit status: 0 done, 1 no such host, 2 usage, 3 store unusable.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from scrapy.settings import Settings

from scrapy_polite.clock import process_clock
from scrapy_polite.commands import (
    EXIT_NO_HOST,
    EXIT_OK,
    EXIT_STORE,
    EXIT_USAGE,
    HOST_COLUMNS,
    STATUSES,
    VERB_HELP,
    VERBS,
    parse_since,
    run_command,
)
from scrapy_polite.policy import HostState, PacingPolicy
from scrapy_polite.stores import Event, MemoryStore, SQLiteStore, open_store
from tests.support.stores import write_sqlite_file

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    code: int
    out: str
    err: str


class Table:
    """A prepared pace table and a way to run ``scrapy polite`` on it."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.now = process_clock()  # what the embedded stores' now reads, in this process
        if kind == "memory":
            self.store = MemoryStore()
            self.uri = "memory://"
        else:
            self.uri = f"sqlite:///{tmp_path}/pace.sqlite3"
            self.store = SQLiteStore(str(tmp_path / "pace.sqlite3"))
        prepare(self.store, self.now)

    def run(self, *argv: str, settings: dict | None = None) -> Result:
        out, err = io.StringIO(), io.StringIO()
        if self.kind == "memory":
            code = run_command(list(argv), settings, store=self.store, out=out, err=err)
        else:
            code = run_command([*argv, "--store", self.uri], settings, out=out, err=err)
        return Result(code, out.getvalue(), err.getvalue())

    def state(self, key: str) -> HostState | None:
        return self.store.get(key)

    def close(self) -> None:
        self.store.close()


def prepare(store, now: float) -> None:
    """Three hosts (one backing off after a 429, one with a Crawl-delay, one idle for years), an address row,
    and the events that explain them."""
    rows = {
        "busy.example": HostState(next_allowed=now + 250, consec=3, ok_seen=True, throttled_at=now - 10,
                                  updated=now - 10),
        "slow.example": HostState(next_allowed=now + 5, crawl_delay=7.0, ok_seen=True, updated=now - 1),
        "idle.example": HostState(next_allowed=1.0, updated=1.0),
        "ip:192.0.2.7": HostState(next_allowed=now + 1, updated=now - 1),
    }
    for key, state in rows.items():
        store.update(key, lambda old, now_, s=state: (s, None))
    url = "http://busy.example/p/3"
    store.append_events([
        Event(now - 12, "booking", "busy.example", url, delay=1.0, due=now - 11, address="192.0.2.7", source="m:1"),
        Event(now - 10, "response", "busy.example", url, status=429, delay=250.0, due=now + 250, reason="throttle",
              retry_after=250.0, steps=3, started=now - 12, source="m:1"),
        Event(now - 10, "backoff", "busy.example", url, status=429, delay=250.0, due=now + 250, reason="429",
              retry_after=250.0, steps=3, started=now - 12, source="m:1"),
        Event(now - 9, "deferral", "busy.example", "http://busy.example/p/4", delay=259.0, due=now + 250,
              reason="throttled", source="m:1"),
        Event(now - 2, "robots_delay", "slow.example", delay=7.0, due=now + 5, source="m:1"),
    ])


@pytest.fixture(params=["memory", "sqlite"])
def table(request, tmp_path):
    t = Table(request.param, tmp_path)
    yield t
    t.close()


def cli(*argv: str, cwd: Path) -> Result:
    """The real ``scrapy polite``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    proc = subprocess.run([sys.executable, "-m", "scrapy", "polite", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def lines_of(table_text: str) -> list[list[str]]:
    """The cells of an aligned table (columns are separated by two spaces or more)."""
    return [re.split(r"\s{2,}", line.strip()) for line in table_text.splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------------
# hosts


def test_hosts_lists_every_host_sorted_by_when_it_is_due(table):
    result = table.run("hosts")
    assert result.code == EXIT_OK, result.err
    header, *body, forgive = result.out.splitlines()
    assert header.startswith(f"pace table {table.store.uri}: 3 hosts, 1 address row;")
    # how to forgive the host with backoff steps, and only that one
    assert forgive.startswith("to forgive a host (forget its backoff steps and hold; its Crawl-delay stays): "
                              "scrapy polite reset busy.example")
    rows = lines_of("\n".join(body))
    assert tuple(rows[0]) == HOST_COLUMNS
    assert [r[0] for r in rows[1:]] == ["idle.example", "slow.example", "busy.example"]  # due now, in 5 s, in 250 s
    idle, slow, busy = rows[1:]
    assert idle[1] == "now" and idle[3] == "-" and idle[4] == "no" and re.fullmatch(r"\d+ d \d+ h ago", idle[5])
    assert re.fullmatch(r"in [45]\.\d s \(at \d\d:\d\d:\d\d\)", slow[1]) and slow[3] == "7 s" and slow[4] == "yes"
    assert re.fullmatch(r"in 4 m (9|10) s \(at \d\d:\d\d:\d\d\)", busy[1]), busy
    # the steps, and what the next success leaves: one step off (2 steps: 1 s × 2^2)
    assert busy[2] == "3 (4.0 s after a success)" and busy[3] == "-" and busy[4] == "yes"
    assert slow[2] == "0" and idle[2] == "0"  # negative control: no steps, nothing after a success
    assert re.fullmatch(r"429, Retry-After 250 s, 1\d\.\d s ago", busy[6]), busy
    assert slow[6] == "-" and idle[6] == "-"  # negative control: hosts that never throttled


def test_hosts_and_show_say_what_a_retry_after_run_leaves_after_a_success(table):
    """docs/spec.md §2, "Retry-After sets the scale": 9 steps built by 429s that all carried Retry-After 3 s —
    the next success leaves 3 s, not the 256 s of 8 steps; ``show`` names the scale."""
    state = HostState(next_allowed=table.now + 3, consec=9, ok_seen=True, throttled_at=table.now, updated=table.now,
                      run_retry_after=3.0)
    table.store.update("ra.example", lambda old, now: (state, None))
    rows = {r[0]: r for r in lines_of(table.run("hosts").out.split("\n", 1)[1])}
    assert rows["ra.example"][2] == "9 (3.0 s after a success)"
    assert rows["busy.example"][2] == "3 (4.0 s after a success)"  # negative control: no Retry-After run
    shown = table.run("show", "ra.example").out
    assert re.search(r"^  Retry-After scale\s+3 s \(the largest Retry-After of this run", shown, re.M), shown
    assert "Retry-After scale" not in table.run("show", "busy.example").out
    data = {h["host"]: h for h in json.loads(table.run("hosts", "--json").out)["hosts"]}
    assert (data["ra.example"]["after_success"], data["ra.example"]["retry_after_scale"]) == (3.0, 3.0)


def test_hosts_throttled_only_lists_hosts_with_backoff_steps(table):
    result = table.run("hosts", "--throttled")
    assert result.code == EXIT_OK, result.err
    rows = lines_of(result.out.split("\n", 1)[1])
    assert [r[0] for r in rows[1:-1]] == ["busy.example"]
    assert "1 throttled host (backoff steps > 0)" in result.out


def test_hosts_json_has_the_columns_as_keys(table):
    result = table.run("hosts", "--json")
    assert result.code == EXIT_OK, result.err
    data = json.loads(result.out)
    assert data["store"] == table.store.uri and data["address_rows"] == 1
    hosts = {h["host"]: h for h in data["hosts"]}
    assert list(hosts) == ["idle.example", "slow.example", "busy.example"]
    busy = hosts["busy.example"]
    assert set(busy) == {"host", "next_allowed", "next_allowed_at", "next_allowed_in", "backoff_steps", "crawl_delay",
                         "origin_delays",
                         "after_success", "retry_after_scale", "2xx_seen", "updated", "updated_at",
                         "ratelimit_interval", "ratelimit_until", "ratelimit_until_at", "latency", "strain",
                         "quota_left", "quota_reset", "quota_reset_at", "quota_limit", "quota_window", "booked",
                         "quota_serial", "last_throttle"}
    assert set(busy) >= {c.lower().replace(" ", "_").replace("-", "_") for c in HOST_COLUMNS}
    assert busy["next_allowed"] == pytest.approx(table.now + 250) and 240 < busy["next_allowed_in"] <= 250
    assert busy["backoff_steps"] == 3 and busy["crawl_delay"] is None and busy["2xx_seen"] is True
    assert busy["after_success"] == 4.0 and busy["retry_after_scale"] is None
    assert hosts["slow.example"]["after_success"] is None  # negative control: no steps
    assert busy["last_throttle"]["cause"] == "429" and busy["last_throttle"]["retry_after"] == 250.0
    assert busy["next_allowed_at"].startswith(time.strftime("%Y-", time.localtime(table.now + 250)))
    assert hosts["slow.example"]["crawl_delay"] == 7.0 and hosts["slow.example"]["last_throttle"] is None
    assert hosts["idle.example"]["next_allowed_in"] == 0.0


def test_hosts_finds_the_last_throttle_of_many_hosts_in_one_pass():
    store = MemoryStore()
    now = store.now()
    for i in range(30):  # more than the command looks up one by one
        host = f"h{i}.example"
        state = HostState(next_allowed=now + 60, consec=1, throttled_at=now - 5 - i, updated=now - 5 - i)
        store.update(host, lambda old, now_, s=state: (s, None))
        store.append_events([Event(now - 8 - i, "backoff", host, status=429, reason="429", retry_after=2.0),
                             Event(now - 5 - i, "backoff", host, status=503, reason="503"),  # the last one
                             Event(now - 1, "backoff", "other.example", status=429, reason="429")])
    out = io.StringIO()
    assert run_command(["hosts", "--json"], store=store, out=out, err=io.StringIO()) == EXIT_OK
    hosts = json.loads(out.getvalue())["hosts"]
    assert len(hosts) == 30 and {h["last_throttle"]["cause"] for h in hosts} == {"503"}


def test_hosts_of_an_empty_table(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    assert run_command(["hosts"], store=MemoryStore(), out=out, err=err) == EXIT_OK
    assert "0 hosts, 0 address rows" in out.getvalue() and "host" not in out.getvalue().split("\n", 1)[1]
    out = io.StringIO()
    assert run_command(["hosts", "--json"], store=MemoryStore(), out=out, err=err) == EXIT_OK
    assert json.loads(out.getvalue())["hosts"] == []


# --------------------------------------------------------------------------------------------------
# show


def test_show_a_host_its_address_rows_and_its_recent_events(table):
    result = table.run("show", "busy.example")
    assert result.code == EXIT_OK, result.err
    text = result.out
    assert text.startswith("busy.example in the pace table")
    fields = dict(re.findall(r"^  (next allowed|backoff steps|Crawl-delay|2xx seen|updated|last throttle)\s{2,}(.*)$",
                             text, re.M))
    assert set(fields) == set(HOST_COLUMNS[1:])
    assert fields["backoff steps"] == "3 (4.0 s after a success)" and fields["2xx seen"] == "yes"
    assert fields["Crawl-delay"] == "-" and fields["last throttle"].startswith("429, Retry-After 250 s")
    assert "  to forgive a host (forget its backoff steps and hold; its Crawl-delay stays): " \
           "scrapy polite reset busy.example" in text
    addresses = text.split("address rows")[1].split("recent events")[0]
    assert "ip:192.0.2.7" in addresses
    events = text.split("recent events")[1]
    assert "429, Retry-After 250 s: delay chosen 250.0 s, a throttle, backoff steps 3" in events
    assert "backoff step 3 (429): 250.0 s (Retry-After)" in events
    assert "deferred (throttled) for 259.0 s" in events and "booked on 192.0.2.7" in events
    assert "robots.txt" not in events  # negative control: another host's event


def test_a_host_with_a_request_in_flight_is_not_allowed_now(table):
    """Trial: after a crawl was killed mid-download, ``hosts`` and ``show`` said ``now`` for a host its hold kept from
    every crawl for 20 s more. The cell says it waits for the answer, and until when at the latest. The control: the
    same row once the hold has ended is "now"."""
    now = table.now
    held = HostState(next_allowed=now - 1, ok_seen=True, updated=now - 2, held_until=now + 20, held_by=7)
    table.store.update("held.example", lambda old, now_: (held, None))
    text = table.run("show", "held.example").out
    assert re.search(r"^  next allowed\s{2,}one interval after the answer in flight \(at the latest in (20\.0|19\.\d) s", text,
                     re.M), text
    listed = [line for line in table.run("hosts").out.splitlines() if line.startswith("held.example")]
    assert len(listed) == 1 and "one interval after the answer in flight" in listed[0], listed
    ended = dataclasses.replace(held, held_until=now - 0.5)
    table.store.update("held.example", lambda old, now_: (ended, None))
    assert re.search(r"^  next allowed\s{2,}now$", table.run("show", "held.example").out, re.M)


def test_show_takes_a_url_or_an_address_row_and_limits_the_events(table):
    by_url = table.run("show", "HTTPS://Busy.Example.:8443/some/page?q=1", "--events", "2")
    assert by_url.code == EXIT_OK, by_url.err
    assert by_url.out.startswith("busy.example in the pace table")
    events = by_url.out.split("recent events")[1]
    assert "(the latest 2)" in events and "booked" not in events and "deferred" in events
    address = table.run("show", "ip:192.0.2.7")
    assert address.code == EXIT_OK, address.err
    assert address.out.startswith("ip:192.0.2.7 in the pace table")
    assert re.search(r"^  next allowed\s+", address.out, re.M) and "address rows" not in address.out
    # An address row has a pace and nothing of a host's own (backoff, Crawl-delay, 2xx seen); a host's has them.
    assert not re.search(r"^  (backoff steps|Crawl-delay|2xx seen|last throttle) ", address.out, re.M), address.out
    assert re.search(r"^  backoff steps\s+", by_url.out, re.M) and re.search(r"^  2xx seen\s+", by_url.out, re.M)
    assert "recent bookings on this address" in address.out and "http://busy.example/p/3" in address.out


def test_show_json(table):
    result = table.run("show", "busy.example", "--json")
    assert result.code == EXIT_OK, result.err
    data = json.loads(result.out)
    assert data["host"] == "busy.example" and data["row"]["backoff_steps"] == 3
    assert [a["address"] for a in data["addresses"]] == ["ip:192.0.2.7"]
    kinds = [e["kind"] for e in data["events"]]
    assert kinds == ["booking", "response", "backoff", "deferral"]
    response = data["events"][1]
    assert response["status"] == 429 and response["retry_after"] == 250.0 and response["delay"] == 250.0
    assert response["url"] == "http://busy.example/p/3" and response["what"].startswith("429")
    slow = json.loads(table.run("show", "slow.example", "--json").out)
    assert slow["row"]["crawl_delay"] == 7.0 and [e["kind"] for e in slow["events"]] == ["robots_delay"]


def test_show_names_an_announced_quota(table):
    now = table.now
    quota = HostState(next_allowed=now + 12, ok_seen=True, updated=now - 1, ratelimit_interval=0.6,
                      ratelimit_until=now + 12)
    table.store.update("quota.example", lambda old, now_: (quota, None))
    text = table.run("show", "quota.example").out
    assert re.search(r"^  rate limit\s{2,}1 request per 0\.6 s$", text, re.M), text
    assert re.search(r"^  quota spent\s{2,}until in 1\d(\.\d)? s \(at ", text, re.M), text
    assert "ratelimit" not in text, text  # the row's field names are not shown raw
    data = json.loads(table.run("show", "quota.example", "--json").out)
    assert data["row"]["ratelimit_interval"] == 0.6 and data["row"]["ratelimit_until"] == pytest.approx(now + 12)
    assert data["row"]["ratelimit_until_at"]
    # a hold whose reset has passed is not shown as spent; the interval stays
    passed = HostState(next_allowed=now - 50, ok_seen=True, updated=now - 60, ratelimit_interval=0.6,
                       ratelimit_until=now - 50)
    table.store.update("reset.example", lambda old, now_: (passed, None))
    text = table.run("show", "reset.example").out
    assert "quota spent" not in text and "1 request per 0.6 s" in text, text
    # negative control: a host without an announced quota has no quota lines
    busy = table.run("show", "busy.example").out
    assert "rate limit" not in busy and "quota spent" not in busy
    assert json.loads(table.run("show", "busy.example", "--json").out)["row"]["ratelimit_interval"] is None


def test_show_errors(table):
    missing = table.run("show", "nowhere.example")
    assert missing.code == EXIT_NO_HOST and "nowhere.example: not in the pace table" in missing.err
    assert missing.out == ""
    for argv in (["show"], ["show", "a.example", "b.example"], ["show", "http:///nohost"], ["show", "ip:nope"],
                 ["show", "busy.example", "--throttled"], ["show", "busy.example", "--events", "-1"]):
        result = table.run(*argv)
        assert result.code == EXIT_USAGE, (argv, result)
        usage, error = result.err.splitlines()  # argparse's convention: the verb's usage line, then the error
        assert usage.startswith("usage: scrapy polite show ") and error.startswith("scrapy polite show: error: ")


# --------------------------------------------------------------------------------------------------
# reset


def test_reset_forgets_the_backoff_and_keeps_the_crawl_delay(table):
    table.store.update("busy.example", lambda s, now: (HostState(**{**s.__dict__, "crawl_delay": 2.0}), None))
    result = table.run("reset", "busy.example")
    assert result.code == EXIT_OK, result.err
    assert result.out.startswith("busy.example: reset; forgot next allowed in 4 m")
    assert "3 backoff steps" in result.out and "2xx seen" in result.out and "last throttle" in result.out
    assert "kept Crawl-delay 2 s, its address rows and its events" in result.out
    state = table.state("busy.example")
    assert state.consec == 0 and state.next_allowed == 0.0 and not state.ok_seen and state.throttled_at == 0.0
    assert state.crawl_delay == 2.0  # the host's number is not ours to forget (docs/spec.md §2)
    assert table.state("ip:192.0.2.7") is not None  # address rows are kept
    events = table.store.events(host="busy.example")
    assert events[-1].kind == "operator" and events[-1].reason == "reset" and events[-1].steps == 3
    assert len(events) == 5  # and the history is kept
    again = table.run("reset", "busy.example")
    assert again.code == EXIT_OK and "forgot nothing (it was clear); kept Crawl-delay 2 s, its address rows" in again.out
    # A next allowed moment already passed held nothing: not among what a reset forgot (the user trial read
    # "forgot next allowed now"); one backoff step in the singular.
    passed = HostState(next_allowed=table.now - 5, consec=1, updated=table.now - 6)
    table.store.update("passed.example", lambda s, now: (passed, None))
    result = table.run("reset", "passed.example")
    assert result.out.startswith("passed.example: reset; forgot 1 backoff step; kept "), result.out


def test_reset_of_a_missing_host_is_exit_1_and_creates_no_row(table):
    result = table.run("reset", "SLOW.example.", "missing.example")
    assert result.code == EXIT_NO_HOST
    assert "slow.example: reset" in result.out
    assert "missing.example: not in the pace table" in result.err
    assert table.state("missing.example") is None  # a reset never creates a row
    assert table.state("slow.example").crawl_delay == 7.0
    data = json.loads(table.run("reset", "slow.example", "--json").out)
    assert data["results"][0]["reset"] is True and "Crawl-delay 7 s" in data["results"][0]["kept"]
    assert table.run("reset").code == EXIT_USAGE
    assert table.run("reset", "a.example", "--clear").code == EXIT_USAGE


# --------------------------------------------------------------------------------------------------
# crawl-delay


def test_crawl_delay_sets_and_clears(table):
    result = table.run("crawl-delay", "slow.example", "2.5")
    assert result.code == EXIT_OK, result.err
    assert result.out.startswith("slow.example: Crawl-delay 2.5 s (was 7 s)") and "robots.txt" in result.out
    assert table.state("slow.example").crawl_delay == 2.5
    assert table.state("slow.example").next_allowed == pytest.approx(table.now + 5)  # nothing else changes
    cleared = table.run("crawl-delay", "slow.example", "--clear", "--json")
    assert cleared.code == EXIT_OK, cleared.err
    assert json.loads(cleared.out) == {"store": table.store.uri, "host": "slow.example", "crawl_delay": None,
                                       "was": 2.5}
    assert table.state("slow.example").crawl_delay == 0.0
    created = table.run("crawl-delay", "new.example", "3")
    assert created.code == EXIT_OK and table.state("new.example").crawl_delay == 3.0
    reasons = [e.reason for e in table.store.events() if e.kind == "operator"]
    assert reasons == ["crawl-delay 2.5 s", "crawl-delay cleared", "crawl-delay 3 s"]


def test_crawl_delay_over_published_delays_holds_then_clear_falls_back_to_the_largest(table):
    """A new-user trial: the operator's delay is one more entry, so ``--clear`` (or the next robots.txt read) falls
    back to the largest delay the host's origins publish, not to none; a delay set holds the host from the command
    on, and the output says when and how to forget that. Negative control: a host whose origins published nothing
    clears to none."""
    published = PacingPolicy().robots_delay_update(None, 4, now=table.now, entry="https://pub.example bot/1")
    table.store.update("pub.example", lambda s, now: (published, None))
    raised = table.run("crawl-delay", "pub.example", "60")
    assert raised.code == EXIT_OK, raised.err
    assert "next allowed in 1 m" in raised.out and "scrapy polite reset pub.example" in raised.out, raised.out
    assert table.state("pub.example").next_allowed >= table.now + 59
    cleared = table.run("crawl-delay", "pub.example", "--clear")
    assert cleared.code == EXIT_OK, cleared.err
    assert "the host's Crawl-delay is now 4 s, the largest its origins' robots.txt publish" in cleared.out
    assert table.state("pub.example").crawl_delay == 4.0
    events = [(e.reason, e.delay) for e in table.store.events() if e.kind == "operator" and e.host == "pub.example"]
    assert events == [("crawl-delay 60 s", 60.0), ("crawl-delay cleared", 4.0)]  # the delay in force, for the audit
    table.run("crawl-delay", "slow.example", "--clear")
    assert table.state("slow.example").crawl_delay == 0.0


def test_crawl_delay_errors(table):
    missing = table.run("crawl-delay", "missing.example", "--clear")
    assert missing.code == EXIT_NO_HOST and "missing.example" in missing.err
    assert table.state("missing.example") is None
    for argv in (["crawl-delay", "slow.example", "-1"], ["crawl-delay", "slow.example", "abc"],
                 ["crawl-delay", "slow.example", "inf"], ["crawl-delay", "slow.example"], ["crawl-delay"],
                 ["crawl-delay", "slow.example", "3", "--clear"], ["crawl-delay", "slow.example", "3", "4"]):
        result = table.run(*argv)
        assert result.code == EXIT_USAGE, (argv, result)
    assert table.state("slow.example").crawl_delay == 7.0  # none of them changed anything


# --------------------------------------------------------------------------------------------------
# expire


def test_expire_removes_idle_rows(table):
    result = table.run("expire")
    assert result.code == EXIT_OK, result.err
    assert result.out.startswith(f"expired 1 row from {table.store.uri} (idle longer than POLITE_STORE_EXPIRE")
    assert table.state("idle.example") is None and table.state("busy.example") is not None
    again = table.run("expire", "--json")
    assert json.loads(again.out)["expired"] == 0  # negative control: nothing left to expire
    done = HostState(next_allowed=table.now - 2, updated=table.now - 3)
    table.store.update("done.example", lambda old, now: (done, None))
    shorter = table.run("expire", settings={"POLITE_STORE_EXPIRE": 0.5})
    assert shorter.code == EXIT_OK and "expired 1 row" in shorter.out  # held rows (due later) are kept
    assert table.state("done.example") is None and table.state("ip:192.0.2.7") is not None
    assert table.run("expire", "busy.example").code == EXIT_USAGE


# --------------------------------------------------------------------------------------------------
# timeline (its picture is tested in test_timeline.py)


def test_timeline_writes_html(table, tmp_path):
    out = tmp_path / "t.html"
    result = table.run("timeline", "-o", str(out))
    assert result.code == EXIT_OK, result.err
    assert str(out) in result.out and "5 events, 2 hosts" in result.out
    document = out.read_text(encoding="utf-8")
    assert set(re.findall(r'data-host="([^"]*)"', document)) == {"busy.example", "slow.example"}
    only = table.run("timeline", "--host", "slow.example", "--since", "1m", "-o", str(out), "--json")
    assert only.code == EXIT_OK and json.loads(only.out)["hosts"] == ["slow.example"]
    one = table.run("timeline", "--host", "slow.example", "-o", str(out))
    assert one.code == EXIT_OK and re.search(r" events?, 1 host \(", one.out), one.out  # (not "1 hosts")
    nothing = table.run("timeline", "--since", "5s", "--host", "busy.example", "-o", str(tmp_path / "n.html"))
    assert nothing.code == EXIT_NO_HOST and not (tmp_path / "n.html").exists()
    assert table.run("timeline", "--since", "yesterday-ish").code == EXIT_USAGE
    assert table.run("timeline", "busy.example").code == EXIT_USAGE
    unwritable = table.run("timeline", "-o", str(tmp_path / "no" / "such" / "dir" / "t.html"))
    assert unwritable.code == 4 and "cannot write" in unwritable.err


def test_parse_since():
    now = 1_800_000_000.0
    assert parse_since("90", now) == now - 90
    assert parse_since("90s", now) == now - 90
    assert parse_since("15m", now) == now - 900
    assert parse_since("2h", now) == now - 7200
    assert parse_since("1d", now) == now - 86400
    assert parse_since("1h30m", now) == now - 5400
    assert parse_since("@1700000000.5", now) == 1700000000.5
    local = time.mktime((2026, 5, 1, 12, 0, 0, 0, 0, -1))
    assert parse_since("2026-05-01T12:00", now) == local
    assert parse_since("2026-05-01 12:00:00", now) == local
    for bad in ("", "soon", "5x", "@", "@nan", "-5m", "2026-13-01"):
        with pytest.raises(Exception, match="--since"):
            parse_since(bad, now)


# --------------------------------------------------------------------------------------------------
# usage and unusable stores


def test_usage_errors_are_exit_2(table):
    for argv in ([], ["frobnicate"], ["hosts", "--bogus"], ["hosts", "busy.example"], ["hosts", "--clear"],
                 ["expire", "--since", "1h"], ["hosts", "--host", "a.example"], ["hosts", "-o", "x.html"]):
        result = table.run(*argv)
        assert result.code == EXIT_USAGE, (argv, result)
    bad_setting = table.run("hosts", settings={"POLITE_HOST_INTERVAL": -1})
    assert bad_setting.code == EXIT_USAGE and "POLITE_HOST_INTERVAL" in bad_setting.err


def test_unusable_stores_are_exit_3(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "corrupt.sqlite3").write_bytes(b"this is not a database" * 100)
    for uri in (f"sqlite:///{tmp_path}/file/pace.sqlite3", f"sqlite:///{tmp_path}/missing.sqlite3",
                f"sqlite:///{tmp_path}/corrupt.sqlite3", "nosuch://x"):
        out, err = io.StringIO(), io.StringIO()
        code = run_command(["hosts", "--store", uri], out=out, err=err)
        assert code == EXIT_STORE, (uri, err.getvalue())
        assert "Fix" in err.getvalue() and out.getvalue() == ""
    assert not (tmp_path / "missing.sqlite3").exists()  # a look never creates a table


def test_a_store_uri_it_cannot_use_is_exit_3_however_it_is_given_as_the_pages_say():
    """Trial: docs/reference/settings-forms.md said `scrapy polite` exits 2 for any invalid setting, but a
    POLITE_STORE it cannot use (given with -s or --store) is 3, "the store is unusable", as the command's own
    statuses say; the pages say so now. The control: an invalid value of another setting is 2."""
    for argv in (["-s", "POLITE_STORE=ftp://x"], ["--store", "ftp://x"], ["-s", "POLITE_STORE=sqlite://"]):
        err = io.StringIO()
        assert run_command(["hosts", *argv], err=err) == EXIT_STORE, (argv, err.getvalue())
        assert "POLITE_STORE '" in err.getvalue() and "Fix: " in err.getvalue()
    assert run_command(["hosts", "-s", "POLITE_EVENT_LOG_SIZE=0"], err=io.StringIO()) == EXIT_USAGE
    forms = " ".join(re.sub(r"\{[a-z:]+\}`", "`", (ROOT / "docs/reference/settings-forms.md").read_text()).split())
    assert (f"`scrapy polite` exits with status {EXIT_USAGE} for the same mistake, and with status {EXIT_STORE} for a "
            "`POLITE_STORE` it cannot use") in forms
    assert "a store URI of an unknown scheme or naming no file" in STATUSES["EXIT_STORE"].meaning


def test_a_database_of_another_application_is_exit_3_and_left_untouched(tmp_path):
    """Trial: ``hosts --store`` on another application's SQLite file exited 0 and added the pace table's tables to
    it. Every verb refuses it (a look never creates a table); the control: the verbs work on a pace table that
    another application added a table to."""
    other = tmp_path / "app.sqlite3"
    before = write_sqlite_file(other, "CREATE TABLE t(a)")
    for argv in (["hosts"], ["audit"], ["expire"], ["crawl-delay", "a.example", "3"]):
        out, err = io.StringIO(), io.StringIO()
        code = run_command([*argv, "--store", f"sqlite:///{other}"], out=out, err=err)
        assert code == EXIT_STORE, (argv, err.getvalue())
        assert "is not a scrapy-polite pace table" in err.getvalue() and out.getvalue() == ""
    assert other.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["app.sqlite3"]
    pace = tmp_path / "pace.sqlite3"
    SQLiteStore(str(pace)).close()
    write_sqlite_file(pace, "CREATE TABLE t(a)")
    assert run_command(["hosts", "--store", f"sqlite:///{pace}"], out=io.StringIO()) == EXIT_OK


# --------------------------------------------------------------------------------------------------
# The real command line on a SQLite table: every verb, every exit status


def test_the_real_command_line(tmp_path):
    uri = f"sqlite:///{tmp_path}/pace.sqlite3"
    store = SQLiteStore(str(tmp_path / "pace.sqlite3"))
    prepare(store, time.time())
    store.close()

    hosts = cli("hosts", "--store", uri, cwd=tmp_path)
    assert hosts.code == 0, hosts.err
    assert [r[0] for r in lines_of(hosts.out.split("\n", 1)[1])][:-1] == ["host", "idle.example", "slow.example",
                                                                     "busy.example"]
    as_json = cli("hosts", "--throttled", "--json", "--store", uri, cwd=tmp_path)
    assert as_json.code == 0 and [h["host"] for h in json.loads(as_json.out)["hosts"]] == ["busy.example"]
    shown = cli("show", "busy.example", "--store", uri, cwd=tmp_path)
    assert shown.code == 0 and "ip:192.0.2.7" in shown.out and "backoff step 3 (429)" in shown.out
    assert cli("show", "nowhere.example", "--store", uri, cwd=tmp_path).code == 1
    delay = cli("crawl-delay", "slow.example", "4", "--store", uri, cwd=tmp_path)
    assert delay.code == 0, delay.err
    reset = cli("reset", "busy.example", "missing.example", "--store", uri, cwd=tmp_path)
    assert reset.code == 1 and "busy.example: reset" in reset.out and "missing.example" in reset.err
    expired = cli("expire", "--store", uri, cwd=tmp_path)
    assert expired.code == 0 and "expired 1 row" in expired.out
    timeline = cli("timeline", "--store", uri, "-o", str(tmp_path / "t.html"), cwd=tmp_path)
    assert timeline.code == 0 and (tmp_path / "t.html").exists()
    usage = cli("frobnicate", "--store", uri, cwd=tmp_path)
    assert usage.code == 2 and "expected a verb" in usage.err
    bad_seconds = cli("crawl-delay", "slow.example", "-5", "--store", uri, cwd=tmp_path)
    assert bad_seconds.code == 2 and "seconds >= 0" in bad_seconds.err
    bad_setting = cli("hosts", "--store", uri, "-s", "POLITE_EVENT_LOG_SIZE=0", cwd=tmp_path)
    assert bad_setting.code == 2 and "POLITE_EVENT_LOG_SIZE" in bad_setting.err
    (tmp_path / "file").write_text("not a directory")
    unusable = cli("hosts", "--store", f"sqlite:///{tmp_path}/file/pace.sqlite3", cwd=tmp_path)
    assert unusable.code == 3 and "Fix:" in unusable.err

    store = open_store(uri)
    try:
        state = store.get("busy.example")
        assert state.consec == 0 and store.get("slow.example").crawl_delay == 4.0
        assert [e.reason for e in store.events() if e.kind == "operator"] == ["crawl-delay 4 s", "reset"]
        assert store.get("idle.example") is None
    finally:
        store.close()


# --------------------------------------------------------------------------------------------------
# The verbs are argparse sub-commands: their help, their usage errors, the global options on either side


def verb_lines(text: str) -> dict[str, str]:
    """The verb lines of ``scrapy polite --help`` (``  VERB  words``)."""
    return {m[1]: m[2] for m in re.finditer(r"^  ([a-z-]+) {2,}(\S.*)$", text, re.M) if m[1] in VERBS}


def guide_verb_lines() -> dict[str, str]:
    """The verbs and their comments in the operating guide's command block (``scrapy polite VERB ...  # words``;
    docs/guides/operating.md)."""
    text = (ROOT / "docs" / "guides" / "operating.md").read_text(encoding="utf-8")
    block = text.split("## The operator command\n\n```sh\n", 1)[1].split("```", 1)[0]
    return {m[1]: m[2] for m in re.finditer(r"^scrapy polite ([a-z-]+) .*?  # (.*)$", block, re.M) if m[1] in VERBS}


def test_help_lists_every_verb_in_the_guide_s_words(tmp_path):
    missing = f"sqlite:///{tmp_path}/missing.sqlite3"
    for argv in (["--help"], ["-h"], ["--store", missing, "--help"], ["-s", "POLITE_ENABLED=1", "-h"]):
        out, err = io.StringIO(), io.StringIO()
        assert run_command(argv, out=out, err=err) == EXIT_OK, (argv, err.getvalue())
        text = out.getvalue()
        assert text.startswith("usage: scrapy polite ") and err.getvalue() == ""
        assert verb_lines(text) == VERB_HELP, text  # every verb, one line each, in VERB_HELP's words
        assert "--store URI" in text and "-s NAME=VALUE" in text and "exit status:" in text
    assert list(VERB_HELP) == list(VERBS)
    assert guide_verb_lines() == VERB_HELP  # the operating guide's command block says the same, word for word
    assert not (tmp_path / "missing.sqlite3").exists()  # help opens no store


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_has_its_own_help(verb, tmp_path):
    missing = f"sqlite:///{tmp_path}/missing.sqlite3"
    texts = []
    for argv in ([verb, "--help"], [verb, "-h", "--store", missing], ["--help", verb], ["-s", "A=1", verb, "-h"]):
        out, err = io.StringIO(), io.StringIO()
        assert run_command(argv, out=out, err=err) == EXIT_OK, (argv, err.getvalue())
        texts.append(out.getvalue())
    assert len(set(texts)) == 1  # -h before or after the verb: the same help
    text = texts[0]
    assert text.startswith(f"usage: scrapy polite {verb} [-h]"), text
    assert VERB_HELP[verb][1:] in text.split("\n\n")[1]
    flags = set(re.findall(r"(?<![\w-])--[a-z-]+", text.split("\n\n", 1)[1].split("Before or after")[0]))
    own = {"--help", *(f for f in ("--json", "--throttled", "--events", "--clear", "--since", "--host", "--output",
                                   "--format") if f in text.split("\n\n")[0].replace("-o PATH", "--output"))}
    assert flags == own, (verb, flags)  # its own options, none of another verb's
    assert "--store URI" in text and "exit status: " in text
    assert not (tmp_path / "missing.sqlite3").exists()


USAGE_ERRORS = [
    ([], "scrapy polite", "expected a verb: hosts, show, reset, crawl-delay, expire, timeline, audit"),
    (["frobnicate"], "scrapy polite", "expected a verb: hosts, show, reset, crawl-delay, expire, timeline, audit "
                                      "(got 'frobnicate')"),
    (["--json", "hosts"], "scrapy polite", "--json is an option of hosts, show, reset, crawl-delay, expire, "
                                           "timeline, audit: it goes after the verb (scrapy polite hosts --json)"),
    (["--bogus", "hosts"], "scrapy polite", "unknown option --bogus; expected a verb"),
    (["hosts", "--bogus"], "scrapy polite hosts", "unrecognized arguments: --bogus"),
    (["hosts", "--clear"], "scrapy polite hosts", "--clear does not apply to `hosts` (it is an option of crawl-delay)"),
    (["expire", "--since", "1h"], "scrapy polite expire", "--since does not apply to `expire` (it is an option of "
                                                          "timeline, audit)"),
    (["hosts", "busy.example"], "scrapy polite hosts", "hosts takes no HOST (got busy.example)"),
    (["show"], "scrapy polite show", "the following arguments are required: HOST_OR_URL"),
    (["show", "a.example", "b.example"], "scrapy polite show", "show takes one HOST_OR_URL (got b.example too)"),
    (["show", "http:///nohost"], "scrapy polite show", "argument HOST_OR_URL: 'http:///nohost' is not a host name"),
    (["show", "a.example", "--events", "-1"], "scrapy polite show", "argument --events: expected a whole number >= 0"),
    (["reset"], "scrapy polite reset", "the following arguments are required: HOST_OR_URL"),
    (["crawl-delay", "a.example"], "scrapy polite crawl-delay", "crawl-delay takes HOST SECONDS, or HOST --clear"),
    (["crawl-delay", "a.example", "3", "--clear"], "scrapy polite crawl-delay", "crawl-delay takes HOST SECONDS, or "
                                                                                "HOST --clear"),
    (["crawl-delay", "a.example", "-inf"], "scrapy polite crawl-delay", "argument SECONDS: expected a number of "
                                                                        "seconds >= 0, got '-inf'"),
    (["timeline", "--format", "png"], "scrapy polite timeline", "argument --format: invalid choice: 'png'"),
    (["timeline", "-o", "t.png"], "scrapy polite timeline", "t.png: the timeline is drawn as SVG or HTML, not PNG. "
                                                          "Fix: -o t.svg"),
    (["timeline", "--since", "soon"], "scrapy polite timeline", "argument --since: --since 'soon'"),
    (["audit", "a.example"], "scrapy polite audit", "audit takes no positional argument (got a.example)"),
    (["hosts", "-s", "NOEQUALS"], "scrapy polite", "Invalid -s value, use -s NAME=VALUE"),
    (["hosts", "-s", "POLITE_HOSTINTERVAL=1"], "scrapy polite hosts", "POLITE_HOSTINTERVAL is not a scrapy-polite "
                                                                      "setting (did you mean POLITE_HOST_INTERVAL?)"),
    (["audit", "--set", "POLITE_EVENTLOG_SIZE=9"], "scrapy polite audit", "POLITE_EVENTLOG_SIZE is not a scrapy-polite "
                                                                          "setting (did you mean POLITE_EVENT_LOG_SIZE?)"),
    (["hosts", "--store"], "scrapy polite", "argument --store: expected one argument"),
]


@pytest.mark.parametrize(("argv", "prog", "message"), USAGE_ERRORS, ids=[" ".join(a) or "-" for a, _, _ in USAGE_ERRORS])
def test_usage_errors_print_the_usage_line_and_exit_2_before_any_store(argv, prog, message, tmp_path):
    missing = f"sqlite:///{tmp_path}/missing.sqlite3"
    out, err = io.StringIO(), io.StringIO()
    code = run_command([*argv, "--store", missing] if "--store" not in argv else argv, out=out, err=err)
    assert code == EXIT_USAGE, (argv, err.getvalue())
    usage, *_, error = err.getvalue().splitlines()  # the usage (timeline's takes two lines), then the error
    assert usage.startswith(f"usage: {prog} "), usage
    assert error.startswith(f"{prog}: error: {message}"), error
    assert out.getvalue() == "" and "Traceback" not in err.getvalue()
    assert not (tmp_path / "missing.sqlite3").exists()  # refused before the store (a missing one would be exit 3)


def test_a_good_command_line_on_a_missing_store_is_exit_3(tmp_path):
    """Negative control of the test above: the same missing store gets past the arguments and fails on itself."""
    err = io.StringIO()
    assert run_command(["show", "a.example", "--store", f"sqlite:///{tmp_path}/missing.sqlite3"], err=err) == EXIT_STORE
    for setting in ("POLITE_HOST_INTERVAL=1", "POLITE_EVENT_LOG_SIZE=9"):  # the settings spelt right
        assert run_command(["audit", "-s", setting, "--store", f"sqlite:///{tmp_path}/missing.sqlite3"],
                           err=io.StringIO()) == EXIT_STORE
    assert "no pace table" in err.getvalue()
    assert "Fix: check the path of --store" in err.getvalue()  # (it was given: not "pass --store URI")


def test_global_options_work_before_and_after_the_verb(tmp_path):
    table = Table("sqlite", tmp_path)
    table.close()
    say = "idle longer than POLITE_STORE_EXPIRE = 12.0 s"
    for argv in (["-s", "POLITE_STORE_EXPIRE=12", "--store", table.uri, "expire"],
                 ["expire", "--set", "POLITE_STORE_EXPIRE=12", "--store", table.uri],
                 ["--store", table.uri, "expire", "-s", "POLITE_STORE_EXPIRE=12", "--json"],
                 ["--set=POLITE_STORE_EXPIRE=12", "expire", f"--store={table.uri}"]):
        out, err = io.StringIO(), io.StringIO()
        assert run_command(argv, out=out, err=err) == EXIT_OK, (argv, err.getvalue())
        assert say in out.getvalue() or json.loads(out.getvalue())["idle_longer_than"] == 12.0, (argv, out.getvalue())
    out = io.StringIO()
    assert run_command(["expire", "--store", table.uri], out=out) == EXIT_OK
    assert say not in out.getvalue()  # negative control: without -s, the default
    for argv in (["-s", "POLITE_EVENT_LOG_SIZE=0", "hosts", "--store", table.uri],
                 ["hosts", "--store", table.uri, "-s", "POLITE_EVENT_LOG_SIZE=0"]):
        err = io.StringIO()
        assert run_command(argv, err=err) == EXIT_USAGE and "POLITE_EVENT_LOG_SIZE" in err.getvalue()


def test_settings_given_to_run_command_are_not_changed(table):
    settings = Settings({"POLITE_STORE_EXPIRE": 99})
    assert table.run("expire", "-s", "POLITE_STORE_EXPIRE=12", settings=settings).code == EXIT_OK
    assert settings.getfloat("POLITE_STORE_EXPIRE") == 99


def test_reset_takes_its_options_between_its_hosts(table):
    result = table.run("reset", "busy.example", "--json", "slow.example")
    assert result.code == EXIT_OK, result.err
    assert [r["host"] for r in json.loads(result.out)["results"]] == ["busy.example", "slow.example"]


def test_the_real_command_line_help_and_options_on_either_side_of_the_verb(tmp_path):
    uri = f"sqlite:///{tmp_path}/pace.sqlite3"
    store = SQLiteStore(str(tmp_path / "pace.sqlite3"))
    prepare(store, time.time())
    store.close()
    top = cli("--help", cwd=tmp_path)
    assert top.code == 0 and verb_lines(top.out) == VERB_HELP, top.out + top.err
    verb = cli("-h", "show", cwd=tmp_path)
    assert verb.code == 0 and verb.out.startswith("usage: scrapy polite show [-h] [--events N] [--json] HOST_OR_URL")
    before = cli("-s", "POLITE_STORE_EXPIRE=12", "--store", uri, "hosts", "--json", cwd=tmp_path)
    after = cli("hosts", "--json", "--store", uri, "-s", "POLITE_EVENT_LOG_SIZE=0", cwd=tmp_path)
    assert before.code == 0 and json.loads(before.out)["address_rows"] == 1, before.err
    assert after.code == 2 and "POLITE_EVENT_LOG_SIZE" in after.err  # -s after the verb is applied too
    wrong = cli("hosts", "--clear", "--store", uri, cwd=tmp_path)
    assert wrong.code == 2 and wrong.err.splitlines() == [
        "usage: scrapy polite hosts [-h] [--throttled] [--json]",
        "scrapy polite hosts: error: --clear does not apply to `hosts` (it is an option of crawl-delay)"]


# --------------------------------------------------------------------------------------------------
# Issue 30, finding 6


def past_the_step_cap(store, now: float, host: str = "capped.example", runs: int = 48) -> None:
    """A host at its step cap answering ``429, Retry-After 3 s`` ``runs`` times: throttles past the cap take no
    step, so the crawl writes their responses (``throttle_counted_before``) and no ``backoff`` event; the last
    backoff step was long before."""
    state = HostState(next_allowed=now + 3, consec=9, ok_seen=True, throttled_at=now - 5, updated=now - 5,
                      run_retry_after=3.0)
    store.update(host, lambda old, now_: (state, None))
    url = f"http://{host}/p"
    events = [Event(now - 900, "backoff", host, url, status=503, delay=256.0, due=now - 644, reason="503", steps=9,
                    source="m:1")]
    for i in range(runs):
        at = now - 5 - 4.0 * (runs - 1 - i)
        events.append(Event(at, "response", host, url, status=429, delay=3.0, due=at + 3, reason="throttle_counted_before",
                            retry_after=3.0, steps=9, source="m:1"))
    store.append_events(events)


def test_the_last_throttle_cause_is_found_past_the_step_cap(table):
    """48 records of "429, Retry-After 3 s" and no backoff event at the last throttle: the cause is the latest
    throttled response, not "not in the event log" (nor the older backoff step's 503)."""
    past_the_step_cap(table.store, table.now)
    shown = table.run("show", "capped.example")
    assert shown.code == EXIT_OK, shown.err
    assert re.search(r"^  last throttle\s{2,}429, Retry-After 3 s, 5\.\d s ago$", shown.out, re.M), shown.out
    listed = table.run("hosts")
    assert re.search(r"429, Retry-After 3 s, 5\.\d s ago", listed.out) and "cause not in the event log" not in listed.out
    data = json.loads(table.run("hosts", "--json").out)
    capped = next(h for h in data["hosts"] if h["host"] == "capped.example")
    assert capped["last_throttle"]["cause"] == "429" and capped["last_throttle"]["retry_after"] == 3.0
    # Negative controls: an answer that was not a throttle is no cause, and a log without the throttle says so.
    table.store.update("quiet.example", lambda old, now_: (HostState(consec=1, throttled_at=table.now - 5,
                                                                     updated=table.now - 5), None))
    table.store.append_events([Event(table.now - 5, "response", "quiet.example", status=200, delay=1.0,
                                     source="m:1")])
    quiet = table.run("show", "quiet.example").out
    assert re.search(r"^  last throttle\s{2,}5\.\d s ago \(cause not in the event log\)$", quiet, re.M), quiet
    # A throttle of the last 2 s: its process may not have written its events yet, and the words say so.
    table.store.update("recent.example", lambda old, now_: (HostState(consec=1, throttled_at=table.now - 0.5,
                                                                      updated=table.now - 0.5), None))
    recent = table.run("show", "recent.example").out
    assert re.search(r"^  last throttle\s{2,}0\.\d s ago \(cause not written to the event log yet\)$", recent,
                     re.M), recent


def test_the_last_throttle_cause_past_the_step_cap_in_one_pass_over_the_log():
    store = MemoryStore()
    now = store.now()
    for i in range(25):  # more hosts than the command looks up one by one
        past_the_step_cap(store, now, host=f"h{i}.example", runs=3)
    out = io.StringIO()
    assert run_command(["hosts", "--json"], store=store, out=out, err=io.StringIO()) == EXIT_OK
    causes = {h["last_throttle"]["cause"] for h in json.loads(out.getvalue())["hosts"]}
    assert causes == {"429"}


class ClosingPipe(io.StringIO):
    """A pipe whose reader goes away (``| head``) after ``keep`` characters: every later write fails as a closed
    pipe does (``BrokenPipeError``)."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.keep = keep

    def write(self, text: str) -> int:
        if self.tell() + len(text) > self.keep:
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)

    def fileno(self) -> int:  # not a file: nothing to point at the null device
        raise io.UnsupportedOperation("fileno")


@pytest.mark.parametrize("argv", [["hosts"], ["hosts", "--json"], ["show", "capped.example", "--events", "100"],
                                  ["show", "capped.example", "--json"]])
def test_a_reader_that_stops_early_ends_the_command_quietly_with_its_own_status(argv):
    """Issue 30 finding 6: ``scrapy polite hosts --json | head``: no BrokenPipeError, and the verb's own status
    (``show`` exited 1, "no such host", when its reader left)."""
    store = MemoryStore()
    now = store.now()
    past_the_step_cap(store, now)
    for i in range(200):
        store.update(f"h{i}.example", lambda old, now_: (HostState(next_allowed=now + 1, updated=now), None))
    err = io.StringIO()
    out = ClosingPipe(keep=80)
    assert run_command(argv, store=store, out=out, err=err) == EXIT_OK
    assert err.getvalue() == "" and 0 < len(out.getvalue()) <= 80
    # Negative control: the whole output, when the reader stays, is longer than what was kept.
    full = io.StringIO()
    assert run_command(argv, store=store, out=full, err=io.StringIO()) == EXIT_OK and len(full.getvalue()) > 80


def test_a_reader_that_stops_early_keeps_the_audit_verdict():
    """The status stays the verb's: an audit that found a violation is 1 whoever reads it (docs/guides/operating.md, "Exit status")."""
    store = MemoryStore()
    now = store.now()
    store.append_events([Event(now - 10, "booking", "a.example", "http://a.example/1", delay=5.0, due=now - 5,
                               address="127.0.0.2", interval=5.0, ip_interval=0.0, source="m:1", seq=0),
                         Event(now - 9, "booking", "a.example", "http://a.example/2", delay=5.0, due=now - 4,
                               address="127.0.0.2", interval=5.0, ip_interval=0.0, source="m:1", seq=1)])
    settings = {"POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"]}
    assert run_command(["audit"], settings, store=store, out=ClosingPipe(keep=20), err=io.StringIO()) == 1


def test_the_real_command_line_into_a_closed_pipe(tmp_path):
    """The real ``scrapy polite hosts --json | head -1`` and ``show HOST | head -1``: exit 0, no traceback."""
    uri = f"sqlite:///{tmp_path}/pace.sqlite3"
    store = SQLiteStore(str(tmp_path / "pace.sqlite3"))
    now = time.time()
    past_the_step_cap(store, now, runs=400)
    rows = {f"h{i}.example": HostState(next_allowed=now + i, updated=now) for i in range(1500)}
    store.update_many(list(rows), lambda states, now_: (rows, None))
    store.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    for argv in (["hosts", "--json"], ["show", "capped.example", "--events", "400"]):
        proc = subprocess.Popen([sys.executable, "-m", "scrapy", "polite", *argv, "--store", uri], cwd=tmp_path,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # the reader goes away, as `head -1` does
        try:
            code = proc.wait(timeout=120)
        finally:
            proc.kill()
        err = proc.stderr.read().decode()
        proc.stderr.close()
        assert first and code == 0 and "Traceback" not in err and "BrokenPipe" not in err, (argv, code, err)


def test_show_says_every_field_in_words(table):
    """Issue 30 finding 6: ``show`` printed "quota left -1", "quota serial", "booked" raw; each field it prints
    is now in words, and the operating guide explains them ("The other fields show prints")."""
    now = table.now
    quota = HostState(next_allowed=now + 2, ok_seen=True, updated=now - 1, ratelimit_interval=0.8, quota_left=2,
                      quota_reset=now + 3, quota_limit=5, quota_window=4.0, quota_serial=14, booked=16,
                      latency=0.123, strain=2, crawl_delay=2.0,
                      origin_delays=json.dumps({"http://quota.example:8080 bot/1": 0.5,
                                                "https://quota.example bot/1": 2.0}))
    table.store.update("quota.example", lambda old, now_: (quota, None))
    text = table.run("show", "quota.example").out
    lines = dict(re.findall(r"^  ([a-zA-Z. -]+?)\s{2,}(.*)$", text, re.M))
    assert lines["quota left"] == "2 requests until its reset"
    assert re.match(r"in (3\.0|2\.9|2\.8) s \(at ", lines["quota reset"]), lines  # in words, whatever the machine's load
    assert lines["quota size"] == "5 requests per 4.0 s"
    assert lines["booked"] == "16 requests (the answer to request 14 counted the quota last, 2 booked since)"
    assert lines["latency"] == "0.123 s (smoothed download time)"
    assert lines["strain"] == "2 (5xx answers and failures not yet earned back)"
    assert lines["robots.txt delays"] == ("https://quota.example 2 s (for bot/1), "
                                          "http://quota.example:8080 0.5 s (for bot/1)")
    assert "origin delays" not in text  # (not by its name: an origin's JSON is no number; the old show raised)
    assert "quota serial" not in text and "quota limit" not in text and "quota window" not in text
    data = json.loads(table.run("show", "quota.example", "--json").out)["row"]
    assert (data["quota_left"], data["quota_limit"], data["quota_window"], data["booked"], data["quota_serial"]) == (
        2, 5, 4.0, 16, 14)
    assert data["origin_delays"] == {"http://quota.example:8080 bot/1": 0.5, "https://quota.example bot/1": 2.0}
    # No quota known (quota_left -1): no quota line at all (the old show printed "quota left  -1").
    plain = HostState(next_allowed=now, ok_seen=True, updated=now - 1, quota_left=-1, booked=3, quota_serial=3)
    table.store.update("plain.example", lambda old, now_: (plain, None))
    text = table.run("show", "plain.example").out
    assert "quota left" not in text and not re.search(r"\s-1$", text, re.M), text
    assert re.search(r"^  booked\s{2,}3 requests$", text, re.M), text  # (no quota: none counted, none to speak of)
    assert "robots.txt delays" not in text  # the control: none published
    # Every line show names is in the operating guide's list of show's lines.
    guide = (ROOT / "docs" / "guides" / "operating.md").read_text(encoding="utf-8")
    for label in ("quota left", "quota reset", "quota size", "booked", "latency", "strain", "rate limit",
                  "quota spent", "Retry-After scale", "in flight", "robots.txt delays"):
        assert f"| `{label}` |" in guide, label
