"""``scrapy polite``'s exit statuses are declared once (``scrapy_polite.commands.help.STATUSES``, issue 31): every
``--help``, the Scrapy command's description and the command reference are made from that one declaration."""

from __future__ import annotations

import io
import re

from scrapy_polite import commands
from scrapy_polite.commands import help as declared


def help_of(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    assert commands.run_command([*argv, "--help"], out=out, err=err) == commands.EXIT_OK, err.getvalue()
    return " ".join(out.getvalue().split())  # unwrapped


def test_every_help_says_each_status_of_its_verb_as_declared():
    for verb in commands.VERBS:
        text = help_of(verb)
        for status in commands.STATUSES.values():
            if verb in status.verbs:
                assert re.search(rf"\b{status.status} (.* or )?{re.escape(status.verbs[verb])}", text), (verb, status)
    top = help_of()
    described = commands.Command().long_desc()
    for name, status in commands.STATUSES.items():
        assert getattr(commands, name) == status.status
        assert set(status.verbs) <= set(commands.VERBS)
        if status.words:
            assert f"{status.status} {status.words}" in top and f"{status.status} {status.words}" in described


def test_a_status_declared_is_said_in_the_help(monkeypatch):
    """The negative control: a status added to the declaration alone reaches the verb's help, the command's help
    and its description, without another word written anywhere."""
    added = declared.ExitStatus(5, "the moon is full", {"hosts": "the moon is full tonight"}, "the moon")
    monkeypatch.setattr(declared, "STATUSES", {**declared.STATUSES, "EXIT_MOON": added})
    assert "5 the moon is full tonight" in help_of("hosts")
    assert "5 the moon is full" in help_of() and "5 the moon is full" in commands.Command().long_desc()
    assert "moon" not in help_of("show")
