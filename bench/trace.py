"""What one ordinary page costs in the package's own code: the modules and functions of ``scrapy_polite`` it runs.

Usage::

    python bench/trace.py [--pages 60] [--window 10] [--store sqlite|memory] [--list]

A real Scrapy crawl (``CrawlerProcess``, the add-on, every interval 0) of one loopback host answering 200 to
every page, ``--pages`` pages one after another (one host: its line sends them one at a time). Once the crawl
is warm (after a third of the pages), the calls of the next ``--window`` pages are traced (``sys.setprofile``, and
``threading.setprofile`` for threads started in the window; the store's thread, started before it, is not seen:
its calls are the store's own), from the spider's callback of one page to the callback of the page
``--window`` later. Printed: the package modules and package functions those pages ran (each counted once:
the set one page's path touches, since every page of the window takes the same path), and the package calls
per page. ``--list`` prints them, with the calls per page of those not called once per page. Issue "One
request, one place" sets the targets: at most 10 modules and 60 functions.

Nothing leaves the machine; a few seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from collections import Counter
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PACKAGE = os.path.join(ROOT, "scrapy_polite") + os.sep


class Tracer:
    """Counts the calls of package functions while on."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str, int]] = Counter()
        self.on = False

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and self.on:
            code = frame.f_code
            if code.co_filename.startswith(PACKAGE):
                self.calls[(os.path.relpath(code.co_filename, ROOT), code.co_qualname, code.co_firstlineno)] += 1

    def start(self) -> None:
        self.on = True
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)

    def stop(self) -> None:
        self.on = False
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=60)
    parser.add_argument("--window", type=int, default=10, help="pages traced (after a third of --pages)")
    parser.add_argument("--store", choices=["sqlite", "memory"], default="sqlite")
    parser.add_argument("--list", action="store_true", help="print the modules and functions")
    args = parser.parse_args()

    import scrapy
    from scrapy.crawler import CrawlerProcess

    from tests.support.server import ArrivalServer, Reply

    tracer = Tracer()
    first = args.pages // 3

    class TraceSpider(scrapy.Spider):
        name = "trace"
        seen = 0

        async def start(self) -> Any:
            for i in range(args.pages):
                yield scrapy.Request(srv.url(f"/p/{i}"), dont_filter=True)

        def parse(self, response: Any) -> None:
            TraceSpider.seen += 1
            if TraceSpider.seen == first:
                tracer.start()
            elif TraceSpider.seen == first + args.window:
                tracer.stop()

    with ArrivalServer("127.0.9.81") as srv, tempfile.TemporaryDirectory() as tmp:
        srv.route("/*", Reply.html("<html><body>ok</body></html>"))
        store = "memory://" if args.store == "memory" else f"sqlite:///{tmp}/trace.sqlite3"
        process = CrawlerProcess({"ADDONS": {"scrapy_polite.Addon": 0}, "POLITE_STORE": store,
                                  "POLITE_HOST_INTERVAL": 0, "POLITE_IP_INTERVAL": 0,
                                  "POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"], "LOG_LEVEL": "WARNING",
                                  "TELNETCONSOLE_ENABLED": False})
        process.crawl(TraceSpider)
        process.start()
    calls = tracer.calls
    modules = sorted({path for path, _, _ in calls})
    functions = sorted(calls)
    print(f"one page of a warm crawl ({args.store}, {args.window} pages traced): {len(modules)} package modules, "
          f"{len(functions)} package functions, {sum(calls.values()) / args.window:.0f} package calls per page")
    if args.list:
        for module in modules:
            names = [f"{name}:{line}" + (f" ×{calls[(path, name, line)] / args.window:g}"
                                          if calls[(path, name, line)] != args.window else "")
                     for path, name, line in functions if path == module]
            print(f"  {module} ({len(names)}): " + ", ".join(names))


if __name__ == "__main__":
    main()
