"""The shared vocabulary (:mod:`scrapy_polite.vocabulary`): "seconds >= 0" read once, the request meta keys named
once (no other module spells one), the reasons and kinds each listing matches, and the documentation's reference
pages (generated from this module by docs/_ext/polite_reference.py) cite the names.
Scrapy-free, except for reading the package's source."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from scrapy_polite import stores, vocabulary
from scrapy_polite.reports import counters, events
from scrapy_polite.vocabulary import (
    CLOSE_REASONS,
    DEFERRAL_REASONS,
    EVENT_KINDS,
    FAILED_CLOSE_REASONS,
    REFUSAL_REASONS,
    TURN_REASONS,
    parse_seconds,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scrapy_polite"

def _reference_pages() -> tuple[str, str]:
    """The generated reference pages of meta keys and of close reasons (docs/_ext/polite_reference.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("polite_reference_v", ROOT / "docs" / "_ext" / "polite_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.meta_page(), module.reasons_page()


META_PAGE, REASONS_PAGE = _reference_pages()

# -- parse_seconds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    (0, 0.0), (5, 5.0), (2.5, 2.5), ("5", 5.0), (" 2.5 ", 2.5), ("1e3", 1000.0), ("0", 0.0), (-0.0, 0.0),
])
def test_parse_seconds_accepts_durations(value, expected):
    got = parse_seconds(value)
    assert got == expected and isinstance(got, float)


@pytest.mark.parametrize("value", [
    -1, -0.001, "-1", float("nan"), "nan", float("inf"), "inf", "-inf", "1e309", "soon", "", None, [5], {"a": 1},
    object(), 10**400,
    True, False,  # though float() and Scrapy's getfloat read them as 1 and 0: False would unpace every host
])
def test_parse_seconds_refuses_what_is_not_a_duration(value):
    assert parse_seconds(value) is None  # never raises


def test_parse_seconds_boundaries():
    """The negative control of the table above: the smallest accepted and the largest finite values."""
    assert parse_seconds(0.0) == 0.0 and parse_seconds(math.ulp(0.0)) == math.ulp(0.0)
    assert parse_seconds(-math.ulp(0.0)) is None
    assert parse_seconds(1.7976931348623157e308) == 1.7976931348623157e308


# -- the meta keys are named once ---------------------------------------------------------------------------

META_NAMES = {name: getattr(vocabulary, name) for name in vocabulary.__all__ if name.endswith("_META")}
assert all(isinstance(v, str) for v in META_NAMES.values())


def _spelled_meta_keys(source: str) -> list[tuple[int, str]]:
    """Where ``source`` spells a meta key as a string literal in code: ``meta["k"]``, ``meta.get("k")``,
    ``meta.pop("k")``, ``meta.setdefault("k")``, ``"k" in meta`` (docstrings and messages do not count)."""
    keys = set(META_NAMES.values())
    found: list[tuple[int, str]] = []

    def is_meta(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "meta") or (
            isinstance(node, ast.Attribute) and node.attr == "meta")

    def literal(node: ast.AST | None) -> str | None:
        return node.value if isinstance(node, ast.Constant) and node.value in keys else None

    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and is_meta(node.value):
            key = literal(node.slice)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_meta(node.func.value)
              and node.func.attr in ("get", "pop", "setdefault") and node.args):
            key = literal(node.args[0])
        elif isinstance(node, ast.Compare) and any(is_meta(c) for c in node.comparators):
            key = literal(node.left)
        if key is not None:
            found.append((node.lineno, key))
    return found


def test_no_module_spells_a_meta_key():
    spelled = {str(path.relative_to(ROOT)): hits for path in sorted(PACKAGE.rglob("*.py"))
               if path.name != "vocabulary.py" and (hits := _spelled_meta_keys(path.read_text()))}
    assert spelled == {}, "use the constants of scrapy_polite.vocabulary"


def test_the_scanner_finds_a_spelled_key():
    """The negative control: each shape the scanner looks for, and a docstring it must leave alone."""
    source = '''
def f(request, meta):
    """meta['polite_ip'] in prose is fine."""
    request.meta["polite_host"] = 1
    meta.get("polite_delay")
    request.meta.pop("_polite_pinned", None)
    if "polite_burst" in request.meta:
        pass
    request.meta.get(HOST_META)
    other.get("polite_ip")
'''
    assert _spelled_meta_keys(source) == [(4, "polite_host"), (5, "polite_delay"), (6, "_polite_pinned"),
                                          (7, "polite_burst")]


def test_the_meta_keys_are_distinct_and_prefixed():
    values = list(META_NAMES.values())
    assert len(set(values)) == len(values)
    assert all(v.startswith(("polite_", "_polite_")) for v in values if v != "dont_pace")


@pytest.mark.parametrize("name", ["DELAY_META", "BURST_META", "DONT_PACE_META", "HOST_META", "IP_META",
                                  "SENT_AT_META", "QUOTA_SERIAL_META", "THROTTLE_RETRIES_META"])
def test_the_reference_cites_each_public_meta_key_with_its_constant(name):
    assert f"`{META_NAMES[name]}`" in META_PAGE and f"scrapy_polite.vocabulary.{name}`" in META_PAGE


def test_the_reference_does_not_cite_the_private_marks():
    for name, value in META_NAMES.items():
        if value.startswith("_"):
            assert value not in META_PAGE and name not in META_PAGE


def test_the_meta_page_is_checked_against_the_constants():
    """The negative control: a key the page would lack is caught (the page is built from META_MEANINGS)."""
    assert "`polite_delay`" in META_PAGE and "`polite_no_such_key`" not in META_PAGE


def test_older_names_are_the_vocabulary_s():
    from scrapy_polite.crawl.retrying import RETRIES_META
    from scrapy_polite.frontier.leases import LEASE_META

    assert RETRIES_META is vocabulary.THROTTLE_RETRIES_META and LEASE_META is vocabulary.LEASE_META


# -- reasons and kinds ------------------------------------------------------------------------------------


def test_every_reason_has_words_and_no_words_lack_a_reason():
    assert set(events.DEFERRAL_WORDS) == set(DEFERRAL_REASONS)
    assert set(events.REFUSAL_WORDS) == set(REFUSAL_REASONS)


def test_turn_reasons_are_deferral_reasons():
    assert TURN_REASONS == {"line", "ip_line", "turn"} and TURN_REASONS < set(DEFERRAL_REASONS)
    assert counters.TURN_REASONS is TURN_REASONS


def test_the_store_s_event_kinds_are_the_vocabulary_s():
    assert stores.EVENT_KINDS is EVENT_KINDS
    assert EVENT_KINDS[0] == "opened" and EVENT_KINDS[-1] == "closed" and len(set(EVENT_KINDS)) == len(EVENT_KINDS)


def test_close_reasons_are_documented():
    assert FAILED_CLOSE_REASONS < set(CLOSE_REASONS)
    for reason in CLOSE_REASONS:
        assert f"`{reason}`" in REASONS_PAGE, reason


def test_polite_enabled_is_spelled_in_settings_only():
    """``POLITE_ENABLED`` is read in one place (:func:`scrapy_polite.settings.polite_enabled`): no other module
    has the name alone as a string (``getbool("POLITE_ENABLED")`` would); docstrings and messages, longer
    strings, may mention it."""
    spelled = [(path.name, node.lineno) for path in sorted(PACKAGE.rglob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and node.value == "POLITE_ENABLED"]
    # SETTINGS (DEFAULTS is made from it) and polite_enabled
    assert sorted(name for name, _ in spelled) == ["declaration.py", "reading.py"], spelled
