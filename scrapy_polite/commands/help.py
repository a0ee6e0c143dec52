"""What ``scrapy polite`` says of itself, declared once: its verbs (:data:`VERB_HELP`, one line each) and its exit
statuses (:data:`STATUSES`). ``scrapy polite --help``, each verb's ``--help``, the Scrapy command's
description and the command reference (docs/_ext/polite_reference.py) are made from these.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "EXIT_BAD_LOG",
    "EXIT_NO_HOST",
    "EXIT_OK",
    "EXIT_OUTPUT",
    "STATUSES",
    "EXIT_STORE",
    "EXIT_USAGE",
    "EXIT_VIOLATED",
    "VERBS",
    "VERB_HELP",
    "ExitStatus",
    "exit_words",
]

#: Each verb's line in ``scrapy polite --help`` (docs/guides/operating.md's command block says the same, word for
#: word), in the order they are listed.
VERB_HELP: Final[Mapping[str, str]] = {
    "hosts": "every host, sorted by when it is due",
    "show": "one host, its address rows, its recent events",
    "reset": "forget a host's backoff (its Crawl-delay, address rows and events are kept)",
    "crawl-delay": "set the host's Crawl-delay; --clear removes it",
    "expire": "remove rows idle longer than POLITE_STORE_EXPIRE",
    "timeline": "draw the event log: a standalone SVG, or an HTML page around it",
    "audit": "check the event log against every pacing rule",
}

VERBS: Final = tuple(VERB_HELP)

EXIT_OK: Final = 0
EXIT_NO_HOST: Final = 1
EXIT_USAGE: Final = 2
EXIT_STORE: Final = 3
EXIT_OUTPUT: Final = 4
#: ``audit``: a rule was broken.
EXIT_VIOLATED: Final = 1
#: ``audit``: the log cannot be audited (truncated, incomplete, corrupt or empty).
EXIT_BAD_LOG: Final = 2


@dataclass(frozen=True)
class ExitStatus:
    """One exit status of ``scrapy polite``.

    Attributes:
        status: the process's exit status.
        words: its words in ``scrapy polite --help`` ("" for a status of one verb only: its words are in
            ``verbs``).
        verbs: each verb that may exit with it → its words in that verb's ``--help``.
        meaning: its meaning in the command reference (Markdown).
    """

    status: int
    words: str
    verbs: Mapping[str, str]
    meaning: str


_TABLE_VERBS = tuple(v for v in VERBS if v != "audit")  # audit's 0 and 2 have words of their own

#: Every exit status, by the name of its constant (:data:`EXIT_OK`, ...). A verb's ``--help`` lists its statuses in
#: this order, those that share a number joined by "or".
STATUSES: Final[Mapping[str, ExitStatus]] = {
    "EXIT_OK": ExitStatus(
        EXIT_OK, "done", {**dict.fromkeys(_TABLE_VERBS, "done"), "audit": "every rule kept"},
        "done (`audit`: every rule kept)"),
    "EXIT_NO_HOST": ExitStatus(
        EXIT_NO_HOST, "no such host (or no events to draw)",
        {"show": "no such host", "reset": "a host is not in the table (the others are reset)",
         "crawl-delay": "no such host (--clear)", "timeline": "no events to draw"},
        "no such host in the table (`show`, `reset`, `crawl-delay --clear`), or no events to draw (`timeline`)"),
    "EXIT_VIOLATED": ExitStatus(EXIT_VIOLATED, "", {"audit": "a rule broken"}, "`audit`: a rule was broken"),
    "EXIT_BAD_LOG": ExitStatus(
        EXIT_BAD_LOG, "", {"audit": "the log cannot be audited (truncated, incomplete, corrupt, empty)"},
        "`audit`: the log cannot be audited (the table came back empty, the log is empty, truncated, incomplete or "
        "corrupt; the message says which and the fix)"),
    "EXIT_USAGE": ExitStatus(
        EXIT_USAGE, "usage", {**dict.fromkeys(_TABLE_VERBS, "usage"), "audit": "a usage error"},
        "usage: an unknown verb or option, an option of another verb, a bad value (`crawl-delay a.example -1`, "
        "`--since soon`), an invalid setting (`-s POLITE_EVENT_LOG_SIZE=0`) or a `POLITE_*` name that is not a "
        "setting (`-s POLITE_HOSTINTERVAL=1`); the verb's usage line and the error are printed before any store is "
        "opened"),
    "EXIT_STORE": ExitStatus(
        EXIT_STORE, "the store is unusable", dict.fromkeys(VERBS, "the store is unusable"),
        "the store is unusable: a store URI of an unknown scheme or naming no file (`--store` or `POLITE_STORE`), no "
        "table there, not a pace table, unreadable or unwritable, a server that does not answer"),
    "EXIT_OUTPUT": ExitStatus(
        EXIT_OUTPUT, "the timeline could not be written", {"timeline": "the file could not be written"},
        "the timeline could not be written (`-o` in a missing folder)"),
}

#: The widths the exit statuses are wrapped to: in ``scrapy polite --help`` (its other paragraphs' width), and in a
#: verb's ``--help``.
_TOP_WIDTH = 94
_VERB_WIDTH = 110


def _listed(verb: str) -> str:
    """``0 done, 2 usage, 3 the store is unusable``: the statuses of ``verb``, by number."""
    by_number: dict[int, list[str]] = {}
    for status in STATUSES.values():
        if verb in status.verbs:
            by_number.setdefault(status.status, []).append(status.verbs[verb])
    return ", ".join(f"{number} {' or '.join(words)}" for number, words in sorted(by_number.items()))


def exit_words(verb: str | None = None, *, width: int | None = None) -> str:
    """The exit statuses in words, wrapped to ``width`` characters (0: one line).

    Args:
        verb: a verb: its statuses (its ``--help``); None: the command's (``scrapy polite --help``): the statuses
            every verb shares, then those of each verb with statuses of its own (usage, said once, aside).
        width: default: the width of the help that prints them.
    """
    if verb is not None:
        text = f"exit status: {_listed(verb)}."
        return textwrap.fill(text, width or _VERB_WIDTH, break_on_hyphens=False) if width != 0 else text
    shared = ", ".join(f"{s.status} {s.words}" for s in sorted(STATUSES.values(), key=lambda s: s.status)
                       if s.words)
    own = [v for v in VERBS if any(not s.words and v in s.verbs for s in STATUSES.values())]
    for name in own:
        statuses = {n: s for n, s in STATUSES.items() if n != "EXIT_USAGE" and name in s.verbs}
        shared += f"; {name}: " + ", ".join(f"{s.status} {s.verbs[name]}" for s in
                                             sorted(statuses.values(), key=lambda s: s.status))
    text = f"exit status: {shared}."
    return textwrap.fill(text, width or _TOP_WIDTH, break_on_hyphens=False) if width != 0 else text
