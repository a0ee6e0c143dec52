"""Tests of scrapy_polite.policy.parse_retry_after: RFC 9110 §10.2.3 plus docs/spec.md §2's decimal deviation.

Expected values are written out by hand; HTTP-dates are checked against ``calendar.timegm`` of the same
instant, never against the parser under test.
"""

from __future__ import annotations

import calendar
import math
import time

import pytest

from scrapy_polite.policy import InvalidRetryAfter, PacingPolicy, parse_retry_after
from scrapy_polite.policy.retry_after import longest_retry_after

#: 1994-11-06 08:49:37 UTC, the instant of RFC 9110's three HTTP-date examples.
RFC_INSTANT = float(calendar.timegm((1994, 11, 6, 8, 49, 37)))
IMF_FIXDATE = "Sun, 06 Nov 1994 08:49:37 GMT"
RFC850_DATE = "Sunday, 06-Nov-94 08:49:37 GMT"
ASCTIME_DATE = "Sun Nov  6 08:49:37 1994"

#: An arbitrary local clock, unrelated to every date below (to prove which reference a date is taken from).
NOW = 1_800_000_000.0


# --------------------------------------------------------------------------------------------------
# delay-seconds, and the decimal deviation
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, want", [
    pytest.param("120", 120.0, id="integer"),
    pytest.param("  42 ", 42.0, id="surrounding whitespace"),
    pytest.param("\t7\r\n", 7.0, id="tabs and line end"),
    pytest.param("0", 0.0, id="zero"),
    pytest.param("299.997", 299.997, id="decimal 299.997"),
    pytest.param("1.5", 1.5, id="decimal 1.5"),
    pytest.param("2.0", 2.0, id="decimal 2.0"),
    pytest.param("0007", 7.0, id="leading zeros"),
    pytest.param("86400", 86400.0, id="a day (clamping is the policy's job, not the parser's)"),
])
def test_delay_seconds(value, want):
    result = parse_retry_after(value, now=NOW)
    assert result == want
    assert isinstance(result, float)


@pytest.mark.parametrize("value", ["120", "1994", "2015"])
def test_digits_are_never_parsed_as_a_date(value):
    # Even a year-like number, and even with a Date header present, is delay-seconds.
    assert parse_retry_after(value, now=NOW, date=IMF_FIXDATE) == float(value)


@pytest.mark.parametrize("value", [
    pytest.param("-5", id="negative"),
    pytest.param("-0.5", id="negative decimal"),
    pytest.param("", id="empty"),
    pytest.param("   ", id="blank"),
    pytest.param("soon", id="garbage word"),
    pytest.param("inf", id="inf"),
    pytest.param("Infinity", id="Infinity"),
    pytest.param("nan", id="nan"),
    pytest.param("NaN", id="NaN"),
    pytest.param("1e3", id="exponent"),
    pytest.param("+-3", id="two signs"),
    pytest.param("12 34", id="two numbers"),
    pytest.param("0x10", id="hex"),
    pytest.param("Wed, 99 Foo 2015", id="date with a bogus month"),
    pytest.param("Fri, 15 Jan 2027 25:02:00 GMT", id="hour 25"),
    pytest.param("Sun, 32 Jan 2027 08:02:00 GMT", id="32 January"),
    pytest.param("Mon, 30 Feb 2026 08:02:00 GMT", id="30 February"),
    pytest.param("Fri, 15 Jan 2027 99999999999:02:00 GMT", id="an hour beyond any"),
    pytest.param("Fri, 15 Jan 2027 08:60:00 GMT", id="minute 60"),
    pytest.param("120, soon", id="a joined line that is no number"),
    pytest.param("Sun, 06 Nov", id="truncated date"),
])
def test_invalid_values_raise(value):
    with pytest.raises(InvalidRetryAfter):
        parse_retry_after(value, now=NOW)


@pytest.mark.parametrize("value, want", [("120, 120", 120.0), ("1,5", 5.0), ("30 ,\t60.5", 60.5)])
def test_field_lines_joined_by_an_intermediary_give_the_longest(value, want):
    """RFC 9110 §5.3: two ``Retry-After`` lines (a gateway's and the origin's) arrive joined by a comma; the longest
    wait is kept. (``1,5`` as a decimal comma would be shorter.)"""
    assert parse_retry_after(value, now=NOW) == want


def test_several_field_lines_give_the_longest_valid_wait():
    """Each line read alone (a date has a comma of its own); the invalid ones are returned, not fatal."""
    date = "Thu, 01 Jan 2026 00:02:00 GMT"  # 120 s after NOW's Date below
    waits, errors = longest_retry_after([b"30", date.encode(), b"soon"], now=0.0, date="Thu, 01 Jan 2026 00:00:00 GMT")
    assert waits == 120.0 and len(errors) == 1 and "soon" in str(errors[0])
    waits, errors = longest_retry_after([b"bad"], now=NOW)
    assert waits is None and len(errors) == 1
    assert longest_retry_after([], now=NOW) == (None, [])


def test_a_leap_second_is_a_date():
    """RFC 9110's HTTP-date allows second 60: a real date, not refused with the impossible ones (the control)."""
    assert parse_retry_after("Thu, 31 Dec 2026 23:59:60 GMT", now=1_798_761_500.0) == 100.0


@pytest.mark.parametrize("value", ["9" * 400, "1" * 310, "9" * 400 + ".5"])
def test_any_run_of_digits_is_delay_seconds_however_long(value):
    # RFC 9110 §10.2.3 sets no limit on delay-seconds: too large for a float is "longer than any cap".
    assert parse_retry_after(value, now=NOW) == math.inf


def test_a_long_run_of_digits_is_clamped_by_the_policy():
    decision = PacingPolicy(max_retry_after=2.0).after_response(
        None, status=429, end=NOW, retry_after=parse_retry_after("9" * 400, now=NOW))
    assert decision.retry_after_clamped is True
    assert decision.delay == 2.0 and decision.state.next_allowed == NOW + 2.0
    # Negative control: 20 digits were always clamped the same way.
    assert PacingPolicy(max_retry_after=2.0).after_response(
        None, status=429, end=NOW, retry_after=parse_retry_after("9" * 20, now=NOW)).delay == 2.0


def test_invalid_retry_after_is_a_value_error():
    # Callers that already catch ValueError keep working.
    assert issubclass(InvalidRetryAfter, ValueError)


@pytest.mark.parametrize("value", ["١٢٠", "１２０"])  # Arabic-Indic and full-width digits
def test_non_ascii_digits_are_invalid(value):
    # RFC 9110: delay-seconds = 1*DIGIT, and DIGIT is ASCII 0-9 only.
    with pytest.raises(InvalidRetryAfter):
        parse_retry_after(value, now=NOW)


def test_absent_header_is_none():
    assert parse_retry_after(None, now=NOW) is None
    assert parse_retry_after(None, now=NOW, date=IMF_FIXDATE) is None


def test_bytes_input():
    assert parse_retry_after(b"120", now=NOW) == 120.0
    assert parse_retry_after(b" 1.5 ", now=NOW) == 1.5
    assert parse_retry_after(b"Sun, 06 Nov 1994 08:51:37 GMT", now=NOW, date=IMF_FIXDATE.encode()) == 120.0
    with pytest.raises(InvalidRetryAfter):
        parse_retry_after(b"-5", now=NOW)
    with pytest.raises(InvalidRetryAfter):
        parse_retry_after(b"\xff\xfe", now=NOW)


# --------------------------------------------------------------------------------------------------
# HTTP-date, the three forms RFC 9110 §5.6.7 requires a recipient to accept
# --------------------------------------------------------------------------------------------------

DATE_FORMS = [
    pytest.param(IMF_FIXDATE, id="IMF-fixdate"),
    pytest.param(RFC850_DATE, id="RFC 850"),
    pytest.param(ASCTIME_DATE, id="asctime"),
]


@pytest.mark.parametrize("value", DATE_FORMS)
def test_http_date_relative_to_date_header(value):
    # The response says it is 08:47:37 and asks us to come back at 08:49:37: 120 s, whatever our clock.
    assert parse_retry_after(value, now=NOW, date="Sun, 06 Nov 1994 08:47:37 GMT") == 120.0


@pytest.mark.parametrize("value", DATE_FORMS)
def test_http_date_relative_to_local_clock(value):
    assert parse_retry_after(value, now=RFC_INSTANT - 30.0) == 30.0


@pytest.mark.parametrize("date", [
    pytest.param("Sun, 06 Nov 1994 08:47:37 GMT", id="IMF-fixdate Date"),
    pytest.param("Sunday, 06-Nov-94 08:47:37 GMT", id="RFC 850 Date"),
    pytest.param("Sun Nov  6 08:47:37 1994", id="asctime Date"),
])
def test_date_header_in_every_form(date):
    assert parse_retry_after(IMF_FIXDATE, now=NOW, date=date) == 120.0


def test_invalid_date_header_falls_back_to_the_local_clock():
    assert parse_retry_after(IMF_FIXDATE, now=RFC_INSTANT - 10.0, date="yesterday-ish") == 10.0


@pytest.mark.parametrize("value", DATE_FORMS)
def test_past_date_is_zero(value):
    assert parse_retry_after(value, now=RFC_INSTANT + 3600.0) == 0.0
    assert parse_retry_after(value, now=NOW, date="Sun, 06 Nov 1994 09:00:00 GMT") == 0.0


def test_date_equal_to_now_is_zero():
    assert parse_retry_after(IMF_FIXDATE, now=RFC_INSTANT) == 0.0


@pytest.fixture
def non_utc_local_time(monkeypatch):
    """Run with a local time zone far from UTC (HTTP-dates are UTC whatever the machine's zone)."""
    if not hasattr(time, "tzset"):
        pytest.skip("time.tzset is not available on this platform")
    monkeypatch.setenv("TZ", "<+0930>-9:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("value", DATE_FORMS)
def test_http_date_is_utc_whatever_the_local_time_zone(non_utc_local_time, value):
    assert time.timezone != 0  # precondition: the zone really is not UTC
    assert parse_retry_after(value, now=RFC_INSTANT - 30.0) == 30.0


# --------------------------------------------------------------------------------------------------
# The inputs of the public bug report that motivated the deviation: a server sending
# "Retry-After: 299.997", a negative value, a date in the past, and the plain integer.
# (Header-name case is the middleware's concern, not the parser's.)
# --------------------------------------------------------------------------------------------------


def test_bug_report_negative_is_invalid():
    with pytest.raises(InvalidRetryAfter):
        parse_retry_after("-5", now=NOW)


def test_bug_report_fractional_near_300():
    assert parse_retry_after("299.997", now=NOW) == pytest.approx(300.0, abs=0.01)


def test_bug_report_past_date_is_zero():
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=NOW) == 0.0


def test_bug_report_plain_integer():
    assert parse_retry_after("120", now=NOW) == 120.0
