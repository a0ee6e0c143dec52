"""The timeline picture of the event log (``scrapy polite timeline``, docs/guides/operating.md, "The timeline").

:func:`timeline_html` draws events (:class:`~scrapy_polite.stores.Event`) as **one self-contained HTML file**:
inline SVG, CSS and a few lines of script, a ``Content-Security-Policy`` of ``default-src 'none'``, so opening
it makes no network request. One row per host; each request a mark from its booking to its response, coloured
by outcome; backoff and Retry-After windows shaded; waits (a bar under the marks) and deferrals (a triangle,
dashed until due) visible; hovering a mark shows its URL, status and the delay chosen.

:func:`timeline_svg` draws the same picture as **one standalone SVG image** (``scrapy polite timeline -o
timeline.svg``), which any browser, editor or issue tracker shows with no browser to drive: its tooltips are
SVG ``<title>`` elements. The add-on drives no browser (the tests render both in headless Chromium).
"""

from __future__ import annotations

import html
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..stores.base import Event
from .events import DEFERRAL_WORDS, REFUSAL_WORDS, clock_time, crawl_events, describe
from .words import plural

__all__ = ["FORMATS", "OUTCOME_COLOURS", "hosts_of", "timeline_format", "timeline_html", "timeline_svg",
           "write_timeline"]

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


#: The picture's own style: the same in the standalone SVG and inside the HTML page.
_SVG_CSS = (
    "text{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;font-size:12px;fill:#222}"
    ".title{font-size:17px;font-weight:600}.meta{fill:#555}"
    ".host{font-family:ui-monospace,Menlo,Consolas,monospace}"
    ".tick{font-size:11px;fill:#555}.grid{stroke:#e4e4e4;stroke-width:1}.band{fill:#f7f7f7}"
    ".mark,.win,.wait,.defer,.point{cursor:pointer}"
    ".mark:hover,.point:hover,.defer:hover{stroke:#000;stroke-width:1.5}")

_CSS = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 20px;color:#222;background:#fff}
svg{display:block}
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

#: The formats :func:`write_timeline` writes, by the ending of the output's name.
FORMATS = ("html", "svg")

_HEAD = 62  # px, the title, the meta line and the legend above the time axis


def _attr(text: str) -> str:
    return html.escape(text, quote=True).replace("\n", "&#10;")


def _shape(tag: str, attrs: str, tip: str, standalone: bool) -> str:
    """One SVG element with its tooltip: a ``data-tip`` attribute (the HTML page's script shows it) and, in the
    standalone SVG, a ``<title>`` child (every browser and editor shows it natively)."""
    if standalone:
        return f'<{tag} {attrs} data-tip="{_attr(tip)}"><title>{html.escape(tip)}</title></{tag}>'
    return f'<{tag} {attrs} data-tip="{_attr(tip)}"/>'


def _legend(top: float) -> str:
    """The legend as SVG: the outcome colours, then the windows, waits, deferrals and points (same words as
    docs/guides/operating.md, "The timeline")."""
    items: list[tuple[str, str]] = [
        (f'<rect width="14" height="12" rx="2" fill="{colour}"/>', name) for name, colour in OUTCOME_COLOURS.items()]
    items += [(f'<rect width="14" height="12" rx="2" fill="{_WINDOW_FILL["backoff"]}"/>', "backoff window"),
              (f'<rect width="14" height="12" rx="2" fill="{_WINDOW_FILL["retry-after"]}"/>', "Retry-After window"),
              ('<rect y="4" width="14" height="4" fill="#4a90d9"/>', "wait in line"),
              ('<path d="M2 1h10L7 9z" fill="#6a51a3"/>', "deferral (dashed until due)"),
              ('<path d="M7 0l6 6-6 6-6-6z" fill="#1b7837"/>', "robots.txt delay"),
              ('<path d="M2 1l10 10M12 1l-10 10" stroke="#000" stroke-width="2"/>', "refusal")]
    out, x = [f'<g class="legend" transform="translate(0 {top})">'], 0.0
    for icon, word in items:
        out.append(f'<g transform="translate({round(x, 1)} 0)">{icon}'
                   f'<text x="19" y="11">{html.escape(word)}</text></g>')
        x += 19 + 6.6 * len(word) + 16  # icon, the word at about 6.6 px a character, a gap
    out.append("</g>")
    return "".join(out)


def _picture(events: Sequence[Event], rows: dict[str, _Row], *, title: str, store: str, drawn: float,
             standalone: bool) -> str:
    """The timeline as one ``<svg>`` element: title, meta line, legend, time axis, one row per host."""
    t0, t1 = _range(events)
    scale = _PLOT / (t1 - t0)

    def x(t: float) -> float:
        return round(_LABEL + (min(max(t, t0), t1) - t0) * scale, 2)

    axis = _HEAD + _AXIS
    height = axis + _ROW * len(rows) + 8
    width = _LABEL + _PLOT + 20
    meta = (f'{plural(len(events), "event")}, {plural(len(rows), "host")}, {clock_time(t0, date=True)} to '
            f'{clock_time(max(e.at for e in events), date=True)} (local time)'
            f'{" — " + store if store else ""}; drawn {clock_time(drawn, date=True)}.')
    out: list[str] = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                      f'viewBox="0 0 {width} {height}">\n']
    if standalone:
        out.append(f"<title>{html.escape(title)}</title>\n")
    out.append(f'<style>{_SVG_CSS}</style>\n<rect width="{width}" height="{height}" fill="#fff"/>\n'
               f'<text class="title" x="0" y="18">{html.escape(title)}</text>\n'
               f'<text class="meta" x="0" y="36">{html.escape(meta)}</text>\n{_legend(44)}\n')
    out.extend(_ticks(x, t0, t1, top=axis, bottom=height - 8))
    out.extend(_row(row, index, x, top=axis + index * _ROW, width=width, standalone=standalone)
               for index, row in enumerate(rows.values()))
    out.append("</svg>\n")
    return "".join(out)


def _ticks(x: Callable[[float], float], t0: float, t1: float, *, top: float, bottom: float) -> list[str]:
    """The time axis from ``t0`` to ``t1`` (epoch s): a grid line and a clock time at each tick; ``x``: a time's
    abscissa (px); ``top`` and ``bottom``: the rows' extent (px)."""
    out = []
    step = _tick_step(t1 - t0)
    tick = math.ceil(t0 / step) * step
    while tick <= t1:
        xt = x(tick)
        label = clock_time(tick)[: 12 if step < 1 else 8]
        out.append(f'<line class="grid" x1="{xt}" y1="{top - 6}" x2="{xt}" y2="{bottom}"/>'
                   f'<text class="tick" x="{xt}" y="{top - 12}" text-anchor="middle">{label}</text>\n')
        tick += step
    return out


def _row(row: _Row, index: int, x: Callable[[float], float], *, top: float, width: float, standalone: bool) -> str:
    """One host's row (``index`` from 0, ``top`` its ordinate, px): its name, then its windows, waits, deferrals,
    request marks and points, each with its tooltip."""
    mid = top + _ROW / 2
    name = row.host or "(no host)"
    short = name if len(name) <= 30 else name[:29] + "…"
    out = [f'<g class="row" data-host="{_attr(row.host)}">']
    if index % 2 == 0:
        out.append(f'<rect class="band" x="0" y="{top}" width="{width}" height="{_ROW}"/>')
    out.append(f'<text class="host" x="6" y="{mid + 4}"><title>{html.escape(name)}</title>{html.escape(short)}</text>')
    for start, end, kind, tip in row.windows:
        out.append(_shape("rect", f'class="win {kind}" x="{x(start)}" y="{top + 2}" '
                          f'width="{max(1.0, x(end) - x(start))}" height="{_ROW - 4}" fill="{_WINDOW_FILL[kind]}"',
                          tip, standalone))
    for start, end, tip in row.waits:
        out.append(_shape("rect", f'class="wait" x="{x(start)}" y="{top + _ROW - 7}" '
                          f'width="{max(1.0, x(end) - x(start))}" height="4" fill="#4a90d9" fill-opacity="0.7"',
                          tip, standalone))
    for at, due, tip in row.deferrals:
        xa = x(at)
        if due is not None and due > at:
            out.append(f'<line x1="{xa}" y1="{top + 5}" x2="{x(due)}" y2="{top + 5}" stroke="#6a51a3" '
                       'stroke-width="1" stroke-dasharray="3,3"/>')
        out.append(_shape("path", f'class="defer" d="M{xa - 4} {top + 1}h8l-4 7z" fill="#6a51a3"', tip, standalone))
    for start, end, kind, tip in row.marks:
        xs = x(start)
        w = max(3.0, x(end) - xs)
        colour = OUTCOME_COLOURS[kind]
        style = f'fill="none" stroke="{colour}" stroke-width="1.5"' if kind == "no response" else f'fill="{colour}"'
        out.append(_shape("rect", f'class="mark {kind.replace(" ", "-")}" x="{xs}" y="{mid - 7}" '
                          f'width="{round(w, 2)}" height="14" rx="1.5" {style}', tip, standalone))
    out.extend(_point(at, kind, tip, top=top, standalone=standalone, x=x) for at, kind, tip in row.points)
    out.append("</g>\n")
    return "".join(out)


def _point(at: float, kind: str, tip: str, *, top: float, standalone: bool, x: Callable[[float], float]) -> str:
    """A moment's mark in a row: a robots.txt Crawl-delay (a diamond), a refusal (a cross), an operator's act (a
    dashed line)."""
    xa = x(at)
    mid = top + _ROW / 2
    if kind == "robots_delay":
        return _shape("path", f'class="point robots" d="M{xa} {mid - 7}l6 7-6 7-6-7z" fill="#1b7837"', tip, standalone)
    if kind == "refusal":
        attrs = (f'class="point refusal" d="M{xa - 5} {mid - 5}l10 10M{xa + 5} {mid - 5}l-10 10" '
                 'stroke="#000" stroke-width="2.5"')
        return _shape("path", attrs, tip, standalone)
    attrs = (f'class="point operator" x1="{xa}" y1="{top}" x2="{xa}" y2="{top + _ROW}" stroke="#000" '
             'stroke-width="2" stroke-dasharray="2,2"')
    return _shape("line", attrs, tip, standalone)


def timeline_svg(events: Iterable[Event], *, title: str = "scrapy-polite timeline", store: str = "",
                 now: float | None = None) -> str:
    """The timeline of ``events`` as one standalone SVG document (see the module): an image any browser, editor
    or issue tracker shows, with its title, legend and a ``<title>`` tooltip on every mark; no script, nothing
    to fetch.

    Args:
        events: the events to draw, any order (:meth:`PaceStore.events
            <scrapy_polite.stores.base.PaceStore.events>`); hosts get one row each, in order of their first event.
        title: the picture's title.
        store: the pace table's URI, for the meta line.
        now: when it was drawn (epoch s; default: now), for the meta line.

    Returns:
        The SVG text (UTF-8 when written), well-formed XML.
    """
    events = sorted(crawl_events(events), key=lambda e: e.at)  # (a log's opening and close: no host's)
    drawn = time.time() if now is None else now
    prolog = '<?xml version="1.0" encoding="UTF-8"?>\n'
    if not events:
        text = f'No events{" in " + store if store else ""}.'
        return (prolog + '<svg xmlns="http://www.w3.org/2000/svg" width="600" height="60" viewBox="0 0 600 60">'
                f'<title>{html.escape(title)}</title><rect width="600" height="60" fill="#fff"/>'
                f'<text x="0" y="18" font-size="17" font-family="sans-serif">{html.escape(title)}</text>'
                f'<text x="0" y="40" font-size="12" font-family="sans-serif" fill="#555">{html.escape(text)}</text>'
                '</svg>\n')
    return prolog + _picture(events, _rows(events), title=title, store=store, drawn=drawn, standalone=True)


def timeline_html(events: Iterable[Event], *, title: str = "scrapy-polite timeline", store: str = "",
                  now: float | None = None) -> str:
    """The timeline of ``events`` as one self-contained HTML document: the picture of :func:`timeline_svg`
    inline, a table per host, and a few lines of script that show a mark's tooltip on hover; a
    ``Content-Security-Policy`` of ``default-src 'none'``, so opening it makes no network request.

    Args: as :func:`timeline_svg`.

    Returns:
        The HTML text (UTF-8 when written).
    """
    events = sorted(crawl_events(events), key=lambda e: e.at)  # (a log's opening and close: no host's)
    drawn = time.time() if now is None else now
    head = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            'style-src \'unsafe-inline\'; script-src \'unsafe-inline\'">\n'
            f'<meta name="viewport" content="width=device-width"><title>{html.escape(title)}</title>\n'
            f'<style>{_CSS}</style></head><body>\n')
    if not events:
        return (head + f'<h1>{html.escape(title)}</h1>\n<p class="meta">No events'
                f'{" in " + html.escape(store) if store else ""}.</p></body></html>\n')
    rows = _rows(events)
    out: list[str] = [head, _picture(events, rows, title=title, store=store, drawn=drawn, standalone=False)]
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


def timeline_format(output: str, requested: str | None = None) -> str:
    """The format to write ``output`` in: ``requested`` when given, else by its name's ending (``.svg``: svg,
    anything else: html).

    Raises:
        ValueError: ``requested`` is not one of :data:`FORMATS`, or ``output`` ends in ``.png`` with no format
            asked (PNG is no longer drawn: the SVG is an image every browser and editor shows).
    """
    if requested is not None:
        if requested not in FORMATS:
            raise ValueError(f"--format {requested!r}: choose one of {', '.join(FORMATS)}")
        return requested
    lowered = output.lower()
    if lowered.endswith(".png"):
        raise ValueError(f"{output}: the timeline is drawn as SVG or HTML, not PNG. Fix: -o "
                         f"{output[:-4]}.svg (an image any browser, editor or issue tracker shows)")
    return "svg" if lowered.endswith(".svg") else "html"


def write_timeline(events: Sequence[Event], output: str, *, title: str = "scrapy-polite timeline", store: str = "",
                   fmt: str | None = None) -> str:
    """Write the timeline of ``events`` to the file ``output``, as :func:`timeline_svg` or :func:`timeline_html`
    (chosen by :func:`timeline_format`).

    Returns:
        The format written: ``"svg"`` or ``"html"``.

    Raises:
        ValueError: no such format (see :func:`timeline_format`); nothing is written.
        OSError: ``output`` cannot be written.
    """
    chosen = timeline_format(output, fmt)
    draw = timeline_svg if chosen == "svg" else timeline_html
    document = draw(events, title=title, store=store)
    with open(output, "w", encoding="utf-8") as f:
        f.write(document)
    return chosen


def hosts_of(events: Iterable[Event]) -> list[str]:
    """The hosts of ``events``, in order of their first event (the timeline's rows but its "(no host)" one: a table's
    ``restored`` event names no host, trial: "5 hosts" for 4)."""
    first: dict[str, float] = defaultdict(lambda: math.inf)
    for e in crawl_events(events):
        if e.host:
            first[e.host] = min(first[e.host], e.at)
    return sorted(first, key=lambda h: (first[h], h))
