"""The items the demo spider scrapes: one per documentation page."""

import scrapy


class PageItem(scrapy.Item):
    url = scrapy.Field()
    host = scrapy.Field()  # the URL's host, without port
    title = scrapy.Field()  # the page's <title>, e.g. "Python: module json"
    links = scrapy.Field()  # number of links on the page
