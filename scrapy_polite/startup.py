"""Refusing to start a crawl (docs/spec.md §7): a configuration that cannot run safely (the add-on only in a
spider's ``custom_settings``, a download handler that resolves names itself) or an invalid setting stops
the crawl before any request is sent, with

* **one** ERROR line naming the problem and the fix (the traceback only at DEBUG), and
* a non-zero exit status from ``scrapy crawl`` / ``scrapy check``: the error is raised out of the crawl's
  start, which Scrapy's runner counts as a crawl that failed to start (``bootstrap_failed``).

Scrapy's ``AsyncCrawlerProcess`` (what ``scrapy crawl`` uses with the default asyncio reactor) would also log
the raised error a second time, with its traceback, as ``Task exception was never retrieved``: the error is
marked as retrieved once it has been reported here. With the plain Twisted ``CrawlerProcess`` the same
report of Twisted (``Unhandled error in Deferred``) is dropped by a filter on the ``twisted`` logger that
only matches the errors reported here.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from typing import Any

from scrapy.settings import SETTINGS_PRIORITIES

from .settings.declaration import DEFAULTS

__all__ = ["leftover_settings_warning", "refuse_to_start", "where_set"]

logger = logging.getLogger(__name__)

#: Where a setting of each priority was set, in the user's words.
_SOURCES = {
    SETTINGS_PRIORITIES["cmdline"]: "on the command line (-s)",
    SETTINGS_PRIORITIES["spider"]: "in the spider's custom_settings",
    SETTINGS_PRIORITIES["project"]: "in the project settings (settings.py)",
    SETTINGS_PRIORITIES["addon"]: "by an add-on",
    SETTINGS_PRIORITIES["command"]: "by the command",
}

_SETTING = re.compile(r"\bPOLITE_[A-Z_]+\b")

#: The messages of the errors reported by :func:`refuse_to_start` (for the ``twisted`` log filter).
_reported: set[str] = set()


def where_set(settings: Any, name: str) -> str | None:
    """Where setting ``name`` got its value (``"on the command line (-s)"``, …), or None when unknown or a
    default."""
    getpriority = getattr(settings, "getpriority", None)
    priority = getpriority(name) if getpriority is not None else None
    if priority is None:
        return None
    return _SOURCES.get(priority) or (f"at priority {priority}" if priority else None)


#: How to remove a setting, by where it was set.
_REMOVE = {
    SETTINGS_PRIORITIES["cmdline"]: "drop {items} from the command line",
    SETTINGS_PRIORITIES["spider"]: "remove {names} from the spider's custom_settings",
    SETTINGS_PRIORITIES["project"]: "remove {names} from settings.py",
}

#: Added to the fix for ``settings.py`` when it names a setting Scrapy's ``startproject`` template sets.
_TEMPLATE = " (the startproject template sets DOWNLOAD_DELAY = 1 and CONCURRENT_REQUESTS_PER_DOMAIN = 1)"


def leftover_settings_warning(settings: Any) -> str | None:
    """The warning about Scrapy's own pacing settings still in force on top of the add-on's (docs/spec.md §5), or
    None when none is: ``DOWNLOAD_DELAY`` > 0, ``AUTOTHROTTLE_ENABLED`` true, and ``CONCURRENT_REQUESTS_PER_DOMAIN``
    set by the user (the project, the spider or ``-s``; its default, 8, is no leftover). Only the settings
    actually in force are named, each with its value, and the fix says where each was set: ``-s NAME=VALUE`` on
    the command line, the spider's ``custom_settings``, or ``settings.py``.

    Args:
        settings: the crawler's :class:`~scrapy.settings.Settings`.
    """
    found: list[tuple[str, str]] = []
    if settings.getfloat("DOWNLOAD_DELAY") > 0:
        found.append(("DOWNLOAD_DELAY", f"{settings.getfloat('DOWNLOAD_DELAY'):g}"))
    if settings.getbool("AUTOTHROTTLE_ENABLED"):
        found.append(("AUTOTHROTTLE_ENABLED", "True"))
    if (settings.getpriority("CONCURRENT_REQUESTS_PER_DOMAIN") or 0) >= SETTINGS_PRIORITIES["project"]:
        found.append(("CONCURRENT_REQUESTS_PER_DOMAIN", str(settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"))))
    if not found:
        return None
    by_source: dict[int, list[tuple[str, str]]] = {}
    for name, value in found:
        by_source.setdefault(settings.getpriority(name) or 0, []).append((name, value))
    fixes = []
    for priority in sorted(by_source, reverse=True):
        items = by_source[priority]
        template = _REMOVE.get(priority, "unset {names} (set {where})")
        fixes.append(template.format(items=" ".join(f"-s {n}={v}" for n, v in items),
                                     names=", ".join(n for n, _ in items),
                                     where=_SOURCES.get(priority, f"at priority {priority}")))
        if priority == SETTINGS_PRIORITIES["project"] and any(n != "AUTOTHROTTLE_ENABLED" for n, _ in items):
            fixes[-1] += _TEMPLATE
    listed = ", ".join(f"{n}={v}" for n, v in found)
    verb = "still applies" if len(found) == 1 else "still apply"
    return (f"scrapy-polite: {listed} {verb} on top of scrapy-polite's pacing (burst streams too): "
            f"{'; '.join(fixes)} unless you want both.")


def refuse_to_start(exc: BaseException, settings: Any = None) -> BaseException:
    """Report ``exc``, the reason the crawl cannot start, as one ERROR line (its traceback at DEBUG) and
    return it, to be raised: ``raise refuse_to_start(exc, settings)``.

    The line is ``scrapy-polite cannot start the crawl: <the error>``; for an error naming a ``POLITE_*``
    setting, followed by where that setting was set (``settings``: the crawler's settings). An error
    reported once is not reported again. With ``LOG_ENABLED = False`` (``scrapy check``'s default) the line is
    written to standard error instead of the log.

    Args:
        exc: the error (its message names the problem and the fix).
        settings: the settings the error was found in (to say where the setting came from), or None.
    """
    if getattr(exc, "_polite_reported", False):
        return exc
    message = " ".join(str(exc).split())  # one line
    match = _SETTING.search(message)
    name = getattr(exc, "setting", None) or (match.group(0) if match is not None else None)
    source = where_set(settings, name) if name is not None and settings is not None else None
    suffix = f" ({name} is set {source})" if source else ""
    if name is not None and "Fix:" not in message:
        suffix += _fix_of_setting(name)
    logger.error("scrapy-polite cannot start the crawl: %s%s", message, suffix)
    if settings is not None and not settings.getbool("LOG_ENABLED", True):  # scrapy check: the line on stderr
        sys.stderr.write(f"ERROR: scrapy-polite cannot start the crawl: {message}{suffix}\n")
    logger.debug("scrapy-polite: the crawl was refused here", exc_info=exc)
    try:
        exc._polite_reported = True  # type: ignore[attr-defined]
    except AttributeError:  # an exception type with __slots__: it may be reported twice
        pass
    _reported.add(str(exc))
    _install_twisted_filter()
    _retrieve_in_current_task(exc)
    return exc


def _fix_of_setting(name: str) -> str:
    """The ``Fix:`` part of an error that names setting ``name`` (docs/guides/troubleshooting.md, "The crawl refuses
    to start"): give it a value the error describes, or remove it for its default."""
    if name not in DEFAULTS:
        return f". Fix: give {name} a value as the error says."
    return f". Fix: give {name} a value as the error says, or remove it to use its default ({DEFAULTS[name]!r})."


def _retrieve_in_current_task(exc: BaseException) -> None:
    """Mark ``exc`` retrieved when the asyncio task it is raised in ends with it (it was reported already);
    a task that ends with any other error is handed to the loop's exception handler as before."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop
        return
    if task is None:
        return

    def retrieve(done: asyncio.Task[Any]) -> None:
        if done.cancelled():
            return
        raised = done.exception()  # marks it retrieved
        if raised is not None and raised is not exc:
            done.get_loop().call_exception_handler(
                {"message": "Task exception was never retrieved", "exception": raised, "future": done})

    task.add_done_callback(retrieve)


class _ReportedFilter(logging.Filter):
    """Drops Twisted's report of an unhandled failure that :func:`refuse_to_start` has reported already."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and str(record.exc_info[1]) in _reported:
            return False
        try:
            text = record.getMessage()
        except Exception:  # a record whose arguments do not format: not ours
            return True
        return not any(message in text for message in _reported)


_FILTER = _ReportedFilter()


def _install_twisted_filter() -> None:
    twisted_logger = logging.getLogger("twisted")
    if _FILTER not in twisted_logger.filters:
        twisted_logger.addFilter(_FILTER)
