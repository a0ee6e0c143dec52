"""Sphinx configuration of scrapy-polite's documentation (MyST Markdown pages, the furo theme).

Build it offline, warnings as errors and every cross reference checked (as .ci/run does):

    sphinx-build -W -n --keep-going -b html docs docs/_build/html

The reference pages under reference/generated/ are written from the code when the build starts
(docs/_ext/polite_reference.py). No extension fetches anything: intersphinx is not used, so a reference to
Scrapy's, Twisted's or Python's own objects is shown as plain text (nitpick_ignore_regex below).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))

import scrapy_polite  # noqa: E402

project = "scrapy-polite"
author = "the scrapy-polite developers"
copyright = "the scrapy-polite developers"
release = version = scrapy_polite.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "polite_reference",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4  # GitHub-style anchors for headings, so spec.md's links (#2-the-pacing-policy) resolve
suppress_warnings = ["myst.header"]  # spec.md's sections are numbered by hand (§1 … §8)

html_theme = "furo"
html_title = f"scrapy-polite {release}"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # signatures name Scrapy's and Twisted's types, which offline builds cannot link
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

nitpicky = True
# Internal names that public docstrings cite: not part of the API (docs/reference/api.md), so not documented.
nitpick_ignore = [
    ("py:class", "scrapy_polite.pacer.Pacer"),
    ("py:class", "scrapy_polite.stores.Event"),
    ("py:class", "PoliteConfig"),
    ("py:func", "scrapy_polite.settings.parse_dns_overrides"),
    ("py:meth", "scrapy_polite.reports.counters.Report.host_report"),
]
# Objects of other projects: without intersphinx (offline) they cannot resolve. Our own names must.
nitpick_ignore_regex = [
    (r"py:.*", r"(scrapy|twisted|zope|playwright|scrapy_playwright|scrapy_redis|redis|dns|http|sqlite3|asyncio|"
               r"typing|collections|types|ipaddress|enum|pathlib|dataclasses|logging|argparse)(\..*)?"),
    (r"py:.*", r"(Any|Callable|Mapping|Sequence|Iterable|Iterator|Awaitable|Final|Literal|None|object|type|str|int|"
               r"float|bool|bytes|dict|list|tuple|set|frozenset|Exception|ValueError|TypeError|KeyError|"
               r"OSError|RuntimeError|IgnoreRequest|NotConfigured|CloseSpider|DontCloseSpider|Deferred|Request|Response|Spider|Crawler|Settings|"
               r"BaseSettings|IReactorCore|IResolverSimple|DNSLookupError|Failure)"),
]
