"""The shared frontier: deferred and in-flight requests of a scrapy-redis crawl live in Redis
(docs/spec.md §5, "The shared frontier"; docs/guides/many-crawlers.md).

With scrapy-redis's scheduler (``scrapy_redis.scheduler.Scheduler``, wrapped by
:class:`~scrapy_polite.scheduler.PoliteScheduler`), every worker shares one queue in Redis. The
:class:`RedisFrontier` keeps beside it, under the key ``POLITE_FRONTIER_KEY`` (default
``%(spider)s:polite``, the convention of scrapy-redis's ``%(spider)s:requests``):

* ``<key>:held:<host>`` (a list per host, first in first out) and ``<key>:due`` (a sorted set: host →
  the moment it is due, the Redis server's clock, seconds): requests deferred until a moment (a throttle,
  a Crawl-delay beyond ``POLITE_MAX_WAIT``), taken by **any** worker once their host is due;
* ``<key>:lease:<worker>`` (a hash: lease id → the request), ``<key>:workers`` (a sorted set: worker → its
  lease deadline) and ``<key>:renewed`` (worker → the moment it last renewed): every request a worker
  takes — from scrapy-redis's queue, a held host or the returned list — is **leased**, not popped: it is
  moved into the worker's lease hash in the same atomic step (one Lua script). The response, a final
  error or a drop ends the lease; a deferral moves the request from the lease into a held list (one
  script). A live worker renews its deadline every second (every ``POLITE_LEASE_TIME / 3`` if shorter);
  any worker that finds a deadline passed (a dead worker) moves that worker's leased requests to
  ``<key>:returned`` (counted in ``polite/lease/expired``), which every worker takes from first;
* ``<key>:count``: how many requests the held lists hold;
* ``<key>:epoch``: a random id, written by the first renewal; a worker that finds it changed or gone says the
  frontier was emptied under the crawl (``polite/frontier/emptied``).

A worker's id is ``<hostname>-<pid>-<random>``: the scheduler logs it at start, and the leases in Redis (and
``scrapy polite hosts``) name it, so a lease can be tied to its process. What is held and leased is read for
the logs and reports by :mod:`scrapy_polite.frontier.report`.

Requests are serialised by scrapy-redis's own serializer (``request.to_dict``: callbacks, errbacks,
priority and meta, ``polite_throttle_retries`` included) and a request taken back never passes the
dupefilter again. A deferred request is written back **as the scheduler handed it out** (the record this
worker took, with its throttle-retry count): the headers, cookies and meta this worker's downloader
middlewares added (its ``User-Agent``, its cookie jar's ``Cookie``, ``Authorization``, ``download_timeout``,
…) stay with this worker's copy of the request and never reach another worker. The guarantee is **at
least once**: a page is fetched twice only when its worker died (or stalled longer than
``POLITE_LEASE_TIME``) after sending it and before its response ended the lease.

Calls that take a request run where scrapy-redis's own ``next_request`` runs (the scheduler's synchronous
interface, one round trip); deferrals, lease ends and renewals run on a thread.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.utils.request import request_from_dict
from twisted.internet import threads
from twisted.internet.defer import Deferred, DeferredList

from ..crawl.reactor import call_later
from ..stores.redis.client import transient
from ..vocabulary import LEASE_META, THROTTLE_RETRIES_META
from .report import LEASERS_LUA, NOW_LUA, FrontierState, describe_leases, leasers, read_hosts

if TYPE_CHECKING:
    from scrapy import Request, Spider

logger = logging.getLogger(__name__)

__all__ = ["FrontierState", "RedisFrontier", "LEASE_META", "is_shared_scheduler", "queue_mode", "worker_id"]

# Each script reads the server's clock: every due time and deadline is the Redis server's.
_NOW = NOW_LUA

#: Take one request, leased: KEYS = due, count, returned, lease hash, workers, scrapy-redis queue, renewed;
#: ARGV = worker, lease seconds, lease id, held key prefix, queue mode (fifo/lifo/priority/none), then the
#: hosts to skip (blocked in this worker). Returns {source, host, data} or nil.
_TAKE = _NOW + """
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZADD', KEYS[7], now, ARGV[1])
local data = redis.call('LPOP', KEYS[3])
local source, host = 'returned', ''
if not data then
  local skip = {}
  for i = 6, #ARGV do skip[ARGV[i]] = true end
  local hosts = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, #ARGV - 4)
  for _, h in ipairs(hosts) do
    if not skip[h] then
      data = redis.call('LPOP', ARGV[4] .. h)
      if data then
        redis.call('DECR', KEYS[2])
        if redis.call('LLEN', ARGV[4] .. h) == 0 then redis.call('ZREM', KEYS[1], h) end
        source, host = 'held', h
        break
      end
      redis.call('ZREM', KEYS[1], h)
    end
  end
end
if not data then
  source = 'queue'
  local mode = ARGV[5]
  if mode == 'fifo' then data = redis.call('RPOP', KEYS[6])
  elseif mode == 'lifo' then data = redis.call('LPOP', KEYS[6])
  elseif mode == 'priority' then
    local first = redis.call('ZRANGE', KEYS[6], 0, 0)
    if first[1] then data = first[1]; redis.call('ZREMRANGEBYRANK', KEYS[6], 0, 0) end
  end
end
if not data then return nil end
redis.call('HSET', KEYS[4], ARGV[3], data)
return {source, host, data}
"""

#: Lease a request taken by scrapy-redis's own pop (a queue class of its own): KEYS = lease hash, workers,
#: renewed; ARGV = worker, lease seconds, lease id, data.
_LEASE = _NOW + """
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZADD', KEYS[3], now, ARGV[1])
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
return 1
"""

#: Defer a leased request: KEYS = lease hash, due, count, the host's held list; ARGV = lease id, host,
#: delay (s), data. The host's due moment only moves later (as in this process's scheduler).
_HOLD = _NOW + """
redis.call('RPUSH', KEYS[4], ARGV[4])
redis.call('INCR', KEYS[3])
local due = now + tonumber(ARGV[3])
local current = redis.call('ZSCORE', KEYS[2], ARGV[2])
if (not current) or due > tonumber(current) then redis.call('ZADD', KEYS[2], due, ARGV[2]) end
if ARGV[1] ~= '' then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 1
"""

#: Renew this worker's deadline, return the leases of dead workers, report: KEYS = workers, returned, due,
#: count, renewed, epoch; ARGV = worker to renew ('': none), lease seconds, lease key prefix, this worker (its
#: own leases are not listed), a new epoch (set when the frontier has none). Returns {expired, returned, held,
#: first due host, its delay from now (s, as a string), now (s, as a string), the frontier's epoch, then four
#: fields per other worker that leases requests (:data:`~scrapy_polite.frontier.report.LEASERS_LUA`)}.
_RENEW = _NOW + LEASERS_LUA + """
local epoch = redis.call('GET', KEYS[6])
if not epoch then epoch = ARGV[5]; redis.call('SET', KEYS[6], epoch) end
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('ZADD', KEYS[5], now, ARGV[1])
end
local expired = 0
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  for _, v in ipairs(redis.call('HVALS', ARGV[3] .. w)) do
    redis.call('RPUSH', KEYS[2], v)
    expired = expired + 1
  end
  redis.call('DEL', ARGV[3] .. w)
  redis.call('ZREM', KEYS[1], w)
  redis.call('ZREM', KEYS[5], w)
end
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
local host, delay = '', ''
if first[1] then host = first[1]; delay = tostring(tonumber(first[2]) - now) end
local out = {expired, redis.call('LLEN', KEYS[2]), tonumber(redis.call('GET', KEYS[4]) or '0'), host, delay,
             tostring(now), epoch}
for _, v in ipairs(leasers(KEYS[1], KEYS[5], ARGV[3], ARGV[4])) do out[#out + 1] = v end
return out
"""

#: Give back every request this worker leases (a stop): KEYS = lease hash, returned, workers, renewed;
#: ARGV = worker.
_RELEASE = """
local n = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do redis.call('RPUSH', KEYS[2], v); n = n + 1 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
return n
"""


def worker_id() -> str:
    """A new worker's id: ``<hostname>-<pid>-<8 random hex digits>`` (names the process that holds a lease)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def is_shared_scheduler(scheduler: Any) -> bool:
    """``scheduler`` is scrapy-redis's (or a subclass): its queue is shared by every worker in Redis."""
    return any(cls.__module__.split(".")[0] == "scrapy_redis" and cls.__name__ == "Scheduler"
               for cls in type(scheduler).__mro__)


def queue_mode(queue: Any) -> str:
    """How :data:`_TAKE` pops scrapy-redis's queue atomically with the lease: ``fifo``, ``lifo`` or
    ``priority`` for its three queue classes (and subclasses that keep their ``pop``); ``none`` for any
    other queue (its own ``pop`` runs, then the request is leased: a kill between the two loses it)."""
    for cls in type(queue).__mro__:
        if cls.__module__ == "scrapy_redis.queue" and cls.__dict__.get("pop") is type(queue).pop:
            return {"FifoQueue": "fifo", "LifoQueue": "lifo", "PriorityQueue": "priority"}.get(cls.__name__, "none")
    return "none"


class RedisFrontier:
    """Held and in-flight requests of one spider in scrapy-redis's Redis (see the module docstring).

    Args:
        server: scrapy-redis's client (``Scheduler.server``, a ``redis.Redis``).
        queue: scrapy-redis's queue (``Scheduler.queue``: its ``key``, ``serializer``).
        spider: the spider (callbacks are serialised by name).
        key: ``POLITE_FRONTIER_KEY`` with ``%(spider)s`` filled in.
        lease_time: ``POLITE_LEASE_TIME``, seconds a lease lasts without renewal.
        inc: ``inc(stat_key, count)``, adds to ``polite/<stat_key>``.
        in_thread: ``in_thread(fn, *args, **kwargs) -> Deferred`` runs a blocking call off the reactor
            (default Twisted's ``deferToThread``; tests inject a synchronous one).
    """

    def __init__(self, server: Any, queue: Any, spider: Spider, key: str, lease_time: float,
                 inc: Callable[[str, float], None],
                 in_thread: Callable[..., Deferred[Any]] = threads.deferToThread) -> None:
        self._in_thread = in_thread
        self.server = server
        self.queue = queue
        self.spider = spider
        self.key = key
        self.lease_time = lease_time
        self.worker = worker_id()
        self.mode = queue_mode(queue)
        self._inc = inc
        self._lease_key = f"{key}:lease:{self.worker}"
        self._held_prefix = f"{key}:held:"
        self._due_key, self._count_key = f"{key}:due", f"{key}:count"
        self._returned_key, self._workers_key = f"{key}:returned", f"{key}:workers"
        self._renewed_key = f"{key}:renewed"
        #: A random id the first worker writes (``<key>:epoch``): one that changes or goes says the frontier was
        #: emptied under the crawl (a Redis restarted without persistence, a flush).
        self._epoch_key = f"{key}:epoch"
        self._epoch: str | None = None
        self._take = server.register_script(_TAKE)
        self._lease = server.register_script(_LEASE)
        self._hold = server.register_script(_HOLD)
        self._renew = server.register_script(_RENEW)
        self._release = server.register_script(_RELEASE)
        self.leased: dict[str, str | None] = {}  # lease id → host (None: not yet known)
        #: lease id → the record as taken (the request as the scheduler hands it out: docs/spec.md §5, "Held")
        self._records: dict[str, bytes] = {}
        self._ending: set[str] = set()
        self._flush_call: Any = None
        self._pending: set[Deferred[Any]] = set()
        self.state = FrontierState()
        #: ``outage(doing, exc)``: told of a write that failed because Redis cannot be reached (the worker logs it
        #: once per outage: :meth:`~scrapy_polite.frontier.worker.SharedWorker.unreachable`); None: each an ERROR.
        self.outage: Callable[[str, BaseException], None] | None = None

    # -- taking -----------------------------------------------------------------------------------------

    def take(self, skip: set[str], *, queue: bool = True) -> tuple[Request, str | None] | None:
        """Take one request, leased to this worker: a returned one first, then one of a due held host not in
        ``skip``, then (``queue``) the head of scrapy-redis's queue. Returns ``(request, host)`` (host: of
        a held request, else None), or None. Blocking, one round trip (as scrapy-redis's own pop).

        Raises:
            redis.RedisError: Redis cannot be reached (the engine logs it, as for scrapy-redis's pop).
        """
        lease_id = uuid.uuid4().hex
        mode = self.mode if queue else "off"
        found = self._take(keys=[self._due_key, self._count_key, self._returned_key, self._lease_key,
                                 self._workers_key, self.queue.key, self._renewed_key],
                           args=[self.worker, self.lease_time, lease_id, self._held_prefix, mode, *sorted(skip)])
        if found is None:
            return None
        source, raw_host, data = (_text(found[0]), _text(found[1]), found[2])
        request = self._decode(lease_id, data)
        if request is None:
            return self.take(skip, queue=queue)
        host = raw_host or None
        self.leased[lease_id] = host
        self._records[lease_id] = data
        self._inc(f"frontier/taken/{source}", 1)
        return request, host

    def lease(self, request: Request) -> None:
        """Lease a request scrapy-redis's own ``pop`` returned (a queue class :func:`queue_mode` does not
        know): one more round trip."""
        lease_id = uuid.uuid4().hex
        data = self._encode(request)
        self._lease(keys=[self._lease_key, self._workers_key, self._renewed_key],
                    args=[self.worker, self.lease_time, lease_id, data])
        request.meta[LEASE_META] = lease_id
        self.leased[lease_id] = None
        self._records[lease_id] = data
        self._inc("frontier/taken/queue", 1)

    def _decode(self, lease_id: str, data: bytes) -> Request | None:
        try:
            request = request_from_dict(self.queue.serializer.loads(data), spider=self.spider)
        except Exception as exc:  # a record of another spider version: counted, logged, its lease ended
            logger.error("scrapy-polite: a request in the shared frontier %s cannot be read back: %s", self.key, exc)
            self._inc("frontier/unreadable", 1)
            self.server.hdel(self._lease_key, lease_id)
            return None
        request.meta[LEASE_META] = lease_id
        return request

    def _encode(self, request: Request) -> bytes:
        data: bytes = self.queue.serializer.dumps(request.to_dict(spider=self.spider))
        return data

    def _as_handed_out(self, lease_id: str | None, request: Request) -> bytes:
        """The record to write back for ``request``: the one this worker took (the request as the scheduler
        handed it out, before this worker's downloader middlewares added its ``User-Agent``, its cookie jar's
        ``Cookie``, ``Authorization``, ``download_timeout``, …), with the request's throttle-retry count,
        the one thing about it that travels (docs/spec.md §5, "Held"). ``request`` itself is not changed.
        Without a record (not taken here) the request is written as it is.

        Raises:
            ValueError: ``request`` cannot be serialised (a callback that is not a spider method).
        """
        taken = self._records.get(lease_id) if lease_id is not None else None
        if taken is None:
            return self._encode(request)
        record = self.queue.serializer.loads(taken)
        meta = dict(record.get("meta") or {})
        meta.pop(LEASE_META, None)
        if THROTTLE_RETRIES_META in request.meta:
            meta[THROTTLE_RETRIES_META] = request.meta[THROTTLE_RETRIES_META]
        record["meta"] = meta
        data: bytes = self.queue.serializer.dumps(record)
        return data

    def owns(self, request: Request) -> bool:
        """``request`` is leased to this worker (its lease may be ending this reactor turn: a throttle retry
        is held again right after its response ended it)."""
        lease_id = request.meta.get(LEASE_META)
        return lease_id in self.leased or lease_id in self._ending

    # -- holding and ending ------------------------------------------------------------------------------

    def hold(self, request: Request, host: str, delay: float) -> bool:
        """Move ``request`` from its lease to its host's held list in Redis, due in ``delay`` seconds (the
        host's due moment only moves later). False when it cannot be serialised (the caller holds it in
        this process; its lease stays)."""
        lease_id = request.meta.get(LEASE_META)
        try:
            data = self._as_handed_out(lease_id if isinstance(lease_id, str) else None, request)
        except ValueError as exc:  # a callback that is not a spider method
            logger.warning("scrapy-polite: deferred %s cannot be written to the shared frontier (%s); it is "
                           "held in this process, leased", request, exc)
            self._inc("frontier/not_serialisable", 1)
            return False
        if isinstance(lease_id, str):
            self._ending.discard(lease_id)
            self.leased.pop(lease_id, None)
            self._records.pop(lease_id, None)
        self._background(self._hold, keys=[self._lease_key, self._due_key, self._count_key,
                                           self._held_prefix + host],
                         args=[lease_id if isinstance(lease_id, str) else "", host, max(0.0, delay), data])
        self._inc("frontier/held", 1)
        return True

    def end(self, request: Request) -> None:
        """``request`` left (response, final error, drop): its lease ends on the next reactor turn, unless it
        is held again first (a throttle retry: :meth:`hold` moves it instead)."""
        lease_id = request.meta.get(LEASE_META)
        if not isinstance(lease_id, str) or lease_id not in self.leased:
            return
        self.leased.pop(lease_id, None)
        self._ending.add(lease_id)
        if self._flush_call is None:
            self._flush_call = call_later(0, self._flush)

    def _flush(self) -> None:
        self._flush_call = None
        ids, self._ending = sorted(self._ending), set()
        for lease_id in ids:
            self._records.pop(lease_id, None)
        if ids:
            self._background(self.server.hdel, self._lease_key, *ids)

    # -- renewal, reports, close -------------------------------------------------------------------------

    def renew(self, *, alive: bool = True) -> FrontierState:
        """Renew this worker's deadline (unless not ``alive``), return dead workers' leases, and read what
        waits (blocking: run it on a thread, or at an idle check). Counts ``polite/lease/expired``."""
        row = self._renew(keys=[self._workers_key, self._returned_key, self._due_key, self._count_key,
                                self._renewed_key, self._epoch_key],
                          args=[self.worker if alive else "", self.lease_time, f"{self.key}:lease:", self.worker,
                                uuid.uuid4().hex])
        expired, returned, held = int(row[0]), int(row[1]), int(row[2])
        delay, now, epoch = _text(row[4]), float(_text(row[5])), _text(row[6])
        state = FrontierState(returned=returned, held=held, first_host=_text(row[3]),
                              first_due=float(delay) if delay else None, elsewhere=leasers(list(row[7:]), now),
                              expired=expired, now=now)
        if expired:
            logger.warning("scrapy-polite: %d requests leased by a worker that stopped renewing its lease were "
                           "returned to the shared frontier %s", expired, self.key)
            self._inc("lease/expired", expired)
        if self._epoch is not None and epoch != self._epoch:
            logger.warning("scrapy-polite: the shared frontier %s was emptied under the crawl (Redis restarted without "
                           "persistence, or its keys were deleted): the requests deferred and leased there, "
                           "scrapy-redis's queue and its dupefilter are gone", self.key)
            self._inc("frontier/emptied", 1)
        self._epoch = epoch
        self.state = state
        return state

    def renew_soon(self) -> Deferred[FrontierState]:
        """:meth:`renew` on a thread."""
        d: Deferred[FrontierState] = self._in_thread(self.renew)
        return d

    def hosts(self) -> list[tuple[str, int, float]]:
        """``(host, requests held in Redis, seconds until due)`` for the first 1,000 hosts, soonest first
        (blocking)."""
        return read_hosts(self.server, self.key)

    def describe(self) -> str:
        """What waits in the shared frontier, per host, and what other workers lease, per worker (renewing or
        not, and when the leases of one that stopped renewing come back), for the log (blocking)."""
        state = self.renew(alive=False)
        parts = [f"{host}: {count} requests, due in {max(0.0, due):.0f} s" for host, count, due in self.hosts()[:20]]
        if state.returned:
            parts.insert(0, f"{state.returned} returned requests, due now")
        leased = describe_leases(state.elsewhere, self.lease_time)
        if leased:
            parts.append(leased)
        return f"Waiting in the shared frontier {self.key}: " + ("; ".join(parts) if parts else "nothing")

    def _background(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        d = self._in_thread(fn, *args, **kwargs)
        self._pending.add(d)

        def done(result: Any) -> Any:
            self._pending.discard(d)
            return result

        def failed(failure: Any) -> None:
            if self.outage is not None and transient(failure.value):
                self.outage("writing to it", failure.value)  # a Redis outage: once per outage, not per write
            else:
                logger.error("scrapy-polite: a write to the shared frontier %s failed: %s", self.key, failure.value)

        d.addBoth(done)
        d.addErrback(failed)

    def settle(self) -> Deferred[Any]:
        """A Deferred fired when every write started so far is done (pending lease ends are started now)."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush()
        return DeferredList(list(self._pending), consumeErrors=True)

    def release(self) -> int:
        """Give back every request this worker still leases (to be taken first by any worker) and leave the
        worker set (blocking; the stop). Returns how many."""
        count = int(self._release(keys=[self._lease_key, self._returned_key, self._workers_key, self._renewed_key],
                                  args=[self.worker]))
        self.leased.clear()
        self._records.clear()
        return count

    def clear(self) -> None:
        """Delete the frontier's keys (``SCHEDULER_PERSIST = False``: scrapy-redis flushes its queue too)."""
        keys = [self._due_key, self._count_key, self._returned_key, self._workers_key, self._renewed_key,
                self._epoch_key]
        keys += [f"{self._held_prefix}{host}" for host, _, _ in self.hosts()]
        self.server.delete(*keys)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
