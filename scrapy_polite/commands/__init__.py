"""``scrapy polite`` — the operator command for the pace table and its event log (docs/guides/operating.md).

Usage (inside a Scrapy project, or with ``--store URI`` / ``-s POLITE_STORE=...``; every store URI works)::

    scrapy polite hosts [--throttled] [--json]
    scrapy polite show HOST_OR_URL [--events N] [--json]
    scrapy polite reset HOST_OR_URL... [--json]
    scrapy polite crawl-delay HOST SECONDS|--clear [--json]
    scrapy polite expire [--json]
    scrapy polite timeline [--since WHEN] [--host HOST]... [-o PATH] [--format svg|html] [--json]
    scrapy polite audit [--since WHEN] [--json]
    scrapy polite --help                 # the verbs, one line each (:data:`VERB_HELP`); VERB --help: its own

Each verb is an argparse sub-command (:class:`VerbParsers`) whose parser names the function that runs it
(``set_defaults(func=...)``); Scrapy's parser takes ``--store`` and Scrapy's global options (``-s NAME=VALUE``...)
before or after the verb (:func:`add_global_options`). The exit statuses and their words are declared once,
in :data:`STATUSES` (:mod:`.help`).

The modules, by job:

* :mod:`.command`: the Scrapy command (:class:`Command`, registered through the ``scrapy.commands`` entry point
  of the package as ``scrapy_polite.commands:Command``) and running one verb (:func:`run_command`);
* :mod:`.parsing`: the command line, argparse sub-commands; :mod:`.inputs`: the arguments read;
* :mod:`.help`: the verbs' lines and the exit statuses, declared once;
* :mod:`.context`: one verb's run on an open store (:class:`~.context.Operator`);
* :mod:`.table_verbs`: ``hosts``, ``show``, ``reset``, ``crawl-delay``, ``expire``; :mod:`.rows`: a host's row
  in words and as JSON; :mod:`.frontier`: the shared frontier's part of ``hosts``;
* :mod:`.log_verbs`: ``timeline`` and ``audit``.

One vocabulary: the columns (:data:`HOST_COLUMNS`) are the words of the closing summary and of the example's
table; a JSON key is its column's name lower-cased, with spaces and dashes as underscores (``backoff steps`` →
``backoff_steps``, ``Crawl-delay`` → ``crawl_delay``), times in epoch seconds with an ``_at`` twin in ISO 8601.
"""

from __future__ import annotations

from . import help as verb_help
from .command import Command, add_global_options, execute, run_command
from .frontier import print_shared_frontier
from .help import *  # noqa: F403  (the verbs' lines and the exit statuses: help.__all__, declared once)
from .inputs import parse_since
from .parsing import VerbParsers
from .rows import HOST_COLUMNS

__all__ = [
    "Command",
    "HOST_COLUMNS",
    "VerbParsers",
    "add_global_options",
    "execute",
    "parse_since",
    "print_shared_frontier",
    "run_command",
]
__all__ += verb_help.__all__
