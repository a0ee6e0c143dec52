"""Contracts for ``scrapy check`` (docs/guides/contracts.md): a spider states how politely it crawls, and
``scrapy check`` asserts it on a real request.

The add-on registers them in ``SPIDER_CONTRACTS`` (``ADDONS = {"scrapy_polite.Addon": 0}`` in the project
settings is enough)::

    def parse(self, response):
        \"\"\"A search page.

        @url https://example.com/search?q=scrapy
        @polite_delay 5
        @public_only
        @paced_requests
        \"\"\"

* ``@polite_delay SECONDS`` — the ``@url``'s host is paced at an interval of at least ``SECONDS`` for this
  spider: ``max(POLITE_HOST_INTERVAL, the host's Crawl-delay, POLITE_HOST_DELAYS, the spider's
  crawl_delay, meta['polite_delay'])`` as the pacer computes it for the request (docs/spec.md §2), read
  after the response, so a robots.txt fetched first (``ROBOTSTXT_OBEY = True``) counts. The failure gives
  the actual interval and where it comes from.
* ``@public_only`` — the ``@url``'s host resolved to at least one address the crawl may contact, and the
  response came from such an address (the booked one). Fails with ``POLITE_ALLOW_PRIVATE = True``, through
  a proxy, or for a response without an address (the HTTP cache). A host with only non-public addresses
  never gets a response: the check then reports the refusal (``BlockedHost``) as an error.
* ``@paced_requests`` — every request the callback returns is paced (none with ``meta['dont_pace']``),
  has a host, and none targets an IP literal the crawl may not contact (non-public, outside
  ``POLITE_ALLOWED_NETWORKS``).

A contract request still held (deferred) when the check ends — its host in backoff, or due after
``POLITE_MAX_IDLE_WAIT`` — fails the check (:class:`ContractRequestDeferred`) instead of passing silently.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.contracts import Contract
from scrapy.exceptions import ContractFail
from twisted.python.failure import Failure

from .network.addresses import parse_ip_literal
from .pacer import Pacer, find_pacer
from .policy import NO_NETWORK_SCHEMES, host_key
from .reports.summary import reason_words, reset_command
from .reports.words import format_due
from .vocabulary import DELAY_META, DONT_PACE_META, HOST_META, IP_META, parse_seconds

if TYPE_CHECKING:
    from scrapy.http import Response

__all__ = [
    "ContractRequestDeferred",
    "PacedRequestsContract",
    "PoliteDelayContract",
    "PublicOnlyContract",
    "fail_held_contract_requests",
    "interval_sources",
]


class ContractRequestDeferred(Exception):
    """A ``scrapy check`` contract request was still held (deferred) when the check ended: its callback,
    and so its contracts, never ran."""


def _pacer(method: Callable[..., Any]) -> Pacer:
    spider = getattr(method, "__self__", None)
    crawler = getattr(spider, "crawler", None)
    pacer = find_pacer(crawler) if crawler is not None else None
    if pacer is None:
        raise ContractFail("scrapy-polite is not enabled for this spider: add ADDONS = "
                           "{'scrapy_polite.Addon': 0} to the project settings (and POLITE_ENABLED = True)")
    return pacer


def interval_sources(pacer: Pacer, host: str, request: Request) -> list[tuple[float, str]]:
    """Every setting, attribute or row that gives ``host`` an interval for ``request``, as ``(seconds,
    where it comes from)``; their maximum is the interval the pacer applies (docs/spec.md §2)."""
    sources = [(pacer.policy.host_interval, "POLITE_HOST_INTERVAL")]
    counters = pacer.report.hosts.get(host)
    state = counters.state if counters is not None else None
    if state is not None and state.crawl_delay > 0:
        if counters is not None and counters.crawl_delay == state.crawl_delay:
            sources.append((state.crawl_delay, "the Crawl-delay of its robots.txt"))
        else:
            sources.append((state.crawl_delay, "its Crawl-delay in the pace table"))
    per_host = pacer.config.host_delays.get(host)
    if per_host is not None:
        sources.append((per_host, f"POLITE_HOST_DELAYS[{host!r}]"))
    if pacer.booker.spider_delay is not None:
        sources.append((pacer.booker.spider_delay, "the spider's crawl_delay"))
    raw = request.meta.get(DELAY_META)
    value = parse_seconds(raw) if raw is not None else None
    if value is not None:
        sources.append((value, "meta['polite_delay']"))
    return sources


class _PoliteContract(Contract):
    """Keeps the callback, to find the crawler's pacer."""

    def __init__(self, method: Callable[..., Any], *args: Any) -> None:
        super().__init__(method, *args)
        self.method = method


class PoliteDelayContract(_PoliteContract):
    """``@polite_delay SECONDS``: the ``@url``'s host is paced at an interval of at least SECONDS.

    Raises:
        ValueError: SECONDS is missing or not a number >= 0 (the check reports it as an error).
    """

    name = "polite_delay"

    def __init__(self, method: Callable[..., Any], *args: Any) -> None:
        super().__init__(method, *args)
        seconds = parse_seconds(args[0]) if args else None
        if seconds is None:
            raise ValueError(f"@polite_delay needs a number of seconds >= 0, e.g. '@polite_delay 5', got "
                             f"{' '.join(map(str, args))!r}")
        self.seconds = seconds

    def pre_process(self, response: Response) -> None:
        pacer = _pacer(self.method)
        request = response.request
        if request is None:
            raise ContractFail("the response has no request")
        host = request.meta.get(HOST_META) or host_key(response.url)
        if request.meta.get(DONT_PACE_META):
            raise ContractFail(f"{response.url} was not paced: the request has meta['dont_pace']")
        if host is None:
            raise ContractFail(f"{response.url} has no host to pace")
        sources = interval_sources(pacer, host, request)
        actual = pacer.effective_interval(host, request)
        if actual + 1e-9 >= self.seconds:
            return
        where = " and ".join(source for seconds, source in sources if seconds == actual)
        others = ", ".join(f"{source} {seconds:g} s" for seconds, source in sources if seconds != actual)
        robots = "" if pacer.crawler.settings.getbool("ROBOTSTXT_OBEY") else (
            "; its robots.txt was not read (ROBOTSTXT_OBEY = False)")
        raise ContractFail(
            f"{host} is paced at an interval of {actual:g} s (from {where}{'; also ' + others if others else ''}"
            f"{robots}), less than {self.seconds:g} s. Fix: crawl_delay = {self.seconds:g} on the spider, "
            f"POLITE_HOST_DELAYS = {{{host!r}: {self.seconds:g}}}, or meta['polite_delay']")


class PublicOnlyContract(_PoliteContract):
    """``@public_only``: the ``@url``'s host resolved to an address the crawl may contact, and only such an
    address was used."""

    name = "public_only"

    def pre_process(self, response: Response) -> None:
        pacer = _pacer(self.method)
        rules = pacer.config.address_filter
        if rules.allow_private:
            raise ContractFail("POLITE_ALLOW_PRIVATE = True lets the crawl contact any address, so it is not "
                               "public-only. Fix: remove POLITE_ALLOW_PRIVATE (allow only the networks you need "
                               "with POLITE_ALLOWED_NETWORKS)")
        request = response.request
        if request is not None and request.meta.get("proxy"):
            raise ContractFail(f"{response.url} was fetched through a proxy (meta['proxy']), which resolves it: "
                               "its addresses were not checked")
        address = response.ip_address
        if address is None:
            raise ContractFail(f"the response of {response.url} has no address (a cached response?): nothing "
                               "shows which address was contacted. Fix: HTTPCACHE_ENABLED = False for the check")
        if not rules.allows(str(address)):
            raise ContractFail(f"{response.url} was fetched from {address}, which the crawl may not contact "
                               f"({rules!r})")
        booked = request.meta.get(IP_META) if request is not None else None
        if booked is not None and str(address) != booked:
            raise ContractFail(f"{response.url} was fetched from {address}, not from the address it was booked "
                               f"and pinned on ({booked})")


class PacedRequestsContract(_PoliteContract):
    """``@paced_requests``: every request the callback returns is paced and has a host the crawl may
    contact (no ``dont_pace``, no non-public IP literal)."""

    name = "paced_requests"

    def post_process(self, output: list[Any]) -> None:
        pacer = _pacer(self.method)
        rules = pacer.config.address_filter
        bad: list[str] = []
        for item in output:
            if not isinstance(item, Request):
                continue
            if item.meta.get(DONT_PACE_META):
                bad.append(f"{item.url} has meta['dont_pace'] (not paced)")
                continue
            host = host_key(item.url)
            if host is None:
                scheme = item.url.partition(":")[0].lower()
                if scheme not in NO_NETWORK_SCHEMES:
                    bad.append(f"{item.url} has no host (refused)")
                continue
            literal = parse_ip_literal(host)
            if literal is not None and not rules.allows(literal):
                bad.append(f"{item.url} targets the non-public address {literal}")
        if bad:
            shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise ContractFail(f"{len(bad)} of the requests returned are not paced or not public: {shown}")


def is_check_run() -> bool:
    """``scrapy check`` is running (it sets ``SCRAPY_CHECK``, as Scrapy documents)."""
    return bool(os.environ.get("SCRAPY_CHECK"))


def fail_held_contract_requests(held: Iterable[Request], due_of: Callable[[str], float | None],
                                 pacer: Pacer) -> int:
    """In a ``scrapy check`` run, fail each contract request still held at close: its errback (the check's)
    gets a :class:`ContractRequestDeferred` saying which host it waited for, why and until when. Returns how
    many were failed (0 outside ``scrapy check``).

    Args:
        held: the requests still held.
        due_of: a host's due time (this process's epoch s; None or ``inf``: when its line frees).
        pacer: the crawler's pacer (why the host is deferred).
    """
    if not is_check_run():
        return 0
    now = pacer.clock()
    failed = 0
    for request in held:
        errback = request.errback
        host = request.meta.get(HOST_META) or host_key(request.url)
        if errback is None or host is None:
            continue
        due = due_of(host)
        counters = pacer.report.hosts.get(host)
        if counters is not None and counters.in_backoff(now):
            why = f"is backing off after {counters.throttle_cause or 'a throttle'}"
        elif counters is not None and counters.slowed_deferrals:
            why = "is deferred for " + ", ".join(reason_words(r) for r in counters.slowed_deferrals)
        else:
            why = "was waiting for its turn"
        when = "" if due is None or due == math.inf else f", due {format_due(due, now)}"
        exc = ContractRequestDeferred(
            f"{request.url} was still deferred when the check ended, so its contracts were not checked: {host} "
            f"{why}{when}. Check again once it is due, raise POLITE_MAX_IDLE_WAIT, or forget the backoff with "
            f"`{reset_command([host])}`")
        errback(Failure(exc))  # type: ignore[no-untyped-call]  # Twisted does not annotate Failure()
        failed += 1
    return failed
