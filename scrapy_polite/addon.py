"""The Scrapy add-on: ``ADDONS = {"scrapy_polite.Addon": 0}`` enables everything with defaults (SPEC §7).

It installs

* :class:`~scrapy_polite.middleware.PoliteDownloaderMiddleware` at downloader-middleware priority 950;
* :class:`~scrapy_polite.extension.PoliteExtension`;
* :class:`~scrapy_polite.scheduler.PoliteScheduler` as ``SCHEDULER``, wrapping the project's own scheduler
  (moved to ``POLITE_SCHEDULER_BASE``);
* the ``POLITE_*`` defaults (README), at add-on priority, so project and spider settings override them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.settings import SETTINGS_PRIORITIES

from .settings import DEFAULTS

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings, Settings

__all__ = ["Addon"]

MIDDLEWARE = "scrapy_polite.middleware.PoliteDownloaderMiddleware"
EXTENSION = "scrapy_polite.extension.PoliteExtension"
SCHEDULER = "scrapy_polite.scheduler.PoliteScheduler"
MIDDLEWARE_PRIORITY = 950


class Addon:
    """Enables scrapy-polite in a Scrapy project or spider."""

    @classmethod
    def update_pre_crawler_settings(cls, settings: BaseSettings) -> None:
        """Process-wide settings, applied before any crawler exists (nothing yet; see SPEC §7)."""

    def update_settings(self, settings: Settings) -> None:
        """Install the components and the ``POLITE_*`` defaults (project and spider settings win)."""
        for name, value in DEFAULTS.items():
            if settings.getpriority(name) is None:
                settings.set(name, value, priority="addon")
        if not settings.getbool("POLITE_ENABLED"):
            return
        settings["DOWNLOADER_MIDDLEWARES"][MIDDLEWARE] = MIDDLEWARE_PRIORITY
        settings["EXTENSIONS"][EXTENSION] = 0
        current = settings.get("SCHEDULER")
        current_path = current if isinstance(current, str) else f"{current.__module__}.{current.__qualname__}"
        if current_path != SCHEDULER:
            # Wrap the project's scheduler unless POLITE_SCHEDULER_BASE was chosen explicitly.
            if (settings.getpriority("POLITE_SCHEDULER_BASE") or 0) <= SETTINGS_PRIORITIES["addon"]:
                settings.set("POLITE_SCHEDULER_BASE", current_path, priority="addon")
            priority = max(settings.getpriority("SCHEDULER") or 0, SETTINGS_PRIORITIES["addon"])
            settings.set("SCHEDULER", SCHEDULER, priority=priority)
