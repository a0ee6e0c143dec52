"""A spider that crawls pydoc-generated HTML documentation sites, following links within their hosts.

Give it the sites' front pages::

    scrapy crawl pydoc_site -a start_urls=http://127.0.0.2:8000/,http://127.0.0.3:8000/

(``run_demo.py`` starts such sites locally and passes their URLs.) ``allowed_domains`` is derived from the
start URLs, so links to other sites (docs.python.org, json.org ...) are dropped by Scrapy's offsite filter.

Its callback carries scrapy-polite's contracts (README, "Contracts"): ``python run_demo.py --check`` serves
the sites on port 8765 and runs ``scrapy check pydoc_site`` against them.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from scrapy import Request, Spider
from scrapy.linkextractors import LinkExtractor

from polite_demo.items import PageItem


class PydocSiteSpider(Spider):
    name = "pydoc_site"

    # Module pages ("os.html") and the index ("." -> "/"); pydoc's in-page anchors are the same pages.
    links = LinkExtractor(allow=(r"/$", r"\.html$"))

    def __init__(self, start_urls: list[str] | str | None = None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(start_urls, str):  # -a start_urls=a,b on the command line
            start_urls = [u.strip() for u in start_urls.split(",") if u.strip()]
        self.start_urls = list(start_urls or [])
        if not self.start_urls and not os.environ.get("SCRAPY_CHECK"):  # scrapy check brings its own @url
            raise ValueError("pydoc_site needs start URLs: -a start_urls=http://host:port/,http://...")
        self.allowed_domains = sorted({urlsplit(u).hostname for u in self.start_urls if urlsplit(u).hostname})

    async def start(self):
        # Unlike Scrapy's default start requests, these go through the dupe filter, so the index page that
        # every module page links back to ("." -> "/") is fetched once, not twice.
        for url in self.start_urls:
            yield Request(url)

    def parse(self, response):
        """A documentation page: its item, then the site's pages it links to.

        The robots host publishes ``Crawl-delay: 3`` (the real robots.txt of www.hockey-reference.com), so
        it is crawled no faster than one request per 3 s, only on its public (here: allowed loopback)
        address, and every link followed is paced.

        @url http://strict.pydoc.test:8765/
        @polite_delay 3
        @public_only
        @paced_requests
        @returns items 1 1
        @returns requests 1
        @scrapes url host title links
        """
        yield PageItem(
            url=response.url,
            host=urlsplit(response.url).hostname,
            title=(response.css("title::text").get() or "").strip(),
            links=len(response.css("a::attr(href)").getall()),
        )
        for link in self.links.extract_links(response):
            yield response.follow(link.url, callback=self.parse)
