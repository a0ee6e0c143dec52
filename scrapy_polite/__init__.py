"""scrapy-polite: polite, safe and fast Scrapy crawls.

Enable it with one line in a project's settings::

    ADDONS = {"scrapy_polite.Addon": 0}

Every host and IP is paced (docs/spec.md §2–3), throttling hosts are backed off and deferred out of the
downloader, and the pacing state persists in a SQLite pace table across runs. See docs/index.md.
"""

from __future__ import annotations

from .addon import Addon

__all__ = ["Addon", "__version__"]
__version__ = "0.1.0"
