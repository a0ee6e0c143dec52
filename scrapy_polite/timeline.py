"""The timeline picture of the event log (``scrapy polite timeline``, README "The timeline").

:func:`timeline_html` draws events (:class:`~scrapy_polite.stores.Event`) as **one self-contained HTML file**:
inline SVG, CSS and a few lines of script, a ``Content-Security-Policy`` of ``default-src 'none'``, so opening
it makes no network request. One row per host; each request a mark from its booking to its response, coloured
by outcome; backoff and Retry-After windows shaded; waits (a bar under the marks) and deferrals (a triangle,
dashed until due) visible; hovering a mark shows its URL, status and the delay chosen.

:class:`Chromium` renders such a file in headless Chromium through the DevTools protocol on a pipe (no port,
no extra package): a PNG screenshot of the whole page, and what the page did — its console errors and every
request it made — for the tests and for ``-o timeline.png``.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .events import DEFERRAL_WORDS, REFUSAL_WORDS, clock_time, describe
from .stores.base import Event

__all__ = ["Chromium", "PageReport", "RenderError", "find_chromium", "timeline_html", "write_timeline",
           "OUTCOME_COLOURS"]

#: The colour of a request mark by its outcome (the legend of the picture uses the same words).
OUTCOME_COLOURS: dict[str, str] = {
    "2xx": "#2e9d4f",
    "3xx": "#3b7dd8",
    "throttle": "#d7301f",
    "4xx": "#f08c00",
    "5xx": "#8c2d04",
    "failure": "#252525",
    "no response": "#b0b0b0",
}

_LABEL = 230  # px, the host column
_PLOT = 1150  # px, the time axis
_ROW = 34  # px, one host
_AXIS = 34  # px, the time axis above the rows


def outcome(event: Event) -> str:
    """The outcome of a ``response`` or ``failure`` event: a key of :data:`OUTCOME_COLOURS`."""
    if event.kind == "failure":
        return "failure"
    if event.reason is not None and event.reason.startswith("throttle"):
        return "throttle"
    status = event.status or 0
    if 200 <= status < 300:
        return "2xx"
    if 300 <= status < 400:
        return "3xx"
    if 400 <= status < 500:
        return "4xx"
    return "5xx"


@dataclass
class _Row:
    host: str
    first: float
    marks: list[tuple[float, float, str, str]] = field(default_factory=list)  # start, end, outcome, tip
    windows: list[tuple[float, float, str, str]] = field(default_factory=list)  # start, end, kind, tip
    waits: list[tuple[float, float, str]] = field(default_factory=list)
    deferrals: list[tuple[float, float | None, str]] = field(default_factory=list)
    points: list[tuple[float, str, str]] = field(default_factory=list)  # at, kind (robots, refusal, operator), tip
    counts: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    wait_seconds: float = 0.0
    deferral_reasons: Counter[str] = field(default_factory=Counter)
    refusal_reasons: Counter[str] = field(default_factory=Counter)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _tip(event: Event) -> str:
    lines = [f"{clock_time(event.at)}  {event.host or '(no host)'}", describe(event)]
    if event.url:
        lines.append(event.url)
    if event.started is not None and event.kind in ("response", "failure"):
        lines.append(f"booked {clock_time(event.started)}, took {max(0.0, event.at - event.started):.2f} s")
    if event.source:
        lines.append(f"process {event.source}")
    return "\n".join(lines)


def _rows(events: Sequence[Event]) -> dict[str, _Row]:
    rows: dict[str, _Row] = {}
    answered = {(e.host, e.started) for e in events if e.kind in ("response", "failure") and e.started is not None}
    for e in events:
        row = rows.get(e.host)
        if row is None:
            row = rows[e.host] = _Row(e.host, e.at)
        kind = e.kind
        if kind in ("response", "failure"):
            start = e.started if e.started is not None and e.started <= e.at else e.at
            mark = outcome(e)
            row.marks.append((start, e.at, mark, _tip(e)))
            row.counts["requests"] += 1
            row.statuses[str(e.status) if kind == "response" else str(e.reason)] += 1
            if mark == "throttle":
                row.counts["throttles"] += 1
        elif kind == "booking":
            if (e.host, e.at) not in answered:
                row.marks.append((e.at, e.at, "no response", _tip(e) + "\n(no response recorded)"))
                row.counts["requests"] += 1
        elif kind == "backoff":
            row.counts["backoff steps"] += 1
            if e.due is not None and e.due > e.at:
                window = "retry-after" if e.retry_after is not None and e.retry_after > 0 else "backoff"
                row.windows.append((e.at, e.due, window, _tip(e)))
        elif kind == "wait":
            row.waits.append((e.at, e.at + (e.delay or 0.0), _tip(e)))
            row.wait_seconds += e.delay or 0.0
            row.counts["waits"] += 1
        elif kind == "deferral":
            row.deferrals.append((e.at, e.due, _tip(e)))
            row.deferral_reasons[e.reason or "?"] += 1
        elif kind in ("robots_delay", "refusal", "operator"):
            row.points.append((e.at, kind, _tip(e)))
            if kind == "refusal":
                row.refusal_reasons[e.reason or "?"] += 1
    return dict(sorted(rows.items(), key=lambda item: (item[1].first, item[0])))


_STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
          86400, 172800, 604800)


def _tick_step(span: float) -> float:
    return next((s for s in _STEPS if span / s <= 10), _STEPS[-1] * math.ceil(span / (10 * _STEPS[-1])))


def _range(events: Sequence[Event]) -> tuple[float, float]:
    first = min(e.at for e in events)
    last = max(e.at for e in events)
    ends = [e.due for e in events if e.due is not None and e.kind in ("backoff", "deferral", "wait")]
    ends += [e.at + (e.delay or 0.0) for e in events if e.kind == "wait"]
    span = max(last - first, 1.0)
    end = max([last, *ends])
    end = min(end, last + max(0.5 * span, 30.0))  # a far due (Retry-After: 3600) is clipped at the edge
    return first, max(end, first + 1.0)


_CSS = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 20px;color:#222;background:#fff}
h1{font-size:18px;margin:0 0 4px}
.meta{color:#555;margin:0 0 10px}
.legend{display:flex;flex-wrap:wrap;gap:6px 16px;margin:0 0 10px;align-items:center}
.legend span{display:inline-flex;align-items:center;gap:5px}
.legend i{display:inline-block;width:14px;height:12px;border-radius:2px}
svg{display:block}
.host{font:12px ui-monospace,Menlo,Consolas,monospace;fill:#222}
.tick{font-size:11px;fill:#555}
.grid{stroke:#e4e4e4;stroke-width:1}
.band{fill:#f7f7f7}
.mark,.win,.wait,.defer,.point{cursor:pointer}
.mark:hover,.point:hover,.defer:hover{stroke:#000;stroke-width:1.5}
#tip{position:fixed;display:none;pointer-events:none;background:#fffef4;border:1px solid #999;border-radius:4px;
padding:6px 8px;font:12px ui-monospace,Menlo,Consolas,monospace;white-space:pre;box-shadow:0 2px 6px rgba(0,0,0,.2);
max-width:90vw;overflow:hidden;z-index:2}
table{border-collapse:collapse;margin-top:14px}
th,td{border-bottom:1px solid #ddd;padding:3px 10px;text-align:left;vertical-align:top}
th{background:#f2f2f2}
td.n{text-align:right}
"""

_SCRIPT = """
(function () {
  var tip = document.getElementById('tip');
  function show(ev) {
    var el = ev.target.closest('[data-tip]');
    if (!el) { tip.style.display = 'none'; return; }
    tip.textContent = el.getAttribute('data-tip');
    tip.style.display = 'block';
    var x = ev.clientX + 14, y = ev.clientY + 14;
    var w = tip.offsetWidth, h = tip.offsetHeight;
    if (x + w > window.innerWidth - 4) { x = Math.max(4, ev.clientX - w - 14); }
    if (y + h > window.innerHeight - 4) { y = Math.max(4, ev.clientY - h - 14); }
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  }
  document.addEventListener('mousemove', show);
  document.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
})();
"""

_WINDOW_FILL = {"backoff": "rgba(230,85,13,0.22)", "retry-after": "rgba(117,107,177,0.28)"}


def _attr(text: str) -> str:
    return html.escape(text, quote=True).replace("\n", "&#10;")


def timeline_html(events: Iterable[Event], *, title: str = "scrapy-polite timeline", store: str = "",
                  now: float | None = None) -> str:
    """The timeline of ``events`` as one self-contained HTML document (see the module).

    Args:
        events: the events to draw, any order (:meth:`PaceStore.events
            <scrapy_polite.stores.base.PaceStore.events>`); hosts get one row each, in order of their first event.
        title: the page's title.
        store: the pace table's URI, for the header.
        now: when it was drawn (epoch s; default: now), for the header.

    Returns:
        The HTML text (UTF-8 when written).
    """
    events = sorted(events, key=lambda e: e.at)
    drawn = time.time() if now is None else now
    head = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            'style-src \'unsafe-inline\'; script-src \'unsafe-inline\'">\n'
            f'<meta name="viewport" content="width=device-width"><title>{html.escape(title)}</title>\n'
            f'<style>{_CSS}</style></head><body>\n<h1>{html.escape(title)}</h1>\n')
    if not events:
        return head + f'<p class="meta">No events{" in " + html.escape(store) if store else ""}.</p></body></html>\n'
    rows = _rows(events)
    t0, t1 = _range(events)
    scale = _PLOT / (t1 - t0)

    def x(t: float) -> float:
        return round(_LABEL + (min(max(t, t0), t1) - t0) * scale, 2)

    height = _AXIS + _ROW * len(rows) + 8
    width = _LABEL + _PLOT + 20
    out: list[str] = [head]
    out.append(f'<p class="meta">{_count(len(events), "event")}, {_count(len(rows), "host")}, '
               f'{clock_time(t0, date=True)} to '
               f'{clock_time(max(e.at for e in events), date=True)} (local time)'
               f'{" — " + html.escape(store) if store else ""}; drawn {clock_time(drawn, date=True)}.</p>\n')
    out.append('<div class="legend">' + "".join(
        f'<span><i style="background:{colour}"></i>{name}</span>' for name, colour in OUTCOME_COLOURS.items()))
    out.append(f'<span><i style="background:{_WINDOW_FILL["backoff"]}"></i>backoff window</span>'
               f'<span><i style="background:{_WINDOW_FILL["retry-after"]}"></i>Retry-After window</span>'
               '<span><i style="background:#4a90d9;height:4px"></i>wait in line</span>'
               '<span><svg width="12" height="10"><path d="M1 1h10L6 9z" fill="#6a51a3"/></svg>deferral '
               '(dashed until due)</span>'
               '<span><svg width="12" height="12"><path d="M6 1l5 5-5 5-5-5z" fill="#1b7837"/></svg>robots.txt '
               'delay</span><span><svg width="12" height="12"><path d="M2 2l8 8M10 2l-8 8" stroke="#000" '
               'stroke-width="2"/></svg>refusal</span></div>\n')
    out.append(f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
               f'viewBox="0 0 {width} {height}">\n')
    step = _tick_step(t1 - t0)
    tick = math.ceil(t0 / step) * step
    while tick <= t1:
        xt = x(tick)
        label = clock_time(tick)[: 12 if step < 1 else 8]
        out.append(f'<line class="grid" x1="{xt}" y1="{_AXIS - 6}" x2="{xt}" y2="{height - 8}"/>'
                   f'<text class="tick" x="{xt}" y="{_AXIS - 12}" text-anchor="middle">{label}</text>\n')
        tick += step
    for index, row in enumerate(rows.values()):
        top = _AXIS + index * _ROW
        mid = top + _ROW / 2
        name = row.host or "(no host)"
        short = name if len(name) <= 30 else name[:29] + "…"
        out.append(f'<g class="row" data-host="{_attr(row.host)}">')
        if index % 2 == 0:
            out.append(f'<rect class="band" x="0" y="{top}" width="{width}" height="{_ROW}"/>')
        out.append(f'<text class="host" x="6" y="{mid + 4}"><title>{html.escape(name)}</title>'
                   f'{html.escape(short)}</text>')
        for start, end, kind, tip in row.windows:
            out.append(f'<rect class="win {kind}" x="{x(start)}" y="{top + 2}" width="{max(1.0, x(end) - x(start))}" '
                       f'height="{_ROW - 4}" fill="{_WINDOW_FILL[kind]}" data-tip="{_attr(tip)}"/>')
        for start, end, tip in row.waits:
            out.append(f'<rect class="wait" x="{x(start)}" y="{top + _ROW - 7}" '
                       f'width="{max(1.0, x(end) - x(start))}" height="4" fill="#4a90d9" fill-opacity="0.7" '
                       f'data-tip="{_attr(tip)}"/>')
        for at, due, tip in row.deferrals:
            xa = x(at)
            if due is not None and due > at:
                out.append(f'<line x1="{xa}" y1="{top + 5}" x2="{x(due)}" y2="{top + 5}" stroke="#6a51a3" '
                           'stroke-width="1" stroke-dasharray="3,3"/>')
            out.append(f'<path class="defer" d="M{xa - 4} {top + 1}h8l-4 7z" fill="#6a51a3" '
                       f'data-tip="{_attr(tip)}"/>')
        for start, end, kind, tip in row.marks:
            xs = x(start)
            w = max(3.0, x(end) - xs)
            colour = OUTCOME_COLOURS[kind]
            style = f'fill="none" stroke="{colour}" stroke-width="1.5"' if kind == "no response" else f'fill="{colour}"'
            out.append(f'<rect class="mark {kind.replace(" ", "-")}" x="{xs}" y="{mid - 7}" width="{round(w, 2)}" '
                       f'height="14" rx="1.5" {style} data-tip="{_attr(tip)}"/>')
        for at, kind, tip in row.points:
            xa = x(at)
            if kind == "robots_delay":
                out.append(f'<path class="point robots" d="M{xa} {mid - 7}l6 7-6 7-6-7z" fill="#1b7837" '
                           f'data-tip="{_attr(tip)}"/>')
            elif kind == "refusal":
                out.append(f'<path class="point refusal" d="M{xa - 5} {mid - 5}l10 10M{xa + 5} {mid - 5}l-10 10" '
                           f'stroke="#000" stroke-width="2.5" data-tip="{_attr(tip)}"/>')
            else:
                out.append(f'<line class="point operator" x1="{xa}" y1="{top}" x2="{xa}" y2="{top + _ROW}" '
                           f'stroke="#000" stroke-width="2" stroke-dasharray="2,2" data-tip="{_attr(tip)}"/>')
        out.append("</g>\n")
    out.append("</svg>\n")
    out.append('<table id="hosts"><thead><tr><th>host</th><th>requests</th><th>statuses</th><th>throttles</th>'
               '<th>backoff steps</th><th>waits in line</th><th>deferred</th><th>refused</th></tr></thead><tbody>\n')
    for row in rows.values():
        statuses = " ".join(f"{k}×{v}" for k, v in sorted(row.statuses.items()))
        reasons = ", ".join(f"{n} {DEFERRAL_WORDS.get(k, k)}" for k, n in sorted(row.deferral_reasons.items()))
        deferrals = sum(row.deferral_reasons.values())
        refused = ", ".join(f"{n} {REFUSAL_WORDS.get(k, k)}" for k, n in sorted(row.refusal_reasons.items()))
        out.append(f'<tr><td>{html.escape(row.host or "(no host)")}</td><td class="n">{row.counts["requests"]}</td>'
                   f'<td>{html.escape(statuses) or "-"}</td><td class="n">{row.counts["throttles"]}</td>'
                   f'<td class="n">{row.counts["backoff steps"]}</td>'
                   f'<td class="n">{row.counts["waits"]} ({row.wait_seconds:.1f} s)</td>'
                   f'<td>{deferrals}{" (" + html.escape(reasons) + ")" if reasons else ""}</td>'
                   f'<td>{html.escape(refused) or "0"}</td></tr>\n')
    out.append('</tbody></table>\n<div id="tip"></div>\n')
    out.append(f"<script>{_SCRIPT}</script>\n</body></html>\n")
    return "".join(out)


# -- rendering in headless Chromium ---------------------------------------------------------------------------

#: The Chromium flags of every render: headless, no sandbox (containers, root), and nothing that reaches the
#: network by itself (component updates, sync, background fetches), with a fresh profile each time.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--no-first-run", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--mute-audio", "--disable-extensions", "--disable-default-apps")


#: Child side of :meth:`Chromium.render`: fds argv[1], argv[2] become 3 and 4, then Chromium (argv[3:]) runs.
_TRAMPOLINE = ("import os, sys\n"
               "os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4)\n"
               "os.execv(sys.argv[3], sys.argv[3:])\n")


class RenderError(RuntimeError):
    """Chromium is missing, failed to start, or did not render the page in time. The message says which."""


def find_chromium() -> str | None:
    """The Chromium binary: ``$POLITE_CHROMIUM``, else ``chromium``, ``chromium-browser``, ``google-chrome``
    on ``PATH``, else None."""
    configured = os.environ.get("POLITE_CHROMIUM")
    if configured:
        return configured
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageReport:
    """What a page did in Chromium.

    Attributes:
        url: the page's ``file://`` URL.
        requests: the URL of every request the page made, its own document first.
        console_errors: console errors, uncaught exceptions and error log entries (CSP violations, failed
            loads), as text.
        screenshot: the whole page as PNG bytes (None when not asked).
        evaluated: the results of the ``evaluate`` expressions, in order.
    """

    url: str
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    screenshot: bytes | None = None
    evaluated: list[Any] = field(default_factory=list)

    @property
    def external_requests(self) -> list[str]:
        """Every request but the page's own document."""
        return [u for u in self.requests if u != self.url]


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``): no port is
    opened and no package is needed. One browser, with a fresh profile, per :meth:`render`.

    Args:
        binary: the Chromium executable (default :func:`find_chromium`).
        timeout: seconds one render may take.

    Raises:
        RenderError: no Chromium was found.
    """

    def __init__(self, binary: str | None = None, *, timeout: float = 60.0) -> None:
        found = binary or find_chromium()
        if not found:
            raise RenderError("rendering a PNG needs Chromium, which was not found. Fix: apt-get install -y chromium "
                              "(or set POLITE_CHROMIUM to the browser's path), or write the timeline as .html")
        self.binary = found
        self.timeout = timeout

    def render(self, path: str, *, width: int = 1440, height: int = 900, screenshot: bool = True,
               hover: str | None = None, evaluate: Sequence[str] = ()) -> PageReport:
        """Open the local file ``path``, wait for its load event (and half a second more), then take the
        screenshot of the whole page.

        Args:
            path: an HTML file.
            width, height: the viewport, CSS pixels.
            screenshot: take one (:attr:`PageReport.screenshot`).
            hover: a CSS selector; the mouse is moved over the centre of the first element it selects before
                ``evaluate`` runs (a tooltip then shows).
            evaluate: JavaScript expressions evaluated in the page, each result (JSON) in
                :attr:`PageReport.evaluated`.

        Raises:
            RenderError: Chromium could not start, crashed or timed out; ``hover`` selected nothing.
        """
        url = "file://" + os.path.abspath(path)
        report = PageReport(url)
        profile = tempfile.mkdtemp(prefix="polite-chromium-")
        commands_read, commands_write = os.pipe()
        replies_read, replies_write = os.pipe()
        errors = tempfile.TemporaryFile()  # noqa: SIM115  (Chromium's stderr; closed in the finally below)
        try:
            args = [self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                    "about:blank"]
            # The protocol runs on the child's fds 3 (commands) and 4 (replies): a two-line Python trampoline
            # puts them there and executes Chromium (no shell: dash cannot redirect fds above 9).
            proc = subprocess.Popen(
                [sys.executable, "-c", _TRAMPOLINE, str(commands_read), str(replies_write), *args],
                pass_fds=(commands_read, replies_write), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=errors)
        except OSError as exc:
            for fd in (commands_read, commands_write, replies_read, replies_write):
                os.close(fd)
            shutil.rmtree(profile, ignore_errors=True)
            errors.close()
            raise RenderError(f"cannot start Chromium ({self.binary}): {exc}") from exc
        os.close(commands_read)
        os.close(replies_write)
        session = _Session(commands_write, replies_read, time.monotonic() + self.timeout)
        try:
            session.run(report, url, width=width, height=height, screenshot=screenshot, hover=hover,
                        evaluate=evaluate)
        except (RenderError, OSError, queue.Empty) as exc:
            errors.seek(0)
            tail = errors.read()[-2000:].decode("utf-8", "replace")
            raise RenderError(f"Chromium did not render {path}: {exc or type(exc).__name__}\n{tail}") from exc
        finally:
            session.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            errors.close()
            shutil.rmtree(profile, ignore_errors=True)
        return report


class _Session:
    """The DevTools protocol over the two pipe ends: NUL-terminated JSON messages."""

    def __init__(self, write_fd: int, read_fd: int, deadline: float) -> None:
        self.write_fd = write_fd
        self.read_fd = read_fd
        self.deadline = deadline
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self.next_id = 0
        self.session_id: str | None = None
        self._reader = threading.Thread(target=self._read, name="polite-chromium-pipe", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = os.read(self.read_fd, 1 << 16)
                if not chunk:
                    break
                buffer += chunk
                while b"\0" in buffer:
                    message, buffer = buffer.split(b"\0", 1)
                    self.messages.put(json.loads(message))
        except OSError:
            pass
        finally:
            self.messages.put(None)

    def _next(self) -> dict[str, Any]:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise RenderError("timed out")
        message = self.messages.get(timeout=remaining)
        if message is None:
            raise RenderError("Chromium closed the connection (it exited)")
        return message

    def send(self, method: str, params: dict[str, Any] | None = None, *, browser: bool = False) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if not browser and self.session_id is not None:
            message["sessionId"] = self.session_id
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._next()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RenderError(f"{method}: {reply['error'].get('message', reply['error'])}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def wait_for(self, method: str) -> None:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._next())

    def drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                message = self.messages.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if message is None:
                break
            self.events.append(message)

    def run(self, report: PageReport, url: str, *, width: int, height: int, screenshot: bool, hover: str | None,
            evaluate: Sequence[str]) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, browser=True)["targetId"]
        self.session_id = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                    browser=True)["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                         "deviceScaleFactor": 1, "mobile": False})
        self.send("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")
        self.drain(0.5)
        if hover is not None:
            box = self.send("Runtime.evaluate", {"expression": (
                f"(function(){{var e=document.querySelector({json.dumps(hover)});if(!e)return null;"
                "var r=e.getBoundingClientRect();return [r.left+r.width/2,r.top+r.height/2];})()"),
                "returnByValue": True})["result"].get("value")
            if not box:
                raise RenderError(f"nothing to hover: {hover!r} selects no element")
            self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": box[0], "y": box[1]})
            self.drain(0.2)
        for expression in evaluate:
            result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
            report.evaluated.append(result.get("result", {}).get("value"))
        if screenshot:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            shot = self.send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": max(1, math.ceil(size["width"])),
                         "height": max(1, math.ceil(size["height"])), "scale": 1}})
            report.screenshot = base64.b64decode(shot["data"])
        self.drain(0.1)
        self._collect(report)
        try:
            self.send("Browser.close", browser=True)
        except RenderError:
            pass  # it closed the pipe on its way out

    def _collect(self, report: PageReport) -> None:
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Network.requestWillBeSent":
                report.requests.append(params["request"]["url"])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                report.console_errors.append(f"console.{params['type']}: {text}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                report.console_errors.append("uncaught: " + str(details.get("exception", {}).get(
                    "description", details.get("text", ""))))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                report.console_errors.append(f"{entry.get('source')}: {entry.get('text')}")

    def close(self) -> None:
        try:
            os.close(self.write_fd)
        except OSError:
            pass
        self._reader.join(timeout=10)
        try:
            os.close(self.read_fd)
        except OSError:
            pass


def write_timeline(events: Sequence[Event], output: str, *, title: str = "scrapy-polite timeline", store: str = "",
                   chromium: str | None = None) -> PageReport | None:
    """Write the timeline of ``events`` to ``output``: HTML, or a PNG screenshot of it when ``output`` ends in
    ``.png`` (rendered by :class:`Chromium`).

    Returns:
        The render's :class:`PageReport` for a PNG (its console errors, its requests), else None.

    Raises:
        RenderError: a PNG could not be rendered (no Chromium, a crash, a timeout).
        OSError: ``output`` cannot be written.
    """
    document = timeline_html(events, title=title, store=store)
    if not output.lower().endswith(".png"):
        with open(output, "w", encoding="utf-8") as f:
            f.write(document)
        return None
    browser = Chromium(chromium)
    with tempfile.TemporaryDirectory(prefix="polite-timeline-") as tmp:
        page = os.path.join(tmp, "timeline.html")
        with open(page, "w", encoding="utf-8") as f:
            f.write(document)
        report = browser.render(page, width=_LABEL + _PLOT + 60, height=120)  # the page's own height
    assert report.screenshot is not None
    with open(output, "wb") as f:
        f.write(report.screenshot)
    return report


def hosts_of(events: Iterable[Event]) -> list[str]:
    """The hosts of ``events``, in order of their first event (the timeline's rows)."""
    first: dict[str, float] = defaultdict(lambda: math.inf)
    for e in events:
        first[e.host] = min(first[e.host], e.at)
    return sorted(first, key=lambda h: (first[h], h))
