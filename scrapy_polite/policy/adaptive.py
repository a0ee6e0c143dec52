"""Latency-aware pacing inside the floor (docs/spec.md §2, "Adaptive pacing"): pure functions, no I/O.

With ``POLITE_ADAPTIVE`` on, each host's interval follows what its server *shows*, before it says anything:

* a **smoothed download latency** ``L`` (an exponentially weighted moving average of each response's
  download time, weight :data:`SMOOTHING` for the newest sample), kept in the host's row of the pace table
  (``HostState.latency``), so every process sharing the table paces on it and it survives a restart;
* **strain steps** ``s`` (``HostState.strain``): each 5xx answer or server-side download failure (timeout,
  refused or reset connection) adds one, each other answer takes one off — one step at a time, like the
  backoff (SPEC §2), and no step is taken past the cap.

The adaptive interval is ``min(cap, max(factor × L, floor) × GROWTH**s)``, and the interval in force is never
below the floor (the host and spider intervals, Crawl-delay, an announced quota: everything
:meth:`~scrapy_polite.policy.PacingPolicy.effective_interval` takes without this module), nor above
``max(cap, floor)``. A Retry-After, a quota hold and the backoff still apply on top of it
(:meth:`~scrapy_polite.policy.PacingPolicy.after_response` takes the larger). ``factor × L`` is Heritrix's
"delay factor" rule (``delayFactor × fetch duration``, bounded by ``minDelayMs`` / ``maxDelayMs``): with
factor ``F`` one crawler keeps a server busy at most ``1 / (F + 1)`` of the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AdaptivePolicy", "GROWTH", "MAX_STRAIN_STEPS", "SMOOTHING"]

#: The weight of the newest latency sample in the smoothed latency (an EWMA): after ``k`` samples of a new
#: latency, ``1 - 0.7**k`` of the change is taken (half after 2, 90 % after 7).
SMOOTHING = 0.3

#: Each strain step multiplies the interval by this (as a backoff step does).
GROWTH = 2.0

#: At most this many strain steps (``GROWTH**10`` = 1024 × the base), besides the cap.
MAX_STRAIN_STEPS = 10


@dataclass(frozen=True)
class AdaptivePolicy:
    """The configuration of adaptive pacing (``POLITE_ADAPTIVE_*``) and its rules. Durations in seconds.

    Attributes:
        factor: ``POLITE_ADAPTIVE_FACTOR``, the interval is at least this many times the smoothed latency
            (> 0; Heritrix's ``delayFactor``).
        cap: ``POLITE_ADAPTIVE_MAX``, the largest interval adaptive pacing sets (a floor above it still wins).

    Raises:
        ValueError: a factor that is not a finite number > 0, or a cap that is not finite and >= 0.
    """

    factor: float = 5.0
    cap: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.factor, (int, float)) or not math.isfinite(self.factor) or self.factor <= 0:
            raise ValueError(f"factor must be a finite number > 0, got {self.factor!r}")
        if not isinstance(self.cap, (int, float)) or not math.isfinite(self.cap) or self.cap < 0:
            raise ValueError(f"cap must be a finite number of seconds >= 0, got {self.cap!r}")

    def interval(self, latency: float, strain: int, floor: float) -> float:
        """The interval in force (seconds): ``max(floor, min(cap, max(factor × latency, floor) × GROWTH**strain))``.

        Args:
            latency: the host's smoothed download latency, seconds (0: none measured yet).
            strain: the host's strain steps, an int >= 0.
            floor: seconds, the interval without adaptive pacing (host interval, Crawl-delay, quota, override).

        Returns:
            Seconds, ``>= floor`` and ``<= max(cap, floor)``; exactly ``floor`` with no latency and no strain.

        >>> AdaptivePolicy(factor=5, cap=60).interval(0.4, 0, 1.0)
        2.0
        >>> AdaptivePolicy(factor=5, cap=60).interval(0.05, 2, 1.0)
        4.0
        >>> AdaptivePolicy(factor=5, cap=60).interval(0.05, 0, 1.0)
        1.0
        """
        base = max(self.factor * latency, floor)
        wanted = base * GROWTH ** min(max(strain, 0), MAX_STRAIN_STEPS)
        return max(floor, min(self.cap, wanted))

    def observe(self, latency: float, strain: int, *, sample: float | None, error: bool,
                floor: float) -> tuple[float, int]:
        """The host's ``(latency, strain)`` after one answer (docs/spec.md §2, "Adaptive pacing").

        Args:
            latency: the smoothed latency so far, seconds (0: none yet).
            strain: the strain steps so far.
            sample: this answer's download time, seconds (None, negative or not finite: not measured; the
                smoothed latency is kept as it is).
            error: the answer was a 5xx or a server-side download failure (adds a strain step); otherwise
                one step is taken off.
            floor: seconds, the interval without adaptive pacing (a step is not added once the interval is
                at the cap).

        Returns:
            ``(latency, strain)``: the first sample is taken as it is, later ones are smoothed with weight
            :data:`SMOOTHING`; ``strain`` in ``0 .. MAX_STRAIN_STEPS``.
        """
        if sample is not None and math.isfinite(sample) and sample >= 0:
            latency = sample if latency <= 0 else latency + SMOOTHING * (sample - latency)
        if error:
            if strain < MAX_STRAIN_STEPS and self.interval(latency, strain, floor) < max(self.cap, floor):
                strain += 1
        elif strain > 0:
            strain -= 1
        return latency, strain
