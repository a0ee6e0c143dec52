"""Crawls in processes of their own, sharing one pace table (docs/spec.md §3, §6): the fleet tests.

:class:`Crawl` starts one ``CrawlerProcess`` in a subprocess with :data:`CRAWL` and the settings given;
:meth:`Crawl.result` waits for it and returns its stats, the statuses its spider saw and how far its clock
ran ahead. A config's ``patch`` names test-only changes made before the crawl starts, for negative controls:
``"no_hold"`` (the booking holds no row while its request is in flight, the behaviour before the in-flight hold),
``"no_watch"`` (the table's identity is never read: a table that comes back empty goes unseen, as before),
``"own_clock"`` (a SQLite file's openers each read their own process clock, as before "One clock per file").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

__all__ = ["CRAWL", "Crawl", "ROOT"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CRAWL = textwrap.dedent("""
    import json, sys, time
    config = json.load(open(sys.argv[1]))
    _real_time = time.time
    if config.get("skew"):  # this process's clock runs ahead (patched before anything reads it)
        time.time = lambda: _real_time() + config["skew"]
    sys.path.insert(0, config["root"])
    from tests.support.fleet import apply_patches
    apply_patches(config.get("patch", []))
    from scrapy.crawler import CrawlerProcess
    from tests.support.crawl import TEST_SETTINGS, ListSpider

    process = CrawlerProcess({**TEST_SETTINGS, **config["settings"]})
    crawler = process.create_crawler(ListSpider)
    process.crawl(crawler, urls=config["urls"])
    process.start()
    stats = {k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, (int, float, str))}
    spider = crawler.spider
    with open(config["out"], "w") as f:
        json.dump({"stats": stats, "statuses": spider.statuses() if spider else [],
                   "clock_ahead": time.time() - _real_time(),
                   "failed": [x.error for x in spider.failed] if spider else []}, f)
""")


def apply_patches(names: list[str]) -> None:
    """Test-only changes to the package, made in the crawl's process before it starts."""
    for name in names:
        if name == "no_hold":
            from scrapy_polite import policy

            policy.PacingPolicy.in_flight_hold = False  # type: ignore[attr-defined]
        elif name == "no_watch":  # the table's identity is never read: a table that comes back empty goes unseen
            from scrapy_polite.crawl import outage

            outage.TableWatch._checks = lambda self: False  # type: ignore[method-assign]
        elif name == "own_clock":  # the boot is not known: no anchor shared through the file
            from scrapy_polite.stores.sqlite import marks

            marks._boot_id = lambda: ""
        else:  # pragma: no cover - a test's typo
            raise ValueError(f"unknown patch {name!r}")


class Crawl:
    """One Scrapy process started with :data:`CRAWL`; :meth:`result` waits for it."""

    def __init__(self, tmp_path: Any, name: str, urls: list[str], settings: dict[str, Any], skew: float = 0.0,
                 patch: list[str] | None = None) -> None:
        self.out = tmp_path / f"{name}.json"
        self.log = tmp_path / f"{name}.log"
        config = tmp_path / f"{name}-config.json"
        config.write_text(json.dumps({"root": ROOT, "settings": settings, "urls": urls, "out": str(self.out),
                                      "skew": skew, "patch": patch or []}))
        script = tmp_path / "crawl.py"
        if not script.exists():
            script.write_text(CRAWL)
        self._log = open(self.log, "w")
        self.proc = subprocess.Popen([sys.executable, str(script), str(config)], cwd=str(tmp_path),
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL the crawl (nothing of it runs after this: no close, no record)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._log.close()

    def result(self, timeout: float = 120.0, reason: str = "finished") -> dict[str, Any]:
        """Wait for the crawl (``timeout`` seconds at most) and return its result; it must have exited 0 and
        closed for ``reason`` (a crawl refused at its start, its table not opened, crawls nothing yet exits 0)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"crawl did not finish in {timeout} s:\n{self.log.read_text()[-4000:]}") from None
        finally:
            self._log.close()
        assert self.proc.returncode == 0, self.log.read_text()[-4000:]
        from tests.support.crawl import assert_no_illegal_moves  # not at the top: this module is also the child

        result: dict[str, Any] = json.loads(self.out.read_text())
        assert_no_illegal_moves(result["stats"], "a fleet crawl")
        assert result["stats"].get("finish_reason") == reason, (result["stats"], self.log.read_text()[-4000:])
        return result
