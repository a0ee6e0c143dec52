"""One run of a ``scrapy polite`` verb (:class:`Operator`): the open store, the settings, the verb's arguments and
where it writes; and the two ways a verb ends early, each with its exit status (:class:`NoSuchHost`,
:class:`BadLog`).
"""

from __future__ import annotations

import argparse
import json
from typing import IO, Any

from ..policy import PacingPolicy
from ..reports.events import process_source
from ..reports.summary import reset_command
from ..settings import PoliteConfig
from ..stores import Event, PaceStore

__all__ = ["BadLog", "NoSuchHost", "Operator"]


class NoSuchHost(Exception):
    """Exit 1 (:data:`~scrapy_polite.commands.help.EXIT_NO_HOST`): the host (or events to draw) is not in the
    table; the message says which."""


class BadLog(Exception):
    """``audit``'s exit 2 (:data:`~scrapy_polite.commands.help.EXIT_BAD_LOG`): the log cannot be audited; the
    message says why and the fix."""


class Operator:
    """A verb's run on one open store: a verb (``opts.func``, the function its parser set) takes it, writes to
    ``out`` (results) and ``err`` (problems), and returns its exit status.

    Args:
        store: the open pace table.
        config: the ``POLITE_*`` settings read.
        opts: the verb's arguments (its parser's namespace, with ``store``: ``--store`` or None).
        out, err: where results and problems are written.
        settings: the Scrapy settings (``SCHEDULER``, scrapy-redis's connection settings).
    """

    def __init__(self, store: PaceStore, config: PoliteConfig, opts: argparse.Namespace, out: IO[str],
                 err: IO[str], settings: Any = None) -> None:
        self.store = store
        self.config = config
        self.opts = opts
        self.out = out
        self.err = err
        self.settings = settings
        #: The store's clock when the verb started (epoch s).
        self.now = store.now()

    @property
    def policy(self) -> PacingPolicy:
        return self.config.policy

    def print(self, text: str = "") -> None:
        print(text, file=self.out)

    def dump(self, data: Any) -> None:
        """``data`` as JSON (``--json``)."""
        json.dump(data, self.out, indent=2, ensure_ascii=False)
        self.out.write("\n")

    def operator_event(self, key: str, reason: str, **extra: Any) -> None:
        """Record the operator's act on ``key`` in the event log (when ``POLITE_EVENT_LOG`` is on)."""
        if self.config.event_log:
            self.store.append_events([Event(self.store.now(), "operator", key, reason=reason, source=process_source(),
                                            **extra)])

    def forgive_words(self, hosts: list[str]) -> str:
        """How to forgive hosts: the ``reset`` command line (its ``--store`` when one was given)."""
        shown = hosts if len(hosts) <= 5 else [*hosts[:5], "..."]
        return (f"to forgive a host (forget its backoff steps and hold; its Crawl-delay stays): "
                f"{reset_command(shown, self.opts.store)}")
