"""robots.txt: the delay it asks of a user agent, read with Protego (the parser Scrapy uses), and the lifecycle of
RFC 9309 as a pure state machine per origin (:func:`decide`, :func:`answered`; docs/spec.md §5, "The robots.txt
lifecycle").

``Crawl-delay`` is not in RFC 9309; it is the de-facto extension every major crawler honours, and
``Request-rate: n/s`` means one request every ``s/n`` seconds. When a group has both, the slower one
applies (both are limits the site published).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Final, Literal

from protego import Protego

from ..vocabulary import parse_seconds

__all__ = [
    "ALLOW_ALL",
    "Action",
    "Answer",
    "Apply",
    "Fetch",
    "Hold",
    "ROBOTS_MAX_BYTES",
    "ROBOTS_MAX_REDIRECTS",
    "ROBOTS_TTL",
    "RobotsState",
    "Rules",
    "Wait",
    "answered",
    "classify_status",
    "decide",
    "fetching",
    "OPERATOR",
    "ORIGINS_KEPT",
    "RESTORED",
    "current_entries",
    "entry_name",
    "in_force",
    "merge_origin_delays",
    "parse_robots_delay",
    "published_delays",
    "reask_floor",
    "robots_delay",
    "with_protego",
    "with_operator_delay",
    "with_origin_delay",
    "truncate",
]


#: Where the add-on's robots.txt middleware keeps, beside a Scrapy ``RobotParser`` not built on Protego
#: (``ROBOTSTXT_PARSER``: urllib's ``PythonRobotParser`` reads only whole-second delays, no ``Request-rate``), a
#: Protego parse of the same body, from which :func:`robots_delay` reads the delay (docs/spec.md §5).
PROTEGO_ATTR = "_polite_protego"


def with_protego(parser: Any, body: bytes) -> Any:
    """``parser`` (a Scrapy ``RobotParser`` of ``body``), with a Protego parse of ``body`` kept beside it under
    :data:`PROTEGO_ATTR` when it is not Protego's own: the delay is read the same whatever parses the rules."""
    if not isinstance(getattr(parser, "rp", None), Protego) and hasattr(parser, "__dict__"):
        vars(parser)[PROTEGO_ATTR] = Protego.parse(body.decode("utf-8-sig", errors="replace"))
    return parser


def robots_delay(parser: Any, user_agent: str) -> float | None:
    """The delay (seconds) a parsed robots.txt asks of ``user_agent``.

    Args:
        parser: a ``protego.Protego`` instance, or Scrapy's ``ProtegoRobotParser`` (whose ``rp`` is one), or a
            Scrapy ``RobotParser`` with a Protego parse beside it (:func:`with_protego`), or any other with
            ``crawl_delay(user_agent)`` (then ``Request-rate`` is not available and only ``Crawl-delay`` counts).
        user_agent: the crawler's user agent (Protego matches its product token).

    Returns:
        ``max(crawl_delay, seconds / requests)`` over what the matching group publishes, or None when it
        publishes neither (or only malformed values, which Protego already discards).
    """
    rp = getattr(parser, PROTEGO_ATTR, None)
    if rp is None:
        rp = getattr(parser, "rp", parser)
    delays: list[float] = []
    crawl_delay = _call(rp, "crawl_delay", user_agent)
    if crawl_delay is not None:
        delays.append(float(crawl_delay))
    rate = _call(rp, "request_rate", user_agent)
    if rate is not None:
        requests, seconds = getattr(rate, "requests", None), getattr(rate, "seconds", None)
        if requests and seconds is not None and requests > 0:
            delays.append(float(seconds) / float(requests))
    valid = [d for d in map(parse_seconds, delays) if d is not None]
    return max(valid) if valid else None


def parse_robots_delay(body: str | bytes, user_agent: str) -> float | None:
    """Parse a robots.txt body with Protego and return :func:`robots_delay` for ``user_agent``.

    Undecodable bytes are replaced (robots.txt is UTF-8 by RFC 9309 §2.3); never raises on content.
    """
    if isinstance(body, bytes):
        body = body.decode("utf-8-sig", errors="replace")  # (a byte order mark is no part of the first line)
    return robots_delay(Protego.parse(body.removeprefix("\ufeff")), user_agent)


def _call(rp: Any, name: str, user_agent: str) -> Any:
    method = getattr(rp, name, None)
    if method is None:
        return None
    return method(user_agent)


# -- the delays of a host's origins, in its row (docs/spec.md §2, "A host's origins") --------------------------------

#: The most entries a row keeps: beyond them, the smallest delays are dropped (never the operator's, nor the largest,
#: the ones in force), so a page that links to a host on thousands of ports grows no row.
ORIGINS_KEPT: Final = 16
#: The name of an operator's delay among a row's entries (``scrapy polite crawl-delay``).
OPERATOR: Final = "operator"
#: The name of the delay a row written back after the table came back empty keeps when its origins' entries do not make
#: it (:func:`merge_origin_delays`): in force as an operator's is, until the next robots.txt read of the host.
RESTORED: Final = "restored"
#: The entries no robots.txt published, in force whatever the others say (the operator's first).
_SET_BY_HAND: Final = (OPERATOR, RESTORED)


def published_delays(text: str) -> dict[str, float]:
    """The entries of a host's row (``HostState.origin_delays``: a JSON object, ``"<origin> <user agent>"`` → seconds
    > 0, :data:`OPERATOR` and :data:`RESTORED` → seconds ≥ 0; ``""``: none). An entry that is no such number, or a
    value that is no such object (a row edited by hand), reads as none."""
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(parsed, dict):
        return {}
    entries: dict[str, float] = {}
    for name, delay in parsed.items():
        if type(delay) in (int, float):
            seconds = parse_seconds(delay)
            if seconds is not None and (seconds > 0 or name in _SET_BY_HAND):
                entries[name] = seconds
    return entries


def entry_name(origin: str, user_agent: str) -> str:
    """The name of the entry a robots.txt read for ``user_agent`` at ``origin`` (``scheme://host[:port]``, one
    spelling: :func:`~scrapy_polite.policy.keys.origin_key`) keeps: each user agent has its own group."""
    return f"{origin} {user_agent}"


def in_force(entries: dict[str, float]) -> float:
    """The delay a row's entries make: the operator's, when there is one, else the restored one, else the largest (0:
    none)."""
    for name in _SET_BY_HAND:
        if name in entries:
            return entries[name]
    return max(entries.values(), default=0.0)


def current_entries(text: str, crawl_delay: float) -> str:
    """A row's entries if they made its ``crawl_delay`` (:func:`in_force`), else none: a row whose delay another writer
    set without them (an earlier version's process or command) keeps stale entries, which count no more."""
    return text if text and in_force(published_delays(text)) == crawl_delay else ""


def with_origin_delay(text: str, name: str, delay: float) -> tuple[str, float]:
    """A row's entries (:func:`published_delays`' text) after a robots.txt read published ``delay`` seconds (0: none)
    for the entry ``name`` (:func:`entry_name`), and the delay in force: the largest entry (0: none).

    robots.txt is per origin and per user agent (RFC 9309 §2.2.1, §2.3), the row per host (docs/spec.md §1): a read
    changes only its own entry, so one origin's robots.txt without a delay never clears another's, in any process of
    the fleet. An operator's entry lasts until a read changes a delay already recorded (the site changed its
    robots.txt): a robots.txt read again unchanged, by any process of the fleet, or read for the first time (another
    user agent, another origin, the first crawl after the command), leaves it in force. A restored entry
    (:data:`RESTORED`) lasts until this read.
    """
    entries = published_delays(text)
    entries.pop(RESTORED, None)
    if name in entries and entries[name] != delay:
        entries.pop(OPERATOR, None)
    entries.pop(name, None)
    if delay > 0:
        entries[name] = float(delay)
    return _as_text(entries), in_force(entries)


def with_operator_delay(text: str, delay: float | None) -> tuple[str, float]:
    """A row's entries after an operator set the host's delay to ``delay`` seconds (None: removed it), and the delay in
    force: the operator's, until a robots.txt of the host changes its delay (:func:`with_origin_delay`); without it,
    the largest the origins publish."""
    entries = published_delays(text)
    for hand in _SET_BY_HAND:
        entries.pop(hand, None)
    if delay is not None:
        entries[OPERATOR] = float(delay)
    return _as_text(entries), in_force(entries)


def merge_origin_delays(one: str, other: str, crawl_delay: float) -> str:
    """Two rows' entries (:func:`published_delays`' text) as one, for a row whose delay is ``crawl_delay`` (a row
    written back into a table that came back empty, docs/spec.md §6): each entry's larger delay; should they not
    make ``crawl_delay`` (an operator's delay on one side only), it is kept as :data:`RESTORED`, so the row's entries
    are current (:func:`current_entries`) and the next robots.txt read falls back to the origins' largest."""
    merged = published_delays(one)
    for name, delay in published_delays(other).items():
        merged[name] = max(delay, merged.get(name, delay))
    if in_force(merged) != crawl_delay:
        merged.pop(OPERATOR, None)
        merged[RESTORED] = crawl_delay
    return _as_text(merged)


def _as_text(entries: dict[str, float]) -> str:
    """Entries as a row keeps them: the :data:`ORIGINS_KEPT` largest (the operator's and the restored one always), in a
    JSON object sorted by name."""
    if len(entries) > ORIGINS_KEPT:
        entries = dict(sorted(entries.items(), key=lambda item: (item[0] in _SET_BY_HAND, item[1]),
                              reverse=True)[:ORIGINS_KEPT])
    return json.dumps({name: entries[name] for name in sorted(entries)}) if entries else ""


# -- the robots.txt lifecycle (RFC 9309; docs/spec.md §5, "The robots.txt lifecycle") ----------------------------
#
# One small state machine per origin (scheme://host:port), pure: states and times in, an action out. The middleware
# (:class:`scrapy_polite.robotstxt.PoliteRobotsTxtMiddleware`) owns the table of states and does what the actions
# say; the clock is injected (every function takes ``now``).

#: Seconds a read robots.txt (its rules, or "unavailable") is used before it is asked again: RFC 9309 §2.4
#: ("crawlers SHOULD NOT use the cached version for more than 24 hours").
ROBOTS_TTL: Final = 24 * 3600.0
#: Bytes of a robots.txt that are parsed: RFC 9309 §2.5 ("crawlers MUST parse at least 500 kibibytes"). The rest,
#: from the last line break within the limit, is ignored (as Google does).
ROBOTS_MAX_BYTES: Final = 500 * 1024
#: Redirects followed to reach a robots.txt: RFC 9309 §2.3.1.2 ("at least five consecutive redirects"); a sixth
#: means "unavailable".
ROBOTS_MAX_REDIRECTS: Final = 5

#: A robots.txt state's phase: ``fetching`` (a robots.txt request is out), ``parsed`` (its rules apply until
#: ``expires_at``), ``unavailable`` (4xx: everything allowed until ``expires_at``), ``unreachable`` (5xx, 429, a
#: network error or a timeout: everything disallowed — held — until it answers; asked again at ``retry_at``).
Phase = Literal["fetching", "parsed", "unavailable", "unreachable"]
#: What one robots.txt answer means: ``parsed`` (2xx), ``unavailable`` (4xx but 429, or more than
#: :data:`ROBOTS_MAX_REDIRECTS` redirects), ``unreachable`` (5xx, 429, any other status, a network error, a
#: timeout), ``none`` (no request reached a server: the host does not exist, or its robots.txt was refused like
#: its pages would be; nothing is learnt, the requests that waited go on and meet the same refusal).
AnswerKind = Literal["parsed", "unavailable", "unreachable", "none"]


@dataclass(frozen=True)
class Rules:
    """The rules read from a robots.txt: a Scrapy ``RobotParser`` (None: everything is allowed, "unavailable")."""

    parser: Any = None


#: Everything allowed (an unavailable robots.txt, RFC 9309 §2.3.1.3).
ALLOW_ALL: Final = Rules(None)


@dataclass(frozen=True)
class RobotsState:
    """What is known of one origin's robots.txt.

    Attributes:
        phase: see :data:`Phase`.
        rules: ``parsed`` / ``unavailable``: the rules in force; ``fetching`` / ``unreachable``: the rules read
            last, if any (a re-ask after :data:`ROBOTS_TTL` that finds robots.txt unreachable keeps using them,
            RFC 9309 §2.4), else None (never read: everything is disallowed).
        expires_at: ``parsed`` / ``unavailable``: when the rules are too old to use (the clock's seconds).
        retry_at: ``unreachable``: when robots.txt is asked again (the host's backoff).
        since: ``unreachable`` (and ``fetching`` again after it): the first unreachable answer of this spell.
        failures: unreachable answers in a row.
        cause: the last unreachable answer, in words (``"503"``, ``"TimeoutError"``).
    """

    phase: Phase
    rules: Rules | None = None
    expires_at: float = math.inf
    retry_at: float = 0.0
    since: float | None = None
    failures: int = 0
    cause: str | None = None

    @property
    def holds(self) -> bool:
        """Requests of the origin are held (not merely waiting for a fetch): unreachable, no rules to fall back on."""
        return self.phase == "unreachable" and self.rules is None


@dataclass(frozen=True)
class Apply:
    """The request is judged by ``rules`` now (allowed, or dropped as disallowed)."""

    rules: Rules


@dataclass(frozen=True)
class Fetch:
    """Ask robots.txt now (the request then waits for the answer); ``expired``: the rules read were older than
    :data:`ROBOTS_TTL`."""

    expired: bool = False


@dataclass(frozen=True)
class Wait:
    """A robots.txt request is out: wait for its answer, then decide again."""


@dataclass(frozen=True)
class Hold:
    """robots.txt is unreachable and nothing was read before: hold the request until ``until`` (when robots.txt is
    asked again); ``since``: when the unreachable spell began."""

    until: float
    since: float


Action = Apply | Fetch | Wait | Hold


@dataclass(frozen=True)
class Answer:
    """One robots.txt answer, classified (:data:`AnswerKind`); ``rules`` for ``parsed`` and ``unavailable``;
    ``cause``: the status or failure, in words."""

    kind: AnswerKind
    rules: Rules | None = None
    cause: str | None = None


def decide(state: RobotsState | None, now: float) -> Action:
    """What to do with a request of an origin whose robots.txt is in ``state`` (None: never asked) at ``now``.

    The RFC 9309 rules: rules younger than :data:`ROBOTS_TTL` apply (§2.4), older ones are asked again; while a
    robots.txt request is out, requests wait for it; an unreachable robots.txt disallows everything (§2.3.1.4) —
    the request is held until ``retry_at``, when it is asked again — unless rules were read before (§2.4 allows
    the cached copy while robots.txt is unreachable)."""
    if state is None:
        return Fetch()
    if state.phase == "fetching":
        return Wait()
    if state.phase in ("parsed", "unavailable"):
        if now < state.expires_at:
            return Apply(state.rules or ALLOW_ALL)
        return Fetch(expired=True)
    if now >= state.retry_at:
        return Fetch()
    if state.rules is not None:
        return Apply(state.rules)
    return Hold(until=state.retry_at, since=state.since if state.since is not None else now)


def fetching(state: RobotsState | None) -> RobotsState:
    """The state while a robots.txt request is out: what was known stays (the rules read last, the spell)."""
    if state is None:
        return RobotsState("fetching")
    return dataclasses.replace(state, phase="fetching", expires_at=math.inf, retry_at=0.0)


def answered(state: RobotsState | None, answer: Answer, now: float, retry_at: float) -> RobotsState | None:
    """The state after ``answer`` came at ``now`` (``retry_at``: when an unreachable robots.txt is asked again, the
    host's backoff). None for an answer that taught nothing (``none``: asked again by the next request)."""
    if answer.kind in ("parsed", "unavailable"):
        return RobotsState(answer.kind, rules=answer.rules or ALLOW_ALL, expires_at=now + ROBOTS_TTL)
    if answer.kind == "none":
        return None
    previous = state if state is not None else RobotsState("fetching")
    return RobotsState("unreachable", rules=previous.rules, retry_at=max(retry_at, now),
                       since=previous.since if previous.since is not None else now,
                       failures=previous.failures + 1, cause=answer.cause)


def classify_status(status: int) -> AnswerKind:
    """A robots.txt response's status as RFC 9309 §2.3.1 reads it: 2xx ``parsed``; 4xx ``unavailable``, except 429
    (a throttle: ``unreachable``, asked again with the host's backoff); a 3xx that is not followed
    ``unavailable`` (§2.3.1.2); 5xx and anything else ``unreachable``."""
    if 200 <= status < 300:
        return "parsed"
    if status == 429:
        return "unreachable"
    if 300 <= status < 500:
        return "unavailable"
    return "unreachable"


def reask_floor(failures: int, interval: float, cap: float) -> float:
    """The least seconds between an unreachable answer and the next ask: ``interval × 2^(failures − 1)``, capped
    at ``cap`` — the pace table's doubling, for the 5xx answers the table does not count as throttles
    (``POLITE_THROTTLE_STATUSES``: 500, 502, 504); the table's own backoff (429, 503, ``Retry-After``, network
    failures) is honoured on top."""
    if failures <= 0:
        return 0.0
    return min(cap, interval * 2.0 ** min(failures - 1, 60))


def truncate(body: bytes, limit: int = ROBOTS_MAX_BYTES) -> bytes:
    """The part of a robots.txt body that is parsed: all of it up to ``limit`` bytes, else up to the last line
    break within ``limit`` (RFC 9309 §2.5: at least 500 KiB)."""
    if len(body) <= limit:
        return body
    head = body[:limit]
    cut = max(head.rfind(b"\n"), head.rfind(b"\r"))
    return head[:cut + 1] if cut >= 0 else head
