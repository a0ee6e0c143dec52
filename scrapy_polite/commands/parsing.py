"""``scrapy polite``'s command line: the verbs as argparse sub-commands (:class:`VerbParsers`), each parser naming
the function that runs its verb (``set_defaults(func=...)``) and the check of its arguments made before any store
is opened (``set_defaults(check=...)``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import IO, Any, NoReturn

from scrapy.exceptions import UsageError

from ..reports.timeline import FORMATS
from . import log_verbs, table_verbs
from .context import Operator
from .help import EXIT_OK, VERB_HELP, VERBS, exit_words
from .inputs import checked, count_arg, read_seconds, since_form, target_key

__all__ = ["CHECKS", "GLOBAL_WORDS", "RUNS", "STORE_HELP", "Exit", "Parser", "Usage", "VerbParsers"]

#: The function that runs each verb (its parser's ``func``).
RUNS: dict[str, Callable[[Operator], int]] = {
    "hosts": table_verbs.hosts, "show": table_verbs.show, "reset": table_verbs.reset,
    "crawl-delay": table_verbs.crawl_delay, "expire": table_verbs.expire, "timeline": log_verbs.timeline,
    "audit": log_verbs.audit_log,
}

#: The check of a verb's arguments before any store is opened (its parser's ``check``; raises ``UsageError``).
CHECKS: dict[str, Callable[[argparse.Namespace], None]] = {
    "crawl-delay": table_verbs.check_crawl_delay, "timeline": log_verbs.check_timeline,
}


def _no_check(opts: argparse.Namespace) -> None:
    """A verb whose arguments need no check beyond their own."""


#: The verb options: their flags and their argparse keywords.
_OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "throttled": (("--throttled",), {"action": "store_true", "help": "only hosts with backoff steps > 0"}),
    "events": (("--events",), {"type": count_arg, "metavar": "N", "default": None,
                               "help": "the latest N events (default 20; 0: none)"}),
    "clear": (("--clear",), {"action": "store_true", "help": "remove the host's Crawl-delay (instead of SECONDS)"}),
    "since": (("--since",), {"metavar": "WHEN", "default": None, "type": checked(since_form),
                             "help": "from WHEN: a duration back from now (90s, 15m, 2h, 1d), @EPOCH seconds, or a "
                                     "local date and time (2026-05-01T12:00, 12:00); default: the whole log"}),
    "host": (("--host",), {"metavar": "HOST", "action": "append", "default": None, "type": checked(target_key),
                           "help": "only this host (repeatable)"}),
    "output": (("-o", "--output"), {"metavar": "PATH", "default": None,
                                    "help": "the file to write, .svg or .html (default timeline.html, or "
                                            "timeline.svg with --format svg)"}),
    "format": (("--format",), {"choices": FORMATS, "default": None,
                               "help": "svg (a standalone image) or html (the picture, a table per host and "
                                       "tooltips); default: by the -o name's ending, else html"}),
    "json": (("--json",), {"action": "store_true",
                           "help": "print JSON (keys: the column names lower-cased, underscored)"}),
}

#: Which options each verb takes (any other is a usage error with it).
_VERB_OPTIONS = {"hosts": ("throttled", "json"), "show": ("events", "json"), "reset": ("json",),
                 "crawl-delay": ("clear", "json"), "expire": ("json",),
                 "timeline": ("since", "host", "output", "format", "json"), "audit": ("since", "json")}

_HOST_OR_URL = "a host (busy.example), any URL of it, or an address row (ip:192.0.2.7)"

#: Each verb's positional arguments: (dest, argparse keywords).
_POSITIONALS: dict[str, tuple[tuple[str, dict[str, Any]], ...]] = {
    "show": (("target", {"metavar": "HOST_OR_URL", "type": checked(target_key), "help": _HOST_OR_URL}),),
    "reset": (("targets", {"metavar": "HOST_OR_URL", "nargs": "+", "type": checked(target_key),
                           "help": _HOST_OR_URL + "; several may be given"}),),
    "crawl-delay": (("target", {"metavar": "HOST", "type": checked(target_key), "help": "a host, or any URL of it"}),
                    ("seconds", {"metavar": "SECONDS", "nargs": "?", "type": checked(read_seconds),
                                 "help": "the Crawl-delay, seconds >= 0"})),
}

#: What a verb says of a positional argument it has no place for (``{got}``: the arguments).
_STRAY = {
    "hosts": "hosts takes no HOST (got {got}); `scrapy polite show HOST` shows one",
    "show": "show takes one HOST_OR_URL (got {got} too); `scrapy polite hosts` lists them all",
    "reset": "reset takes HOST_OR_URL arguments only (got {got})",
    "crawl-delay": table_verbs.CRAWL_DELAY_ARGS + " (got {got} too)",
    "expire": "expire takes no argument (got {got})",
    "timeline": "timeline takes no positional argument (got {got}); use --host HOST",
    "audit": "audit takes no positional argument (got {got})",
}

STORE_HELP = "the pace table (default: POLITE_STORE, or the project's .scrapy/polite.sqlite3)"

#: What a verb's --help says of the options before or after it.
GLOBAL_WORDS = ("Before or after the verb: --store URI (the pace table; default: POLITE_STORE, or the project's\n"
                ".scrapy/polite.sqlite3) and Scrapy's global options (-s NAME=VALUE or --set NAME=VALUE,\n"
                "-L LEVEL, --logfile FILE, --nolog, --profile FILE, --pidfile FILE, --pdb).")


class Usage(Exception):
    """A usage error found by ``parser`` (exit 2): printed as argparse does, the parser's usage line first."""

    def __init__(self, message: str, parser: argparse.ArgumentParser) -> None:
        super().__init__(message)
        self.parser = parser


class Exit(Exception):
    """argparse is done (``--help`` printed): the command's exit status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Parser(argparse.ArgumentParser):
    """An argparse parser that raises :class:`Usage` / :class:`Exit` instead of ending the process (the
    command also runs in-process, :func:`~.command.run_command`) and prints its help to the command's output."""

    def __init__(self, *args: Any, out: IO[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.out = out

    def print_help(self, file: Any = None) -> None:  # typeshed: SupportsWrite[str] | None
        super().print_help(file or self.out)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise Exit(status)

    def error(self, message: str) -> NoReturn:
        raise Usage(message, self)


class VerbParsers:
    """``scrapy polite``'s verbs as argparse sub-commands: one parser per verb, with its own arguments and
    ``--help``, under a top-level parser whose help lists them (one line each, :data:`VERB_HELP`).

    Scrapy's own parser (``scrapy.cmdline``: :meth:`~.command.Command.add_options`, ``parse_known_args``) takes
    ``--store`` and Scrapy's global options wherever they are, before or after the verb; what it leaves (the
    verb and its arguments) is parsed here, strictly: an unknown verb, an unknown option, an option of another
    verb or an argument without a place is a usage error (exit 2).
    """

    def __init__(self, out: IO[str] | None = None) -> None:
        width = max(map(len, VERBS))
        listing = "\n".join(f"  {verb:<{width}}  {VERB_HELP[verb]}" for verb in VERBS)
        self.top = Parser(
            prog="scrapy polite", out=out, formatter_class=argparse.RawDescriptionHelpFormatter,
            usage="scrapy polite [-h] [--store URI] [-s NAME=VALUE] VERB [ARGUMENTS]",
            description=f"Look at and steer scrapy-polite's pace table and event log.\n\nverbs:\n{listing}\n\n"
                        "`scrapy polite VERB --help` shows a verb's arguments.",
            epilog=f"Scrapy's other global options work too (-L LEVEL, --logfile FILE, --nolog, --profile FILE,\n"
                   f"--pidfile FILE, --pdb).\n\n{exit_words()}")
        shown = self.top.add_argument_group("global options (before or after the verb)")
        shown.add_argument("--store", metavar="URI", default=argparse.SUPPRESS, help=STORE_HELP)
        shown.add_argument("-s", "--set", metavar="NAME=VALUE", default=argparse.SUPPRESS,
                           help="set a Scrapy setting (repeatable), e.g. -s POLITE_STORE_PREFIX=crawl1:")
        subparsers = self.top.add_subparsers(title="verbs", dest="verb", metavar="VERB", prog="scrapy polite",
                                             parser_class=Parser, help=argparse.SUPPRESS)
        self.verbs: dict[str, Parser] = {}
        for verb in VERBS:
            words = VERB_HELP[verb]
            parser = subparsers.add_parser(verb, help=words, description=f"{words[0].upper()}{words[1:]}.",
                                           formatter_class=argparse.RawDescriptionHelpFormatter,
                                           epilog=f"{GLOBAL_WORDS}\n\n{exit_words(verb)}", out=out)
            for dest, keywords in _POSITIONALS.get(verb, ()):
                parser.add_argument(dest, **keywords)
            for name in _VERB_OPTIONS[verb]:
                flags, keywords = _OPTIONS[name]
                parser.add_argument(*flags, dest=name, **keywords)
            parser.set_defaults(func=RUNS[verb], check=CHECKS.get(verb, _no_check))
            self.verbs[verb] = parser

    def parse(self, args: list[str]) -> argparse.Namespace:
        """The verb (``verb``), its arguments (each option's default set), the function that runs it (``func``,
        taking an :class:`~.context.Operator`, returning the exit status), its arguments checked (``check``).

        Raises:
            Usage: a usage error (its parser names the verb).
            Exit: ``--help`` was printed.
        """
        first = args[0] if args else None
        if first in ("-h", "--help"):
            self.top.print_help()
            raise Exit(EXIT_OK)
        if first is None or first not in VERBS:
            expected = f"expected a verb: {', '.join(VERBS)}"
            if first is not None and first.startswith("-"):
                flag = first.split("=", 1)[0]
                owners = _owners(flag)
                if owners:
                    self.top.error(f"{flag} is an option of {', '.join(owners)}: it goes after the verb "
                                   f"(scrapy polite {owners[0]} {flag})")
                self.top.error(f"unknown option {flag}; {expected}")
            self.top.error(expected + ("" if first is None else f" (got {first!r})"))
        parser = self.verbs[first]
        namespace, extras = parser.parse_known_intermixed_args(args[1:], argparse.Namespace(verb=first))
        if extras:
            parser.error(_unrecognized(first, extras, namespace))
        try:
            namespace.check(namespace)
        except UsageError as exc:
            parser.error(str(exc))
        return namespace


def _owners(flag: str) -> list[str]:
    """The verbs that take the option ``flag``."""
    return [verb for verb, names in _VERB_OPTIONS.items() if any(flag in _OPTIONS[n][0] for n in names)]


def _unrecognized(verb: str, extras: list[str], namespace: argparse.Namespace) -> str:
    """The usage error for what ``verb``'s parser left: an option of another verb, an unknown option, or an
    argument without a place (``-inf``, which argparse takes for an option, as ``crawl-delay``'s SECONDS)."""
    numbers = [a for a in extras if _number(a)]
    if verb == "crawl-delay" and numbers and namespace.seconds is None and not namespace.clear:
        try:
            read_seconds(numbers[0])
        except UsageError as exc:
            return f"argument SECONDS: {exc}"
    options = [a for a in extras if a.startswith("-") and a != "-" and not _number(a)]
    if options:
        flag = options[0].split("=", 1)[0]
        owners = _owners(flag)
        if owners:
            return f"{flag} does not apply to `{verb}` (it is an option of {', '.join(owners)})"
        return f"unrecognized arguments: {' '.join(options)}"
    return _STRAY[verb].format(got=" ".join(extras))


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

