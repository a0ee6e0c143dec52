#!/usr/bin/env python
"""Run the scrapy-polite demo: a real Scrapy crawl of pydoc documentation sites on loopback hosts.

Starts one documentation site per host (see HOSTS) in background threads, runs the ``pydoc_site`` spider of
the ``polite_demo`` project in-process with the project's settings (``CrawlerProcess(get_project_settings())``),
then prints, per host, what the server saw and what scrapy-polite did, and the persisted pace table.

    cd example_project && python run_demo.py           # or: python example_project/run_demo.py
    python run_demo.py --reset                         # forget the pace table first
    python run_demo.py --pages 8                       # a quick run: 8 pages per host
    python run_demo.py --store /tmp/pace.sqlite3       # another pace table (also: env POLITE_DEMO_STORE)
    python run_demo.py --check                         # serve the sites on port 8765, run `scrapy check`

Run it twice: the second run starts from the pace table the first one left ("pace table at start").
Exit status: 0 when the crawl finished and every page of every site was fetched, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import time
from collections import Counter
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

# The demo's hosts: host name used in URLs -> (loopback address it is served on, role). Every key that is not
# an IP literal is given to scrapy-polite's resolver as POLITE_DNS_OVERRIDES = {name: [address]} (see
# dns_overrides()); the ".test" names are reserved (RFC 2606) and never reach a real DNS server.
HOSTS: dict[str, tuple[str, str]] = {
    "docs.pydoc.test": ("127.0.0.2", "healthy"),
    "busy.pydoc.test": ("127.0.0.3", "throttling"),
    "strict.pydoc.test": ("127.0.0.4", "robots"),
    "127.0.0.5": ("127.0.0.5", "healthy"),
}

#: The real robots.txt the "robots" host publishes: www.hockey-reference.com's (Crawl-delay: 3 for "*").
ROBOTS_FILE = os.path.join(HERE, "polite_demo", "data", "www.hockey-reference.com.robots.txt")

#: The throttling host's Retry-After (seconds) on its 429 answers.
RETRY_AFTER = 3

DEFAULT_PAGES = 30  # about 90 s at the robots host's 3 s Crawl-delay

#: The port the sites are served on for ``--check``: the spider's contracts name it in their ``@url``.
CHECK_PORT = 8765


def dns_overrides() -> dict[str, list[str]]:
    """``POLITE_DNS_OVERRIDES`` for the host names of HOSTS that are not IP literals."""
    overrides = {}
    for name, (address, _role) in HOSTS.items():
        try:
            ipaddress.ip_address(name)
        except ValueError:
            overrides[name] = [address]
    return overrides


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=DEFAULT_PAGES,
                        help=f"pages per host, the index included (default {DEFAULT_PAGES})")
    parser.add_argument("--reset", action="store_true", help="delete the pace table before the crawl")
    parser.add_argument("--store", default=os.environ.get("POLITE_DEMO_STORE") or None,
                        help="pace table to use (POLITE_STORE): a file path or a sqlite:///... / memory:// URI; "
                             "default: env POLITE_DEMO_STORE, else the project's .scrapy/polite.sqlite3")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--arrivals", metavar="PATH", help="also write every server-side arrival as CSV to PATH")
    parser.add_argument("--timeline", metavar="PATH",
                        help="where to write the crawl's timeline (.html, or .svg for the picture alone); default: "
                             "polite-timeline.html beside the pace table file (or in the project's .scrapy/)")
    parser.add_argument("--check", action="store_true",
                        help=f"serve the sites on port {CHECK_PORT} and run `scrapy check pydoc_site` (the spider's "
                             "scrapy-polite contracts) instead of the crawl; exits with its status")
    args = parser.parse_args(argv)
    if args.pages < 1:
        parser.error("--pages must be >= 1")
    return args


def store_uri_from_arg(value: str | None) -> str | None:
    """A ``POLITE_STORE`` URI for a ``--store`` value (paths are taken relative to the caller's cwd)."""
    if not value:
        return None
    if "://" in value or value == "memory:":
        return value
    return f"sqlite:///{os.path.abspath(value)}"


def project_store_uri() -> str:
    """The pace table scrapy-polite uses when POLITE_STORE is unset: ``.scrapy/polite.sqlite3`` of the project.

    The same path as ``scrapy_polite.pacer.default_store_uri()``, computed without creating anything:
    that function passes ``createdir=True`` to Scrapy's ``data_path()``, which makes a *directory* of that
    name when the file does not exist yet (and SQLite then cannot open it). Reading the table before the
    crawl (below) creates the file first, so the demo runs either way."""
    from scrapy.utils.project import data_path

    return f"sqlite:///{os.path.abspath(data_path('polite.sqlite3'))}"


def sqlite_path(uri: str) -> str | None:
    if uri.startswith("sqlite:///"):
        return os.path.abspath(uri[len("sqlite:///"):])
    if "://" not in uri and uri != "memory:":
        return os.path.abspath(uri)
    return None


# -- the sites ------------------------------------------------------------------------------------------

def build_servers(pages: int, port: int = 0) -> list[Any]:
    from demo_server import DemoServer, PydocSite, Throttle, stdlib_modules

    modules = stdlib_modules()
    per_host = len(modules) // len(HOSTS)
    if pages - 1 > per_host:
        raise SystemExit(f"--pages {pages} is too many: each host can document at most {per_host} modules "
                         f"(+ the index), --pages <= {per_host + 1}")
    with open(ROBOTS_FILE, encoding="utf-8") as f:
        robots = f.read()
    servers = []
    for i, (name, (address, role)) in enumerate(HOSTS.items()):
        site = PydocSite(f"Python documentation ({role} host {name})", modules[i::len(HOSTS)][:pages - 1],
                         robots_txt=robots if role == "robots" else None)
        throttle = Throttle(total=len(site.pages), retry_after=RETRY_AFTER) if role == "throttling" else None
        servers.append(DemoServer(address, site, throttle=throttle, name=name, port=port))
    return servers


# -- the pace table -------------------------------------------------------------------------------------

def read_pace_table(uri: str) -> list[tuple[str, Any]] | None:
    """The persisted rows, or None for a store that persists nothing (memory://)."""
    from scrapy_polite.stores import TABLE_KEY, ProcessLocal, has_ability, open_store

    store = open_store(uri)
    try:
        if has_ability(store, ProcessLocal):
            return None
        return [(key, state) for key, state in store.items() if key != TABLE_KEY]  # the table's identity: no host
    finally:
        store.close()


def default_timeline_path(store_path: str | None) -> str:
    """``polite-timeline.html`` beside the pace table file, or in the project's ``.scrapy/`` (memory://)."""
    folder = os.path.dirname(store_path) if store_path else os.path.join(HERE, ".scrapy")
    return os.path.join(folder, "polite-timeline.html")


def write_demo_timeline(uri: str, crawler: Any, output: str, *, since: float) -> str | None:
    """Draw this crawl's events (since ``since``, epoch s) from the event log of the pace table at ``uri`` into
    ``output`` (scrapy_polite.reports.timeline); its path, or None when there is nothing to draw or it cannot be
    written."""
    from scrapy_polite.pacer import find_pacer
    from scrapy_polite.reports.timeline import write_timeline
    from scrapy_polite.stores import StoreError

    pacer = find_pacer(crawler)
    try:
        # The crawl's own event log (a memory:// table lives in the crawl's own store object).
        events = pacer.logged_events(since=since, limit=1_000_000) if pacer is not None else []
        if not events:
            print("\nno timeline: the event log has no events of this crawl (POLITE_EVENT_LOG = False?)")
            return None
        os.makedirs(os.path.dirname(output), exist_ok=True)
        write_timeline(events, output, title="scrapy-polite demo: the crawl's timeline", store=uri)
    except (StoreError, ValueError, OSError) as exc:
        print(f"\nno timeline: {exc}", file=sys.stderr)
        return None
    return output


def relative(t: float, now: float) -> str:
    if not t:
        return "-"
    d = t - now
    if abs(d) < 0.05:
        return "now"
    return f"in {d:.1f} s" if d > 0 else f"{-d:.0f} s ago"


def role_of(key: str) -> str:
    """The demo role of a pace-table key: a host of HOSTS, or "address" for a per-IP row (``ip:<address>``)."""
    from scrapy_polite.policy import host_key

    if key.startswith("ip:"):
        return "address"
    for name, (_address, role) in HOSTS.items():
        if host_key(f"http://{name}/") == key:
            return role
    return "-"


def print_pace_table(label: str, rows: list[tuple[str, Any]] | None, uri: str) -> None:
    print(f"\n{label}: {uri}")
    if rows is None:
        print("  (memory:// store: nothing is persisted)")
        return
    if not rows:
        print("  (empty)")
        return
    now = time.time()
    # The columns of `scrapy polite hosts` (one vocabulary with the closing summary).
    table = [("host", "role", "backoff steps", "Crawl-delay", "2xx seen", "next allowed", "updated")]
    for host, s in rows:
        table.append((host, role_of(host), str(s.consec), f"{s.crawl_delay:g} s" if s.crawl_delay else "-",
                      "yes" if s.ok_seen else "no", relative(s.next_allowed, now), relative(s.updated, now)))
    print_table(table, indent="  ")


def table_changes(start: list[tuple[str, Any]] | None, end: list[tuple[str, Any]] | None) -> list[str]:
    """What this run changed in the persisted pace table, host by host, in the words of ``scrapy polite hosts``:
    ``busy.pydoc.test: backoff steps 2 → 0, 2xx seen no → yes``; a row new in this run says ``new row``."""
    if start is None or end is None:
        return []
    before = dict(start)
    lines = []
    for host, s in end:
        if host.startswith("ip:"):
            continue
        old = before.get(host)
        if old is None:
            delay = f"{s.crawl_delay:g} s" if s.crawl_delay else "-"
            lines.append(f"{host}: new row (backoff steps {s.consec}, Crawl-delay {delay}, "
                         f"2xx seen {'yes' if s.ok_seen else 'no'})")
            continue
        changed = []
        if old.consec != s.consec:
            changed.append(f"backoff steps {old.consec} → {s.consec}")
        if old.crawl_delay != s.crawl_delay:
            changed.append(f"Crawl-delay {old.crawl_delay:g} s → {s.crawl_delay:g} s")
        if old.ok_seen != s.ok_seen:
            changed.append(f"2xx seen {'yes' if old.ok_seen else 'no'} → {'yes' if s.ok_seen else 'no'}")
        if old.crawl_delay and old.crawl_delay == s.crawl_delay:
            changed.append(f"Crawl-delay {s.crawl_delay:g} s kept from the table (honoured before robots.txt was "
                           "read again)")
        if old.consec and old.consec == s.consec:
            changed.append(f"still {s.consec} backoff steps")
        lines.append(f"{host}: " + (", ".join(changed) if changed else "unchanged"))
    return lines


def print_table(rows: list[tuple[str, ...]], indent: str = "") -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


# -- the report -----------------------------------------------------------------------------------------

def host_results(servers: list[Any], report: dict[str, dict[str, Any]], rows: list[tuple[str, Any]] | None,
                 *, host_interval: float, ip_interval: float) -> dict[str, dict[str, Any]]:
    """Per host: the server's view (arrivals, statuses, gaps), scrapy-polite's host_report() and the
    persisted row, as plain data (printed, and written by --json)."""
    from demo_server import gaps

    from scrapy_polite.policy import host_key

    persisted = dict(rows or [])
    results = {}
    for srv in servers:
        key = host_key(srv.url())
        arrivals = sorted(srv.arrivals, key=lambda a: a.start)
        pages_ok = {a.path for a in arrivals if a.status == 200} & set(srv.site.pages)
        r = report.get(key, {})
        crawl_delay = r.get("crawl_delay") or 0.0
        # Each demo host has an address of its own, so its requests are also paced by POLITE_IP_INTERVAL.
        expected = max(host_interval, crawl_delay, ip_interval)
        pairs = list(zip(arrivals, arrivals[1:]))
        g = gaps(arrivals)
        state = persisted.get(key)
        results[key] = {
            "role": role_of(key),
            "url": srv.url(),
            "pages": len(srv.site.pages),
            "pages_ok": len(pages_ok),
            "server_requests": len(arrivals),
            "server_statuses": {str(k): v for k, v in sorted(Counter(a.status for a in arrivals).items())},
            "min_gap": min(g) if g else None,
            "expected_interval": expected,
            "short_gaps": [{"after": a.path, "before": b.path, "gap": b.start - a.end}
                           for a, b in pairs if b.start - a.end < expected - 0.05],
            "min_gap_after_429": min((b.start - a.end for a, b in pairs if a.status == 429), default=None),
            "arrivals": [{"path": a.path, "status": a.status, "start": a.start, "end": a.end} for a in arrivals],
            "report": r,
            "persisted": None if state is None else _state_dict(state),
        }
    return results


def _state_dict(state: Any) -> dict[str, Any]:
    return {"consec": state.consec, "crawl_delay": state.crawl_delay, "ok_seen": state.ok_seen,
            "next_allowed": state.next_allowed, "updated": state.updated}


def _deferred(rep: dict[str, Any]) -> str:
    """Deferrals because the host slows us down (``throttled``, ``Crawl-delay``), in the summary's words; the
    ordinary waits for the host's line are turn waits (docs/getting-started.md, "The words")."""
    from scrapy_polite.reports.counters import TURN_REASONS
    from scrapy_polite.reports.summary import reason_words

    reasons = {k: n for k, n in sorted((rep.get("deferral_reasons") or {}).items()) if k not in TURN_REASONS and n}
    return ", ".join(f"{n} {reason_words(k)}" for k, n in reasons.items()) or "-"


def print_results(results: dict[str, dict[str, Any]]) -> None:
    now = time.time()
    table = [("host", "role", "pages", "requests", "statuses", "throttles", "backoff steps", "turn waits",
              "deferred", "Crawl-delay", "min gap (expected)", "consec", "next_allowed")]
    for host, r in results.items():
        rep, st = r["report"], r["persisted"]
        statuses = " ".join(f"{k}×{v}" for k, v in r["server_statuses"].items())
        gap = "-" if r["min_gap"] is None else f"{r['min_gap']:.2f} s (>= {r['expected_interval']:g} s)"
        table.append((
            host, r["role"], f"{r['pages_ok']}/{r['pages']}", str(r["server_requests"]), statuses,
            str(rep.get("throttles", 0)), str(rep.get("backoff_steps", 0)),
            f"{rep.get('turn_waits', 0)} ({rep.get('turn_wait_seconds', 0.0):.1f} s)",
            _deferred(rep), "-" if not rep.get("crawl_delay") else f"{rep['crawl_delay']:g} s",
            gap, "-" if st is None else str(st["consec"]), "-" if st is None else relative(st["next_allowed"], now),
        ))
    print_table(table)
    for host, r in results.items():
        if r["min_gap_after_429"] is not None:
            print(f"  {host}: min gap after a 429: {r['min_gap_after_429']:.2f} s (>= Retry-After {RETRY_AFTER} s)")
        for short in r["short_gaps"]:
            print(f"  {host}: only {short['gap']:.2f} s between {short['after']} and {short['before']} "
                  f"(expected >= {r['expected_interval']:g} s)")
    print("  requests, statuses, min gap: server side (gap = a request's arrival - the previous response's end);\n"
          "  expected = max(POLITE_HOST_INTERVAL, Crawl-delay, POLITE_IP_INTERVAL) (each host has its own address);\n"
          "  throttles, backoff steps, turn waits, deferred, Crawl-delay: scrapy-polite's host_report(), in the\n"
          "  words of its closing summary (docs/getting-started.md, \"The words\");\n"
          "  consec, next_allowed: the persisted pace table")


# -- scrapy check ---------------------------------------------------------------------------------------

def run_check(pages: int, store_uri: str | None) -> int:
    """Serve the sites on :data:`CHECK_PORT` and run ``scrapy check pydoc_site`` in the project, the host names
    given to scrapy-polite's resolver on the command line; its exit status."""
    import subprocess

    servers = build_servers(pages, port=CHECK_PORT)
    for srv in servers:
        srv.start()
    args = [sys.executable, "-m", "scrapy", "check", "pydoc_site", "-s",
            f"POLITE_DNS_OVERRIDES={json.dumps(dns_overrides())}"]
    if store_uri:
        args += ["-s", f"POLITE_STORE={store_uri}"]
    print("$ scrapy check pydoc_site", flush=True)
    try:
        return subprocess.run(args, cwd=HERE, check=False).returncode
    finally:
        for srv in servers:
            srv.stop()


# -- main -----------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Before chdir: relative paths are the caller's.
    store_uri = store_uri_from_arg(args.store)
    json_path = os.path.abspath(args.json) if args.json else None
    arrivals_path = os.path.abspath(args.arrivals) if args.arrivals else None
    timeline_arg = os.path.abspath(args.timeline) if args.timeline else None

    # Run inside the Scrapy project, so that its settings and its .scrapy/ data dir are the ones used.
    os.chdir(HERE)
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    os.environ["SCRAPY_SETTINGS_MODULE"] = "polite_demo.settings"
    if args.check:
        return run_check(min(args.pages, 3), store_uri)

    from polite_demo.spiders.pydoc_site import PydocSiteSpider
    from scrapy.crawler import CrawlerProcess
    from scrapy.utils.project import get_project_settings

    from scrapy_polite.pacer import find_pacer
    from scrapy_polite.policy.robots import parse_robots_delay

    settings = get_project_settings()
    if store_uri:
        settings.set("POLITE_STORE", store_uri, priority="cmdline")
    overrides = dns_overrides()
    if overrides:
        settings.set("POLITE_DNS_OVERRIDES", overrides, priority="cmdline")
    uri = settings.get("POLITE_STORE") or project_store_uri()

    path = sqlite_path(uri)
    if args.reset and path:
        deleted = False
        if os.path.isdir(path) and not os.listdir(path):
            os.rmdir(path)  # an empty directory left where the file belongs (see project_store_uri())
        for p in (path, path + "-wal", path + "-shm"):
            if os.path.isfile(p):
                os.remove(p)
                deleted = True
        print(f"--reset: deleted the pace table {path}" if deleted else f"--reset: no pace table at {path}")

    from scrapy_polite.stores import StoreError

    try:
        start_rows = read_pace_table(uri)
    except StoreError as exc:
        print(f"{exc}\n(run_demo.py --reset starts a fresh pace table)", file=sys.stderr)
        return 1
    print_pace_table("pace table at start", start_rows, uri)

    servers = build_servers(args.pages)
    rendering = time.time()
    size = sum(srv.site.warm() for srv in servers)
    print(f"\nrendered {sum(len(srv.site.pages) for srv in servers)} pages with pydoc ({size / 1e6:.1f} MB) "
          f"in {time.time() - rendering:.1f} s")
    for srv in servers:
        srv.start()
    print("sites:")
    url_width = max(len(srv.url()) for srv in servers)
    for srv in servers:
        note = ""
        if srv.site.robots_txt:
            delay = parse_robots_delay(srv.site.robots_txt, settings.get("USER_AGENT"))
            note = f"  (robots.txt: {os.path.basename(ROBOTS_FILE)}, Crawl-delay for us: {delay:g} s)"
        elif srv.throttle:
            note = f"  (answers 429 with Retry-After: {RETRY_AFTER} after 5 pages, and before its last page)"
        print(f"  {srv.url():<{url_width}}  {role_of(srv.name):<10}  {len(srv.site.pages)} pages{note}")
    sys.stdout.flush()

    started = time.time()
    try:
        process = CrawlerProcess(settings)
        crawler = process.create_crawler(PydocSiteSpider)
        process.crawl(crawler, start_urls=[srv.url("/") for srv in servers])
        process.start()
    finally:
        for srv in servers:
            srv.stop()
    elapsed = time.time() - started

    # The crawler's settings include the add-on's POLITE_* defaults.
    host_interval = crawler.settings.getfloat("POLITE_HOST_INTERVAL")
    ip_interval = crawler.settings.getfloat("POLITE_IP_INTERVAL")
    finish_reason = crawler.stats.get_value("finish_reason") if crawler.stats else None
    pacer = find_pacer(crawler)  # None when the crawl was refused at its start (the error was logged)
    report = pacer.report.host_report() if pacer is not None else {}
    if pacer is None:
        print("\nno scrapy-polite report: the crawl did not start", file=sys.stderr)
    rows = read_pace_table(uri)
    results = host_results(servers, report, rows, host_interval=host_interval, ip_interval=ip_interval)

    print(f"\ncrawl finished in {elapsed:.1f} s (finish_reason: {finish_reason}); "
          f"POLITE_HOST_INTERVAL {host_interval:g} s, POLITE_IP_INTERVAL {ip_interval:g} s\n")
    print_results(results)
    print_pace_table("pace table at end", rows, uri)
    changes = table_changes(start_rows, rows)
    if changes and start_rows:
        print("\nwhat this run changed in the pace table it started from:")
        for line in changes:
            print(f"  {line}")
    elif changes:
        print("\nthis run started from an empty pace table: every row above is new (run the demo again to start "
              "from it)")
    if path:
        print(f"\npace table file: {path}")
    timeline = write_demo_timeline(uri, crawler, timeline_arg or default_timeline_path(path), since=started - 1)
    if timeline:
        print(f"\ntimeline: {timeline}\n  (open it in a browser: one row per host, hover a mark for its URL, status "
              "and the delay chosen; `scrapy polite timeline -o FILE` draws it again from the event log)")

    if arrivals_path:
        with open(arrivals_path, "w", encoding="utf-8") as f:
            f.write("host,path,status,start,end\n")
            for srv in servers:
                for a in srv.arrivals:
                    f.write(f"{a.host},{a.path},{a.status},{a.start:.6f},{a.end:.6f}\n")
    if json_path:
        data = {
            "elapsed": elapsed, "finish_reason": finish_reason, "store": uri, "pages": args.pages,
            "start_table": None if start_rows is None else {host: _state_dict(s) for host, s in start_rows},
            "table_changes": table_changes(start_rows, rows),
            "hosts": results, "timeline": timeline,
        }
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, default=str)

    incomplete = [h for h, r in results.items() if r["pages_ok"] < r["pages"]]
    if finish_reason != "finished" or incomplete:
        print(f"\nthe crawl did not complete: finish_reason={finish_reason}, incomplete hosts: {incomplete or '-'}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
