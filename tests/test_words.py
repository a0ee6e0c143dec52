"""scrapy_polite/reports/words.py: the one copy of each formatter the summary, the progress lines, the contracts, the
operator command, the audit and the timeline share (issue 31: the copies in commands.py and summary.py had
diverged)."""

from __future__ import annotations

import time

from scrapy_polite.reports.words import (
    format_due,
    format_duration,
    format_relative,
    format_table,
    format_time,
    iso_time,
    plural,
)

NOW = 1_700_000_000.0


def test_durations_read_as_a_person_would():
    assert [format_duration(s) for s in (0.0, 0.44, 12.0, 59.94, 250.4, 7300, 86399, 86400 + 2 * 3600 + 1)] == [
        "0.0 s", "0.4 s", "12.0 s", "59.9 s", "4 m 10 s", "2 h 1 m", "23 h 59 m", "1 d 2 h"]


def test_the_reconciled_duration_counts_days_and_never_reads_negative():
    """The summary's copy had no days (``26 h 5 m``) and read a negative span as ``0.0 s``; the command's had days
    and read it as its size. One copy: days, and ``0.0 s`` (the direction is :func:`format_relative`'s to say)."""
    assert format_duration(26 * 3600 + 300) == "1 d 2 h"
    assert format_duration(-5.0) == "0.0 s" and format_duration(-500.0) == "0.0 s"


def test_relative_times_say_which_way():
    assert format_relative(NOW + 12, NOW) == "in 12.0 s"
    assert format_relative(NOW - 3, NOW) == "3.0 s ago"
    assert format_relative(NOW - 250.4, NOW) == "4 m 10 s ago"
    assert format_relative(NOW + 0.04, NOW) == "now" == format_relative(NOW - 0.04, NOW)
    assert format_relative(0, NOW) == "-"


def test_due_times_give_the_clock_and_the_date_beyond_a_day():
    assert format_due(NOW + 250.4, NOW) == f"in 4 m 10 s (at {time.strftime('%H:%M:%S', time.localtime(NOW + 250.4))})"
    later = NOW + 2 * 86400
    assert format_due(later, NOW) == f"in 2 d 0 h (at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(later))})"
    # Passed, or within 0.05 s: "now" (the summary's copy said "in 0.0 s (at ...)" for a moment 0.04 s away).
    assert format_due(NOW - 10, NOW) == "now" == format_due(NOW + 0.04, NOW)
    assert format_due(NOW + 0.06, NOW).startswith("in 0.1 s (at ")


def test_counts_and_times():
    assert (plural(1, "request"), plural(0, "request"), plural(3, "host")) == ("1 request", "0 requests", "3 hosts")
    assert format_time(0) == "-" and format_time(NOW) == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(NOW))
    assert iso_time(0) is None and iso_time(None) is None
    stamp = iso_time(NOW + 0.25)
    assert stamp is not None and stamp.startswith(time.strftime("%Y-%m-%dT%H:%M:%S.250", time.localtime(NOW)))


def test_tables_align_left_or_right():
    rows = [("host", "requests", "state"), ("a.example", "7", "ok"), ("bb.example", "12", "-")]
    assert format_table(rows).split("\n") == ["host        requests  state",
                                              "a.example   7         ok",
                                              "bb.example  12        -"]
    assert format_table(rows, "  ", right={1}).split("\n") == ["  host        requests  state",
                                                               "  a.example          7  ok",
                                                               "  bb.example        12  -"]
    assert format_table([]) == ""
