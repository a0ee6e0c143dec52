"""Every held host wakes by its due moment (issue 30 finding 4; docs/spec.md §2, "Announced quotas" and "Quota
booking"): a Hypothesis ``RuleBasedStateMachine`` over the pure policy, on an injected clock.

One host's row (the pace table), requests booked on it (:meth:`PacingPolicy.book`), and answers to them in the
three header styles — IETF ``RateLimit-Policy``/``RateLimit``, ``RateLimit-Limit``/``-Remaining``/``-Reset``,
``X-RateLimit-*`` with a delta, an epoch (also in the past) or an epoch-milliseconds reset — parsed by
:func:`~scrapy_polite.policy.ratelimit.parse_rate_limits`, with edge values (``r=0``, ``t=0``, no reset, no window,
``q=1``, 429s), in any order (:meth:`PacingPolicy.after_response`); download failures; answers that never come.
One process (one request in flight at a time, as a host's line makes it) or several sharing the row.

**The invariant.** When a booking is refused, the policy reports when the host is due: ``defer_verdict(...).due``
when the request leaves the downloader, else ``Booking.start`` (the moment it waits for in line). That moment is
after ``now`` (never a due in the past, never a busy loop), and at that moment a booking proceeds — unless an
answer came since (it may give a new reason), or the host awaits answers of requests booked since the last
counted one (the two tries-again of the rules: the host's first answer, and a quota that the requests still
unanswered may have spent), and then it proceeds by the latest moment those rules allow: the answer's timeout
(:data:`~scrapy_polite.policy.FIRST_ANSWER_TIMEOUT`, at most ``max_wait``, after the row's last write) or the end
of the window after the recorded reset. Nothing refused reports a later due without an answer since.

Negative control: the same steps on the old refill (requests booked since the last counted answer subtracted at
every reset, the hold never written) break the invariant — the host of the finding, held window after window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scrapy_polite.policy import FIRST_ANSWER_TIMEOUT, HostState, PacingPolicy
from scrapy_polite.policy.ratelimit import parse_rate_limits

T0 = 1_800_000_000.0
STYLES = ("ietf", "draft", "x-delta", "x-epoch", "x-epoch-ms", "x-epoch-past")


def fields(style: str, quota: int, window: int | None, remaining: int, reset: int | None, now: float
           ) -> dict[str, list[str]]:
    """The rate-limit fields of one answer in ``style`` (``window``/``reset`` None: not announced)."""
    if style == "ietf":
        policy = f'"default";q={quota}' + (f";w={window}" if window else "")
        limit = f'"default";r={remaining}' + (f";t={reset}" if reset is not None else "")
        return {"RateLimit-Policy": [policy], "RateLimit": [limit]}
    if style == "draft":
        out = {"RateLimit-Limit": [f"{quota}, {quota};w={window}" if window else str(quota)],
               "RateLimit-Remaining": [str(remaining)]}
        if reset is not None:
            out["RateLimit-Reset"] = [str(reset)]
        return out
    out = {"X-RateLimit-Limit": [str(quota)], "X-RateLimit-Remaining": [str(remaining)]}
    if reset is not None:
        if style == "x-delta":
            out["X-RateLimit-Reset"] = [str(reset)]
        elif style == "x-epoch":
            out["X-RateLimit-Reset"] = [str(math.floor(now) + reset)]
        elif style == "x-epoch-ms":
            out["X-RateLimit-Reset"] = [str((math.floor(now) + reset) * 1000)]
        else:  # a reset in the past (a server whose clock is behind, a stale cache)
            out["X-RateLimit-Reset"] = [str(math.floor(now) - 100 - reset)]
    return out


@dataclass(frozen=True)
class Report:
    """What the policy said of a refused booking: ``due`` (epoch s) and ``by``, the latest moment the rules let the
    host be held without an answer since (``due``, unless it awaits answers)."""

    due: float
    by: float


def awaited_by(policy: PacingPolicy, row: HostState, due: float) -> float:
    """The latest moment the host may stay held after ``due`` while it awaits answers of requests booked since the
    last counted answer (``booked > quota_serial``), from the row the refusal was decided on; ``due`` otherwise:

    * its first answer, or an answer on a quota spent with its reset not known: the answer's timeout after the
      row's last write (:data:`~scrapy_polite.policy.FIRST_ANSWER_TIMEOUT`, at most ``max_wait``);
    * a refill the unanswered requests may have spent: the end of the window after the recorded reset."""
    if row.booked <= row.quota_serial:
        return due
    by = due
    if row.quota_serial > 0 and row.quota_reset > 0 and row.quota_window > 0:
        by = max(by, row.quota_reset + row.quota_window)
    else:
        by = max(by, row.updated + min(policy.max_wait, FIRST_ANSWER_TIMEOUT))
    return by


class QuotaWake(RuleBasedStateMachine):
    """One host's row, booked and answered at random; see the module docstring for the invariant."""

    policy_class: type[PacingPolicy] = PacingPolicy

    def __init__(self) -> None:
        super().__init__()
        self.policy = self.policy_class()
        self.now = T0
        self.row: HostState | None = None
        self.in_flight: list[tuple[int | None, float]] = []  # (serial, booked at)
        self.processes = 1
        self.report: Report | None = None  # the last refusal's report, None once booked or answered

    @initialize(interval=st.sampled_from([0.0, 0.001, 0.5, 1.0]), max_wait=st.sampled_from([60.0, 3.0]),
                processes=st.sampled_from([1, 1, 3]), start=st.floats(0.0, 4.0))
    def setup(self, interval: float, max_wait: float, processes: int, start: float) -> None:
        self.policy = self.policy_class(host_interval=interval, max_backoff=max(300.0, interval), max_wait=max_wait)
        self.processes = processes  # 1: a host's line lets one request be in flight; more: other processes
        self.now = T0 + start

    # -- time --------------------------------------------------------------------------------------------------

    @rule(seconds=st.sampled_from([0.0, 0.001, 0.05, 0.3, 0.8, 1.0, 2.5, 4.0, 11.0, 61.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: self.report is not None)
    @rule(late=st.sampled_from([0.0, 0.0, 1e-6, 0.5]), by=st.booleans())
    def to_the_due_moment(self, late: float, by: bool) -> None:
        """To the moment the policy reported (or the latest it allows), where the invariant bites."""
        assert self.report is not None
        self.now = max(self.now, (self.report.by if by else self.report.due) + late)

    # -- bookings ----------------------------------------------------------------------------------------------

    @precondition(lambda self: len(self.in_flight) < self.processes)
    @rule()
    def book(self) -> None:
        booking = self.policy.book(self.row, {}, now=self.now)
        report = self.report
        if report is not None and self.now >= report.by:
            assert booking.booked, (f"held past its due: reported due {report.due - T0:.3f}, held at most until "
                                    f"{report.by - T0:.3f}, refused at {self.now - T0:.3f} (start "
                                    f"{booking.start - T0:.3f})", self.row)
        if booking.booked:
            self.row = booking.writes.get("", booking.host)
            self.in_flight.append((self.row.booked if self.row is not None else None, self.now))
            self.report = None
            return
        verdict = self.policy.defer_verdict(booking.host, self.now)
        due = verdict.due if verdict is not None else booking.start
        assert due > self.now, ("a held host's due is not after now", due - T0, self.now - T0, booking.host)
        row = booking.host if booking.host is not None else HostState()
        by = awaited_by(self.policy, self.row or HostState(), due)
        if report is not None:  # nothing answered since the last refusal: no later due without a reason
            assert by <= report.by, ("a later due with no answer since", by - T0, report.by - T0, row)
        self.report = Report(due=due, by=by)

    # -- answers -----------------------------------------------------------------------------------------------

    def _take(self, index: int) -> tuple[int | None, float]:
        return self.in_flight.pop(index % len(self.in_flight))

    @precondition(lambda self: bool(self.in_flight))
    @rule(index=st.integers(0, 7), style=st.sampled_from(STYLES), quota=st.integers(1, 6),
          window=st.sampled_from([None, 1, 4, 60]), remaining=st.integers(0, 6),
          reset=st.sampled_from([None, 0, 1, 3, 4, 30]), status=st.sampled_from([200, 200, 404, 429]),
          announced=st.sampled_from([True, True, True, False]))
    def answer(self, index: int, style: str, quota: int, window: int | None, remaining: int, reset: int | None,
               status: int, announced: bool) -> None:
        serial, sent_at = self._take(index)
        limits = None
        if announced:  # an answer may also carry no rate-limit field (a proxy's page, an error page)
            limits = parse_rate_limits(fields(style, quota, window, min(remaining, quota), reset, self.now),
                                       now=self.now)
        decision = self.policy.after_response(self.row, status=status, end=self.now, sent_at=sent_at,
                                              retry_after=1.0 if status == 429 else None, ratelimits=limits,
                                              serial=serial)
        self.row = decision.state
        self.report = None  # an answer may give a new reason to hold the host

    @precondition(lambda self: bool(self.in_flight))
    @rule(index=st.integers(0, 7))
    def failure(self, index: int) -> None:
        """A download failure that reached the server's side (a throttle without Retry-After)."""
        serial, sent_at = self._take(index)
        self.row = self.policy.after_response(self.row, status=None, end=self.now, sent_at=sent_at,
                                              serial=serial).state
        self.report = None

    @precondition(lambda self: bool(self.in_flight))
    @rule(index=st.integers(0, 7))
    def never_answered(self, index: int) -> None:
        """The answer never comes (a crawl stopped while it was in flight): the row never hears of it."""
        self._take(index)

    @invariant()
    def a_deferral_is_never_due_in_the_past(self) -> None:
        verdict = self.policy.defer_verdict(self.row, self.now)
        assert verdict is None or verdict.due > self.now


QuotaWake.TestCase.settings = hsettings(max_examples=400, stateful_step_count=50)
TestQuotaWake = QuotaWake.TestCase


# --------------------------------------------------------------------------------------------------
# The negative control: the old refill breaks the invariant


class OldRefill(PacingPolicy):
    """The refill before issue 30: requests booked since the last counted answer subtracted at every reset."""

    @staticmethod
    def _refill(state: HostState, now: float) -> HostState:
        if state.quota_limit <= 0:
            return HostState(**{**state.__dict__, "quota_left": -1, "quota_reset": 0.0})
        since = max(state.booked - state.quota_serial, 0)
        reset = 0.0
        if state.quota_window > 0:
            reset = state.quota_reset + (math.floor((now - state.quota_reset) / state.quota_window) + 1) \
                * state.quota_window
        return HostState(**{**state.__dict__, "quota_left": max(state.quota_limit - since, 0), "quota_reset": reset,
                            "quota_serial": state.booked})


class OldQuotaWake(QuotaWake):
    policy_class = OldRefill


def finding_steps(machine: QuotaWake) -> None:
    """The finding's host, one process: 5 per 4 s announced; after a refill, a window of answers that never come
    (a crawl stopped, a proxy that drops them), then the next reset."""
    machine.setup(interval=0.5, max_wait=60.0, processes=1, start=0.0)
    machine.book()
    machine.answer(0, "ietf", 5, 4, 0, 1, 200, True)  # r=0, t=1: held until the reset
    machine.book()
    assert machine.report is not None
    machine.to_the_due_moment(0.0, False)
    for _ in range(5):  # the refill's 5, one each w / q = 0.8 s; none ever answered
        machine.book()
        machine.never_answered(0)
        machine.advance(0.8)
    machine.advance(4.0)  # past the reset the 5th booking recorded
    for _ in range(6):  # to every moment the policy reports, until it books
        machine.book()
        if machine.report is None:
            return
        machine.to_the_due_moment(0.0, False)


def test_the_finding_host_wakes_by_its_due_moment():
    machine = QuotaWake()
    finding_steps(machine)
    assert machine.report is None and machine.row is not None and machine.row.booked == 7


def test_negative_control_the_old_refill_holds_the_host_past_its_due_moment():
    machine = OldQuotaWake()
    with pytest.raises(AssertionError, match="held past its due|a later due with no answer since"):
        finding_steps(machine)
