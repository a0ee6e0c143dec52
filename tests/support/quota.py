"""A loopback server's quota: enforces ``q`` requests per ``w`` seconds and announces it in one of the
rate-limit header forms (scrapy_polite.policy.ratelimit), for the end-to-end tests and ``bench/ratelimit.py``.

Usage::

    quota = Quota(form="ietf", quota=5, window=2.0)
    srv.route("/*", quota.handler())
    ... crawl ...
    quota.refused            # how many requests were answered 429
    quota.ideal(n)           # n * window / quota: the time the quota allows n requests at its rate

Two ways to enforce, both standard:

* ``"bucket"`` (the default for the forms that announce a window: ``ietf``, ``draft``): a token bucket of
  ``quota`` tokens refilled at ``quota / window`` per second. A client spaced by ``window / quota`` never
  empties it; one that bursts gets 429 once the ``quota`` tokens are spent.
* ``"window"`` (the default for the ``x-*`` forms, which announce no window): fixed windows aligned on
  multiples of ``window`` in epoch seconds (GitHub's kind): ``quota`` requests per window, the reset is the
  window's end.

Forms (what the response says; every reset is exact, so a client that honours it is never refused):

* ``ietf``: ``RateLimit-Policy: "default";q=Q;w=W`` and ``RateLimit: "default";r=R;t=T`` (``t`` rounded up);
* ``draft``: ``RateLimit-Limit: Q, Q;w=W``, ``RateLimit-Remaining: R``, ``RateLimit-Reset: T`` (rounded up);
* ``x-delta``: ``X-RateLimit-Limit: Q``, ``X-RateLimit-Remaining: R``, ``X-RateLimit-Reset: T`` (delta seconds,
  three decimals, rounded up);
* ``x-epoch``: the same with ``X-RateLimit-Reset`` the epoch second of the window's end (GitHub);
* ``discord``: ``X-RateLimit-Reset`` the epoch time with three decimals, and ``X-RateLimit-Reset-After``;
* ``none``: no rate-limit field (the quota is enforced all the same).

A refused request gets ``429`` with the same fields and a ``Retry-After`` (whole seconds, rounded up).
``enforce=False`` announces the quota but never refuses.

``quiet=N`` answers the N requests after the first answer that says nothing remains **without** any rate-limit
field (a caching proxy or an error page in front of the server may drop them; the server still counts the
requests).

``rounding="down"`` announces every reset in whole seconds **truncated** (``int(seconds)``, the epoch second the
window ends in), as many servers do (Flask-Limiter's ``int(reset_time)``, ``int(reset - now)``): the quota is
then replenished up to 1 s after the moment announced. ``window_announced=False`` leaves the window out of
``RateLimit-Limit`` (``RateLimit-Limit: Q``, the drafts' plain form).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from tests.support.server import Handler, Reply, RequestInfo, clock

__all__ = ["FORMS", "Quota"]

FORMS = ("ietf", "draft", "x-delta", "x-epoch", "discord", "none")


def _up(seconds: float, digits: int = 0) -> float:
    """``seconds`` rounded up to ``digits`` decimals (a reset announced early would invite a 429)."""
    scale = 10 ** digits
    return math.ceil(max(0.0, seconds) * scale - 1e-9) / scale


@dataclass
class Quota:
    """One server's quota (thread-safe: the server answers on several threads).

    Args:
        form: how the quota is announced (:data:`FORMS`).
        quota: requests allowed per window (``q``).
        window: the window in seconds (``w``; a whole number for the ``x-epoch`` form).
        enforce: answer 429 beyond the quota (False: announce it only).
        mode: ``"bucket"`` or ``"window"`` (None: by the form, see the module docstring).
        extra: more headers for every response (e.g. a malformed field).
        rounding: ``"up"`` (every reset rounded up: never early) or ``"down"`` (whole seconds, truncated).
        window_announced: the ``draft`` form's ``RateLimit-Limit`` names the window (``Q, Q;w=W``); False: ``Q``.
        quiet: how many answers after the first that says nothing remains carry no rate-limit field.
    """

    form: str = "ietf"
    quota: int = 5
    window: float = 2.0
    enforce: bool = True
    mode: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    rounding: str = "up"
    window_announced: bool = True
    quiet: int = 0
    served: int = 0
    refused: int = 0

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"unknown form {self.form!r}; one of {FORMS}")
        if self.rounding not in ("up", "down"):
            raise ValueError(f"rounding must be 'up' or 'down', got {self.rounding!r}")
        if self.mode is None:
            self.mode = "bucket" if self.form in ("ietf", "draft") else "window"
        self._lock = threading.Lock()
        self._tokens = float(self.quota)
        self._filled_at = clock()
        self._window_start = 0.0
        self._used = 0
        self._spent_seen = False
        #: How many answers went out without their rate-limit fields (``quiet``).
        self.quieted = 0

    def ideal(self, requests: int) -> float:
        """Seconds the quota allows ``requests`` requests at its sustained rate: ``requests × w / q``."""
        return requests * self.window / self.quota

    # -- the quota ---------------------------------------------------------------------------------------

    def _take(self, now: float) -> tuple[bool, int, float, float]:
        """One request at ``now``: (allowed, remaining after it, seconds until more quota, epoch of that)."""
        with self._lock:
            if self.mode == "bucket":
                rate = self.quota / self.window
                self._tokens = min(float(self.quota), self._tokens + (now - self._filled_at) * rate)
                self._filled_at = now
                allowed = self._tokens >= 1.0 or not self.enforce
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                remaining = int(self._tokens)
                reset = (1.0 - (self._tokens - remaining)) / rate  # until the next whole token
            else:
                start = math.floor(now / self.window) * self.window
                if start != self._window_start:
                    self._window_start, self._used = start, 0
                allowed = self._used < self.quota or not self.enforce
                self._used += 1
                remaining = max(0, self.quota - self._used)
                reset = start + self.window - now
            if allowed:
                self.served += 1
            else:
                self.refused += 1
            return allowed, remaining, reset, now + reset

    def headers(self, remaining: int, reset: float, reset_at: float) -> dict[str, str]:
        """The rate-limit fields of one response."""
        q, w = self.quota, self.window
        w_int = int(w) if float(w).is_integer() else math.ceil(w)
        down = self.rounding == "down"
        seconds = int(reset) if down else int(_up(reset))  # whole seconds
        if self.form == "ietf":
            out = {"RateLimit-Policy": f'"default";q={q};w={w_int}',
                   "RateLimit": f'"default";r={remaining};t={seconds}'}
        elif self.form == "draft":
            limit = f"{q}, {q};w={w_int}" if self.window_announced else str(q)
            out = {"RateLimit-Limit": limit, "RateLimit-Remaining": str(remaining), "RateLimit-Reset": str(seconds)}
        elif self.form == "x-delta":
            out = {"X-RateLimit-Limit": str(q), "X-RateLimit-Remaining": str(remaining),
                   "X-RateLimit-Reset": str(seconds) if down else f"{_up(reset, 3):.3f}"}
        elif self.form == "x-epoch":
            out = {"X-RateLimit-Limit": str(q), "X-RateLimit-Remaining": str(remaining),
                   "X-RateLimit-Reset": str(math.floor(reset_at) if down else math.ceil(reset_at - 1e-9))}
        elif self.form == "discord":
            out = {"X-RateLimit-Limit": str(q), "X-RateLimit-Remaining": str(remaining),
                   "X-RateLimit-Reset": f"{_up(reset_at, 3):.3f}", "X-RateLimit-Reset-After": f"{_up(reset, 3):.3f}"}
        else:
            out = {}
        return {**out, **self.extra}

    def handler(self, body: str = "ok") -> Handler:
        """A server handler that takes one unit of the quota per request."""

        def handle(info: RequestInfo, count: int) -> Reply:
            allowed, remaining, reset, reset_at = self._take(clock())
            headers = self.headers(remaining, reset, reset_at)
            with self._lock:
                if self._spent_seen and self.quieted < self.quiet:
                    self.quieted += 1
                    headers = {}
                elif remaining == 0:
                    self._spent_seen = True
            if not allowed:
                return Reply.text("quota exceeded", status=429,
                                  headers={**headers, "Retry-After": str(int(_up(reset)) or 1)})
            return Reply.html(f"<html><body><p>{body} {info.path}</p></body></html>", headers=headers)

        return handle
