"""The robots.txt lifecycle of RFC 9309 (docs/spec.md §5, "The robots.txt lifecycle"): Scrapy's
``RobotsTxtMiddleware``, extended.

The add-on installs :class:`PoliteRobotsTxtMiddleware` in place of Scrapy's (same priority, 100), so users keep
``ROBOTSTXT_OBEY``, ``ROBOTSTXT_PARSER`` and ``ROBOTSTXT_USER_AGENT``. Per origin (scheme, host and port) it keeps
a :class:`~scrapy_polite.policy.robots.RobotsState` and does what the pure
:func:`~scrapy_polite.policy.robots.decide` says:

* **2xx**: the rules apply for 24 hours (§2.4), then robots.txt is asked again and the new rules and Crawl-delay
  apply (``polite/robots/expired``);
* **4xx** but 429: "unavailable", everything allowed (§2.3.1.3), for 24 hours too (``polite/robots/unavailable``);
* **5xx, 429, a network error, a timeout**: "unreachable", everything disallowed (§2.3.1.4): the origin's
  requests are **held** by :class:`~scrapy_polite.scheduler.PoliteScheduler` (deferral reason
  ``robots_unreachable``), not dropped, and robots.txt is asked again when the host's backoff ends (the pace
  table's, ``Retry-After`` honoured; :func:`~scrapy_polite.policy.robots.reask_floor` for 5xx the table does not count
  as throttles); its answer then applies to the held requests. A request the scheduler cannot hold waits. A
  robots.txt unreachable for longer than ``POLITE_MAX_IDLE_WAIT`` ends like deferred requests do (the idle
  check closes the spider ``polite_deferred``; a waiting request is dropped, ``polite/robots/given_up``). A
  re-ask after 24 hours that finds robots.txt unreachable keeps the rules read before (§2.4);
* up to :data:`~scrapy_polite.policy.robots.ROBOTS_MAX_REDIRECTS` redirects are followed (§2.3.1.2), across hosts: each
  hop is a request to its own host, booked and paced there; the robots.txt reached is the original origin's;
* the first :data:`~scrapy_polite.policy.robots.ROBOTS_MAX_BYTES` are parsed (§2.5).

robots.txt requests are not retried by Scrapy's ``RetryMiddleware`` (``dont_retry``) nor redirected by its
``RedirectMiddleware`` (``dont_redirect``): the re-asks at the host's backoff replace Scrapy's immediate retries,
and the redirects are followed here, whatever ``REDIRECT_ENABLED`` / ``REDIRECT_MAX_TIMES`` say.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from scrapy import signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Request
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler
from twisted.internet.defer import Deferred

from .addon import CacheAnswers, cache_answers
from .crawl.reactor import await_deferred
from .crawl.seams import Closing
from .middleware import defer_early, hold_request, stopped_error
from .pacer import CrawlStopped, Pacer, get_pacer
from .policy import host_key, origin_of
from .policy.robots import (
    ALLOW_ALL,
    ROBOTS_MAX_BYTES,
    ROBOTS_MAX_REDIRECTS,
    Answer,
    Apply,
    Fetch,
    Hold,
    RobotsState,
    Rules,
    Wait,
    answered,
    classify_status,
    decide,
    fetching,
    reask_floor,
    truncate,
    with_protego,
)
from .resolver import HostNotFound, InvalidHostName
from .settings import polite_enabled
from .stores import StoreError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

__all__ = ["PoliteRobotsTxtMiddleware", "answer_of_failure"]

#: Request meta of every robots.txt request: not judged by robots.txt, not retried by ``RetryMiddleware`` (the
#: re-ask at the host's backoff replaces that), not redirected by ``RedirectMiddleware`` (followed here).
_ROBOTS_META = {"dont_obey_robotstxt": True, "dont_retry": True, "dont_redirect": True}


def answer_of_failure(exc: BaseException) -> Answer:
    """A robots.txt download that failed, classified: no request reached a server (``IgnoreRequest``: refused like
    its pages would be; NXDOMAIN or an invalid host name) → ``none``; anything else (a
    refused, reset or timed-out connection, a DNS server failure, a TLS error) → ``unreachable`` (RFC 9309
    §2.3.1.4: "server or network errors")."""
    if isinstance(exc, (IgnoreRequest, HostNotFound, InvalidHostName)):
        return Answer("none", cause=type(exc).__name__)
    return Answer("unreachable", cause=type(exc).__name__)


class PoliteRobotsTxtMiddleware(RobotsTxtMiddleware):
    """Scrapy's ``RobotsTxtMiddleware`` with the robots.txt lifecycle of RFC 9309 (module docstring).

    Raises:
        NotConfigured: ``ROBOTSTXT_OBEY`` is False (Scrapy's rule).

    Attributes:
        clock: the clock of the rules' ages and re-ask times (seconds; None: the pacer's process clock). Tests
            inject one (a subclass setting it) to age rules by 24 hours without waiting.
    """

    clock: Callable[[], float] | None = None

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        #: None with ``POLITE_ENABLED = False``: Scrapy's own behaviour.
        self.pacer: Pacer | None = get_pacer(crawler) if polite_enabled(crawler.settings) else None
        self._states: dict[str, RobotsState] = {}
        #: origin → the host key its held requests are held under (for the report).
        self._hosts: dict[str, str] = {}
        self._waiters: dict[str, list[Deferred[Rules | None]]] = {}
        maxsize = crawler.settings.getint("DOWNLOAD_MAXSIZE")
        #: A robots.txt is downloaded up to at least ROBOTS_MAX_BYTES whatever DOWNLOAD_MAXSIZE says (0: no limit).
        self._maxsize = 0 if maxsize <= 0 else max(maxsize, ROBOTS_MAX_BYTES)
        #: Whether the HTTP cache answers a request (:func:`~scrapy_polite.addon.cache_answers`), found at the
        #: first request (the downloader's middlewares are built by then); None: it may not be asked.
        self._cache_answers: CacheAnswers | None = None
        self._cache_found = False

    def _now(self) -> float:
        assert self.pacer is not None
        return (self.clock or self.pacer.clock)()

    def _offset(self) -> float:
        """This middleware's clock minus the pacer's (0 unless a test injected a clock)."""
        assert self.pacer is not None
        return 0.0 if self.clock is None else self.clock() - self.pacer.clock()

    async def process_request(self, request: Request) -> Request | None:  # type: ignore[override]
        pacer = self.pacer
        if pacer is None:
            await super().process_request(request)
            return None
        if request.meta.get("dont_obey_robotstxt") or request.url.startswith(("data:", "file:")):
            return None
        origin = origin_of(urlparse_cached(request))
        host = host_key(request.url)
        early = True  # the early deferral is still to be decided (once per pass)
        while True:
            now = self._now()
            action = decide(self._states.get(origin), now)
            if isinstance(action, Apply):
                self.process_request_2(action.rules.parser, request)  # IgnoreRequest when disallowed
                return None
            if early and isinstance(action, (Fetch, Wait)):
                early = False
                # The early deferral (docs/spec.md §5): a host that should defer is held, its robots.txt not asked;
                # unless the HTTP cache answers both: then neither is a request to the host.
                if await defer_early(pacer, request, host, unless=lambda: self._cached(request, origin)):
                    return request  # the engine hands it back to the scheduler, which holds it until due
                continue  # decided again: another request may have asked robots.txt during the read
            if isinstance(action, Fetch):
                self._start(origin, host, request, expired=action.expired)
                continue
            if isinstance(action, Wait):
                waiter: Deferred[Rules | None] = Deferred()
                self._waiters.setdefault(origin, []).append(waiter)
                try:
                    rules = await maybe_deferred_to_future(waiter)
                except CrawlStopped as exc:  # the close cut robots.txt's request short: held (JOBDIR keeps it), or
                    if host is None or pacer.failed is not None or not pacer.booker.can_defer(request):  # not sent
                        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc  # (Closing: counted)
                        raise stopped_error(request, cause, pacer.report) from exc
                    due = pacer.booker.defer(host, pacer.clock(), "turn", request).due
                    hold_request(pacer, request, host, due, reason="turn")
                    return request
                if rules is not None:  # an answer that taught nothing: the requests that waited for it go on
                    self.process_request_2(rules.parser, request)
                    return None
                continue
            assert isinstance(action, Hold)
            if host is not None and pacer.failed is None and pacer.booker.can_defer(request):
                due = action.until - self._offset()
                pacer.booker.defer(host, due, "robots_unreachable", request)
                hold_request(pacer, request, host, due)
                return request  # the engine hands it back to the scheduler, which holds it until due
            # Not from our scheduler: it waits, as a request that cannot be deferred waits for its host's turn.
            limit = pacer.config.max_idle_wait
            if now - action.since > limit:
                pacer.report.inc("robots/given_up")
                raise IgnoreRequest(f"scrapy-polite: the robots.txt of {origin} has been unreachable for longer than "
                                    f"POLITE_MAX_IDLE_WAIT={limit:g} s; {request} was not sent")
            until = min(action.until, action.since + limit + 0.001)
            try:
                await await_deferred(pacer.booker.sleep(max(0.0, until - now)))
            except Closing as exc:
                raise stopped_error(request, exc, pacer.report) from exc

    def _cached(self, request: Request, origin: str) -> bool:
        """Whether the HTTP cache answers ``request`` and its origin's robots.txt request too, with a fresh answer
        :meth:`_read` takes as it is (not a stored error it asks past the cache, nor a redirect): the page is then not
        held for its host's turn, as a page the cache answers never is (docs/spec.md §5; trial H: a crawl the cache
        answered whole waited 55 s for a host's backoff, its pages held for robots.txt). Asked only for a page that
        would be held (two reads of the cache's storage)."""
        if not self._cache_found:
            self._cache_answers, self._cache_found = cache_answers(self.crawler), True
        answers = self._cache_answers
        return answers is not None and answers(request) and answers(
            self._robots_request(f"{origin}/robots.txt"),
            lambda cached: classify_status(cached.status) != "unreachable" and _location(cached) is None)

    def _robots_request(self, url: str) -> Request:
        """The request of the robots.txt at ``url``: never itself obeying robots.txt, retried nor redirected."""
        meta: dict[str, Any] = dict(_ROBOTS_META)
        if self._maxsize:
            meta["download_maxsize"] = self._maxsize
        return Request(url, priority=self.DOWNLOAD_PRIORITY, meta=meta, callback=NO_CALLBACK)

    # -- asking robots.txt --------------------------------------------------------------------------------------

    def _start(self, origin: str, host: str | None, request: Request, *, expired: bool) -> None:
        """Ask the origin's robots.txt now, on behalf of ``request``: the state is ``fetching`` until it answers."""
        assert self.pacer is not None
        previous = self._states.get(origin)
        self._states[origin] = fetching(previous)
        if host is not None:
            self._hosts[origin] = host
        if expired:
            self.pacer.report.inc("robots/expired")
            logger.info("scrapy-polite: the robots.txt of %s was read more than 24 hours ago: asking it again "
                        "(RFC 9309 §2.4)", origin)
        d = deferred_from_coro(self._ask(origin, request, previous))
        d.addErrback(lambda failure: logger.error("scrapy-polite: could not read the robots.txt of %s", origin,
                                                  exc_info=failure.value))

    async def _ask(self, origin: str, request: Request, previous: RobotsState | None = None) -> None:
        """Fetch the origin's robots.txt, move its state, wake the requests waiting for it. ``previous``: its state
        before this fetch, put back when the request was not sent (the next request asks again)."""
        assert self.pacer is not None
        before = self._states.get(origin)
        # Should reading fail unexpectedly (logged by the caller), the origin stays unreachable for an interval.
        state: RobotsState | None = answered(before, Answer("unreachable", cause="error"), self._now(),
                                             self._now() + self.pacer.policy.host_interval)
        waiters_get: Rules | None = None
        stopped: CrawlStopped | None = None
        try:
            answer, hosts = await self._read(origin)
            now = self._now()
            retry_at = now
            if answer.kind == "unreachable":
                failures = (before.failures if before is not None else 0) + 1
                retry_at = await self._retry_at(hosts, failures, now)
            elif answer.kind in ("parsed", "unavailable"):
                # The delay is recorded before any waiting request goes on (it is booked after it).
                parser = answer.rules.parser if answer.rules is not None and answer.rules.parser is not None \
                    else build_from_crawler(self._parserimpl, self.crawler, b"")
                await _send_robots_parsed(self.crawler, parser, request)
            else:
                waiters_get = ALLOW_ALL
            state = answered(before, answer, now, retry_at)
            self._report(origin, before, state, answer, now)
        except CrawlStopped as exc:  # not sent (the crawl's close, or its stop): nothing learnt, nothing allowed
            state, stopped = previous, exc  # (not ``before``, which is ``fetching``: nothing would end it)
        finally:
            if state is None:
                self._states.pop(origin, None)
            else:
                self._states[origin] = state
            for waiter in self._waiters.pop(origin, []):
                if stopped is not None:
                    waiter.errback(stopped)
                else:
                    waiter.callback(waiters_get)

    async def _read(self, origin: str) -> tuple[Answer, list[str]]:
        """Download the origin's robots.txt, following up to ROBOTS_MAX_REDIRECTS redirects; its answer and the
        hosts its requests went to."""
        assert self.pacer is not None
        stats = self._stats
        url = f"{origin}/robots.txt"
        hosts: list[str] = []
        for hop in range(ROBOTS_MAX_REDIRECTS + 1):
            host = host_key(url)
            if host is not None:
                hosts.append(host)
            robots_request = self._robots_request(url)
            stats.inc_value("robotstxt/request_count")
            try:
                response = await _download(self.crawler, robots_request)
                if _stored_error(robots_request, response):  # not the server's answer now: asked past the HTTP cache
                    stats.inc_value("robotstxt/request_count")
                    response = await _download(self.crawler, robots_request.replace(
                        meta={**robots_request.meta, "dont_cache": True}))
            except CrawlStopped:
                raise  # not sent: not an answer (_ask)
            except Exception as exc:
                if not isinstance(exc, IgnoreRequest):
                    stats.inc_value(f"robotstxt/exception_count/{type(exc)}")
                return answer_of_failure(exc), hosts
            stats.inc_value("robotstxt/response_count")
            stats.inc_value(f"robotstxt/response_status_count/{response.status}")
            location = _location(response)
            if location is None or hop == ROBOTS_MAX_REDIRECTS:
                return self._answer(response, redirected_too_often=location is not None), hosts
            self.pacer.report.inc("robots/redirects")
            url = location
        raise AssertionError("unreachable")  # pragma: no cover

    def _answer(self, response: Response, *, redirected_too_often: bool) -> Answer:
        kind = classify_status(response.status)
        if kind != "parsed":
            if redirected_too_often:
                logger.info("scrapy-polite: robots.txt redirected more than %d times (last %s): unavailable, "
                            "everything allowed (RFC 9309 §2.3.1.2)", ROBOTS_MAX_REDIRECTS, response.url)
            return Answer(kind, rules=ALLOW_ALL if kind == "unavailable" else None, cause=str(response.status))
        body = truncate(response.body)
        if len(body) < len(response.body):
            assert self.pacer is not None
            self.pacer.report.inc("robots/truncated")
            logger.info("scrapy-polite: %s is %d bytes: only the first %d are parsed (RFC 9309 §2.5)", response.url,
                        len(response.body), len(body))
        parser = build_from_crawler(self._parserimpl, self.crawler, body)
        return Answer("parsed", rules=Rules(with_protego(parser, body)))

    async def _retry_at(self, hosts: list[str], failures: int, now: float) -> float:
        """When an unreachable robots.txt is asked again (this middleware's clock): when every host its requests
        went to is due in the pace table (its backoff, ``Retry-After`` included), and no sooner than
        :func:`~scrapy_polite.policy.robots.reask_floor` after ``now``."""
        pacer = self.pacer
        assert pacer is not None
        at = now + reask_floor(failures, pacer.policy.host_interval, pacer.policy.max_backoff)
        for host in hosts:
            try:
                due = await pacer.booker.due(host)
            except StoreError:
                continue  # the crawl is being stopped (logged once); the floor is enough for what is left of it
            at = max(at, due + self._offset())
        return at

    def _report(self, origin: str, before: RobotsState | None, state: RobotsState | None, answer: Answer,
                now: float) -> None:
        """Count, log and tell the report what an answer did (``before``: the state while it was asked)."""
        pacer = self.pacer
        assert pacer is not None
        host = self._hosts.get(origin)
        if answer.kind == "unreachable" and state is not None:
            pacer.report.inc("robots/unreachable")
            wait = state.retry_at - now
            if state.rules is not None:
                logger.info("scrapy-polite: the robots.txt of %s is unreachable (%s): keeping the rules read before "
                            "(RFC 9309 §2.4), asking again in %.1f s", origin, answer.cause, wait)
            elif state.failures == 1:
                logger.warning("scrapy-polite: the robots.txt of %s is unreachable (%s): its requests are held until "
                               "it answers (RFC 9309 §2.3.1.4); asking again in %.1f s", origin, answer.cause, wait)
            else:
                logger.info("scrapy-polite: the robots.txt of %s is still unreachable (%s, %d answers in %.1f s): "
                            "asking again in %.1f s", origin, answer.cause, state.failures,
                            now - (state.since if state.since is not None else now), wait)
            if host is not None and state.holds and state.since is not None:
                pacer.report.robots_unreachable(host, state.since - self._offset(), answer.cause)
            return
        if answer.kind == "unavailable":
            pacer.report.inc("robots/unavailable")
        if before is not None and before.since is not None:
            logger.info("scrapy-polite: the robots.txt of %s answered (%s) after %.1f s unreachable: it now decides "
                        "the requests held for it", origin, answer.cause or "2xx", now - before.since)
        if host is not None:
            pacer.report.robots_unreachable(host, None)


def _location(response: Response) -> str | None:
    """The absolute http(s) URL a redirect response points to, or None (not a redirect, or not to http(s))."""
    if response.status not in (301, 302, 303, 307, 308):
        return None
    raw = response.headers.get(b"Location")
    if not raw:
        return None
    target = urljoin(response.url, raw.decode("latin-1").strip())
    return target if urlsplit(target).scheme in ("http", "https") else None


def _stored_error(request: Request, response: Response) -> bool:
    """``response`` is a 5xx or 429 answer of robots.txt that the HTTP cache kept and answered ``request`` with, the
    server not asked (trial: with the cache on, the 503 it stored was every re-ask's answer: the host was held for
    ever, run after run). Not a stale entry the cache sent a request to revalidate (``meta['cached_response']``), which
    it returns when the server answers 5xx: the server was asked."""
    return "cached" in response.flags and classify_status(response.status) == "unreachable" \
        and "cached_response" not in request.meta


async def _download(crawler: Crawler, request: Request) -> Response:
    """``crawler.engine.download_async(request)`` (Scrapy ≥ 2.19: its ``download`` returns a Deferred)."""
    engine = crawler.engine
    assert engine is not None
    download_async = getattr(engine, "download_async", None)
    if download_async is not None:
        return await download_async(request)  # type: ignore[no-any-return]
    return await maybe_deferred_to_future(engine.download(request))


async def _send_robots_parsed(crawler: Crawler, parser: Any, request: Request) -> None:
    """Send ``robots_parsed`` as Scrapy's middleware does (the extension records the delay), and wait for it."""
    send = getattr(crawler.signals, "send_catch_log_async", None)
    if send is not None:
        await send(signal=signals.robots_parsed, robotparser=parser, request=request)
    else:  # pragma: no cover - older Scrapy
        await maybe_deferred_to_future(crawler.signals.send_catch_log_deferred(
            signal=signals.robots_parsed, robotparser=parser, request=request))
