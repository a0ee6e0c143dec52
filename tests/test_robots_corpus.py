"""scrapy_polite.policy.robots against real robots.txt files (Protego's public corpus, ``tests/data/robots``).

Every file has a ``Crawl-delay`` or ``Request-rate`` line in some real-world spelling. For each file and
user agent, :func:`scrapy_polite.policy.robots.parse_robots_delay` must not raise and must equal what Protego itself
reports, computed here independently: ``crawl_delay(ua)`` and ``request_rate(ua)`` (``n/s`` → ``s/n``
seconds), the larger of the two when both are published.

The corpus is ``tests/data/robots`` in the repository (provenance: ``tests/data/README.md``), or the folder
``$POLITE_ROBOTS_CORPUS`` names when it is set. It is never skipped: a missing or empty corpus fails.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
from protego import Protego

from scrapy_polite.policy.robots import parse_robots_delay

AGENTS = ("scrapy-polite-test", "Scrapy", "*")
_ENV = "POLITE_ROBOTS_CORPUS"
_DEFAULT = Path(__file__).resolve().parent / "data" / "robots"
CORPUS = Path(os.environ[_ENV]) if os.environ.get(_ENV) else _DEFAULT
FILES = sorted(p for p in CORPUS.iterdir() if p.is_file()) if CORPUS.is_dir() else []
#: One failing parameter instead of an empty (silently skipped) set when the corpus is missing.
FILE_PARAMS = [pytest.param(p, id=p.name) for p in FILES] or [pytest.param(None, id="corpus-missing")]

_UA_LINE = re.compile(r"(?im)^[ \t]*user-agent[ \t]*:[ \t]*([^#\r\n]*)")


def _require_corpus() -> None:
    """Fail (never skip) when the corpus is missing: it is part of the repository."""
    if FILES:
        return
    if os.environ.get(_ENV):
        pytest.fail(f"{_ENV}={os.environ[_ENV]!r} is not a folder of robots.txt files")
    pytest.fail(f"robots.txt corpus missing or empty at {CORPUS}: it is part of the repository "
                f"(tests/data/robots, see tests/data/README.md); restore it, or set {_ENV} to its folder")


def _text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def _named_agents(text: str) -> list[str]:
    """The user agents a file names in its groups (besides AGENTS), so per-agent groups are exercised too."""
    names = {m.strip() for m in _UA_LINE.findall(text)}
    return sorted(n for n in names if n and n not in AGENTS)


def protego_delay(rp: Protego, ua: str) -> float | None:
    """The reference: Protego's own answer, combined as the spec says (max of Crawl-delay and s/n)."""
    values = []
    cd = rp.crawl_delay(ua)
    if cd is not None:
        values.append(float(cd))
    rr = rp.request_rate(ua)
    if rr is not None and rr.requests:
        values.append(rr.seconds / rr.requests)
    values = [v for v in values if math.isfinite(v) and v >= 0]
    return max(values) if values else None


def test_corpus_present():
    _require_corpus()
    assert len(FILES) >= 300, f"only {len(FILES)} files in {CORPUS}"


@pytest.mark.parametrize("path", FILE_PARAMS)
def test_file_matches_protego(path: Path | None):
    _require_corpus()
    assert path is not None
    body = path.read_bytes()
    text = _text(path)
    rp = Protego.parse(text)
    for ua in (*AGENTS, *_named_agents(text)):
        got = parse_robots_delay(body, ua)
        want = protego_delay(rp, ua)
        assert got == want, f"{path.name}: user agent {ua!r}: parse_robots_delay={got!r}, Protego={want!r}"
        assert got is None or (isinstance(got, float) and math.isfinite(got) and got >= 0)
    # str input gives the same answer as bytes
    assert parse_robots_delay(text, "*") == parse_robots_delay(body, "*")


def test_corpus_is_not_trivial():
    """The corpus must actually exercise delays: most files publish one that our agents (or a named one)
    get. Measured on the 588-file corpus: 397 files give a delay to one of AGENTS, 571 to some agent."""
    _require_corpus()
    ours = anyone = 0
    for path in FILES:
        body = path.read_bytes()
        hit = any(parse_robots_delay(body, ua) is not None for ua in AGENTS)
        ours += hit
        anyone += hit or any(parse_robots_delay(body, ua) is not None for ua in _named_agents(_text(path)))
    assert ours >= 350, f"only {ours}/{len(FILES)} files give a delay to one of {AGENTS}"
    assert anyone >= 500, f"only {anyone}/{len(FILES)} files give a delay to any agent"


# Values read by hand from the files (line numbers as of the corpus snapshot).
SPOT = [
    ("arxiv.org", "*", 15.0),  # l.5-6  User-agent: * / Crawl-delay: 15
    ("arxiv.org", "scrapy-polite-test", 15.0),  # not named: falls back to *
    ("arxiv.org", "Baiduspider", 10.0),  # l.148-149 its own group
    ("arxiv.org", "bingbot", 1.0),  # l.112-113
    ("alison.com", "*", 5.0),  # Crawl-delay: 5
    ("www.parents.com", "*", 0.5),  # "Crawl-delay: .5"
    ("www.fda.gov", "*", 30.0),  # "Crawl-Delay: 30 # wait 30 seconds ..." (trailing comment)
    ("www.fda.gov", "usasearch", 2.0),  # its own group, Crawl-delay: 2
    ("www.symantec.com", "IQ-WWW", 0.2),  # "Request-rate: 5/1" = 5 pages per second
    ("www.symantec.com", "*", None),  # the * group publishes no delay
    ("moodle.org_443", "*", 20.0),  # Crawl-delay: 20 and Request-rate: 1/20
    ("ballotpedia.org", "*", None),  # "#Crawl-delay: 5" / "#Request-rate: 1/5" are commented out
    ("www.eliteprospects.com", "*", None),  # Crawl-delay: 30 before any User-agent line belongs to no group
]


@pytest.mark.parametrize(("name", "ua", "expected"), SPOT, ids=[f"{n}-{u}" for n, u, _ in SPOT])
def test_spot_values(name: str, ua: str, expected: float | None):
    _require_corpus()
    path = CORPUS / name
    if not path.is_file():
        pytest.fail(f"spot-check file {name} missing from {CORPUS}")
    assert parse_robots_delay(path.read_bytes(), ua) == expected
