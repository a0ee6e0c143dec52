"""The example project (example_project/run_demo.py) end to end: two real runs as a user would start them.

The first run starts from an empty pace table (a temporary file, never the developer's .scrapy/), from the
repository root; the second run uses the same table, from inside the project directory, with the table
given through ``POLITE_DEMO_STORE``. Each run writes its results as JSON (``--json``), which the tests
check against what the demo promises: every host crawled completely, the throttling host backed off and
was deferred, the robots host's Crawl-delay adopted and kept, the healthy hosts paced, and the second run
starting from the table the first one left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "example_project"
DEMO = PROJECT / "run_demo.py"

TOLERANCE = 0.05  # seconds: clocks and scheduling

# run_demo.HOSTS, as the tests expect it (checked by test_demo_hosts_are_the_expected_ones).
HOSTS = {"docs.pydoc.test": "healthy", "busy.pydoc.test": "throttling", "strict.pydoc.test": "robots",
         "127.0.0.5": "healthy"}
RETRY_AFTER = 3.0
ROBOTS_CRAWL_DELAY = 3.0  # polite_demo/data/www.hockey-reference.com.robots.txt, group "*"


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 180) -> tuple[str, dict]:
    json_path = args[args.index("--json") + 1]
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    full_env.pop("SCRAPY_SETTINGS_MODULE", None)
    proc = subprocess.run([sys.executable, str(DEMO), *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"run_demo.py exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-5000:]}"
    with open(json_path, encoding="utf-8") as f:
        return proc.stdout, json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two consecutive demo runs sharing one pace table: ``(stdout1, data1, stdout2, data2)``."""
    tmp = tmp_path_factory.mktemp("demo")
    store = tmp / "pace.sqlite3"
    out1, data1 = _run(["--pages", "8", "--store", str(store), "--json", str(tmp / "run1.json")], cwd=ROOT)
    out2, data2 = _run(["--pages", "3", "--json", str(tmp / "run2.json")], cwd=PROJECT,
                       env={"POLITE_DEMO_STORE": str(store)})
    return out1, data1, out2, data2


def _section(stdout: str, title: str) -> str:
    """The lines of ``stdout`` from the one starting with ``title`` to the next blank line."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end])


def _gaps(arrivals: list[dict]) -> list[tuple[str, str, float]]:
    s = sorted(arrivals, key=lambda a: a["start"])
    return [(a["path"], b["path"], b["start"] - a["end"]) for a, b in zip(s, s[1:])]


def test_demo_hosts_are_the_expected_ones():
    sys.path.insert(0, str(PROJECT))
    try:
        import run_demo
    finally:
        sys.path.remove(str(PROJECT))
    assert {name: role for name, (_address, role) in run_demo.HOSTS.items()} == HOSTS
    assert run_demo.RETRY_AFTER == RETRY_AFTER
    from scrapy_polite.policy.robots import parse_robots_delay

    with open(run_demo.ROBOTS_FILE, "rb") as f:
        assert parse_robots_delay(f.read(), "polite-demo/1.0") == ROBOTS_CRAWL_DELAY


def test_first_run_completes_and_prints_every_host(runs):
    out, data, _, _ = runs
    assert data["finish_reason"] == "finished"
    assert "pace table at start" in out
    table = _section(out, "host ")
    for host, role in HOSTS.items():
        assert any(line.split()[:2] == [host, role] for line in table.splitlines()), (host, table)
        result = data["hosts"][host]
        assert result["role"] == role
        assert result["pages_ok"] == result["pages"] == 8, result
    assert "pace table file:" in out


def test_throttling_host_backs_off_and_defers(runs):
    _, data, _, _ = runs
    r = data["hosts"]["busy.pydoc.test"]
    assert r["server_statuses"].get("429", 0) > 0
    assert r["report"]["backoff_steps"] > 0
    assert r["report"]["deferrals"] > 0
    # Retry-After: 3 was honoured: the host was left alone at least 3 s after every 429.
    assert r["min_gap_after_429"] >= RETRY_AFTER - TOLERANCE


def test_robots_host_adopts_its_crawl_delay(runs):
    _, data, _, _ = runs
    r = data["hosts"]["strict.pydoc.test"]
    assert r["report"]["crawl_delay"] == ROBOTS_CRAWL_DELAY
    assert r["persisted"]["crawl_delay"] == ROBOTS_CRAWL_DELAY
    # Every gap, the one after robots.txt itself included (robots.txt is a request to the host too).
    gaps = _gaps(r["arrivals"])
    assert gaps and min(g[2] for g in gaps) >= ROBOTS_CRAWL_DELAY - TOLERANCE, gaps


def test_healthy_hosts_are_paced(runs):
    _, data, _, _ = runs
    for host, role in HOSTS.items():
        if role == "healthy":
            r = data["hosts"][host]
            assert r["min_gap"] >= 1.0 - TOLERANCE, (host, r["min_gap"])
            assert set(r["server_statuses"]) <= {"200", "404"}  # 404: no robots.txt
            assert r["report"]["backoff_steps"] == 0


def test_second_run_starts_from_the_first_runs_pace_table(runs):
    _, data1, out2, data2 = runs
    assert data2["finish_reason"] == "finished"
    start = _section(out2, "pace table at start")
    for host in HOSTS:
        assert any(line.split()[:1] == [host] for line in start.splitlines()), (host, start)
        # exactly the rows the first run left
        assert data2["start_table"][host] == data1["hosts"][host]["persisted"]
    assert data2["start_table"]["strict.pydoc.test"]["crawl_delay"] == ROBOTS_CRAWL_DELAY
    # The table's identity row (outage.TableWatch's) is no host: not listed, not "changed" (it was, as "#table").
    assert "#table" not in start and "#table" not in data2["start_table"]
    assert not any(line.startswith("#table") for line in data2["table_changes"])


def test_second_run_paces_the_robots_host_from_its_first_request(runs):
    """The remembered Crawl-delay applies before robots.txt is even fetched again."""
    _, _, _, data2 = runs
    r = data2["hosts"]["strict.pydoc.test"]
    assert min(g[2] for g in _gaps(r["arrivals"])) >= ROBOTS_CRAWL_DELAY - TOLERANCE, _gaps(r["arrivals"])


def test_the_spider_carries_the_contracts_and_scrapy_check_passes(tmp_path):
    """``run_demo.py --check``: the example spider's scrapy-polite contracts, through the real ``scrapy check``."""
    source = (PROJECT / "polite_demo" / "spiders" / "pydoc_site.py").read_text()
    for contract in ("@polite_delay 3", "@public_only", "@paced_requests"):
        assert contract in source
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    proc = subprocess.run([sys.executable, str(DEMO), "--check", "--store", str(tmp_path / "pace.sqlite3")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Ran 6 contracts" in out and out.rstrip().endswith("OK"), out


def test_the_demo_writes_a_timeline_of_every_host(runs):
    """The example crawl writes the timeline of its event log beside the pace table and prints its path."""
    import re

    out, data, _, _ = runs
    printed = re.search(r"^timeline: (\S+)$", out, re.M)
    assert printed, out[-2000:]
    path = printed.group(1)
    assert data["timeline"] == path and os.path.isfile(path)
    document = Path(path).read_text(encoding="utf-8")
    assert set(re.findall(r'<g class="row" data-host="([^"]*)"', document)) == set(HOSTS)
    assert 'class="win retry-after"' in document  # the throttling host's Retry-After windows


def test_second_run_shows_what_it_changed_in_the_table_it_started_from(runs):
    """Issue 19: the second run says what the persisted table changed, host by host; the first, which started
    from an empty table, does not pretend to (negative control)."""
    out1, _, out2, data2 = runs
    assert "what this run changed in the pace table it started from:" not in out1
    assert "this run started from an empty pace table" in out1
    changes = _section(out2, "what this run changed in the pace table it started from:")
    for host in HOSTS:
        assert any(line.strip().startswith(f"{host}: ") for line in changes.splitlines()), (host, changes)
    strict = next(line for line in data2["table_changes"] if line.startswith("strict.pydoc.test: "))
    assert f"Crawl-delay {ROBOTS_CRAWL_DELAY:g} s kept from the table" in strict, strict


def test_the_example_project_leaves_retry_times_alone():
    """README: "Leave RETRY_TIMES alone" — the example's settings follow it."""
    source = (PROJECT / "polite_demo" / "settings.py").read_text()
    assert not re.search(r"^\s*RETRY_TIMES\s*=", source, re.M), "example_project sets RETRY_TIMES"
