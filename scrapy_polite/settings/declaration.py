"""The ``POLITE_*`` settings declared once (:data:`SETTINGS`): name, how each is read, default, doc and caveats;
:data:`DEFAULTS`, the settings reference (docs/_ext/polite_reference.py) and the unknown-name check
(:func:`unknown_settings_error`) are made from it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One ``POLITE_*`` setting, declared once: its name, how it is read, its default and what it does (the
    settings reference, Scrapy's defaults of the add-on (:data:`DEFAULTS`) and the unknown-setting check are made
    from it).

    Attributes:
        name: the setting's name.
        kind: how it is read: ``"bool"``, ``"seconds"`` (a finite number >= 0), ``"number"`` (a finite number),
            ``"count"`` (a whole number), ``"list"``, ``"dict"`` or ``"string"`` (anything else, checked by its
            own reader).
        default: the value when the project sets none.
        doc: what it does, one paragraph of Markdown (units always given).
        notes: the caveats a user can trip on, each ``(kind, text)`` with kind ``"note"`` or ``"warning"``;
            the reference shows each as an admonition beside the setting.
        guide: the documentation page (``guides/...``) that explains the setting at length.
        default_words: how the reference shows the default when its value alone would mislead (None: the value).
    """

    name: str
    kind: str
    default: Any
    doc: str
    notes: tuple[tuple[str, str], ...] = ()
    guide: str = ""
    default_words: str | None = None


#: Every setting, in the order the reference lists them: what it does, how it is read and its caveats. The
#: settings reference of the documentation is generated from this table (docs/_ext/polite_reference.py), and
#: tests/test_docs.py checks it against :data:`DEFAULTS` and against how :class:`PoliteConfig` reads each one.
SETTINGS: tuple[Setting, ...] = (
    Setting("POLITE_ENABLED", "bool", True, "Turn everything off without removing the add-on.", notes=(
        ("warning", "With `POLITE_ENABLED = False` nothing of scrapy-polite runs, **the address checks included**: "
                    "the crawl may then reach private and loopback addresses. In a spider's `custom_settings` it turns "
                    "that spider's part off: its pacing and its own checks (its download handlers, scrapy-playwright's "
                    "guard); only the process's resolver (built before any spider) still refuses the non-public "
                    "addresses it resolves."),)),
    Setting("POLITE_HOST_INTERVAL", "seconds", 1.0,
            "Base interval (seconds) between the end of one response and the start of the next request to one host. "
            "The effective interval of a host is the largest of this, its published `Crawl-delay`, its announced "
            "quota and the overrides (`POLITE_HOST_DELAYS`, a spider's `crawl_delay`, `meta['polite_delay']`).",
            notes=(("note", "The default pace is **one request every 2 seconds per host**, not every second: "
                            "`POLITE_IP_INTERVAL` (2 s) also spaces requests to each IP address, and a host with a "
                            "single address of its own is paced by both. To crawl such a host once a second, set "
                            "`POLITE_IP_INTERVAL = 1.0` (or `0` to pace by host only)."),),
            guide="guides/throttles"),
    Setting("POLITE_IP_INTERVAL", "seconds", 2.0,
            "Minimum interval (seconds) between two requests to one IP address, whatever the host (end of one "
            "response to the start of the next request). Hosts that share an address share its budget. `0` paces "
            "by host only.",
            notes=(("note", "With the defaults (1 s per host, 2 s per address) a host with one address of its own is "
                            "crawled at **one request every 2 seconds**: this setting, not `POLITE_HOST_INTERVAL`, "
                            "sets the pace."),),
            guide="guides/throttles"),
    Setting("POLITE_MAX_BACKOFF", "seconds", 300.0,
            "Cap (seconds) of a computed backoff, `interval × 2^n` with `n` the backoff steps before the throttle.",
            guide="guides/throttles"),
    Setting("POLITE_MAX_WAIT", "seconds", 60.0,
            "Longest time (seconds, > 0) one request waits in line. A host that publishes or is given a delay longer "
            "than this, or is throttling us, is deferred instead: its requests leave the downloader until due.",
            guide="guides/throttles"),
    Setting("POLITE_THROTTLE_STATUSES", "list", [429, 503],
            "HTTP statuses that mean \"slow down\" (a list of 4xx and 5xx statuses, not empty). A 403 from a host that "
            "already served a 2xx is a throttle too, until the same page is refused again after a 2xx of the host "
            "(a 403 listed here is always one).",
            guide="guides/throttles"),
    Setting("POLITE_MAX_RETRY_AFTER", "seconds", 3600.0,
            "Cap (seconds) on an honoured `Retry-After` (any number of digits), and on an announced quota's interval "
            "and hold. Larger values are clamped, logged once per host and counted.",
            guide="guides/throttles"),
    Setting("POLITE_MAX_FAILURE_BACKOFF", "seconds", 60.0,
            "Cap (seconds) of the backoff after download failures (timeouts, refused or reset connections): a host "
            "that is down is retried sooner than one that throttles.",
            guide="guides/throttles"),
    Setting("POLITE_THROTTLE_RETRIES", "count", 10,
            "How many times scrapy-polite retries a page whose response was a throttle, besides and before Scrapy's "
            "`RETRY_TIMES` (a whole number >= 0; `0` leaves throttles to Scrapy).",
            guide="guides/throttles"),
    Setting("POLITE_RATELIMIT_HEADERS", "bool", True,
            "Read the quotas hosts announce (`RateLimit-Policy` / `RateLimit`, `RateLimit-Limit/-Remaining/-Reset`, "
            "`X-RateLimit-*`) and pace by them; `False` ignores them.",
            guide="guides/quotas"),
    Setting("POLITE_ADAPTIVE", "bool", False,
            "Adaptive pacing: each host's interval also follows its response times, at least "
            "`POLITE_ADAPTIVE_FACTOR` × its smoothed latency, doubled per 5xx or timeout not yet earned back; never "
            "below the other intervals.",
            notes=(("warning", "With `AUTOTHROTTLE_ENABLED = True` as well the crawl refuses to start (one ERROR line, "
                               "exit status 1) unless `POLITE_ADAPTIVE_WITH_AUTOTHROTTLE = True`."),),
            guide="guides/adaptive"),
    Setting("POLITE_ADAPTIVE_FACTOR", "number", 2.0,
            "The adaptive interval is at least this many times the host's smoothed download latency (a finite "
            "number > 0; Heritrix's \"delay factor\"). With `2`, the server spends at most a third of its time on "
            "the crawl.",
            guide="guides/adaptive"),
    Setting("POLITE_ADAPTIVE_MAX", "seconds", 60.0,
            "Cap (seconds) of the interval adaptive pacing sets (a larger Crawl-delay, quota or override still wins).",
            guide="guides/adaptive"),
    Setting("POLITE_ADAPTIVE_WITH_AUTOTHROTTLE", "bool", False,
            "With `POLITE_ADAPTIVE` on, the crawl refuses to start while `AUTOTHROTTLE_ENABLED` is on (two pacers, "
            "one unaware of the other) unless this is `True`; then a WARNING says so at start.",
            guide="guides/adaptive"),
    Setting("POLITE_MAX_IDLE_WAIT", "seconds", 300.0,
            "When everything left is deferred beyond this (seconds), the spider closes with reason "
            "`polite_deferred` and the log lists each host and when it is due.",
            notes=(("note", "Requests still deferred at that close are not crawled: without `JOBDIR` they are "
                            "counted in `polite/deferred/not_crawled` and listed; with `JOBDIR` they are saved and "
                            "come back on resume."),),
            guide="guides/throttles"),
    Setting("POLITE_MAX_HELD_IN_MEMORY", "count", 10_000,
            "How many deferred requests are held in memory (a whole number >= 0); the others wait on disk and come "
            "back in due order. Under `JOBDIR` every held request is on disk. Also how many requests the scheduler "
            "cannot hold (robots.txt, a media pipeline's files) wait for their host outside `CONCURRENT_REQUESTS`; "
            "the next wait in it.",
            guide="guides/throttles"),
    Setting("POLITE_HOST_DELAYS", "dict", {},
            "Per-host interval (seconds), e.g. `{\"api.example.com\": 5}` (a dict or a JSON object). It can only "
            "slow a host down.",
            guide="guides/throttles"),
    Setting("POLITE_STORE", "string", None,
            "The pace table: `None` is `sqlite:///<project>/.scrapy/polite.sqlite3`; `sqlite:///relative/path`, "
            "`sqlite:////absolute/path`, `memory://` (not persisted), or `redis://host:port/db`, `rediss://…`, "
            "`unix:///path/redis.sock?db=0`, or a Redis Cluster, `redis+cluster://host:port[,host:port…]` (shared by "
            "many processes). A Redis URL takes `?layout=table` (the default: the table in one hash slot) or "
            "`?layout=sharded` (one slot per row).",
            notes=(("warning", "A Redis **restarted without persistence** (no `appendonly yes`), or a failover onto an "
                               "empty replica, forgets every delay it held. Each running crawl then writes back what "
                               "it knew (one WARNING, `polite/store/restores`), but what no running crawl knew is "
                               "lost, and so is the event log before that moment (`scrapy polite audit` exits 2). "
                               "Turn on Redis's append-only file to lose nothing."),
                   ("note", "`memory://` keeps the table in the process only (its crawls share it): the next run "
                            "starts with no backoff and no Crawl-delay.")),
            guide="guides/many-crawlers", default_words="`None` (`sqlite:///<project>/.scrapy/polite.sqlite3`)"),
    Setting("POLITE_STORE_EXPIRE", "seconds", 30 * 24 * 3600.0,
            "Rows of hosts idle this long (seconds; 30 days by default) are removed when the table is opened (Redis: "
            "each key expires this long after its row's `next_allowed` or last write, whichever is later).",
            guide="guides/operating", default_words="`2592000.0` (30 days)"),
    Setting("POLITE_STORE_PREFIX", "string", "polite:",
            "Key prefix of the table in a shared server (Redis): one table per prefix, so several can share a "
            "server.",
            guide="guides/many-crawlers"),
    Setting("POLITE_STORE_TIMEOUT", "seconds", 60.0,
            "How long (seconds, > 0) a server store may stay unreachable mid-crawl before the spider closes with "
            "reason `polite_store_error` (and `scrapy crawl` exits with status 1). Requests wait meanwhile: none is "
            "sent without a booking.",
            guide="guides/many-crawlers"),
    Setting("POLITE_EVENT_LOG", "bool", True,
            "Keep the event log beside the pace table: every booking, wait, deferral, response, failure, backoff "
            "step, robots.txt delay, refusal and operator action. `scrapy polite audit` and `timeline` read it.",
            guide="guides/operating"),
    Setting("POLITE_EVENT_LOG_SIZE", "count", 100_000,
            "The most events a table's log keeps (a whole number >= 1, about 300 bytes each in SQLite); the oldest "
            "are deleted first.",
            notes=(("note", "An audit that reaches back past the oldest event kept reports the log **truncated** "
                            "(exit status 2): raise this before a long crawl you mean to audit whole, or audit from "
                            "a later moment with `--since`."),),
            guide="guides/operating"),
    Setting("POLITE_SCHEDULER_BASE", "string", "scrapy.core.scheduler.Scheduler",
            "The scheduler `PoliteScheduler` wraps; the add-on fills it in from your `SCHEDULER`.",
            guide="guides/many-crawlers", default_words="your `SCHEDULER` (`scrapy.core.scheduler.Scheduler`)"),
    Setting("POLITE_SHARED_FRONTIER", "bool", True,
            "With scrapy-redis's scheduler, keep deferred and in-flight requests in Redis, leased; `False`: held in "
            "each process, as without scrapy-redis.",
            guide="guides/many-crawlers"),
    Setting("POLITE_FRONTIER_KEY", "string", "%(spider)s:polite",
            "The key prefix of the shared frontier in scrapy-redis's Redis (`%(spider)s`: the spider's name, as in "
            "scrapy-redis's `%(spider)s:requests`).",
            guide="guides/many-crawlers"),
    Setting("POLITE_LEASE_TIME", "seconds", 60.0,
            "Seconds (> 0) a worker's leases last without renewal (each worker renews them every second, or every "
            "third of this if shorter). The requests of a worker that stopped renewing go back to the shared "
            "frontier this long after its last renewal.",
            notes=(("note", "scrapy-redis's `MAX_IDLE_TIME_BEFORE_CLOSE` **may be shorter** than `POLITE_LEASE_TIME`: "
                            "an idle worker does not close while a worker that stopped renewing (killed, crashed, "
                            "frozen) still leases requests, whatever its idle window. It waits until they come back "
                            "(at most `POLITE_LEASE_TIME` after that worker's last renewal), fetches them, then "
                            "closes."),
                   ("warning", "A `POLITE_LEASE_TIME` shorter than the longest pause a live worker can freeze for (a "
                               "long garbage collection, a stopped VM) makes it look dead: its pages are fetched "
                               "twice. A longer one only makes the survivors wait longer for a dead worker's "
                               "pages.")),
            guide="guides/many-crawlers"),
    Setting("POLITE_ALLOW_PRIVATE", "bool", False,
            "Allow non-public addresses (intranet crawls); also lifts the download handler checks.",
            notes=(("note", "Per process: a spider's `custom_settings` can only narrow, never widen, the project's "
                            "address rules (a spider that tries gets a WARNING naming the networks that stay "
                            "refused)."),),
            guide="guides/safety"),
    Setting("POLITE_ALLOWED_NETWORKS", "list", [],
            "CIDR networks of non-public addresses to allow anyway, e.g. `[\"127.0.0.0/8\"]` for local tests "
            "(`-s POLITE_ALLOWED_NETWORKS=127.0.0.0/8,::1/128` on the command line).",
            notes=(("note", "Per process, like `POLITE_ALLOW_PRIVATE`: a spider can only narrow it."),),
            guide="guides/safety"),
    Setting("POLITE_CHECKED_HANDLERS", "list", [],
            "Download handlers (import paths or classes) you accept with the weaker *checked* address rule; any "
            "other handler the add-on does not know refuses to start.",
            guide="guides/safety"),
    Setting("POLITE_DNS_OVERRIDES", "dict", {},
            "Host → list of IP addresses, used instead of DNS (still filtered by the address rules).",
            notes=(("note", "The DNS settings are per process: set them in the project settings, not in a spider's "
                            "`custom_settings`. A *checked* handler resolves names itself and does not see them."),),
            guide="guides/safety"),
    Setting("POLITE_DNS_NAMESERVERS", "list", [],
            "`host[:port]` nameservers (IP addresses); empty: the system's `/etc/resolv.conf`.",
            guide="guides/safety"),
    Setting("POLITE_DNS_TIMEOUT", "seconds", 5.0, "Seconds for one lookup (A and AAAA together).",
            guide="guides/safety"),
    Setting("POLITE_DNS_MIN_TTL", "seconds", 60.0,
            "Shortest time (seconds) an answer is cached, whatever its TTL.", guide="guides/safety"),
    Setting("POLITE_DNS_MAX_TTL", "seconds", 3600.0, "Longest time (seconds) an answer is cached.",
            guide="guides/safety"),
)

#: Every setting with its default (made from :data:`SETTINGS`).
DEFAULTS: dict[str, Any] = {setting.name: setting.default for setting in SETTINGS}

_PREFIX = "POLITE_"


# -- unknown names ----------------------------------------------------------------------------------------


def unknown_settings(names: Iterable[str]) -> list[tuple[str, str | None]]:
    """The ``POLITE_*`` names that are not settings, each with the closest known name (or None).

    A name counts when it starts with ``POLITE_`` in any case (``polite_host_interval`` is a typo too:
    Scrapy setting names are case-sensitive) and is not a key of :data:`DEFAULTS`. The closest name is
    :func:`difflib.get_close_matches` over the part after ``POLITE_`` (cutoff 0.6).

    Args:
        names: setting names, e.g. a Scrapy ``Settings`` (which iterates over its names).

    Returns:
        ``[(name, closest or None), ...]`` in the order first seen, each name once.

    >>> unknown_settings(["POLITE_HOST_INTERVALS", "POLITE_IP_INTERVAL", "LOG_LEVEL"])
    [('POLITE_HOST_INTERVALS', 'POLITE_HOST_INTERVAL')]
    """
    known = {name[len(_PREFIX):]: name for name in DEFAULTS}
    found: list[tuple[str, str | None]] = []
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or name in seen or name in DEFAULTS:
            continue
        upper = name.upper()
        if not upper.startswith(_PREFIX):
            continue
        seen.add(name)
        close = difflib.get_close_matches(upper[len(_PREFIX):], list(known), n=1)
        found.append((name, known[close[0]] if close else None))
    return found


def unknown_settings_error(settings: Iterable[str]) -> str | None:
    """The error for the unknown ``POLITE_*`` names in ``settings`` (see :func:`unknown_settings`), or None when there
    is none, e.g. ``POLITE_HOST_INTERVALS is not a scrapy-polite setting (did you mean POLITE_HOST_INTERVAL?). Fix:
    correct it or remove it (the settings reference lists them)``. A misspelt setting would have no effect: a crawl
    meant to go slower than the default would not (trial: ``POLITE_HOST_INTERVL = 2`` crawled at the default pace),
    so the add-on refuses to start with it.

    Args:
        settings: a Scrapy ``Settings`` or a mapping (its keys are read) or any iterable of names.
    """
    found = unknown_settings(settings)
    if not found:
        return None
    parts = [f"{name} is not a scrapy-polite setting" + (f" (did you mean {close}?)" if close else "")
             for name, close in found]
    them = "it" if len(found) == 1 else "them"
    return f"{'; '.join(parts)}. Fix: correct {them} or remove {them} (the settings reference lists the settings)"
