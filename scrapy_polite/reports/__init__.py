"""What a crawl tells about itself (the stats reference in docs/reference; the audit of its record: docs/spec.md
§8): :mod:`.counters` keeps the per-host counters and the ``polite/...`` stats
(:class:`~scrapy_polite.reports.counters.Report`), :mod:`.events` the event log beside the pace table
(:class:`~scrapy_polite.reports.events.EventLog`), :mod:`.summary` says the closing summary, the progress and the
start-up lines, :mod:`.timeline` draws the timeline picture, and :mod:`.words` holds the one copy of each formatter
of durations, times, counts and tables."""
