"""A spider that crawls pydoc-generated HTML documentation sites, following links within their hosts.

Give it the sites' front pages::

    scrapy crawl pydoc_site -a start_urls=http://127.0.0.2:8000/,http://127.0.0.3:8000/

(``run_demo.py`` starts such sites locally and passes their URLs.) ``allowed_domains`` is derived from the
start URLs, so links to other sites (docs.python.org, json.org ...) are dropped by Scrapy's offsite filter.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from scrapy import Request
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule

from polite_demo.items import PageItem


class PydocSiteSpider(CrawlSpider):
    name = "pydoc_site"

    rules = (
        # Module pages ("os.html") and the index ("." -> "/"); pydoc's in-page anchors are the same pages.
        Rule(LinkExtractor(allow=(r"/$", r"\.html$")), callback="parse_page", follow=True),
    )

    def __init__(self, start_urls: list[str] | str | None = None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(start_urls, str):  # -a start_urls=a,b on the command line
            start_urls = [u.strip() for u in start_urls.split(",") if u.strip()]
        self.start_urls = list(start_urls or [])
        if not self.start_urls:
            raise ValueError("pydoc_site needs start URLs: -a start_urls=http://host:port/,http://...")
        self.allowed_domains = sorted({urlsplit(u).hostname for u in self.start_urls if urlsplit(u).hostname})

    async def start(self):
        # Unlike Scrapy's default start requests, these go through the dupe filter, so the index page that
        # every module page links back to ("." -> "/") is fetched once, not twice.
        for url in self.start_urls:
            yield Request(url)

    def parse_start_url(self, response):
        return self.parse_page(response)

    def parse_page(self, response):
        yield PageItem(
            url=response.url,
            host=urlsplit(response.url).hostname,
            title=(response.css("title::text").get() or "").strip(),
            links=len(response.css("a::attr(href)").getall()),
        )
