"""``scrapy polite`` — the operator command for the pace table (docs/spec.md §7).

Usage (inside a Scrapy project, or with ``-s POLITE_STORE=...``)::

    scrapy polite show [HOST ...]     # the table: next allowed, backoff steps, Crawl-delay, 2xx seen
    scrapy polite reset HOST [...]    # forget a host's backoff (keeps its Crawl-delay, docs/spec.md §2)
    scrapy polite expire              # remove rows idle longer than POLITE_STORE_EXPIRE

Registered through the ``scrapy.commands`` entry point of the package.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from .pacer import default_store_uri
from .policy import HostState, PacingPolicy, host_key
from .settings import PoliteConfig, SettingsError
from .stores import PaceStore, StoreError, StoreOptions, open_store, sqlite_path

__all__ = ["Command", "format_table"]


def format_table(rows: list[tuple[str, Any]], now: float) -> str:
    """The pace table as aligned text; ``rows`` are ``(key, HostState)``; times relative to ``now`` (s)."""
    lines = [f"{'host':<40} {'next allowed':>14} {'backoff':>7} {'crawl-delay':>11} {'2xx seen':>8}"]
    for key, state in rows:
        wait = state.next_allowed - now
        when = f"in {wait:.1f} s" if wait > 0 else "now"
        delay = f"{state.crawl_delay:g} s" if state.crawl_delay else "-"
        lines.append(f"{key:<40} {when:>14} {state.consec:>7} {delay:>11} {'yes' if state.ok_seen else 'no':>8}")
    return "\n".join(lines)


def _reset(state: HostState | None, now: float) -> tuple[HostState | None, bool]:
    """Reset a host's row (docs/spec.md §2); ``(None, False)`` when it has none."""
    return (PacingPolicy.reset(state, now=now), True) if state is not None else (None, False)


class Command(ScrapyCommand):
    """``scrapy polite show|reset|expire`` on the project's pace table."""

    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "show [HOST ...] | reset HOST [HOST ...] | expire"

    def short_desc(self) -> str:
        return "Show or reset scrapy-polite's pace table"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--store", metavar="URI", default=None,
                            help="the pace table (default: POLITE_STORE, or .scrapy/polite.sqlite3)")

    def _store(self, opts: argparse.Namespace, config: PoliteConfig) -> PaceStore:
        uri = opts.store or config.store_uri or default_store_uri()
        path = sqlite_path(uri)
        if path is not None and not os.path.exists(path):  # a look must not create a table
            raise StoreError(f"no pace table at {os.path.abspath(path)} (nothing crawled with this "
                             "POLITE_STORE yet). Fix: run it inside the Scrapy project, or pass --store URI")
        return open_store(uri, StoreOptions(prefix=config.store_prefix, timeout=config.store_timeout,
                                            expire=config.store_expire))

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if not args or args[0] not in ("show", "reset", "expire"):
            raise UsageError("expected one of: show, reset, expire")
        verb, hosts = args[0], args[1:]
        assert self.settings is not None
        try:
            config = PoliteConfig.from_settings(self.settings)  # the settings are read once, here
            store = self._store(opts, config)
        except (SettingsError, StoreError) as exc:
            print(exc)
            self.exitcode = 1
            return
        try:
            now = store.now()
            keys = [host_key(h if "://" in h else f"http://{h}/") or h for h in hosts]
            if verb == "show":
                rows = [(k, s) for k, s in store.items() if not keys or k in keys]
                print(f"pace table {store.uri}: {len(rows)} rows")
                print(format_table(rows, now))
            elif verb == "reset":
                if not keys:
                    raise UsageError("reset needs at least one HOST")
                for key in keys:
                    found = store.update(key, _reset)
                    print(f"{key}: {'reset' if found else 'not in the table (nothing to reset)'}")
            else:
                print(f"expired {store.expire(now - config.store_expire)} rows from {store.uri}")
        finally:
            store.close()
