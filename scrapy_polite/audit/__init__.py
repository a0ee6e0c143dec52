"""The audit of a crawl's event log (docs/spec.md §8, docs/guides/operating.md, "Auditing a crawl"): pure functions,
no I/O, behind ``scrapy polite audit``.

* :mod:`.log`: reading the log: every event as the crawl writes it, none missing (:class:`LogError` otherwise);
* :mod:`.rules`: the rules the crawl promised to keep, checked per host and per address (:func:`audit`);
* :mod:`.report`: the findings (:class:`AuditReport`, :class:`Violation`, ...);
* :mod:`.words`: the report in words (:func:`format_report`) and as JSON (:func:`report_json`).
"""

from __future__ import annotations

from .log import LogError
from .report import VIOLATION_KINDS, AddressSummary, AuditReport, HostSummary, Loss, Throttle, Violation
from .rules import audit
from .words import format_report, report_json

__all__ = ["VIOLATION_KINDS", "AddressSummary", "AuditReport", "HostSummary", "LogError", "Loss", "Throttle",
           "Violation", "audit", "format_report", "report_json"]
