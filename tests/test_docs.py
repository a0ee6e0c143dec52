"""The documentation against the code (docs/; issue 32): the reference generated from the code says what the
code does, both ways, and the hand-written pages name only what exists.

* settings: :data:`scrapy_polite.settings.SETTINGS` declares every setting of ``DEFAULTS``, each read the way its
  declared kind says (found in the source of ``scrapy_polite/settings/``), and the generated page shows each with its default;
* stats: every ``polite/...`` key the package's source counts is declared in
  :data:`scrapy_polite.vocabulary.STATS`, and every declared key is counted somewhere;
* meta keys, close reasons, the command's verbs and exit statuses: on the generated pages;
* the hand-written pages name no setting, stat or meta key the code does not have;
* every WARNING and ERROR the code can log is in the troubleshooting guide;
* every ``docs/spec.md §n`` (and ``§n, "Label"``) the code cites exists;
* README.md fits on a screen or two, and its two commands are the ones ``.ci/run`` runs.

Each scanner has a negative control: a source or page made to break the rule, which the check must catch.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from scrapy_polite import commands, settings, vocabulary
from scrapy_polite.commands import rows
from scrapy_polite.policy import HostState
from scrapy_polite.settings import DEFAULTS, SETTINGS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scrapy_polite"
DOCS = ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("polite_reference", DOCS / "_ext" / "polite_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("polite_reference", module)
    spec.loader.exec_module(module)
    return module


GEN = _generator()

#: The hand-written pages (the generated ones are checked against the code directly).
HAND_PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts and "generated" not in p.parts)


def _plain(text: str) -> str:
    """A page's text without MyST roles' names (``{setting}`X``` → ```X```), whitespace collapsed."""
    return " ".join(re.sub(r"\{[a-z:]+\}`", "`", text).split())


# -- settings -----------------------------------------------------------------------------------------------

#: How settings.py reads a setting, by the reader it calls → the declared kind that reader means.
_READERS = {"_seconds": "seconds", "_positive_seconds": "seconds", "_bool": "bool", "_count": "count", "_list": "list", "_dict": "dict",
            "_dns_overrides": "dict"}


def readers_in(source: str) -> dict[str, set[str]]:
    """Each ``"POLITE_*"`` name passed to a reader of ``source`` (``_seconds(settings, "POLITE_X")``), with the
    kinds it is read as; ``_read(settings, NAME, settings.getfloat, …)`` is a ``number``, ``_raw`` a ``string``."""
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                 and a.value.startswith("POLITE_")]
        if not names:
            continue
        func = node.func.id
        if func in _READERS:
            kind = _READERS[func]
        elif func == "_read":
            getter = node.args[2] if len(node.args) > 2 else None
            kind = "number" if isinstance(getter, ast.Attribute) and getter.attr == "getfloat" else "other"
        elif func == "_raw":
            kind = "string"
        else:
            continue
        for name in names:
            found.setdefault(name, set()).add(kind)
    return found


def kind_mismatches(declared: dict[str, str], read: dict[str, set[str]]) -> list[str]:
    """Settings whose declared kind is not how the code reads them (a setting read by its raw value as well as by
    a typed reader is judged by the typed one), or that the code never reads, or reads without declaring."""
    problems = []
    for name, kind in declared.items():
        kinds = read.get(name, set())
        typed = kinds - {"string"}
        if not kinds:
            problems.append(f"{name}: declared, never read")
        elif (typed and kind not in typed) or (not typed and kind != "string"):
            problems.append(f"{name}: declared {kind}, read as {sorted(kinds)}")
    problems += [f"{name}: read, not declared" for name in read if name not in declared]
    return problems


def test_every_setting_is_declared_once_with_its_default():
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    assert set(names) == set(DEFAULTS)
    assert all(s.default is DEFAULTS[s.name] for s in SETTINGS)
    assert all(s.doc.strip() and s.kind in GEN._KIND_WORDS for s in SETTINGS)
    assert all(kind in ("note", "warning") and text.strip() for s in SETTINGS for kind, text in s.notes)


def test_each_setting_is_read_as_declared():
    read = readers_in("\n".join(path.read_text(encoding="utf-8") for path in sorted((PACKAGE / "settings").glob("*.py"))))
    assert kind_mismatches({s.name: s.kind for s in SETTINGS}, read) == []


def test_the_reader_scan_catches_a_wrong_kind():
    """The negative control: a boolean read as seconds, an undeclared setting, a declared one never read."""
    source = '''
def f(settings):
    a = _seconds(settings, "POLITE_A")
    b = _read(settings, "POLITE_B", settings.getfloat, "a number")
    c = _raw(settings, "POLITE_C")
    d = _bool(settings, "POLITE_D")
'''
    read = readers_in(source)
    assert read == {"POLITE_A": {"seconds"}, "POLITE_B": {"number"}, "POLITE_C": {"string"}, "POLITE_D": {"bool"}}
    assert kind_mismatches({"POLITE_A": "seconds", "POLITE_B": "number", "POLITE_C": "string",
                            "POLITE_D": "bool"}, read) == []
    assert kind_mismatches({"POLITE_A": "bool", "POLITE_B": "number", "POLITE_C": "string", "POLITE_E": "bool"},
                           read) == ["POLITE_A: declared bool, read as ['seconds']", "POLITE_E: declared, never read",
                                     "POLITE_D: read, not declared"]


def test_the_settings_page_shows_every_setting_with_its_default_and_caveats():
    page = GEN.settings_page()
    for s in SETTINGS:
        assert f"```{{setting}} {s.name}\n```" in page and f"## `{s.name}`" in page
        assert f"- default: {s.default_words or GEN._literal(s.default)}" in page
        for kind, text in s.notes:
            assert f"```{{{kind}}}\n{text}\n```" in page
    assert "`2.0`" in page.split("## `POLITE_IP_INTERVAL`", 1)[1].split("## ", 1)[0]


def test_the_caveats_users_looked_for_are_at_their_settings():
    """Issue 32's new user: each caveat is an admonition where the setting is described."""
    notes = {s.name: " ".join(text for _, text in s.notes) for s in SETTINGS}
    assert "one request every 2 seconds per host" in notes["POLITE_HOST_INTERVAL"]
    assert "one request every 2 seconds" in notes["POLITE_IP_INTERVAL"]
    assert "MAX_IDLE_TIME_BEFORE_CLOSE" in notes["POLITE_LEASE_TIME"]
    assert "restarted without persistence" in notes["POLITE_STORE"]


def test_the_settings_page_refuses_a_table_that_misses_a_setting(monkeypatch):
    """The negative control: a setting in DEFAULTS without its declaration stops the build."""
    from scrapy_polite import settings

    monkeypatch.setattr(settings, "SETTINGS", SETTINGS[1:])
    with pytest.raises(ValueError, match=SETTINGS[0].name):
        GEN.settings_page()


# -- stats --------------------------------------------------------------------------------------------------

#: The calls that set a stat: ``report.inc("key")`` and the like add ``polite/``; Scrapy's stats collector's
#: methods take the whole key.
_PREFIXED = {"inc", "_inc"}
_WHOLE = {"inc_value", "set_value", "max_value", "min_value", "get_value"}


def _key_patterns(node: ast.AST, constants: dict[str, ast.AST]) -> list[str]:
    """The keys an argument can be: a string, an f-string (each ``{…}`` becomes ``<>``), either branch of a
    conditional, or a module constant holding one of those."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "<>" for v in node.values)]
    if isinstance(node, ast.IfExp):
        return _key_patterns(node.body, constants) + _key_patterns(node.orelse, constants)
    if isinstance(node, ast.Name) and node.id in constants:
        return _key_patterns(constants[node.id], constants)
    return []


def stat_keys_in(source: str) -> set[str]:
    """Every ``polite/...`` key ``source`` sets or reads (``<>`` for a part computed at run time)."""
    tree = ast.parse(source)
    constants = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name)}
    keys: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        for key in _key_patterns(node.args[0], constants):
            if node.func.attr in _PREFIXED and not key.startswith("polite/") and key != "<>":
                keys.add(f"polite/{key}")
            elif node.func.attr in (_PREFIXED | _WHOLE) and key.startswith("polite/") and key != "polite/<>":
                keys.add(key)
    return keys


def _pattern(key: str) -> re.Pattern[str]:
    return re.compile("".join("[^/]+" if part.startswith("<") else re.escape(part)
                              for part in re.split(r"(<[^>]*>)", key)) + "$")


def _canonical(key: str) -> str:
    return re.sub(r"<[^>]*>", "<>", key)


def undeclared(used: set[str], declared: set[str]) -> set[str]:
    """Keys used that no declared key names: the same key, or a pattern and a key it covers."""
    return {u for u in used if not any(_canonical(u) == _canonical(d) or _pattern(u).match(d) or _pattern(d).match(u)
                                       for d in declared)}


def unused(declared: set[str], used: set[str]) -> set[str]:
    """Declared keys nothing in the source sets."""
    return {d for d in declared if not any(_canonical(u) == _canonical(d) or _pattern(u).match(d) for u in used)}


def package_stat_keys() -> set[str]:
    return set().union(*(stat_keys_in(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))
                         if p.name != "vocabulary.py"))


def test_every_stat_the_package_counts_is_declared_and_every_declared_stat_is_counted():
    used = package_stat_keys()
    assert "polite/requests" in used and "polite/throttles/<>" in used and "polite/unpinned/browser_aborted" in used
    assert undeclared(used, set(vocabulary.STATS)) == set()
    assert unused(set(vocabulary.STATS), used) == set()


def test_the_stat_scan_catches_an_undeclared_key():
    """The negative control: each shape a stat is counted in, and a key left out of the declaration."""
    source = '''
STAT = "a/constant"
def f(self, stats, reason, source):
    self.report.inc("a/plain")
    self.pacer.inc(f"a/{reason}")
    self._inc("a/one" if reason else f"b/{reason}")
    stats.set_value("polite/c/whole", 1)
    stats.inc_value("scheduler/dequeued/redis")
    self.report.inc(STAT)
    self.counter.inc(source)
'''
    used = stat_keys_in(source)
    assert used == {"polite/a/plain", "polite/a/<>", "polite/a/one", "polite/b/<>", "polite/c/whole",
                    "polite/a/constant"}
    declared = {"polite/a/plain", "polite/a/<reason>", "polite/a/one", "polite/c/whole", "polite/a/constant",
                "polite/d/never"}
    assert undeclared(used, declared) == {"polite/b/<>"}
    assert unused(declared, used) == {"polite/d/never"}


def test_the_stats_page_lists_every_stat():
    page = GEN.stats_page()
    for key in vocabulary.STATS:
        assert f"```{{stat}} {key}\n```\n`{key}`\n: " in page


# -- meta keys, close reasons, the command --------------------------------------------------------------------


def test_the_meta_page_cites_each_public_key_with_its_constant_and_no_private_mark():
    page = GEN.meta_page()
    public = ["DELAY_META", "BURST_META", "DONT_PACE_META", "HOST_META", "IP_META", "SENT_AT_META",
              "QUOTA_SERIAL_META", "THROTTLE_RETRIES_META"]
    assert list(vocabulary.META_MEANINGS) == public
    for name in public:
        assert f"`{getattr(vocabulary, name)}` ({{py:data}}`~scrapy_polite.vocabulary.{name}`)" in page
    for name in vocabulary.__all__:
        if name.endswith("_META") and getattr(vocabulary, name).startswith("_"):
            assert getattr(vocabulary, name) not in page and name not in page


def test_the_reasons_page_gives_every_close_reason_and_signal():
    page = GEN.reasons_page()
    assert list(vocabulary.CLOSE_REASON_MEANINGS) == list(vocabulary.CLOSE_REASONS)
    for reason in vocabulary.CLOSE_REASONS:
        assert f"```{{closereason}} {reason}\n```\n`{reason}`" in page
    assert set(GEN.connected_signals()) == set(GEN.SIGNAL_WORDS)
    assert all(f"| `{name}` |" in page for name in GEN.SIGNAL_WORDS)


def test_the_command_page_is_the_command_s_own_help():
    page = GEN.command_page()
    for verb, words in commands.VERB_HELP.items():
        assert f"| [`{verb}`](#verb-{verb}) | {words} |" in page
        assert f"```text\n{GEN.verb_help(verb)}\n```" in page
    for name in (n for n in commands.__all__ if n.startswith("EXIT_")):
        assert f"| {getattr(commands, name)} | `{name}` |" in page


def test_the_command_page_refuses_an_exit_status_without_words(monkeypatch):
    """The negative control: a new exit status without its meaning stops the build."""
    monkeypatch.setattr(commands, "__all__", [*commands.__all__, "EXIT_NEW"])
    monkeypatch.setattr(commands, "EXIT_NEW", 5, raising=False)
    with pytest.raises(ValueError, match="STATUSES"):
        GEN.command_page()


def guide_verb_lines(text: str) -> dict[str, str]:
    """The verbs and their comments in the operating guide's command block (``scrapy polite VERB …  # words``)."""
    block = text.split("## The operator command\n\n```sh\n", 1)[1].split("```", 1)[0]
    return {m[1]: m[2] for m in re.finditer(r"^scrapy polite ([a-z-]+) .*?  # (.*)$", block, re.M)
            if m[1] in commands.VERBS}


def test_the_operating_guide_lists_every_verb_in_the_command_s_words():
    assert guide_verb_lines((DOCS / "guides" / "operating.md").read_text(encoding="utf-8")) == commands.VERB_HELP


def test_the_guide_s_verb_lines_are_read_word_for_word():
    """The negative control: a block whose words differ from VERB_HELP's."""
    text = "## The operator command\n\n```sh\nscrapy polite hosts [--json]  # all the hosts\n```\n"
    assert guide_verb_lines(text) == {"hosts": "all the hosts"} != {"hosts": commands.VERB_HELP["hosts"]}


def test_show_s_other_fields_are_explained():
    """Every field of a host's row that ``show`` prints by its name (not in words: ``rows.SHOWN_FIELDS``) is in
    the operating guide's table (the lines in words are checked by ``tests/test_command.py``)."""
    section = (DOCS / "guides" / "operating.md").read_text(encoding="utf-8").split("(show-fields)=", 1)[1]
    section = section.split("\n#", 2)[1]
    by_name = [f for f in HostState.__dataclass_fields__ if f not in rows.SHOWN_FIELDS]
    assert [f for f in by_name if f"| `{f.replace('_', ' ')}` |" not in section] == []
    # Negative control: a field shown by its name that the table does not list is found.
    assert "| `held by` |" not in section


# -- the hand-written pages name only what exists --------------------------------------------------------------


#: Misspelt settings the pages show on purpose (the unknown-setting warning's example).
_EXAMPLE_TYPOS = {"POLITE_HOST_INTERVALS"}


def unknown_names(text: str) -> set[str]:
    """``POLITE_*`` settings, ``polite/...`` stats and ``polite_*`` meta keys a page names in code spans that the
    code does not have (a pattern such as ``polite/deferrals/<reason>`` stands for its keys)."""
    stats = set(vocabulary.STATS)
    metas = {getattr(vocabulary, n) for n in vocabulary.__all__ if n.endswith("_META")}
    unknown = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for name in re.findall(r"\bPOLITE_[A-Z_]*[A-Z]\b", span):
            if name not in DEFAULTS and name not in _EXAMPLE_TYPOS and not name.startswith("POLITE_TEST_") \
                    and not name.startswith("POLITE_DEMO_") and name != "POLITE_ROBOTS_CORPUS":
                unknown.add(name)
        for key in re.findall(r"\bpolite/[a-z0-9_/<>]*[a-z0-9_>]", span):
            if key not in stats and undeclared({key}, stats):
                unknown.add(key)
        for key in re.findall(r"^(polite_[a-z_]+)$", span):
            if key not in metas and key not in vocabulary.CLOSE_REASONS and not hasattr(settings, key):
                unknown.add(key)
    return unknown


@pytest.mark.parametrize("page", HAND_PAGES + [ROOT / "README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_names_only_settings_stats_and_meta_keys_that_exist(page):
    assert unknown_names(page.read_text(encoding="utf-8")) == set()


def test_the_name_scan_catches_a_name_the_code_lacks():
    """The negative control: a misspelt setting, an undeclared stat, an unknown meta key; real ones pass."""
    text = ("Set `POLITE_HOST_INTERVALL = 2` ({setting}`POLITE_IP_INTERVAL`), see `polite/throttles/429`, "
            "`polite/waitz`, `polite_delay`, `polite_delays`, `polite_deferred`, `-s POLITE_STORE=x`.")
    assert unknown_names(text) == {"POLITE_HOST_INTERVALL", "polite/waitz", "polite_delays"}


# -- every WARNING and ERROR is in the troubleshooting guide ---------------------------------------------------

_LEVELS = {"warning", "error", "exception", "critical"}
#: Log calls whose message is built elsewhere: the words the guide must have for each, by (module, line text).
_BUILT_ELSEWHERE = {
    ("extension.py", 'logger.warning("%s", leftover)'): "still apply on top of scrapy-polite's pacing",
    ("pacer.py", 'logger.error("%s", exc)'): "not scrapy_polite.resolver.PublicHostnameResolver, so non-public "
                                             "addresses could be reached",
}
#: Scrapy's own message, which the add-on's handler repeats as Scrapy does.
_SCRAPY_S_OWN = {("_compat.py", "_http11_logger.warning(get_dataloss_msg(request.url))")}


def logged_messages(path: Path) -> list[tuple[str, str]]:
    """Each WARNING or ERROR log call of ``path``: (its source line, the words the guide must have: the longest
    literal part of its message, up to 40 characters)."""
    source = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("logger")):
            continue
        if node.func.attr in _LEVELS:
            message = node.args[0] if node.args else None
        elif node.func.attr == "log" and len(node.args) >= 2:
            message = node.args[1]
        else:
            continue
        line = " ".join(ast.get_source_segment(source, node).split()).split(",", 1)[0] + \
            ("," + " ".join(ast.get_source_segment(source, node).split()).split(",", 1)[1]
             if "," in ast.get_source_segment(source, node) else "")
        call = " ".join(ast.get_source_segment(source, node).split())
        if (path.name, call) in _SCRAPY_S_OWN:
            continue
        if isinstance(message, ast.Constant) and isinstance(message.value, str):
            parts = [p.strip(" .;:()") for p in re.split(r"%[-0-9.]*[sdrgf]", message.value)]
            words = max(parts, key=len)[:40].strip()
        else:
            words = ""
        if len(words) < 10:
            words = _BUILT_ELSEWHERE.get((path.name, call), "")
        found.append((f"{path.name}: {line[:100]}", words))
    return found


def missing_from(guide: str, messages: list[tuple[str, str]]) -> list[str]:
    plain = _plain(guide)
    return [where for where, words in messages if not words or " ".join(words.split()) not in plain]


def test_every_warning_and_error_is_in_the_troubleshooting_guide():
    messages = [m for p in sorted(PACKAGE.rglob("*.py")) for m in logged_messages(p)]
    assert len(messages) > 40
    guide = (DOCS / "guides" / "troubleshooting.md").read_text(encoding="utf-8")
    assert missing_from(guide, messages) == []


def test_the_troubleshooting_check_catches_a_new_message(tmp_path):
    """The negative control: a new WARNING the guide does not have, and one built elsewhere without words."""
    module = tmp_path / "new.py"
    module.write_text('logger.warning("scrapy-polite: the moon is %s tonight, a new message", phase)\n'
                      'logger.error("%s", exc)\nlogger.info("scrapy-polite: not a warning at all, %s", x)\n')
    messages = logged_messages(module)
    assert [words for _, words in messages] == ["scrapy-polite: the moon is", ""]
    assert len(missing_from("# Troubleshooting\n", messages)) == 2
    assert missing_from("`scrapy-polite: the moon is …`", messages) == [messages[1][0]]


# -- the design page's anchors: every docs/spec.md citation exists ---------------------------------------------

_CITATION = re.compile(r'docs/spec\.md`?\s+§(\d+(?:\.\d+)?)(?:,?\s+"([^"]+)")?')


def spec_sections(spec: str) -> dict[str, str]:
    """Each section of the spec (``## §n Title``) → its text."""
    parts = re.split(r"(?m)^## §(\d+(?:\.\d+)?) ", spec)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def broken_citations(source: str, sections: dict[str, str]) -> list[str]:
    """The citations of ``source`` naming a section the spec lacks, or a label its section lacks (a label is a
    heading of the section, or in the bold words a paragraph or item opens with)."""
    broken = []
    joined = " ".join(re.sub(r"\n\s*#:?", " ", source).split())  # a citation may run over comment lines
    for m in _CITATION.finditer(joined):
        number, label = m[1], m[2]
        text = sections.get(number)
        if text is None:
            broken.append(m[0])
        elif label and not re.search(rf"(?m)^(#+ |\* \*\*|\*\*)[^*\n]*?{re.escape(label)}", text):
            broken.append(m[0])
    return broken


def test_every_spec_citation_in_the_code_exists():
    sections = spec_sections((DOCS / "spec.md").read_text(encoding="utf-8"))
    assert {"1", "2", "3", "4", "4.1", "5", "6", "7", "8"} <= set(sections)
    cited = 0
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        if path.name == "test_docs.py":
            continue
        text = path.read_text(encoding="utf-8")
        cited += len(_CITATION.findall(" ".join(re.sub(r"\n\s*#:?", " ", text).split())))
        assert broken_citations(text, sections) == [], path.name
    assert cited > 200


def test_the_citation_check_catches_a_missing_section_and_label():
    """The negative control: §9 does not exist, §5 has no "Overrides" label, §5 has "Held" and "Idle"."""
    sections = spec_sections("## §5 Deferral\n\n* **Held.** x\n\n**Idle.** y\n\n### The request lifecycle\n")
    source = ('# docs/spec.md §5, "Held"; docs/spec.md §5, "Idle"; docs/spec.md §5 "The request lifecycle"\n'
              '# docs/spec.md §9; docs/spec.md §5, "Overrides"; (docs/spec.md\n# §5, "Per-spider overrides")')
    assert broken_citations(source, sections) == ["docs/spec.md §9", 'docs/spec.md §5, "Overrides"',
                                                  'docs/spec.md §5, "Per-spider overrides"']


# -- README ---------------------------------------------------------------------------------------------------


def test_readme_fits_on_a_screen_or_two_and_keeps_its_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 12 * 1024
    blocks = re.findall(r"```sh\n(.*?)\n```", text, re.S)
    assert blocks[0] == ('python3 -m venv .venv && .venv/bin/pip install -q -e ".[test]" && '
                         '.venv/bin/python example_project/run_demo.py')
    test_command = 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[test]" && .venv/bin/python -m pytest -q'
    assert blocks[1] == test_command
    ci_last = (ROOT / ".ci" / "run").read_text(encoding="utf-8").rstrip().splitlines()[-1]
    assert ci_last == test_command.split(" && ", 1)[1]  # .ci/run's last line, after its own venv
    for link in re.findall(r"\]\(([^)#]+)", text):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link
