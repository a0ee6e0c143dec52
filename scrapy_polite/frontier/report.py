"""What a shared frontier holds, read from Redis: per host (held requests), per worker (leased requests), and
the words the logs and ``scrapy polite hosts`` use for them (docs/spec.md §5, "The shared frontier";
docs/guides/many-crawlers.md).

:mod:`scrapy_polite.frontier` takes, holds and ends requests; this module only reads. Its Lua fragments are
shared by the frontier's scripts (:data:`NOW_LUA`, :data:`LEASERS_LUA`), so that a worker deciding whether
to close and an operator running ``scrapy polite hosts`` read the leases the same way.

Keys under the frontier's key ``<key>`` (``POLITE_FRONTIER_KEY``) that this module reads: ``<key>:due`` and
``<key>:held:<host>`` (held requests), ``<key>:returned``, ``<key>:workers`` (worker → its lease deadline),
``<key>:renewed`` (worker → the moment it last renewed) and ``<key>:lease:<worker>`` (its leased requests).
Every moment is the Redis server's clock (``TIME``), in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BEATS_BEFORE_STOPPED", "FrontierState", "WorkerLeases", "beat_period", "describe_leases",
           "leasers", "waiting_in_redis"]

#: Lua: ``now``, the Redis server's clock in seconds (every due time and deadline of the frontier is on it).
NOW_LUA = "local t = redis.call('TIME'); local now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"

#: Lua: ``leasers(workers, renewed, lease_prefix, me)``, the workers other than ``me`` that lease requests:
#: a flat list ``worker, leases, last renewal ('' when not recorded), deadline`` per worker, the first 1,000
#: workers by deadline.
LEASERS_LUA = """
local function leasers(workers, renewed, prefix, me)
  local out = {}
  local rows = redis.call('ZRANGE', workers, 0, 999, 'WITHSCORES')
  for i = 1, #rows, 2 do
    local w = rows[i]
    if w ~= me then
      local n = redis.call('HLEN', prefix .. w)
      if n > 0 then
        out[#out + 1] = w
        out[#out + 1] = n
        out[#out + 1] = redis.call('ZSCORE', renewed, w) or ''
        out[#out + 1] = rows[i + 1]
      end
    end
  end
  return out
end
"""

#: Per host: {host, held, due delay (s)} for the first 1,000 due hosts: KEYS = due; ARGV = held key prefix.
HOSTS_LUA = NOW_LUA + """
local out = {}
local rows = redis.call('ZRANGE', KEYS[1], 0, 999, 'WITHSCORES')
for i = 1, #rows, 2 do
  out[#out + 1] = rows[i]
  out[#out + 1] = redis.call('LLEN', ARGV[1] .. rows[i])
  out[#out + 1] = tostring(tonumber(rows[i + 1]) - now)
end
return out
"""

#: Every worker's leases: KEYS = workers, renewed; ARGV = lease key prefix. Returns {now, leasers…}.
WORKERS_LUA = NOW_LUA + LEASERS_LUA + """
local out = leasers(KEYS[1], KEYS[2], ARGV[1], '')
table.insert(out, 1, tostring(now))
return out
"""

#: How many beats a worker may miss before the reports call it "stopped renewing" (a report's word only: a
#: worker about to close waits for a lease whose worker has not renewed since it decided, whatever this).
BEATS_BEFORE_STOPPED = 3


def beat_period(lease_time: float) -> float:
    """Seconds between a worker's lease renewals: every second, or every third of ``POLITE_LEASE_TIME`` (s)
    if shorter (docs/spec.md §5, "Leases")."""
    return min(1.0, lease_time / 3)


@dataclass(frozen=True)
class WorkerLeases:
    """The requests one worker leases, as read from Redis.

    Attributes:
        worker: its id, ``<hostname>-<pid>-<random>`` (each worker logs it at start).
        leases: how many requests it leases.
        renewed_at: when it last renewed its leases (the Redis server's clock, epoch s); None when not
            recorded (a worker of an earlier version of the add-on, which did not record it).
        deadline: when its leases come back to the frontier unless it renews (server clock, epoch s).
        now: the server's clock when this was read (epoch s).
    """

    worker: str
    leases: int
    renewed_at: float | None
    deadline: float
    now: float

    @property
    def back_in(self) -> float:
        """Seconds until its leases come back if it does not renew (0: due now, returned by the next renewal
        of any worker)."""
        return max(0.0, self.deadline - self.now)

    @property
    def renewed_ago(self) -> float | None:
        """Seconds since it last renewed (None: not recorded)."""
        return None if self.renewed_at is None else max(0.0, self.now - self.renewed_at)

    def renewing(self, lease_time: float) -> bool:
        """It renewed within the last :data:`BEATS_BEFORE_STOPPED` beats of ``lease_time`` (s) (a report's word:
        see :data:`BEATS_BEFORE_STOPPED`); without a recorded renewal, its deadline says the same."""
        ago = self.renewed_ago
        if ago is None:
            ago = lease_time - (self.deadline - self.now)
        return ago <= BEATS_BEFORE_STOPPED * beat_period(lease_time)

    def words(self, lease_time: float) -> str:
        """``worker W: 14 requests, stopped renewing 5 s ago, back in 55 s``, or ``worker W: 2 requests,
        renewing (last 0.4 s ago)``."""
        head = f"worker {self.worker}: {self.leases} request{'' if self.leases == 1 else 's'}"
        ago = self.renewed_ago
        if self.renewing(lease_time):
            return f"{head}, renewing" + (f" (last {ago:.1f} s ago)" if ago is not None else "")
        since = f" {ago:.0f} s ago" if ago is not None else ""
        return f"{head}, stopped renewing{since}, back in {self.back_in:.0f} s"


def leasers(rows: list[Any], now: float) -> tuple[WorkerLeases, ...]:
    """The rows of :data:`LEASERS_LUA` (flat, four per worker), read at ``now`` (server clock, epoch s)."""
    out = []
    for i in range(0, len(rows) - 3, 4):
        renewed = _text(rows[i + 2])
        out.append(WorkerLeases(_text(rows[i]), int(rows[i + 1]), float(renewed) if renewed else None,
                                float(_text(rows[i + 3])), now))
    return tuple(out)


@dataclass(frozen=True)
class FrontierState:
    """What the shared frontier holds, as last read (:meth:`RedisFrontier.renew
    <scrapy_polite.frontier.leases.RedisFrontier.renew>`).

    Attributes:
        returned: requests given back by stopped or dead workers, to be taken first.
        held: requests held in Redis until their host is due.
        first_host: the host due first ('' when nothing is held).
        first_due: seconds from now until it is due (may be negative; None when nothing is held).
        elsewhere: the other workers that lease requests (live or not), soonest deadline first.
        expired: leases of dead workers returned by this read.
        now: the Redis server's clock at this read (epoch s; 0 before the first read).
    """

    returned: int = 0
    held: int = 0
    first_host: str = ""
    first_due: float | None = None
    elsewhere: tuple[WorkerLeases, ...] = ()
    expired: int = 0
    now: float = 0.0

    @property
    def others_leased(self) -> int:
        """Requests other workers lease (they come back if their worker stops renewing)."""
        return sum(w.leases for w in self.elsewhere)

    @property
    def takeable_in(self) -> float | None:
        """Seconds until this worker may take something (0: now), None when nothing waits in Redis. Other
        workers' leases are not counted here (the idle check weighs them: docs/spec.md §5, "Idle")."""
        if self.returned:
            return 0.0
        if self.first_due is not None:
            return max(0.0, self.first_due)
        return None


def describe_leases(elsewhere: tuple[WorkerLeases, ...], lease_time: float, limit: int = 10) -> str:
    """``leased by other workers: worker W: 14 requests, stopped renewing …; …`` ('' when none), for the log."""
    if not elsewhere:
        return ""
    parts = [w.words(lease_time) for w in elsewhere[:limit]]
    if len(elsewhere) > limit:
        parts.append(f"{len(elsewhere) - limit} more workers")
    total = sum(w.leases for w in elsewhere)
    return f"{total} requests leased by other workers ({'; '.join(parts)})"


def read_hosts(server: Any, key: str) -> list[tuple[str, int, float]]:
    """``(host, requests held in Redis, seconds until due)`` for the first 1,000 hosts of the frontier ``key``,
    soonest first (blocking)."""
    rows = server.register_script(HOSTS_LUA)(keys=[f"{key}:due"], args=[f"{key}:held:"])
    return [(_text(rows[i]), int(rows[i + 1]), float(_text(rows[i + 2]))) for i in range(0, len(rows), 3)]


def read_workers(server: Any, key: str) -> tuple[WorkerLeases, ...]:
    """Every worker of the frontier ``key`` that leases requests, live or not, soonest deadline first
    (blocking, one round trip)."""
    rows = server.register_script(WORKERS_LUA)(keys=[f"{key}:workers", f"{key}:renewed"], args=[f"{key}:lease:"])
    return leasers(list(rows[1:]), float(_text(rows[0])))


def waiting_in_redis(server: Any, key_template: str, limit: int = 1000
                     ) -> list[tuple[str, int, list[tuple[str, int, float]], tuple[WorkerLeases, ...]]]:
    """What waits in every shared frontier of a Redis server (``scrapy polite hosts``), without a crawl.

    Args:
        server: a ``redis.Redis`` client (scrapy-redis's ``REDIS_URL``).
        key_template: ``POLITE_FRONTIER_KEY`` (``%(spider)s`` matches any spider).
        limit: the most hosts listed per frontier.

    Returns:
        ``(frontier key, returned requests, [(host, held requests, seconds until due), …], leases per worker)``
        per frontier (one with held, returned or leased requests), sorted by key; each frontier's hosts soonest
        due first, its workers soonest deadline first.

    Raises:
        redis.RedisError: the server cannot be reached.
    """
    base = key_template % {"spider": "*"}
    keys: set[str] = set()
    for suffix in (":due", ":returned", ":workers"):
        keys.update(_text(k)[: -len(suffix)] for k in server.scan_iter(match=base + suffix, count=1000))
    found = []
    for key in sorted(keys):
        found.append((key, int(server.llen(f"{key}:returned")), read_hosts(server, key)[:limit],
                      read_workers(server, key)))
    return found


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
