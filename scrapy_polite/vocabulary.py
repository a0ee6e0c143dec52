"""The words the package and its users share, named once: request meta keys, the ``polite/...`` stats, deferral
and refusal reasons, event kinds, close reasons, and the reading of "a number of seconds >= 0".

A leaf module (it imports nothing of the package), so every unit, the pure policy included, can use it.
The documentation's reference pages (request meta keys, stats, close reasons) are generated from it
(docs/_ext/polite_reference.py); docs/spec.md §5 and §7 define what the keys mean.

Reasons and kinds are ``Literal`` types, so mypy checks every place that produces one; their values are plain
strings at run time (they are stored in the pace table's event log and read back by older and newer versions),
and each has a tuple of every value for the code that validates or lists them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, get_args

__all__ = [
    "BURST_META",
    "CloseReason",
    "CLOSE_REASONS",
    "CLOSE_REASON_MEANINGS",
    "DEFERRAL_REASONS",
    "DELAY_META",
    "DONT_PACE_META",
    "DeferralReason",
    "EVENT_KINDS",
    "EventKind",
    "FAILED_CLOSE_REASONS",
    "HOST_META",
    "INVALID_DELAY_META",
    "IP_META",
    "LEASE_META",
    "PINNED_META",
    "PROXY_COUNTED_META",
    "META_MEANINGS",
    "QUOTA_SERIAL_META",
    "RECORDED_META",
    "REFUSAL_REASONS",
    "RefusalReason",
    "SENT_AT_META",
    "STATS",
    "THROTTLE_RETRIES_META",
    "TURN_REASONS",
    "parse_seconds",
]

# -- request meta keys ---------------------------------------------------------------------------------------
# Set by the user (docs/spec.md §5 and §7, public surface):

#: Seconds: a larger interval after this request's response (docs/spec.md §5, "Per-spider overrides"). A value
#: that is not a number of seconds >= 0 (:func:`parse_seconds`) is ignored, logged and counted
#: (``polite/invalid_meta``).
DELAY_META: Final = "polite_delay"
#: ``True``: one segment of a stream; skips the ordinary interval while the host has not throttled (§5).
BURST_META: Final = "polite_burst"
#: ``True``: the request is not paced (still address-checked), counted in ``polite/dont_pace``.
DONT_PACE_META: Final = "dont_pace"

# Set by the package on a request it paces:

#: The request's pacing key (docs/spec.md §1), set when the middleware first sees it.
HOST_META: Final = "polite_host"
#: The IP address the request was booked on, the one it connects to (docs/spec.md §4, pinned).
IP_META: Final = "polite_ip"
#: Epoch seconds of the pace table's clock at which the request was booked (a burst: when it was decided).
SENT_AT_META: Final = "polite_sent_at"
#: The booking's serial on its host's row, which counts the host's announced quota (docs/spec.md §2).
QUOTA_SERIAL_META: Final = "polite_quota_serial"
#: How many times the package retried this page after a throttle (``POLITE_THROTTLE_RETRIES``).
THROTTLE_RETRIES_META: Final = "polite_throttle_retries"
#: The shared frontier's lease on the request (docs/spec.md §5, "The shared frontier").
LEASE_META: Final = "polite_lease"

# The package's own marks, not for users (the leading underscore):

#: The invalid ``polite_delay`` of this request was already logged and counted.
INVALID_DELAY_META: Final = "_polite_invalid_delay"
#: The resolver holds a pin of this request's booked address until its download ends.
PINNED_META: Final = "_polite_pinned"
#: This request's proxy was already counted (``polite/proxy_unpinned``).
PROXY_COUNTED_META: Final = "_polite_proxy_counted"
RECORDED_META: Final = "_polite_recorded"  # this pass's download is recorded (docs/spec.md §5, "Recording")
#: ``meta['dont_cache']`` was set by the package on a throttle it handed on (not by the user): the cache does not
#: store that throttle, and the next pass (Scrapy's retry copy) drops both, so the cache may keep its answer.
UNCACHED_META: Final = "_polite_uncached"
#: This page was answered 403: ``(the recording process's token, the page's URL, the host's 2xx answers it had recorded
#: then)``; a second 403 of that page after a 2xx of the host is a refusal of the page (docs/spec.md §2).
FORBIDDEN_META: Final = "_polite_forbidden"

#: The meta keys a user may read or set, each with what it means (the reference lists them, in this order):
#: the constant's name → (who sets it, its meaning). The package's own marks (leading underscore) and the
#: frontier's lease are not listed.
META_MEANINGS: Final[Mapping[str, tuple[str, str]]] = MappingProxyType({
    "DELAY_META": ("you", "seconds: a larger interval after this request's response (e.g. an expensive search "
                          "page); a value that is not a number of seconds >= 0 is ignored, logged and counted "
                          "(`polite/invalid_meta`)"),
    "BURST_META": ("you", "`True`: a segment of one stream (e.g. an HLS playlist's segments): skip the ordinary "
                          "interval while the host has not throttled; wait or defer as soon as it has. Every "
                          "response still updates the pace table, and a spent quota still holds it"),
    "DONT_PACE_META": ("you", "`True`: exempt this request from pacing, never from the address rules (counted in "
                              "`polite/dont_pace`); it is not booked, so the event log has no booking of it and the "
                              "audit does not judge it; its response is still recorded (a throttle still backs the "
                              "host off)"),
    "HOST_META": ("the package", "the pacing key: the URL's host as the WHATWG URL Standard reads it, lower-cased, "
                                 "without port"),
    "IP_META": ("the package", "the booked address, the one the request connects to"),
    "SENT_AT_META": ("the package", "epoch seconds (of the pace table's clock) at which the request was booked; "
                                    "for a burst request, when the decision was taken; not set for `dont_pace` "
                                    "requests"),
    "QUOTA_SERIAL_META": ("the package", "the booking's serial on its host's row, which counts the host's "
                                         "announced quota; not set for burst requests"),
    "THROTTLE_RETRIES_META": ("the package", "how many times the package has retried this page after a throttle "
                                             "so far (`POLITE_THROTTLE_RETRIES`); kept across a `JOBDIR` resume"),
})

# -- stats ----------------------------------------------------------------------------------------------------

#: Every ``polite/...`` stat the package sets, each with its meaning (the stats reference lists them in this
#: order). ``<reason>``, ``<status>`` and ``<handler>`` stand for one path segment each. tests/test_docs.py scans
#: the package's source: every key it counts is declared here, and every key declared here is counted.
STATS: Final[Mapping[str, str]] = MappingProxyType({
    "polite/requests": "requests booked on their host (a deferred request once, when it is booked at last: "
                       "Scrapy's `downloader/request_count` counts it again at each pass through the downloader "
                       "middlewares)",
    "polite/waits": "waits in line (for the host's interval or an address's budget)",
    "polite/wait_seconds": "the total seconds of those waits",
    "polite/deferrals": "requests deferred: held out of the downloader until their host is due, for every reason "
                        "(the summary's \"deferred\" counts those the host slowed, its \"turn waits\" those of "
                        "a busy line)",
    "polite/deferrals/<reason>": "requests deferred, by reason: `throttled` (the host is backing us off), "
                                 "`ratelimit` (its announced quota is spent, or slower than `POLITE_MAX_WAIT`), "
                                 "`crawl_delay` (a published delay longer than `POLITE_MAX_WAIT`), `line` (another "
                                 "request of the host is in flight), `ip_line` (every address of the host is busy), "
                                 "`turn` (its turn comes later and the downloader is full: it waits out of it), "
                                 "`robots_unreachable` (its robots.txt answered 5xx or 429, or could not be reached: "
                                 "everything is disallowed until it answers)",
    "polite/deferred/max_held": "the most requests held at once",
    "polite/held_in_flight": "bookings kept out because another request to the host or address was in flight (in "
                             "another process, or in this one behind a slow pace table): the request asks again one "
                             "interval later",
    "polite/lease/expired": "requests leased by a worker that stopped renewing its lease (killed, or stalled longer "
                            "than `POLITE_LEASE_TIME`), returned to the shared frontier by this worker",
    "polite/frontier/emptied": "times this worker found the shared frontier emptied under the crawl (Redis restarted "
                               "without persistence, or its keys deleted): what was deferred, leased or queued there "
                               "is gone",
    "polite/frontier/taken/queue": "requests this worker took from scrapy-redis's queue",
    "polite/frontier/taken/held": "requests this worker took from a host held in the shared frontier, once due",
    "polite/frontier/taken/returned": "requests this worker took that a stopped or dead worker had given back",
    "polite/frontier/held": "deferred requests this worker wrote back to the shared frontier, held until their "
                            "host is due",
    "polite/frontier/full": "times this worker did not take from the shared queue because it had "
                            "`CONCURRENT_REQUESTS` in hand",
    "polite/frontier/returned_at_close": "requests this worker still had taken at its close, given back to the "
                                         "shared frontier",
    "polite/frontier/leased_elsewhere_at_close": "requests other workers leased when this worker closed (renewing "
                                                 "ones: theirs to finish; the closing log names each worker)",
    "polite/frontier/not_serialisable": "deferred requests that could not be written to Redis (held in the "
                                        "process, still leased)",
    "polite/frontier/unreadable": "records of the shared frontier that could not be read back (dropped)",
    "polite/lifecycle/reclaimed": "requests that left without passing scrapy-polite's middleware (a middleware "
                                  "returned another request in their place) and were found missing from the "
                                  "downloader: their host's line freed",
    "polite/lifecycle/copied": "requests the spider scheduled again while their first pass was still held or in the "
                               "downloader (the same Request object yielded twice): each sent as a copy",
    "polite/lifecycle/illegal": "moves of a request to a stage it may not enter from the one it was in (a bug: "
                                "each kind is logged once at WARNING; docs/spec.md §5, \"The request lifecycle\")",
    "polite/ip_line/retaken": "bookings that came back from a slow pace table to find their address taken by "
                              "another request of the crawl, and waited for it",
    "polite/stranded": "the spider closed with reason `polite_stranded`: held requests were parked on nothing (a "
                       "defect; the log names them)",
    "polite/deferred/saved": "deferred requests saved under `JOBDIR` at close",
    "polite/deferred/resumed": "deferred requests read back from `JOBDIR` on resume",
    "polite/deferred/not_crawled": "deferred requests still held when the crawl closed without `JOBDIR` (not "
                                   "crawled; the log lists their hosts)",
    "polite/closed_waiting": "requests the scheduler could not hold (robots.txt, `engine.download()`: a media "
                             "pipeline's) dropped, not sent, when the crawl closed while they waited for their host",
    "polite/deferred/not_saved": "deferred requests that could not be saved under `JOBDIR` (a callback that is not "
                                 "a spider method, unpicklable meta); each is logged",
    "polite/deferred/spilled": "held requests written to disk: beyond `POLITE_MAX_HELD_IN_MEMORY`, or every one "
                               "under `JOBDIR`",
    "polite/deferred/unreadable": "held requests that could not be read back from disk (a callback the resumed "
                                  "spider no longer has); each is logged",
    "polite/throttles/<status>": "responses judged a throttle, by status (`failure` for timeouts, refused or reset "
                                 "connections)",
    "polite/backoff_steps": "throttles that took a new backoff step",
    "polite/retry_after/honoured": "`Retry-After` headers honoured",
    "polite/retry_after/clamped": "`Retry-After` headers clamped to `POLITE_MAX_RETRY_AFTER`",
    "polite/retry_after/invalid": "`Retry-After` headers that could not be read (ignored)",
    "polite/throttle/retries": "throttled pages sent again by scrapy-polite (not counted in Scrapy's `retry/count`)",
    "polite/throttle/given_up": "pages given up after their host kept throttling: `POLITE_THROTTLE_RETRIES` spent, "
                                "and a throttle reached the spider",
    "polite/ratelimit/responses": "responses that announced a quota",
    "polite/ratelimit/adopted": "announced intervals recorded (when they changed)",
    "polite/ratelimit/holds": "responses saying the quota was spent (the host is held until the reset)",
    "polite/ratelimit/clamped": "announced intervals or holds clamped to `POLITE_MAX_RETRY_AFTER`",
    "polite/ratelimit/malformed": "malformed rate-limit fields (ignored)",
    "polite/crawl_delay/adopted": "robots.txt delays recorded",
    "polite/robots/unreachable": "robots.txt answers that left it unreachable: 5xx, 429, a network error or a "
                                 "timeout (the host's requests are held until it answers; the delay recorded before "
                                 "is kept)",
    "polite/robots/unavailable": "robots.txt answered 4xx (not 429), or redirected more than 5 times: everything "
                                 "allowed",
    "polite/robots/expired": "robots.txt rules older than 24 hours asked again (RFC 9309 §2.4)",
    "polite/robots/redirects": "redirects followed to reach a robots.txt",
    "polite/robots/truncated": "robots.txt files longer than 500 KiB: the first 500 KiB parsed, the rest ignored",
    "polite/robots/given_up": "requests that could not be held, dropped because their robots.txt stayed unreachable "
                              "longer than `POLITE_MAX_IDLE_WAIT`",
    "polite/robots/errors": "robots.txt parsers whose delay could not be read",
    "polite/burst": "requests sent as burst (`meta['polite_burst']`)",
    "polite/dont_pace": "requests exempted from pacing (`meta['dont_pace']`)",
    "polite/refused/no_host": "requests refused because their URL has no host",
    "polite/refused/invalid_host": "requests refused because the URL Standard rejects their host",
    "polite/invalid_meta": "invalid `meta['polite_delay']` values (ignored)",
    "polite/store_errors": "the crawl was stopped because its pace table could not be read or written",
    "polite/blocked/private_address": "requests refused because their host has only non-public addresses",
    "polite/dns/nxdomain": "DNS lookups answered NXDOMAIN (no such host)",
    "polite/dns/servfail": "DNS lookups that failed (SERVFAIL, or no nameserver reachable)",
    "polite/dns/timeout": "DNS lookups that timed out (`POLITE_DNS_TIMEOUT`)",
    "polite/proxy_unpinned": "requests through a proxy (paced by host, not pinned)",
    "polite/unpinned/<handler>": "requests sent through a *checked* handler (`httpx`, `aiohttp`, `playwright`, or "
                                 "the lower-cased class name of one in `POLITE_CHECKED_HANDLERS`): checked and booked "
                                 "on an address, not pinned to it",
    "polite/unpinned/address_changed": "responses of a checked handler that came from another address than the "
                                       "booked one",
    "polite/unpinned/refused_response": "of those, the responses from a non-public address (dropped with an "
                                        "`IgnoreRequest`)",
    "polite/unpinned/redirected": "responses of a checked handler, or of scrapy-playwright's browser, from another "
                                  "host than the booked one (the browser follows redirects itself): not recorded on "
                                  "the booked host",
    "polite/unpinned/browser_aborted": "scrapy-playwright without the crawl's proxy (checked): browser requests "
                                       "(scripts, images, XHR, the page itself) aborted because their host is "
                                       "non-public, does not resolve, or is refused by the URL Standard",
    "polite/browser/proxied": "scrapy-playwright (pinned): connections the browser made through the crawl's proxy, "
                              "each to the address it was checked on (a tunnel for HTTPS and WebSockets, one request "
                              "for plain HTTP); per host in the INFO line at close",
    "polite/browser/refused": "scrapy-playwright (pinned): the browser's connections the crawl's proxy refused (a "
                              "non-public address, a name with no allowed address, a host the URL Standard refuses): "
                              "nothing was sent to them",
    "polite/browser/failed": "scrapy-playwright (pinned): the browser's connections the crawl's proxy could not make "
                             "(a DNS failure, the checked address not answering)",
    "polite/resolver_missing": "the crawl was stopped because the resolver is not installed",
    "polite/store/restores": "times the pace table was found to have come back empty (its identity gone: a Redis "
                             "restarted without persistence, a SQLite file deleted or replaced)",
    "polite/store/restored_rows": "the rows this process wrote back after such a loss",
    "polite/store/outages": "times the pace table (Redis) became unreachable mid-crawl",
    "polite/store/outage_seconds": "the seconds it stayed unreachable",
    "polite/events/dropped": "events that could not be written to the event log (dropped; the crawl is not "
                             "affected)",
})

# -- reasons and kinds ------------------------------------------------------------------------------------

#: Why a request left the downloader (``polite/deferrals/<reason>``; docs/spec.md §2 and §5): ``throttled`` (the
#: host is backing us off), ``ratelimit`` (its announced quota is spent or too slow), ``crawl_delay`` (a published
#: delay longer than ``POLITE_MAX_WAIT``), ``line`` / ``ip_line`` (another request of the host / of its address
#: is in flight), ``turn`` (its turn comes later and the downloader is full), ``robots_unreachable`` (its
#: robots.txt is unreachable: everything is disallowed until it answers, RFC 9309 §2.3.1.4; docs/spec.md §5, "The
#: robots.txt lifecycle").
DeferralReason = Literal["throttled", "ratelimit", "crawl_delay", "line", "ip_line", "turn", "robots_unreachable"]
#: Every deferral reason, in order.
DEFERRAL_REASONS: Final[tuple[DeferralReason, ...]] = get_args(DeferralReason)
#: The deferral reasons that only mean "wait for the host's turn"; the others are the host slowing us down.
TURN_REASONS: Final[frozenset[DeferralReason]] = frozenset({"line", "ip_line", "turn"})

#: Why a request was refused (``polite/refused/<reason>``, ``polite/blocked/private_address`` for ``non_public``;
#: docs/spec.md §4): ``non_public`` (only non-public addresses), ``no_host`` (a URL without a host; the closing
#: summary's), ``invalid_host`` (a host name the resolver refuses; its words only).
RefusalReason = Literal["non_public", "no_host", "invalid_host"]
#: Every refusal reason, in order.
REFUSAL_REASONS: Final[tuple[RefusalReason, ...]] = get_args(RefusalReason)

#: The kinds of the event log's events, in the order a request meets them (docs: guides/operating;
#: :class:`~scrapy_polite.stores.Event` describes the fields of each).
EventKind = Literal["opened", "booking", "wait", "deferral", "response", "failure", "backoff", "robots_delay",
                    "refusal", "operator", "restored", "closed"]
#: Every event kind, in order.
EVENT_KINDS: Final[tuple[EventKind, ...]] = get_args(EventKind)

#: The reasons the add-on closes a spider with (:data:`CLOSE_REASON_MEANINGS`): ``polite_deferred``
#: (everything left is deferred beyond ``POLITE_MAX_IDLE_WAIT``), ``polite_stranded`` (held requests nothing will
#: wake), ``polite_store_error`` (the pace table stayed unreachable), ``polite_resolver_missing`` (address
#: filtering is on but the resolver is not ours).
CloseReason = Literal["polite_deferred", "polite_stranded", "polite_store_error", "polite_resolver_missing"]
#: Every close reason, in order.
CLOSE_REASONS: Final[tuple[CloseReason, ...]] = get_args(CloseReason)
#: The close reasons of a crawl the add-on stopped as failed: ``scrapy crawl`` exits with status 1 (§7).
FAILED_CLOSE_REASONS: Final[frozenset[CloseReason]] = frozenset({"polite_store_error", "polite_resolver_missing"})
#: What each close reason means, for the reference (every reason of
#: :data:`~scrapy_polite.vocabulary.CLOSE_REASONS`, in its order).
CLOSE_REASON_MEANINGS: Final[Mapping[CloseReason, str]] = MappingProxyType({
    "polite_deferred": "everything left was deferred beyond `POLITE_MAX_IDLE_WAIT`; the log lists each host and "
                       "when it is due",
    "polite_stranded": "held requests waited for lines that nothing in the downloader would free (a defect; the "
                       "log names them, `polite/stranded` counts it)",
    "polite_store_error": "the pace table could not be read or written (a Redis outage longer than "
                          "`POLITE_STORE_TIMEOUT` is one): without it the crawl cannot be paced",
    "polite_resolver_missing": "address filtering is on but the process's DNS resolver is not scrapy-polite's "
                               "(the add-on was not enabled in the project settings)",
})


# -- durations ----------------------------------------------------------------------------------------------


def parse_seconds(value: object) -> float | None:
    """``value`` as a duration: a finite number of seconds ``>= 0``, or None when it is not one.

    The one reading of every duration a user or a server gives (settings, ``meta['polite_delay']``, a spider's
    ``crawl_delay``, the ``@polite_delay`` contract, ``scrapy polite crawl-delay``, a robots.txt delay): what
    ``float()`` reads — an int, a float, a numeric string such as ``"5"``, ``" 2.5 "`` or ``"1e3"`` — that is
    finite (not NaN, not infinite) and not negative. A bool is none, though ``float()`` and Scrapy's ``getfloat``
    read it as 1 or 0: ``POLITE_HOST_INTERVAL = False`` would silently unpace every host.
    Every duration is in seconds (docs/spec.md §2, Scrapy's ``DOWNLOAD_DELAY`` convention). Never raises: the
    caller decides what a bad value means (a :class:`~scrapy_polite.settings.SettingsError` for a setting, a
    counted and logged fallback for a request's meta).

    Args:
        value: anything.

    Returns:
        the seconds as a float, or None.

    >>> parse_seconds("2.5"), parse_seconds(0), parse_seconds(-1), parse_seconds("nan"), parse_seconds("soon")
    (2.5, 0.0, None, None, None)
    """
    if isinstance(value, bool):
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]  # anything float() refuses is not a duration
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
