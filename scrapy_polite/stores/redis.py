"""``redis://host:port/db`` (also ``rediss://`` and ``unix://``), or a Redis Cluster
(``redis+cluster://host:port[,host:port…]``, ``rediss+cluster://…``): one pace table shared by every process
on every machine that points ``POLITE_STORE`` at the same Redis (docs/spec.md §6).

Needs the ``redis`` client (``pip install scrapy-polite[redis]``; it uses ``hiredis`` when installed).

**One policy, optimistic writes.** The pacing rules stay in Python (:mod:`scrapy_polite.policy`); Redis
only stores rows and checks versions. Every row is a hash carrying a version. A read is one small script
(``TIME`` + ``HMGET``…, atomic, so several rows are one snapshot, and routed to the node of the table's slot
on a cluster); a write is one small generic Lua script that writes the new rows only if **every row read**
still has the version read (absent = 0), else returns the current rows and the clock, on which the update
function is applied again. So an uncontended booking is two round trips, and a contended one costs one
more per lost race. ``WATCH``/``MULTI`` would need a connection held per transaction and a third round trip
(``WATCH``, read, ``MULTI…EXEC``), and a lost race starts over with a new read; the script returns what the
retry needs.

**Exactly once.** Every update has a random id; the write that applies it also sets the key
``<prefix>{pace}#done:<id>`` (to the number of the attempt that was applied), with a TTL of
``POLITE_STORE_TIMEOUT`` + :data:`DONE_MARGIN` seconds, in the same script. Each write first looks for that key
and applies nothing when it is there: so the resend of a write whose reply was lost (by this module, by a
cluster client, or by the crawl's retry after :class:`~scrapy_polite.stores.base.StoreUnavailable`, which
uses the same update function and so the same id) returns the first result instead of applying the update
again — whatever other writers did to the rows meanwhile, since the record is not in the rows. A retry that
writes nothing still claims the id, so a write of it still in flight can no longer be applied.

**Contention.** An update is a sequence of steps (:meth:`RedisStore.update_steps`): each is one read and/or one
write round trip and never sleeps; after a lost race it returns :class:`~scrapy_polite.stores.base.Again`
with the moment to wait (none after the first loss: the next step writes on the rows the lost race returned;
then a random moment up to 0.2 ms, doubling up to 20 ms, after which the step reads the rows again).
:class:`~scrapy_polite.stores.AsyncStore` waits on the reactor's clock, so a hot row never holds a store
thread while it waits: it delays the bookings of its own host and addresses only. After
:data:`MAX_ATTEMPTS` lost races or :data:`MAX_BUSY_SECONDS` of them the update raises
:class:`~scrapy_polite.stores.base.StoreBusy`. The blocking :meth:`RedisStore.update` (``scrapy polite``)
runs the same steps and sleeps between them.

**The server's clock.** ``TIME`` is the ``now`` of every booking and record (:attr:`RedisStore.server_clock`),
so processes whose clocks disagree still keep the spacing. On a cluster it is the clock of the node that
holds the table.

**Keys.** ``<prefix>{pace}:<key>`` for the rows (``POLITE_STORE_PREFIX``, default ``polite:``),
``<prefix>{pace}`` for the version counter, ``<prefix>{pace}#events`` for the event log and
``<prefix>{pace}#done:<id>`` for the idempotence records: every key of one table has the hash tag ``{pace}``
(or the prefix's own ``{tag}`` when it has one), so a table lives in one hash slot of a Redis Cluster and
every script's keys are in one slot. A row expires ``POLITE_STORE_EXPIRE`` seconds after the later of its
write and its ``next_allowed``.

**The sharded layout** (the URL option ``layout=sharded``; ``layout=table``, the above, is the default): one hash
tag per row, ``<prefix>{<key>}``, its records ``<prefix>{<key>}#done:<id>`` in its slot, so the rows spread over
every slot of a cluster. An update whose rows span slots (a booking) locks and reads each slot's rows, decides,
and writes each slot's rows, one pipelined round trip per phase (:class:`_ShardedUpdate`; docs/scale.md).

**Outages.** A lost connection raises :class:`~scrapy_polite.stores.base.StoreUnavailable` (after one
immediate reconnect attempt); the crawl waits and retries (:class:`~scrapy_polite.outage.StoreGuard`).
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis import exceptions as redis_errors
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.retry import Retry

from ..policy import HostState
from .base import (
    Again,
    CallThreads,
    Event,
    ExpiringRows,
    KeyPrefixed,
    ManyUpdateFn,
    ServerClock,
    Snapshot,
    SteppedStore,
    StoreBusy,
    StoreCorrupt,
    StoreError,
    StoreOptions,
    StoreUnavailable,
    UpdateFn,
    UpdateSteps,
)

__all__ = ["CLUSTER_SCHEMES", "DONE_MARGIN", "LAYOUTS", "LOCK_LEASE", "MAX_ATTEMPTS", "MAX_BUSY_SECONDS", "RedisStore",
           "redact_uri", "split_layout"]

T = TypeVar("T")

#: The URL schemes of a Redis Cluster, and the scheme of one node's URL each stands for.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

#: The key layouts of a table (the URL option ``layout=``, docs/scale.md): ``table`` (the default: one hash
#: tag, ``{pace}``, for the whole table, so one slot of a cluster) and ``sharded`` (one hash tag per row, so the
#: rows spread over every slot, and bookings over every node).
LAYOUTS = ("table", "sharded")

#: Seconds an update whose rows span slots (``layout=sharded``) holds their locks at most: it locks them, decides,
#: and writes them within two round trips per slot; a process that dies in between blocks those rows this long.
LOCK_LEASE = 5.0

#: The hash field of each :class:`HostState` field (short: every booking reads a row). A field added to
#: HostState needs a name here (checked at import); a row written before a field existed reads its default.
_STATE_FIELDS: dict[str, str] = {
    "next_allowed": "n", "consec": "c", "crawl_delay": "d", "ok_seen": "o", "throttled_at": "t", "updated": "u",
    "ratelimit_interval": "q", "ratelimit_until": "r",
    "quota_left": "ql", "quota_reset": "qr", "quota_limit": "qq", "quota_window": "qw", "quota_serial": "qs",
    "booked": "b",
    "latency": "l", "strain": "s",
    "run_retry_after": "m",
    "held_until": "hu", "held_by": "hb",
}
_STATE_TYPES: dict[str, type] = {f.name: type(f.default) for f in dataclasses.fields(HostState)}
if set(_STATE_FIELDS) != set(_STATE_TYPES):  # pragma: no cover - a development error, caught by any test run
    raise RuntimeError(f"scrapy_polite.stores.redis: HostState fields {sorted(_STATE_TYPES)} and their hash "
                       f"fields {sorted(_STATE_FIELDS)} differ: name the new field in _STATE_FIELDS")

#: The fields of a row's hash: the version, then the :class:`HostState` fields. (Rows written by earlier
#: versions also hold a field ``w``, their write token, which is no longer read.)
_FIELDS = ("v", *_STATE_FIELDS.values())

#: Lua shared by the scripts below (each fragment is pasted into a script's text, so one script still runs
#: atomically). The update's idempotence record is the last of KEYS in every script that writes: when it is
#: there, the update was applied, nothing is done and its value (the attempt's number) is returned.
_LUA_RETURN_IF_DONE = """
local done = redis.call('GET', KEYS[#KEYS])
if done then
  return done
end
"""

#: A lost race (``n`` rows in KEYS, the clock ``t``, the state fields ``names``): returns the clock and every
#: row's version and fields, on which the caller decides again.
_LUA_RETURN_CURRENT_ROWS = """
local out = {t[1], t[2]}
for j = 1, n do
  out[#out + 1] = redis.call('HMGET', KEYS[j], 'v', unpack(names))
end
return out
"""

#: Writes the rows of ARGV from index ``i`` on, ``f`` + 2 values per row: its index in KEYS, its expiry (Unix
#: ms, "0": none) and its ``f`` field values (``names``), with the version ``row_version(index)`` (each script
#: defines it).
_LUA_WRITE_ROWS = """
while i <= #ARGV do
  local index = tonumber(ARGV[i])
  local key = KEYS[index]
  local pairs = {'v', row_version(index)}
  for k = 1, f do
    pairs[#pairs + 1] = names[k]
    pairs[#pairs + 1] = ARGV[i + 1 + k]
  end
  redis.call('HSET', key, unpack(pairs))
  if ARGV[i + 1] == '0' then
    redis.call('PERSIST', key)
  else
    redis.call('PEXPIREAT', key, ARGV[i + 1])
  end
  i = i + 2 + f
end
"""

#: ``release(key)``: drops the lock of a row (``sharded``); a lock-only row (no version: the row did not exist
#: when it was locked) is deleted.
_LUA_RELEASE = """
local function release(key)
  if redis.call('HEXISTS', key, 'v') == 1 then
    redis.call('HDEL', key, 'lk', 'lx')
  else
    redis.call('DEL', key)
  end
end
"""

#: Reads the clock and rows, atomically. KEYS[1..n]: the rows; KEYS[n+1]: the update's idempotence record when
#: ARGV[1] is "1" (its value is returned, or false), else any key of the table's slot (routing on a cluster).
#: ARGV[2..]: the hash fields. Returns {seconds, microseconds, record or false, fields of each row...}.
_READ = """
local n = #KEYS - 1
local t = redis.call('TIME')
local out = {t[1], t[2], false}
if ARGV[1] == '1' then
  out[3] = redis.call('GET', KEYS[n + 1])
end
local names = {}
for k = 2, #ARGV do names[k - 1] = ARGV[k] end
for i = 1, n do
  out[#out + 1] = redis.call('HMGET', KEYS[i], unpack(names))
end
return out
"""

#: Writes the rows of ARGV if the update's idempotence record is absent and every row of KEYS still has the
#: version read; with the rows, sets the record. KEYS[1..n]: the rows read; KEYS[n+1]: the table's version
#: counter; KEYS[n+2]: the record. ARGV[1]: this attempt's number (the record's value); ARGV[2]: the record's
#: TTL (ms); ARGV[3..n+2]: the versions read ("0": absent); ARGV[n+3]: the number f of state fields, then their
#: f hash field names; then f + 2 values per row to write: its index in KEYS, its expiry (Unix ms, "0":
#: none) and its f field values. Returns the record's value (a string) when it was there (nothing written),
#: the clock and the current rows when a version changed (nothing written), else the new version (a number).
#: Generic: no pacing rule here, and no field name either.
_WRITE_IF_UNCHANGED = _LUA_RETURN_IF_DONE + """
local n = #KEYS - 2
local f = tonumber(ARGV[n + 3])
local names = {}
for k = 1, f do names[k] = ARGV[n + 3 + k] end
for i = 1, n do
  local v = redis.call('HGET', KEYS[i], 'v')
  if (v or '0') ~= ARGV[i + 2] then
    local t = redis.call('TIME')
""" + _LUA_RETURN_CURRENT_ROWS + """
  end
end
local version = redis.call('INCR', KEYS[n + 1])
local function row_version(index)
  return version
end
local i = n + 4 + f
""" + _LUA_WRITE_ROWS + """
redis.call('SET', KEYS[n + 2], ARGV[1], 'PX', ARGV[2])
return version
"""

#: Deletes each row of KEYS whose version is still ARGV[i]; returns how many it deleted.
_DELETE_IF_UNCHANGED = """
local deleted = 0
for i = 1, #KEYS do
  if redis.call('HGET', KEYS[i], 'v') == ARGV[i] then
    deleted = deleted + redis.call('DEL', KEYS[i])
  end
end
return deleted
"""

#: The sharded layout (``?layout=sharded``): one hash tag per row, so a multi-row update may span slots.
#: Writes an update's rows in one slot, once. KEYS[1..n]: the rows of the slot; KEYS[n+1]: the update's
#: idempotence record in that slot. ARGV[1]: the attempt's number; ARGV[2]: the record's TTL (ms); ARGV[3]: the
#: update's token; ARGV[4]: "w" (optimistic) or "c" (the write of a locked update); ARGV[5..n+4]: the versions
#: read. Every row must still have the version read and no live lock of another update (a row locked by this
#: token since the read cannot have changed; the version check also covers a lock that was lost). ARGV[n+5]:
#: the number f of state fields, their names, then f + 2 values per row to write as in _WRITE_IF_UNCHANGED.
#: A row's new version is max(its version + 1, the server's clock in µs): it only grows, even across a delete.
#: Every row of KEYS loses its lock (a lock-only row is deleted). Returns the record's value when it was there,
#: the clock and the current rows when a version changed or a row is locked ("w"), 0 then ("c"), else 1.
_SHARD_WRITE = _LUA_RETURN_IF_DONE + _LUA_RELEASE + """
local n = #KEYS - 1
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local f = tonumber(ARGV[n + 5])
local names = {}
for k = 1, f do names[k] = ARGV[n + 5 + k] end
local versions = {}
for i = 1, n do
  local row = redis.call('HMGET', KEYS[i], 'v', 'lk', 'lx')
  versions[i] = tonumber(row[1] or '0')
  local foreign = row[2] and row[2] ~= ARGV[3] and tonumber(row[3] or '0') > now_ms
  if (row[1] or '0') ~= ARGV[i + 4] or foreign then
    if ARGV[4] == 'c' then
      return 0
    end
""" + _LUA_RETURN_CURRENT_ROWS + """
  end
end
local function row_version(index)
  return string.format('%d', math.max(versions[index] + 1, now_us))
end
local i = n + 6 + f
""" + _LUA_WRITE_ROWS + """
for j = 1, n do
  if redis.call('HGET', KEYS[j], 'lk') then
    release(KEYS[j])
  end
end
redis.call('SET', KEYS[n + 1], ARGV[1], 'PX', ARGV[2])
return 1
"""

#: Locks and reads an update's rows in one slot (the first phase of an update whose rows span slots).
#: KEYS[1..n]: the rows; KEYS[n+1]: the update's record in that slot. ARGV[1]: the token; ARGV[2]: the lease
#: (ms); ARGV[3..]: the hash fields to read ("v" first). Returns the record's value when it is there (nothing
#: locked); {0, seconds, µs} when a row holds a live lock of another update (nothing locked); else every row
#: is locked by this token until the lease ends (a lock-only row is created for an absent one, expiring with
#: its lease) and {1, seconds, µs, fields of each row...}.
_SHARD_LOCK = _LUA_RETURN_IF_DONE + """
local n = #KEYS - 1
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
for i = 1, n do
  local row = redis.call('HMGET', KEYS[i], 'lk', 'lx')
  if row[1] and row[1] ~= ARGV[1] and tonumber(row[2] or '0') > now_ms then
    return {0, t[1], t[2]}
  end
end
local names = {}
for k = 3, #ARGV do names[k - 2] = ARGV[k] end
local out = {1, t[1], t[2]}
for i = 1, n do
  local existed = redis.call('EXISTS', KEYS[i])
  redis.call('HSET', KEYS[i], 'lk', ARGV[1], 'lx', string.format('%d', now_ms + lease))
  if existed == 0 then
    redis.call('PEXPIRE', KEYS[i], 2 * lease)
  end
  out[#out + 1] = redis.call('HMGET', KEYS[i], unpack(names))
end
return out
"""

#: Releases this token's locks on the rows of KEYS (ARGV[1]: the token); a lock-only row is deleted.
_SHARD_UNLOCK = _LUA_RELEASE + """
for i = 1, #KEYS do
  if redis.call('HGET', KEYS[i], 'lk') == ARGV[1] then
    release(KEYS[i])
  end
end
return 1
"""

#: Lost races one update may meet before it gives up (each costs one round trip; the winner of every race
#: makes progress, so this is only reached under extreme contention on one row) …
MAX_ATTEMPTS = 10_000
#: … or seconds it may spend losing them (counted from its second lost race).
MAX_BUSY_SECONDS = 10.0
#: Seconds an idempotence record outlives ``POLITE_STORE_TIMEOUT``: the crawl retries an update only while
#: the outage has lasted less than that timeout, so the record is still there for every retry.
DONE_MARGIN = 120.0

#: Writes of unknown outcome remembered for their retry (oldest forgotten first).
_PENDING_LIMIT = 10_000

#: Error replies that mean "not now" rather than "never": the server is loading its data after a restart
#: (a ``BusyLoadingError``, a connection error), is a read-only replica or lost its master (a failover in
#: progress), its cluster is reconfiguring or unreachable, it cannot persist (``MISCONF``), or a script holds
#: it (``BUSY``). redis-py maps some replies to classes (and strips their code from the message), the others
#: by their code.
_TRANSIENT_ERRORS: tuple[type[Exception], ...] = (redis_errors.ReadOnlyError, redis_errors.MasterDownError,
                                                  redis_errors.TryAgainError, redis_errors.ClusterError,
                                                  redis_errors.RedisClusterException)
_TRANSIENT_REPLIES = ("MISCONF", "BUSY ")


@dataclass(frozen=True)
class _Row:
    version: bytes
    state: HostState | None


def _row(values: Sequence[Any]) -> _Row:
    version, *fields = values
    if version is None:
        return _Row(b"0", None)
    state: dict[str, Any] = {}
    for name, raw in zip(_STATE_FIELDS, fields):
        if raw is not None:  # None: a field the writer's version did not have yet (its default)
            kind = _STATE_TYPES[name]
            state[name] = raw == b"1" if kind is bool else kind(raw)
    return _Row(bytes(version), HostState(**state))


def _encode(state: HostState) -> list[Any]:
    """The state's field values in the order of :data:`_STATE_FIELDS` (floats by ``repr``: exact)."""
    out: list[Any] = []
    for name in _STATE_FIELDS:
        value = getattr(state, name)
        kind = _STATE_TYPES[name]
        out.append(int(bool(value)) if kind is bool else int(value) if kind is int else repr(float(value)))
    return out


def redact_uri(uri: str) -> str:
    """``uri`` with its password (in the authority or a ``password=`` query parameter) replaced by ``***``,
    for messages and logs."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    netloc = parts.netloc
    if parts.password is not None:
        user = parts.username or ""
        host = netloc.rpartition("@")[2]
        netloc = f"{user}:***@{host}"
    query = parts.query
    if "password=" in query:
        query = urlencode([(k, "***" if k == "password" else v) for k, v in parse_qsl(query, keep_blank_values=True)])
    if (netloc, query) == (parts.netloc, parts.query):
        return uri
    rebuilt = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return rebuilt if netloc else rebuilt.replace(":", "://", 1)  # unix:///path keeps its empty authority


def split_layout(uri: str) -> tuple[str, str]:
    """A Redis URL without its ``layout=`` option (which redis-py does not know), and the layout it names
    (:data:`LAYOUTS`; ``table`` when absent).

    Raises:
        ValueError: a layout that is not one of :data:`LAYOUTS`.
    """
    parts = urlsplit(uri)
    if "layout=" not in parts.query:
        return uri, "table"
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    layouts = [v for k, v in pairs if k == "layout"]
    layout = layouts[-1] if layouts else "table"
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    query = urlencode([(k, v) for k, v in pairs if k != "layout"])
    rebuilt = urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))
    return (rebuilt if parts.netloc else rebuilt.replace(":", "://", 1)), layout


def _cluster_nodes(uri: str) -> tuple[str, list[tuple[str, int]]]:
    """A ``redis+cluster://[user:password@]host:port[,host:port…][/0][?options]`` URL as the URL of its first
    node (``redis://…`` or ``rediss://…``, with the credentials and options) and the other nodes.

    Raises:
        ValueError: no node, a port that is not a number, or a database other than 0.
    """
    parts = urlsplit(uri)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for item in hosts.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        if not host:
            raise ValueError(f"{item!r} names no host")
        if port and not port.isdigit():
            raise ValueError(f"port {port!r} is not a number")
        nodes.append((host, int(port) if port else 6379))
    if not nodes:
        raise ValueError("it names no node")
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError("a Redis Cluster has only database 0")
    first_host, first_port = nodes[0]
    first = f"[{first_host}]:{first_port}" if ":" in first_host else f"{first_host}:{first_port}"
    netloc = f"{userinfo}{at}{first}"
    return urlunsplit((CLUSTER_SCHEMES[parts.scheme.lower()], netloc, "", parts.query, "")), nodes[1:]


class _Script:
    """A Lua script run by ``EVALSHA``, or by ``EVAL`` (its text) when the node does not know it: a node
    restarted, or a cluster client whose view of the nodes is partial after an outage (redis-py 5 then loads
    the script on the nodes it knows, not always on the slot's)."""

    def __init__(self, client: Any, text: str) -> None:
        self._client = client
        self.script = client.register_script(text)
        self.text = text

    def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return self.script(keys=keys, args=args)
        except redis_errors.NoScriptError:
            return self._client.eval(self.text, len(keys), *keys, *args)


def _node(host: str, port: int) -> ClusterNode:
    return ClusterNode(host, port)  # type: ignore[no-untyped-call]


@dataclass
class _Pending:
    """What is known of an update whose write may have been applied: its id and each attempt's result."""

    token: str
    results: dict[int, Any] = field(default_factory=dict)
    #: ``sharded``, rows in several slots: attempt → each slot's write (a retry finishes a partial write).
    writes: dict[int, list[list[Any]]] = field(default_factory=dict)


def _event(fields: dict[bytes, bytes], stream: str, raw_id: Any) -> Event:
    """One entry of the event stream: a JSON list of :class:`Event`'s fields in order; an entry written before
    a field was added is shorter (the missing fields are None).

    Raises:
        StoreCorrupt: the entry is not such a list.
    """
    try:
        values = json.loads(fields[b"e"])
        if not isinstance(values, list) or not 3 <= len(values) <= len(Event._fields):
            raise ValueError(f"expected a list of 3 to {len(Event._fields)} fields")
        return Event(*values)
    except (KeyError, ValueError, TypeError) as exc:
        raise StoreCorrupt(f"the event log {stream} holds an entry that cannot be read (id {_text(raw_id)}: "
                           f"{exc}). Fix: delete the entry (XDEL), or the stream to start a fresh log") from None


class RedisStore(ServerClock, ExpiringRows, CallThreads, KeyPrefixed, SteppedStore):
    """The pace table in a Redis server or a Redis Cluster, shared by every process that uses the same URI
    and prefix (docs/spec.md §6).

    Args:
        uri: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS) or
            ``unix:///path/to/socket?db=N`` (redis-py's URL forms) for one server;
            ``redis+cluster://[[user]:password@]host:port[,host:port…][?options]`` or ``rediss+cluster://…``
            for a Redis Cluster (the nodes listed are where the client first learns the cluster's layout;
            one reachable is enough; database 0 only). Any of them takes the option ``layout=table`` (the
            default: one hash tag for the table) or ``layout=sharded`` (one per row; docs/scale.md).
        options: ``prefix`` (``POLITE_STORE_PREFIX``), ``timeout`` (``POLITE_STORE_TIMEOUT``, seconds; one
            call waits at most ``min(timeout, 5)`` seconds for the server; an idempotence record is kept
            ``timeout`` + :data:`DONE_MARGIN` seconds) and ``expire`` (``POLITE_STORE_EXPIRE``, seconds).
        client: a ready ``redis.Redis`` or ``redis.cluster.RedisCluster`` (tests); built from ``uri`` when None.

    Raises:
        StoreError: the server cannot be reached, refuses the credentials, or is not a usable Redis (at
            construction: the crawl must not start) — also a cluster node named by ``redis://`` or a single
            server named by ``redis+cluster://``; an unknown ``layout``, or ``layout=sharded`` with a prefix that
            has a hash tag or holds a ``layout=table`` table. The message names the URI (password hidden) and
            the fix.
    """

    #: The table's clock is the server's (``TIME``): the pacer converts its due times to this process's clock.
    server_clock: Literal[True] = True
    #: Rows expire on the server (key TTLs): no sweep at start is needed.
    expires_rows: Literal[True] = True
    #: Threads of :class:`~scrapy_polite.stores.AsyncStore` for this backend: each call waits on the network,
    #: so two overlap their round trips; more only contend for the GIL (bench/distributed.py, 2 cores).
    threads = 2

    def __init__(self, uri: str, options: StoreOptions | None = None, *,
                 client: redis.Redis | RedisCluster | None = None) -> None:
        options = options or StoreOptions()
        self.uri = redact_uri(uri)
        try:
            uri, layout = split_layout(uri)
        except ValueError as exc:
            raise StoreError(f"POLITE_STORE {self.uri!r}: {exc}. Fix: layout=table (the default, one slot) or "
                             "layout=sharded (one slot per row: docs/scale.md).") from None
        #: The key layout (:data:`LAYOUTS`): ``table`` (one hash tag) or ``sharded`` (one per row).
        self.layout = layout
        self.sharded = layout == "sharded"
        if self.sharded and "{" in options.prefix:
            raise StoreError(f"POLITE_STORE {self.uri!r} with layout=sharded and POLITE_STORE_PREFIX "
                             f"{options.prefix!r}: a prefix with a hash tag puts every row in one slot again. "
                             "Fix: a prefix without braces (e.g. 'crawl-a:'), or layout=table.")
        self.prefix = options.prefix
        self.expire_after = options.expire
        #: Seconds an update's idempotence record is kept (``POLITE_STORE_TIMEOUT`` + :data:`DONE_MARGIN`).
        self.done_ttl = max(0.0, options.timeout) + DONE_MARGIN
        self._base = f"{options.prefix}{{pace}}"
        self._rows = f"{self._base}:"
        self._counter = self._base
        self._done = f"{self._base}#done:"
        #: The event log: one stream, ``<prefix>{pace}#events`` (``#``: never a row's key, which has ``:``).
        #: Sharded: ``<prefix>{events}#events``, a slot of its own (appends are batched off the hot path).
        self._events = f"{options.prefix}{{events}}#events" if self.sharded else f"{self._base}#events"
        self.events_max = max(0, int(options.events_max))
        scheme = uri.partition(":")[0].lower()
        #: The URI names a Redis Cluster (``redis+cluster://``): the cluster client, which follows the slots.
        self.cluster = isinstance(client, RedisCluster) if client is not None else scheme in CLUSTER_SCHEMES
        wait = max(0.1, min(5.0, options.timeout))
        self._client: Any
        try:
            if client is not None:
                self._client = client
            elif self.cluster:
                first, others = _cluster_nodes(uri)
                # The cluster client resends a command after a lost connection (to the slot's new owner after a
                # failover; once without waiting, redis-py >= 6; its default count in 5): safe, since every write
                # carries its idempotence record.
                self._client = RedisCluster(
                    url=first, startup_nodes=[_node(h, p) for h, p in others], retry=Retry(NoBackoff(), 1),
                    socket_timeout=wait, socket_connect_timeout=wait, client_name="scrapy-polite")
            else:
                self._client = redis.Redis.from_url(
                    uri, socket_timeout=wait, socket_connect_timeout=wait, retry=Retry(NoBackoff(), 0),
                    health_check_interval=30, client_name="scrapy-polite")
        except (ValueError, redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
            if self.cluster and not isinstance(exc, ValueError) and "db" not in str(exc):
                raise self._start_error(exc) from None
            raise StoreError(f"POLITE_STORE {self.uri!r} is not a Redis URL scrapy-polite can use: {exc}. Fix: use "
                             "redis://host:port/db, rediss://host:port/db or unix:///path/to/redis.sock?db=0 for one "
                             "server, redis+cluster://host:port[,host:port...] for a Redis Cluster.") from exc
        self._read_script = _Script(self._client, _READ)
        self._write = _Script(self._client, _WRITE_IF_UNCHANGED)
        self._delete_if = _Script(self._client, _DELETE_IF_UNCHANGED)
        self._shard_write = _Script(self._client, _SHARD_WRITE)
        self._shard_lock = _Script(self._client, _SHARD_LOCK)
        self._shard_unlock = _Script(self._client, _SHARD_UNLOCK)
        self._lock = threading.Lock()
        #: (update function, keys) → what is known of its write whose connection was lost.
        self._ambiguous: OrderedDict[tuple[Any, tuple[str, ...]], _Pending] = OrderedDict()
        try:
            self._client.ping()
            if not self.cluster:
                self._refuse_a_cluster_node()
            if self.sharded and self._client.exists(self._counter):
                self._client.close()
                raise StoreError(f"scrapy-polite cannot use its pace table {self.uri} with layout=sharded: the prefix "
                                 f"{self.prefix!r} holds a table of layout=table. Fix: another POLITE_STORE_PREFIX for "
                                 "the sharded table (its rows start empty), or drop layout=sharded.")
        except (redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
            self._client.close()
            raise self._start_error(exc) from None  # the message says it all: one error, the URL, the fix

    def _start_error(self, exc: BaseException) -> StoreError:
        if self.cluster and "cluster mode is not enabled" in str(exc).lower():
            return StoreError(f"scrapy-polite cannot use its pace table {self.uri}: the server is not part of a "
                              "Redis Cluster. Fix: use redis://host:port/db for a single server.")
        return self._error("reach", exc)

    def _refuse_a_cluster_node(self) -> None:
        """A ``redis://`` URL naming one node of a cluster would fail on every key of another node's slot:
        refused at start (a server that does not answer ``INFO cluster`` is taken for a single server)."""
        try:
            info = self._client.info("cluster")
        except redis_errors.ResponseError:
            return
        if str(info.get("cluster_enabled", "0")) == "1":
            self._client.close()
            raise StoreError(f"scrapy-polite cannot use its pace table {self.uri}: the server is a node of a Redis "
                             "Cluster, and a redis:// URL reaches that node only. Fix: name the cluster, "
                             "redis+cluster://host:port[,host:port...] (POLITE_STORE).")

    # -- errors -----------------------------------------------------------------------------------------

    def _error(self, action: str, exc: BaseException) -> StoreError:
        text = (str(exc) or type(exc).__name__).rstrip(".")
        if isinstance(exc, (redis_errors.AuthenticationError, redis_errors.AuthorizationError,
                            redis_errors.NoPermissionError)):
            return StoreError(f"scrapy-polite cannot {action} its pace table {self.uri}: {text}. Fix: give the "
                              "right user and password in POLITE_STORE (redis://user:password@host:port/db).")
        if self._transient(exc):
            cls = StoreUnavailable if action != "reach" else StoreError
            start = ("start the cluster's nodes there or point POLITE_STORE to reachable nodes "
                     "(redis+cluster://host:port,host:port)" if self.cluster else
                     "start Redis there (e.g. redis-server --port 6379) or point POLITE_STORE to a reachable "
                     "server (redis://host:port/db)")
            return cls(f"scrapy-polite cannot {action} its pace table {self.uri}: {text}. Fix: {start}.")
        return StoreError(f"scrapy-polite cannot {action} its pace table {self.uri}: {text}. Fix: point "
                          "POLITE_STORE to a Redis server (version 5 or later) whose keys under "
                          f"{self.prefix!r} only scrapy-polite writes, or change POLITE_STORE_PREFIX.")

    @staticmethod
    def _transient(exc: BaseException) -> bool:
        if isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError, ConnectionError,
                            TimeoutError)):
            return not isinstance(exc, redis_errors.AuthenticationError)
        return isinstance(exc, _TRANSIENT_ERRORS) or (isinstance(exc, redis_errors.ResponseError)
                                                      and str(exc).startswith(_TRANSIENT_REPLIES))

    def _run(self, action: str, call: Callable[[], T]) -> T:
        """``call()``, retried once at once on a lost connection (a pooled connection the server closed);
        redis errors become :class:`StoreError` (:class:`StoreUnavailable` when transient)."""
        try:
            try:
                return call()
            except (redis_errors.ConnectionError, ConnectionError) as exc:
                if isinstance(exc, (redis_errors.AuthenticationError, redis_errors.BusyLoadingError)):
                    raise
                return call()
        except (redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
            raise self._error(action, exc) from exc
        except (ConnectionError, TimeoutError) as exc:
            raise self._error(action, exc) from exc

    # -- reads ------------------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        """A row's Redis key: ``<prefix>{pace}:<key>`` (``table``), ``<prefix>{<key>}`` (``sharded``)."""
        return f"{self.prefix}{{{key}}}" if self.sharded else self._rows + key

    def _record_of(self, name: str, token: str) -> str:
        """The idempotence record of update ``token`` in the slot of the row key ``name``."""
        return f"{name}#done:{token}" if self.sharded else self._done + token

    def slot_groups(self, keys: Sequence[str]) -> list[list[int]]:
        """The indices of ``keys`` grouped by the hash slot of their row's Redis key, the groups in the order of
        their slots (the order an update locks them in): one group unless the table is ``sharded`` on a
        cluster (a single server runs any script on any keys)."""
        if not (self.sharded and self.cluster) or len(keys) < 2:
            return [list(range(len(keys)))]
        groups: dict[int, list[int]] = {}
        for index, key in enumerate(keys):
            groups.setdefault(key_slot(self._key(key).encode()), []).append(index)
        return [groups[slot] for slot in sorted(groups)]

    def _read(self, keys: Sequence[str], record: str | None = None) -> tuple[list[_Row], float, bytes | None]:
        """The rows of ``keys``, the server's clock and, when ``record`` names an idempotence record, its value
        (None: absent), in one round trip (one script: atomic, on the node of the keys' slot)."""
        names = [*map(self._key, keys), record or (self._key(keys[0]) if self.sharded and keys else self._counter)]
        reply = self._run("read", partial(self._read_script, keys=names, args=["1" if record else "0", *_FIELDS]))
        seconds, micros, found, *rows = reply
        return [_row(values) for values in rows], int(seconds) + int(micros) / 1e6, found

    def _run_scripts(self, script: _Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Run ``script`` once per ``(keys, args)`` of ``calls`` in one pipelined round trip (on a cluster, to each
        slot's node in parallel; each call atomic on its node) and return the replies (an error reply raises,
        after the others ran). A node that does not know the script gets it loaded, and the calls are sent
        again (each script is idempotent for its update)."""
        def call() -> list[Any]:
            for _ in range(2):
                pipe = self._client.pipeline(transaction=False)
                for keys, args in calls:  # execute_command: redis-py blocks pipe.evalsha on a cluster
                    # On a cluster, the slot's node named: else redis-py >= 6 asks a node for the keys first.
                    route = {"target_nodes": self._client.get_node_from_key(keys[0])} if self.cluster else {}
                    pipe.execute_command("EVALSHA", script.script.sha, len(keys), *keys, *args, **route)
                replies = list(pipe.execute(raise_on_error=False))
                if not any(isinstance(r, redis_errors.NoScriptError) for r in replies):
                    break
                self._client.script_load(script.text)
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies

        return self._run("write", call)

    def now(self) -> float:
        """The server's clock (``TIME`` on the node of the table's slot; ``sharded``: of the event log's slot),
        Unix epoch seconds."""
        if self.sharded:
            reply = self._run("read", partial(self._read_script, keys=[self._events], args=["0", *_FIELDS]))
            return int(reply[0]) + int(reply[1]) / 1e6
        return self._read([])[1]

    def get(self, key: str) -> HostState | None:
        return self._read([key])[0][0].state

    def read(self, keys: Sequence[str]) -> Snapshot:
        """See :meth:`PaceStore.read <scrapy_polite.stores.base.PaceStore.read>`. ``sharded`` on a cluster: one
        atomic read per slot, in the order of :meth:`slot_groups`; the clock is that of the first key's slot."""
        keys = list(keys)
        if not keys:
            return Snapshot({}, self.now())
        states: dict[str, HostState | None] = {}
        now = 0.0
        for group in self.slot_groups(keys):
            part = [keys[i] for i in group]
            rows, clock, _ = self._read(part)
            if 0 in group:
                now = clock
            states.update({key: row.state for key, row in zip(part, rows)})
        return Snapshot({key: states[key] for key in keys}, now)

    # -- writes -----------------------------------------------------------------------------------------

    def update(self, key: str, fn: UpdateFn[T]) -> T:
        """See :meth:`PaceStore.update <scrapy_polite.stores.base.PaceStore.update>`: the steps of
        :meth:`update_steps`, sleeping between two (call it off the reactor)."""
        return _finish(self.update_steps(key, fn))

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> T:
        """See :meth:`PaceStore.update_many <scrapy_polite.stores.base.PaceStore.update_many>`: the steps of
        :meth:`update_many_steps`, sleeping between two (call it off the reactor)."""
        return _finish(self.update_many_steps(keys, fn))

    def update_steps(self, key: str, fn: UpdateFn[T]) -> UpdateSteps[T]:
        """:meth:`update` as :class:`~scrapy_polite.stores.base.UpdateSteps` that never sleep (docs/spec.md §6,
        "Redis: contention"); no I/O until the first step."""
        def many(states: dict[str, HostState | None], now: float) -> tuple[dict[str, HostState], T]:
            new, result = fn(states[key], now)
            return ({key: new} if new is not None else {}), result

        if self.sharded:
            return _ShardedUpdate(self, [key], many, fn)
        return _Update(self, [key], many, fn)

    def update_many_steps(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> UpdateSteps[T]:
        """:meth:`update_many` as :class:`~scrapy_polite.stores.base.UpdateSteps` that never sleep
        (docs/spec.md §6, "Redis: contention"); no I/O until the first step."""
        if self.sharded:
            return _ShardedUpdate(self, list(dict.fromkeys(keys)), fn, fn)
        return _Update(self, list(dict.fromkeys(keys)), fn, fn)

    def _take_pending(self, name: tuple[Any, tuple[str, ...]]) -> _Pending | None:
        with self._lock:
            return self._ambiguous.pop(name, None)

    def _remember(self, name: tuple[Any, tuple[str, ...]], pending: _Pending) -> None:
        with self._lock:
            self._ambiguous[name] = pending
            self._ambiguous.move_to_end(name)
            while len(self._ambiguous) > _PENDING_LIMIT:
                self._ambiguous.popitem(last=False)

    def _expiry_ms(self, state: HostState, now: float) -> int:
        """When the row's key expires: ``POLITE_STORE_EXPIRE`` after the later of now, its write and its
        ``next_allowed`` (Unix ms); 0 for never (an expiry beyond what Redis can hold)."""
        at = (max(now, state.updated, state.next_allowed, state.held_until) + self.expire_after) * 1000.0
        return int(at) + 1 if at < 2**62 else 0

    def delete(self, key: str) -> bool:
        return bool(self._run("write", lambda: self._client.delete(self._key(key))))

    # -- the whole table --------------------------------------------------------------------------------

    def _scan(self) -> Iterator[list[tuple[str, _Row]]]:
        """Every row, in batches, as ``(key, row)`` (``sharded`` on a cluster: node after node)."""
        start = f"{self.prefix}{{" if self.sharded else self._rows
        pattern = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in start) + ("*}" if self.sharded else "*")
        for scanned in self._scanned():
            cursor = 0
            while True:
                cursor, names = self._scan_batch(scanned, cursor, pattern)
                if names:
                    rows = self._run("read", partial(self._hmget_all, names))
                    batch = [(name[len(start):-1] if self.sharded else name[len(start):], _row(values))
                             for name, values in zip(names, rows)]
                    yield [(key, row) for key, row in batch if row.state is not None]
                if cursor == 0:
                    break

    def _scanned(self) -> list[Any]:
        """The clients that ``SCAN`` runs on: on a cluster, the node that holds the table's slot (``sharded``:
        every primary)."""
        if not self.cluster:
            return [self._client]
        client = self._client
        if self.sharded:
            nodes = self._run("read", client.get_primaries)
            return [client.get_redis_connection(node) for node in nodes]
        return [client.get_redis_connection(client.get_node_from_key(self._counter))]

    def _scan_batch(self, scanned: Any, cursor: int, pattern: str) -> tuple[int, list[str]]:
        next_cursor, names = self._run("read", lambda: scanned.scan(cursor, match=pattern, count=1000))
        return int(next_cursor), [n.decode() if isinstance(n, bytes) else str(n) for n in names]

    def _hmget_all(self, names: list[str]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.hmget(name, _FIELDS)
        return list(pipe.execute())

    def items(self) -> Iterator[tuple[str, HostState]]:
        rows = sorted((key, row.state) for batch in self._scan() for key, row in batch if row.state is not None)
        return iter(rows)

    def expire(self, before: float) -> int:
        removed = 0
        for batch in self._scan():
            stale = [(key, row) for key, row in batch if row.state is not None
                     and row.state.updated < before and row.state.next_allowed < before]
            for group in self.slot_groups([k for k, _ in stale]) if stale else []:
                part = [stale[i] for i in group]
                removed += int(self._run("write", partial(self._delete_if, keys=[self._key(k) for k, _ in part],
                                                          args=[row.version for _, row in part])))
        return removed

    # -- the event log --------------------------------------------------------------------------------

    def append_events(self, events: Sequence[Event]) -> None:
        """``XADD`` each event (one JSON field) to the table's stream, then ``XTRIM MAXLEN`` to the cap (exact)
        and refresh the stream's expiry (``POLITE_STORE_EXPIRE``), in one pipelined round trip. A batch whose
        connection was lost after it was sent may be appended twice (the log is diagnostic)."""
        if not events:
            return

        def call() -> list[Any]:
            pipe = self._client.pipeline(transaction=not self.cluster)  # redis-py 5: no MULTI on a cluster
            for event in events:
                pipe.xadd(self._events, {"e": json.dumps(list(event), separators=(",", ":"))})
            pipe.xtrim(self._events, maxlen=self.events_max, approximate=False)
            if self.expire_after * 1000 < 2**62:
                pipe.pexpire(self._events, max(1, int(self.expire_after * 1000)))
            return list(pipe.execute())

        self._run("write", call)

    def events(self, since: float | None = None, host: str | None = None, limit: int = 1000) -> list[Event]:
        """Reads the stream newest first, 1000 entries a round trip, until it holds ``limit`` matching events,
        or reaches entries appended more than a minute before ``since`` (an entry's id is the server's time of
        its append, which comes after the event)."""
        if limit <= 0:
            return []
        margin = 60.0
        found: list[tuple[float, str, Event]] = []
        upper = "+"
        while True:
            chunk = self._run("read", partial(self._client.xrevrange, self._events, upper, "-", 1000))
            if not chunk:
                break
            for raw_id, fields in chunk:
                if not fields:  # an entry without fields: not ours
                    continue
                event = _event(fields, self._events, raw_id)
                if (since is None or event.at >= since) and (host is None or event.host == host):
                    found.append((event.at, _text(raw_id), event))
                    if len(found) == limit:
                        break
            if len(found) >= limit:
                break
            last_id = _text(chunk[-1][0])
            appended = int(last_id.partition("-")[0]) / 1000.0
            if since is not None and appended < since - margin:
                break
            if len(chunk) < 1000:
                break
            upper = _before(last_id)  # not "(id": exclusive ranges need Redis 6.2
        found.sort(key=lambda f: (f[0], _stream_order(f[1])))
        return [f[2] for f in found]

    def close(self) -> None:
        self._client.close()


def _finish(steps: UpdateSteps[T]) -> T:
    """Run ``steps`` to their end on this thread, sleeping between two.

    Only the blocking :meth:`RedisStore.update` / ``update_many`` run here: ``scrapy polite`` and scripts,
    never a crawl. A crawl reaches the store through :class:`~scrapy_polite.stores.AsyncStore`, which runs
    the same steps itself (``update_steps``), each on a store thread and the wait between two on the
    reactor's clock, so this sleep never runs on the reactor nor holds a store thread (docs/spec.md §6,
    "Redis: contention")."""
    while True:
        out = steps.step()
        if not isinstance(out, Again):
            return out
        if out.delay > 0:
            time.sleep(out.delay)


#: The write arguments that name the state fields: their number, then their hash field names.
_FIELD_ARGS = (len(_STATE_FIELDS), *_STATE_FIELDS.values())


def _rows_args(store: RedisStore, keys: Sequence[str], new: dict[str, HostState], now: float) -> list[Any]:
    """The write arguments of the rows of ``new`` among ``keys``: for each, its position in ``keys`` (from 1),
    its expiry (:meth:`RedisStore._expiry_ms`) and its field values."""
    out: list[Any] = []
    for position, key in enumerate(keys, start=1):
        state = new.get(key)
        if state is not None:
            out.extend((position, store._expiry_ms(state, now), *_encode(state)))
    return out


class _Steps(Generic[T]):
    """What every update of a :class:`RedisStore` shares, step by step (:class:`UpdateSteps`): its identity and
    pending record, the decision on the rows read, the optimistic read-then-write of one slot, and the wait
    after a lost race.

    ``identity`` (the caller's update function) and ``keys`` name one logical update: when a write of it was
    sent but its connection was lost (applied or not, nobody knows), the next update with the same function
    on the same keys takes over its id (so its record) and the results of its attempts: it first reads the
    record with the rows, and returns the result of the attempt that was applied when there is one.
    """

    #: On an outage, keep the update's id for its retry even when nothing was sent yet (its locks carry it).
    _keep_token = False

    def __init__(self, store: RedisStore, keys: list[str], fn: ManyUpdateFn[T], identity: Any) -> None:
        self._store = store
        self._keys = keys
        self._fn = fn
        self._name = (identity, tuple(keys))
        pending = store._take_pending(self._name)
        #: An earlier call of this update may have been applied: look for its record before anything else.
        self._check = pending is not None
        self._pending = pending or _Pending(uuid.uuid4().hex)
        self._rows: list[_Row] | None = None
        self._now = 0.0
        self._now_at = 0.0  # time.monotonic() when the server's clock read self._now
        self._lost = 0
        self._busy_until: float | None = None

    def step(self) -> T | Again:
        try:
            return self._step()
        except StoreUnavailable:
            if self._keep_token or self._pending.results:  # a write may be in flight: its retry must find it
                self._store._remember(self._name, self._pending)
            raise

    def _step(self) -> T | Again:
        raise NotImplementedError

    def _applied(self, attempt: bytes) -> T:
        """The result of the attempt whose write the record names."""
        return self._pending.results[int(attempt)]  # type: ignore[no-any-return]

    def _record_ttl_ms(self) -> int:
        return max(1, int(self._store.done_ttl * 1000))

    def _decide(self, rows: list[_Row]) -> tuple[dict[str, HostState], T, float]:
        """The update function on ``rows``: the new rows, the result and the ``now`` it ran with.

        Raises:
            ValueError: the function wrote a row it did not read.
        """
        # The server's clock as read, moved on by the time since (this process's monotonic clock): a step that
        # waited in the pool's queue after a lost race must not book at a moment already past.
        now = self._now + max(0.0, time.monotonic() - self._now_at)
        new, result = self._fn({key: row.state for key, row in zip(self._keys, rows)}, now)
        stray = set(new).difference(self._keys)
        if stray:
            raise ValueError(f"update function wrote {sorted(stray)!r}, which it did not read")
        return new, result, now

    def _optimistic_step(self, record: str,
                         write: Callable[[int, list[_Row], dict[str, HostState], float], Any]) -> T | Again:
        """One step of an update whose rows are in one slot: read the rows (and ``record``, when an earlier
        attempt may have been applied), decide, and ``write(attempt, rows, new, now)`` if the rows still have
        the versions read (the script's reply: the record's value, the current rows, or success)."""
        if self._rows is None:
            check = self._check or bool(self._pending.results)  # an earlier attempt may have been applied
            rows, self._now, found = self._store._read(self._keys, record if check else None)
            self._now_at = time.monotonic()
            if found is not None:
                return self._applied(found)
            self._rows = rows
        rows = self._rows
        new, result, now = self._decide(rows)
        if not new and not self._pending.results:
            return result  # nothing to write, and no earlier write of this update to fence off
        attempt = len(self._pending.results)
        self._pending.results[attempt] = result
        reply = write(attempt, rows, new, now)
        if isinstance(reply, bytes):  # the record was there: an earlier attempt (or its resend) was applied
            return self._applied(reply)
        if not isinstance(reply, list):
            return result
        self._now = int(reply[0]) + int(reply[1]) / 1e6
        self._now_at = time.monotonic()
        self._rows = [_row(values) for values in reply[2:]]
        return self._lost_race(reread=False)

    def _lost_race(self, reread: bool) -> Again:
        """The wait after a lost race: none after the first (unless ``reread``: the rows must be read again),
        then a random moment, doubling, and the rows are read again.

        Raises:
            StoreBusy: :data:`MAX_ATTEMPTS` lost races, or :data:`MAX_BUSY_SECONDS` of them.
        """
        self._lost += 1
        if self._lost >= MAX_ATTEMPTS:
            raise self._busy()
        if self._lost < 2 and not reread:
            return Again(0.0)
        # Lost twice in a row: step aside a random moment, so that writers of one row stop colliding, then
        # read the rows again (those of the reply are stale by then: writing on them would surely lose).
        self._busy_until = self._busy_until or time.monotonic() + MAX_BUSY_SECONDS
        if time.monotonic() > self._busy_until:
            raise self._busy()
        self._rows = None
        return Again(random.uniform(0.0, min(0.02, 0.0001 * 2 ** (self._lost - 1))))

    def _busy(self) -> StoreBusy:
        return StoreBusy(f"scrapy-polite could not write its pace table {self._store.uri}: {len(self._keys)} rows "
                         f"({', '.join(self._keys)}) changed under every one of its attempts (at most "
                         f"{MAX_ATTEMPTS}, {MAX_BUSY_SECONDS:g} s). Fix: fewer processes on these hosts, or a less "
                         "loaded Redis.")


class _Update(_Steps[T]):
    """One optimistic read-modify-write of a ``table`` layout (one slot), step by step (:class:`_Steps`)."""

    def __init__(self, store: RedisStore, keys: list[str], fn: ManyUpdateFn[T], identity: Any) -> None:
        super().__init__(store, keys, fn, identity)
        self._record = store._done + self._pending.token
        self._names = [*map(store._key, keys), store._counter, self._record]

    def _step(self) -> T | Again:
        return self._optimistic_step(self._record, self._write)

    def _write(self, attempt: int, rows: list[_Row], new: dict[str, HostState], now: float) -> Any:
        store = self._store
        args: list[Any] = [attempt, self._record_ttl_ms(), *(row.version for row in rows), *_FIELD_ARGS,
                           *_rows_args(store, self._keys, new, now)]
        return store._run("write", partial(store._write, keys=self._names, args=args))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _before(entry_id: str) -> str:
    """The stream id just before ``entry_id``."""
    ms, seq = _stream_order(entry_id)
    return f"{ms}-{seq - 1}" if seq > 0 else f"{ms - 1}-{2**64 - 1}"


def _stream_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id ``"ms-seq"`` as a sortable pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass
class _Group:
    """The rows of one hash slot in a :class:`_ShardedUpdate`: their indices in the update's keys, their Redis
    keys and the update's idempotence record in that slot."""

    indices: list[int]
    names: list[str]
    record: str


class _ShardedUpdate(_Steps[T]):
    """One update of a ``sharded`` table (docs/scale.md), step by step (:class:`UpdateSteps`).

    Rows in one slot (a single-row update, or rows whose tags share a slot, or any update on a single server):
    the optimistic read and write of :class:`_Update`, whose write also fails on a row another update has
    locked. Rows in several slots (a booking: the host's row and an address's): **lock, decide, write** —
    each slot's rows are locked and read in one script (in the order of the slots, so two updates never wait on
    each other in a cycle: a step that finds a row locked releases what it took and tries again later), the
    update function runs on them with the clock of the first key's slot, then each slot's new rows are
    written, and its locks released, in one script with the slot's idempotence record. An update is applied in
    every slot or, only when its process stalls past :data:`LOCK_LEASE` between two writes and another update
    takes the lock, in the first slots only (it then raises :class:`StoreError`: the caller does not act on it,
    so a booking's request is not sent; only more spacing than asked for results). The resend of a write whose
    reply was lost finds each slot's record, as in :class:`_Update`.
    """

    _keep_token = True  # its retry reuses the token: records and locks

    def __init__(self, store: RedisStore, keys: list[str], fn: ManyUpdateFn[T], identity: Any) -> None:
        super().__init__(store, keys, fn, identity)
        token = self._pending.token
        names = [store._key(key) for key in keys]
        self._groups = [_Group(g, [names[i] for i in g], store._record_of(names[g[0]], token))
                        for g in store.slot_groups(keys)]
        #: Attempt → the write arguments of each group (a resend after a lost reply writes the same rows).
        self._writes: dict[int, list[list[Any]]] = self._pending.writes

    def _step(self) -> T | Again:
        return self._one_slot_step() if len(self._groups) == 1 else self._locked_step()

    def _args(self, group: _Group, attempt: int, mode: str, rows: list[_Row], new: dict[str, HostState],
              now: float) -> list[Any]:
        return [attempt, self._record_ttl_ms(), self._pending.token, mode,
                *(rows[i].version for i in group.indices), *_FIELD_ARGS,
                *_rows_args(self._store, [self._keys[i] for i in group.indices], new, now)]

    def _write(self, group: _Group, args: list[Any]) -> Any:
        store = self._store
        return store._run("write", partial(store._shard_write, keys=[*group.names, group.record], args=args))

    # -- one slot: optimistic ---------------------------------------------------------------------------

    def _one_slot_step(self) -> T | Again:
        group = self._groups[0]
        return self._optimistic_step(group.record, lambda attempt, rows, new, now: self._write(
            group, self._args(group, attempt, "w", rows, new, now)))

    # -- several slots: lock, decide, write -------------------------------------------------------------

    def _unlock(self, groups: Sequence[_Group]) -> None:
        if groups:
            self._store._run_scripts(self._store._shard_unlock,
                                     [(group.names, [self._pending.token]) for group in groups])

    def _locked_step(self) -> T | Again:
        store = self._store
        lease = max(1, int(LOCK_LEASE * 1000))
        rows: list[_Row] = [_Row(b"0", None)] * len(self._keys)
        # Every slot's lock-and-read in one pipelined round trip (the nodes answer in parallel). A slot whose rows
        # another update holds is not locked; the slots that were are released, and the update tries again.
        replies = store._run_scripts(store._shard_lock, [([*group.names, group.record],
                                                          [self._pending.token, lease, *_FIELDS])
                                                         for group in self._groups])
        locked = [group for group, reply in zip(self._groups, replies)
                  if not isinstance(reply, bytes) and int(reply[0]) == 1]
        done = [int(reply) for reply in replies if isinstance(reply, bytes)]
        if done:  # an earlier attempt of this update was written in some slot: finish it (its writes check
            return self._finish(done[0])  # the versions it read, so a row written since is never overwritten)
        if len(locked) < len(self._groups):
            self._unlock(locked)
            return self._lost_race(reread=True)
        for group, reply in zip(self._groups, replies):
            if 0 in group.indices:  # the clock of the first key's slot (a booking's: the host's)
                self._now = int(reply[1]) + int(reply[2]) / 1e6
                self._now_at = time.monotonic()
            for index, values in zip(group.indices, reply[3:]):
                rows[index] = _row(values)
        try:
            new, result, now = self._decide(rows)
        except BaseException:
            self._unlock(locked)
            raise
        if not new and not self._pending.results:
            self._unlock(locked)
            return result
        attempt = len(self._pending.results)
        self._pending.results[attempt] = result
        self._writes[attempt] = [self._args(group, attempt, "c", rows, new, now) for group in self._groups]
        return self._finish(attempt)

    def _finish(self, attempt: int) -> T | Again:
        """Write every slot's rows of ``attempt``, in one pipelined round trip (a slot already written returns
        its record)."""
        writes = self._writes.get(attempt)
        if writes is None:  # the record of an attempt this process no longer knows (its pending was forgotten)
            raise StoreError(f"scrapy-polite lost track of an update of its pace table {self._store.uri} "
                             f"({', '.join(self._keys)}). Fix: retry.")
        replies = self._store._run_scripts(self._store._shard_write,
                                           [([*group.names, group.record], args)
                                            for group, args in zip(self._groups, writes)])
        refused = [group for group, reply in zip(self._groups, replies) if reply == 0]
        if refused:
            self._unlock(refused)
            if len(refused) == len(self._groups):  # another update took every lock after its lease: nothing
                return self._lost_race(reread=True)  # was written, try again
            raise StoreError(f"scrapy-polite's update of {', '.join(self._keys)} in its pace table "
                             f"{self._store.uri} was written in {len(self._groups) - len(refused)} of its "
                             f"{len(self._groups)} slots only: its process stalled past the locks' lease "
                             f"({LOCK_LEASE:g} s) and another update took a lock. Nothing was sent on it. Fix: a "
                             "less loaded machine or Redis.")
        return self._applied(str(attempt).encode())
