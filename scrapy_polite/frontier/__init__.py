"""The shared frontier of a scrapy-redis crawl (docs/spec.md §5, "The shared frontier"): :mod:`.leases` takes,
holds and leases the requests in Redis (:class:`~scrapy_polite.frontier.leases.RedisFrontier`), :mod:`.report`
reads what it holds, per host and per worker, and :mod:`.worker` is this worker's side (its beat, its share, its
idle decision, its close)."""
