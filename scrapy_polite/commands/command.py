"""The Scrapy command ``scrapy polite`` (:class:`Command`, registered through the package's ``scrapy.commands``
entry point) and running one verb (:func:`execute`; in this process: :func:`run_command`): the verb's parser
(:class:`~.parsing.VerbParsers`) names the function that runs it, which takes the open store
(:class:`~.context.Operator`) and returns the exit status (:mod:`.help`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO, Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.settings import BaseSettings, Settings

from ..pacer import default_store_uri
from ..settings import PoliteConfig, SettingsError, check_setting_names
from ..stores import PaceStore, StoreCorrupt, StoreError, StoreOptions, open_store, sqlite_path
from .context import BadLog, NoSuchHost, Operator
from .help import EXIT_BAD_LOG, EXIT_NO_HOST, EXIT_STORE, EXIT_USAGE, exit_words
from .parsing import STORE_HELP, Exit, Parser, Usage, VerbParsers

__all__ = ["Command", "add_global_options", "execute", "run_command"]

#: What ``scrapy polite`` is, in Scrapy's list of commands and its description.
DESCRIPTION = "scrapy polite — the operator command for the pace table and its event log (docs/guides/operating.md)."


class Command(ScrapyCommand):
    """``scrapy polite hosts|show|reset|crawl-delay|expire|timeline|audit`` on the project's pace table."""

    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "[options] VERB [ARGUMENTS]  (`scrapy polite --help` lists the verbs)"

    def short_desc(self) -> str:
        return "Look at and steer scrapy-polite's pace table and event log"

    def long_desc(self) -> str:
        return f"{DESCRIPTION} E{exit_words(width=0)[1:]}"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        add_global_options(parser)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        self.exitcode = execute(args, opts, self.settings, out=sys.stdout, err=sys.stderr)


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """The options of Scrapy's parser for ``scrapy polite`` (beside Scrapy's global ones): ``--store``, and a
    ``-h/--help`` that defers to the verb parsers (:class:`~.parsing.VerbParsers`: the verbs, or one verb's arguments).
    Scrapy's parser takes them before or after the verb; it is built with ``conflict_handler="resolve"``, so
    this ``--help`` replaces its own (the same in Scrapy 2.18 and later: scrapy/cmdline.py)."""
    group = parser.add_argument_group("scrapy polite")
    group.add_argument("--store", metavar="URI", default=None, help=STORE_HELP)
    group.add_argument("-h", "--help", action="store_true", dest="verb_help", default=False,
                       help="the verbs (or, after a verb, its arguments), and exit")


class _ReaderMayLeave:
    """The command's output, whose reader may stop reading early (``scrapy polite hosts | head``): once a write
    finds the pipe closed (``BrokenPipeError``), the rest of the output is dropped, quietly, and the stream's file
    descriptor is pointed at the null device so that no later flush (the interpreter's, at exit) fails again —
    the pattern of Python's documentation ("Note on SIGPIPE", the ``signal`` module). The verb goes on and its
    exit status is its own (0 for ``hosts`` and ``show``; docs/guides/operating.md, "The operator command")."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        #: The reader has gone: nothing more is written.
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._left()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._left()

    def _left(self) -> None:
        self.gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
        except OSError:  # pragma: no cover - no null device: the interpreter's own flush may complain
            return
        try:
            os.dup2(devnull, self.stream.fileno())
        except (AttributeError, OSError, ValueError):  # not a file (a test's buffer): nothing to silence
            pass
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _print_usage_error(parser: argparse.ArgumentParser, message: str, err: IO[str]) -> None:
    """A usage error as argparse prints one: the parser's usage line, then ``PROG: error: MESSAGE``."""
    parser.print_usage(err)
    print(f"{parser.prog}: error: {message}", file=err)


def execute(args: list[str], opts: argparse.Namespace, settings: Any, *, out: IO[str], err: IO[str],
            store: PaceStore | None = None) -> int:
    """Run one verb; its exit status (:data:`~.help.STATUSES`). A usage error (an unknown verb or option, an option of
    another verb, a bad value, an invalid setting) is printed on ``err`` with the verb's usage line, as argparse
    does, and gives :data:`~.help.EXIT_USAGE`; ``--help`` prints on ``out`` and gives :data:`~.help.EXIT_OK`.

    Args:
        args: the verb and its arguments (what Scrapy's parser left, :func:`add_global_options`).
        opts: the options Scrapy's parser took (``store``, ``verb_help``).
        settings: the Scrapy settings (``POLITE_*``).
        out, err: where results and problems are written; a reader of ``out`` that stops reading early (a closed
            pipe) ends the output quietly, and the status is the verb's own (:class:`_ReaderMayLeave`).
        store: an open store to use instead of opening ``--store`` / ``POLITE_STORE`` (tests, a ``memory://``
            table of this process); it is not closed.
    """
    reader = _ReaderMayLeave(out)
    try:
        return _execute(args, opts, settings, out=reader, err=err, store=store)  # type: ignore[arg-type]
    finally:
        reader.flush()  # a reader gone before the last line: quiet, as above


def _execute(args: list[str], opts: argparse.Namespace, settings: Any, *, out: IO[str], err: IO[str],
             store: PaceStore | None) -> int:
    """:func:`execute` on an output whose reader may leave."""
    parsers = VerbParsers(out)
    if getattr(opts, "verb_help", False):
        args = [*args, "--help"]
    try:
        verb_opts = parsers.parse(args)
    except Exit as done:
        return done.status
    except Usage as exc:
        _print_usage_error(exc.parser, str(exc), err)
        return EXIT_USAGE
    verb_opts.store = getattr(opts, "store", None)
    try:
        return _run(verb_opts, settings, out=out, err=err, store=store)
    except UsageError as exc:
        _print_usage_error(parsers.verbs[verb_opts.verb], str(exc), err)
        return EXIT_USAGE


def _run(opts: argparse.Namespace, settings: Any, *, out: IO[str], err: IO[str], store: PaceStore | None) -> int:
    """Run the parsed verb (``opts.func``, see :func:`execute`) on the store, opened unless given, and closed if
    opened here.

    Raises:
        UsageError: a bad value, an invalid setting or a ``POLITE_*`` name that is not a setting (exit 2).
    """
    try:
        check_setting_names(settings)
        config = PoliteConfig.from_settings(settings)
    except SettingsError as exc:
        raise UsageError(str(exc), print_help=False) from None
    owned = store is None
    try:
        if store is None:
            store = _open(opts, config)
        try:
            return int(opts.func(Operator(store, config, opts, out, err, settings)))
        finally:
            if owned:
                store.close()
    except NoSuchHost as exc:
        print(exc, file=err)
        return EXIT_NO_HOST
    except BadLog as exc:
        print(f"scrapy polite audit: {exc}", file=err)
        return EXIT_BAD_LOG
    except StoreCorrupt as exc:
        if opts.verb == "audit":  # a log that cannot be read cannot be audited
            print(f"scrapy polite audit: the event log cannot be read: {exc}", file=err)
            return EXIT_BAD_LOG
        print(exc, file=err)
        return EXIT_STORE
    except StoreError as exc:
        print(exc, file=err)
        return EXIT_STORE


def _open(opts: argparse.Namespace, config: PoliteConfig) -> PaceStore:
    uri = opts.store or config.store_uri or default_store_uri()
    path = sqlite_path(uri)
    if path is not None and not os.path.exists(path):  # a look must not create a table
        fix = ("check the path of --store (a relative one is from the current directory)" if opts.store
               else "run it inside the Scrapy project, or pass --store URI")
        raise StoreError(f"no pace table at {os.path.abspath(path)} (nothing crawled with this POLITE_STORE yet). "
                         f"Fix: {fix}")
    return open_store(uri, StoreOptions(prefix=config.store_prefix, timeout=config.store_timeout,
                                        expire=config.store_expire, events_max=config.event_log_size))


def run_command(argv: list[str], settings: Any = None, *, store: PaceStore | None = None,
                out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    """``scrapy polite ARGV...`` in this process, parsed as Scrapy parses it (``scrapy.cmdline``: the command's
    ``default_settings``, :meth:`Command.add_options` on a parser with ``conflict_handler="resolve"``,
    ``parse_known_args``, ``process_options`` for ``-s``), then the verb (:func:`execute`); its exit status.

    Args:
        argv: the arguments after ``scrapy polite``.
        settings: Scrapy settings or a mapping (default: none, the ``POLITE_*`` defaults); not changed (``-s``
            applies to a copy).
        store: an open store to use (e.g. a ``memory://`` table of this process); not closed.
        out, err: default ``sys.stdout`` / ``sys.stderr``.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    base = Settings(settings.copy_to_dict() if isinstance(settings, BaseSettings) else (settings or {}))
    command = Command()
    base.setdict(command.default_settings, priority="command")
    command.settings = base
    parser = Parser(prog="scrapy polite", usage=f"scrapy polite {command.syntax()}", add_help=False,
                     conflict_handler="resolve")
    command.add_options(parser)
    try:
        opts, args = parser.parse_known_args(argv)
        command.process_options(args, opts)
    except Usage as exc:
        _print_usage_error(parser, str(exc), err)
        return EXIT_USAGE
    except UsageError as exc:  # an invalid -s
        _print_usage_error(parser, str(exc), err)
        return EXIT_USAGE
    return execute(args, opts, base, out=out, err=err, store=store)
