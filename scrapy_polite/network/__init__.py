"""Network safety inside the crawl: which host a URL names (:mod:`.hosts`, the WHATWG URL Standard), which
addresses may be contacted (:mod:`.addresses`, public only) and the download handlers' modes (:mod:`.handlers`).
The components a project names in its settings (:mod:`scrapy_polite.resolver`, :mod:`scrapy_polite.handler`,
:mod:`scrapy_polite.browser`, :mod:`scrapy_polite.browser_proxy`) use them (docs/spec.md §3–4.1)."""
