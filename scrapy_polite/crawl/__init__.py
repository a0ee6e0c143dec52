"""The glue of one crawl between the pure rules (:mod:`scrapy_polite.policy`), the pace table
(:mod:`scrapy_polite.stores`) and Scrapy's components: a request's life (:mod:`.lifecycle`), its booking
(:mod:`.booking`), the record of its outcome (:mod:`.recording`), the retries of throttled pages
(:mod:`.retrying`), resolution and pinning (:mod:`.resolution`), the held requests (:mod:`.held`), the typed seams
(:mod:`.seams`), a store's outage (:mod:`.outage`) and the reactor's turns (:mod:`.reactor`).
:class:`~scrapy_polite.pacer.Pacer` composes them (docs/design/development.md, "The code")."""
