"""The delay a robots.txt asks of a user agent, read with Protego (the parser Scrapy uses).

``Crawl-delay`` is not in RFC 9309; it is the de-facto extension every major crawler honours, and
``Request-rate: n/s`` means one request every ``s/n`` seconds. When a group has both, the slower one
applies (both are limits the site published).
"""

from __future__ import annotations

import logging
from typing import Any

from protego import Protego

from .vocabulary import parse_seconds

logger = logging.getLogger(__name__)

__all__ = ["robots_delay", "parse_robots_delay"]


def robots_delay(parser: Any, user_agent: str) -> float | None:
    """The delay (seconds) a parsed robots.txt asks of ``user_agent``.

    Args:
        parser: a ``protego.Protego`` instance, or Scrapy's ``ProtegoRobotParser`` (whose ``rp`` is one),
            or any Scrapy ``RobotParser`` with ``crawl_delay(user_agent)`` (then ``Request-rate`` is not
            available and only ``Crawl-delay`` counts).
        user_agent: the crawler's user agent (Protego matches its product token).

    Returns:
        ``max(crawl_delay, seconds / requests)`` over what the matching group publishes, or None when it
        publishes neither (or only malformed values, which Protego already discards).
    """
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
        body = body.decode("utf-8", errors="replace")
    return robots_delay(Protego.parse(body), user_agent)


def _call(rp: Any, name: str, user_agent: str) -> Any:
    method = getattr(rp, name, None)
    if method is None:
        return None
    return method(user_agent)
