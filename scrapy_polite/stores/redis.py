"""``redis://host:port/db`` (also ``rediss://`` and ``unix://``): one pace table shared by every process
on every machine that points ``POLITE_STORE`` at the same Redis (docs/spec.md §6).

Needs the ``redis`` client (``pip install scrapy-polite[redis]``; it uses ``hiredis`` when installed).

**One policy, optimistic writes.** The pacing rules stay in Python (:mod:`scrapy_polite.policy`); Redis
only stores rows and checks versions. Every row is a hash carrying a version. A read is one pipelined
round trip, ``TIME`` + ``HMGET``… (inside ``MULTI``/``EXEC`` for a snapshot of several rows); a write is
one small generic Lua script that writes the new rows only if **every row read** still has the version
read (absent = 0), else returns the current rows and the clock, on which the update function is applied
again (a bounded number of times, then
:class:`~scrapy_polite.stores.base.StoreBusy`). So an uncontended booking is two round trips, and a
contended one costs one more per lost race. ``WATCH``/``MULTI`` would need a connection held per
transaction and a third round trip (``WATCH``, read, ``MULTI…EXEC``), and a lost race starts over
with a new read; the script returns what the retry needs.

Versions come from one counter per table, so a row deleted and written again never reuses a version
(no ABA). Every write also leaves a random token in the rows it writes: when the connection is lost
after a write was sent, the retry of the same update finds its token and returns the first result
instead of applying the update twice.

**The server's clock.** ``TIME`` is the ``now`` of every booking and record (:attr:`RedisStore.server_clock`),
so processes whose clocks disagree still keep the spacing.

**Keys.** ``<prefix>{pace}:<key>`` for the rows (``POLITE_STORE_PREFIX``, default ``polite:``) and
``<prefix>{pace}`` for the version counter: every key of one table has the hash tag ``{pace}`` (or the
prefix's own ``{tag}`` when it has one), so a table lives in one hash slot of a Redis Cluster. A row expires
``POLITE_STORE_EXPIRE`` seconds after the later of its write and its ``next_allowed``.

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
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis import exceptions as redis_errors
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..policy import HostState
from .base import Event, ManyUpdateFn, Snapshot, StoreBusy, StoreError, StoreOptions, StoreUnavailable, UpdateFn

__all__ = ["RedisStore", "redact_uri"]

T = TypeVar("T")

#: The hash field of each :class:`HostState` field (short: every booking reads a row). A field added to
#: HostState needs a name here (checked at import); a row written before a field existed reads its default.
_STATE_FIELDS: dict[str, str] = {
    "next_allowed": "n", "consec": "c", "crawl_delay": "d", "ok_seen": "o", "throttled_at": "t", "updated": "u",
    "ratelimit_interval": "q", "ratelimit_until": "r",
}
_STATE_TYPES: dict[str, type] = {f.name: type(f.default) for f in dataclasses.fields(HostState)}
if set(_STATE_FIELDS) != set(_STATE_TYPES):  # pragma: no cover - a development error, caught by any test run
    raise RuntimeError(f"scrapy_polite.stores.redis: HostState fields {sorted(_STATE_TYPES)} and their hash "
                       f"fields {sorted(_STATE_FIELDS)} differ: name the new field in _STATE_FIELDS")

#: The fields of a row's hash: version, write token, then the :class:`HostState` fields.
_FIELDS = ("v", "w", *_STATE_FIELDS.values())

#: Writes the rows of ARGV if every row of KEYS still has the version read; else returns the clock and the
#: current rows. KEYS[1..n]: the rows read; KEYS[n+1]: the table's version counter. ARGV[1]: the write's
#: token; ARGV[2..n+1]: the versions read ("0": absent); ARGV[n+2]: the number f of state fields, then their
#: f hash field names; then f + 2 values per row to write: its index in KEYS, its expiry (Unix ms, "0":
#: none) and its f field values. Generic: no pacing rule here, and no field name either.
_WRITE_IF_UNCHANGED = """
local n = #KEYS - 1
local f = tonumber(ARGV[n + 2])
local names = {}
for k = 1, f do names[k] = ARGV[n + 2 + k] end
for i = 1, n do
  local v = redis.call('HGET', KEYS[i], 'v')
  if (v or '0') ~= ARGV[i + 1] then
    local t = redis.call('TIME')
    local out = {t[1], t[2]}
    for j = 1, n do
      out[#out + 1] = redis.call('HMGET', KEYS[j], 'v', 'w', unpack(names))
    end
    return out
  end
end
local version = redis.call('INCR', KEYS[n + 1])
local i = n + 3 + f
while i <= #ARGV do
  local key = KEYS[tonumber(ARGV[i])]
  local pairs = {'v', version, 'w', ARGV[1]}
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

#: Lost races one update may meet before it gives up (each costs one round trip; the winner of every race
#: makes progress, so this is only reached under extreme contention on one row) …
MAX_ATTEMPTS = 10_000
#: … or seconds it may spend losing them. After the second lost race in a row each retry first sleeps a
#: random moment (up to 0.2 ms, doubling up to 20 ms), so that writers of one row stop colliding.
MAX_BUSY_SECONDS = 10.0

#: Writes of unknown outcome remembered for their retry (oldest forgotten first).
_PENDING_LIMIT = 10_000

#: Error replies that mean "not now" rather than "never": the server is loading its data after a restart
#: (a ``BusyLoadingError``, a connection error), is a read-only replica or lost its master (a failover in
#: progress), its cluster is reconfiguring, it cannot persist (``MISCONF``), or a script holds it (``BUSY``).
#: redis-py maps some replies to classes (and strips their code from the message), the others by their code.
_TRANSIENT_ERRORS: tuple[type[Exception], ...] = (redis_errors.ReadOnlyError, redis_errors.MasterDownError,
                                                  redis_errors.TryAgainError, redis_errors.ClusterDownError)
_TRANSIENT_REPLIES = ("MISCONF", "BUSY ")


@dataclass(frozen=True)
class _Row:
    version: bytes
    token: bytes | None
    state: HostState | None


def _row(values: Sequence[Any]) -> _Row:
    version, token, *fields = values
    if version is None:
        return _Row(b"0", None, None)
    state: dict[str, Any] = {}
    for name, raw in zip(_STATE_FIELDS, fields):
        if raw is not None:  # None: a field the writer's version did not have yet (its default)
            kind = _STATE_TYPES[name]
            state[name] = raw == b"1" if kind is bool else kind(raw)
    return _Row(bytes(version), token, HostState(**state))


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


class RedisStore:
    """The pace table in a Redis server, shared by every process that uses the same URI and prefix.

    Args:
        uri: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS) or
            ``unix:///path/to/socket?db=N`` (redis-py's URL forms).
        options: ``prefix`` (``POLITE_STORE_PREFIX``), ``timeout`` (``POLITE_STORE_TIMEOUT``, seconds; one
            call waits at most ``min(timeout, 5)`` seconds for the server) and ``expire``
            (``POLITE_STORE_EXPIRE``, seconds).
        client: a ready ``redis.Redis`` (tests); built from ``uri`` when None.

    Raises:
        StoreError: the server cannot be reached, refuses the credentials, or is not a usable Redis (at
            construction: the crawl must not start). The message names the URI (password hidden) and the fix.
    """

    #: The table's clock is the server's (``TIME``): the pacer converts its due times to this process's clock.
    server_clock = True
    #: Rows expire on the server (key TTLs): no sweep at start is needed.
    expires_rows = True
    #: Threads of :class:`~scrapy_polite.stores.AsyncStore` for this backend: each call waits on the network,
    #: so two overlap their round trips; more only contend for the GIL (bench/distributed.py, 2 cores).
    threads = 2

    def __init__(self, uri: str, options: StoreOptions | None = None, *, client: redis.Redis | None = None) -> None:
        options = options or StoreOptions()
        self.uri = redact_uri(uri)
        self.prefix = options.prefix
        self.expire_after = options.expire
        self._base = f"{options.prefix}{{pace}}"
        self._rows = f"{self._base}:"
        self._counter = self._base
        #: The event log: one stream, ``<prefix>{pace}#events`` (``#``: never a row's key, which has ``:``).
        self._events = f"{self._base}#events"
        self.events_max = max(0, int(options.events_max))
        wait = max(0.1, min(5.0, options.timeout))
        try:
            self._client = client or redis.Redis.from_url(
                uri, socket_timeout=wait, socket_connect_timeout=wait, retry=Retry(NoBackoff(), 0),
                health_check_interval=30, client_name="scrapy-polite")
        except (ValueError, redis_errors.RedisError) as exc:
            raise StoreError(f"POLITE_STORE {self.uri!r} is not a Redis URL scrapy-polite can use: {exc}. Fix: use "
                             "redis://host:port/db, rediss://host:port/db or unix:///path/to/redis.sock?db=0."
                             ) from exc
        self._write = self._client.register_script(_WRITE_IF_UNCHANGED)
        self._delete_if = self._client.register_script(_DELETE_IF_UNCHANGED)
        self._lock = threading.Lock()
        #: (update function, keys) → (token, result) of a write whose connection was lost.
        self._ambiguous: OrderedDict[tuple[Any, tuple[str, ...]], tuple[str, Any]] = OrderedDict()
        try:
            self._client.ping()
        except redis_errors.RedisError as exc:
            self._client.close()
            raise self._error("reach", exc) from None  # the message says it all: one error, the URL, the fix

    # -- errors -----------------------------------------------------------------------------------------

    def _error(self, action: str, exc: BaseException) -> StoreError:
        text = (str(exc) or type(exc).__name__).rstrip(".")
        if isinstance(exc, (redis_errors.AuthenticationError, redis_errors.AuthorizationError,
                            redis_errors.NoPermissionError)):
            return StoreError(f"scrapy-polite cannot {action} its pace table {self.uri}: {text}. Fix: give the "
                              "right user and password in POLITE_STORE (redis://user:password@host:port/db).")
        if self._transient(exc):
            cls = StoreUnavailable if action != "reach" else StoreError
            return cls(f"scrapy-polite cannot {action} its pace table {self.uri}: {text}. Fix: start Redis "
                       "there (e.g. redis-server --port 6379) or point POLITE_STORE to a reachable server "
                       "(redis://host:port/db).")
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
        except redis_errors.RedisError as exc:
            raise self._error(action, exc) from exc
        except (ConnectionError, TimeoutError) as exc:
            raise self._error(action, exc) from exc

    # -- reads ------------------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return self._rows + key

    def _read(self, keys: Sequence[str], *, atomic: bool = True) -> tuple[list[_Row], float]:
        """The rows of ``keys`` and the server's clock, in one round trip: ``MULTI`` / ``TIME`` / ``HMGET``… /
        ``EXEC`` when ``atomic`` (and more than one key), else a plain pipeline (an update's read: its write
        checks every row it read anyway)."""
        def call() -> list[Any]:
            pipe = self._client.pipeline(transaction=atomic and len(keys) > 1)
            pipe.time()
            for key in keys:
                pipe.hmget(self._key(key), _FIELDS)
            return pipe.execute()

        replies = self._run("read", call)
        seconds, micros = replies[0]
        return [_row(values) for values in replies[1:]], seconds + micros / 1e6

    def now(self) -> float:
        """The server's clock (``TIME``), Unix epoch seconds."""
        seconds, micros = self._run("read", self._client.time)
        return float(seconds + micros / 1e6)

    def get(self, key: str) -> HostState | None:
        return self._read([key])[0][0].state

    def read(self, keys: Sequence[str]) -> Snapshot:
        rows, now = self._read(keys)
        return Snapshot({key: row.state for key, row in zip(keys, rows)}, now)

    # -- writes -----------------------------------------------------------------------------------------

    def update(self, key: str, fn: UpdateFn[T]) -> T:
        def many(states: dict[str, HostState | None], now: float) -> tuple[dict[str, HostState], T]:
            new, result = fn(states[key], now)
            return ({key: new} if new is not None else {}), result

        return self._update([key], many, fn)

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> T:
        return self._update(list(dict.fromkeys(keys)), fn, fn)

    def _update(self, keys: list[str], fn: ManyUpdateFn[T], identity: Any) -> T:
        """The optimistic read-modify-write. ``identity`` (the caller's update function) and ``keys`` name one
        logical update: when a write of it was sent but its connection was lost (the write may or may not
        have been applied), the next call with the same function on the same keys first looks for the
        token of that write, and returns the first result when it finds it."""
        name = (identity, tuple(keys))
        with self._lock:
            pending = self._ambiguous.pop(name, None)
        token = pending[0] if pending is not None else uuid.uuid4().hex
        mark = token.encode()
        names = [*map(self._key, keys), self._counter]
        rows, now = self._read(keys, atomic=False)
        if pending is not None and any(row.token == mark for row in rows):
            return pending[1]  # type: ignore[no-any-return]  # the result of the write that was applied
        busy_until: float | None = None
        for attempt in range(MAX_ATTEMPTS):
            if attempt >= 2:  # lost twice in a row: step aside a random moment before the next try
                busy_until = busy_until or time.monotonic() + MAX_BUSY_SECONDS
                if time.monotonic() > busy_until:
                    break
                # Never on the reactor: AsyncStore runs every Redis call on its store threads (only memory
                # and SQLite are ever called inline), and `scrapy polite` has no reactor.
                time.sleep(random.uniform(0.0, min(0.02, 0.0001 * 2 ** (attempt - 1))))
            new, result = fn({key: row.state for key, row in zip(keys, rows)}, now)
            stray = set(new).difference(keys)
            if stray:
                raise ValueError(f"update function wrote {sorted(stray)!r}, which it did not read")
            if not new:
                return result
            args: list[Any] = [token, *(row.version for row in rows), len(_STATE_FIELDS), *_STATE_FIELDS.values()]
            for index, key in enumerate(keys, start=1):
                state = new.get(key)
                if state is not None:
                    args.extend((index, self._expiry_ms(state, now), *_encode(state)))
            try:
                reply = self._run("write", partial(self._write, keys=names, args=args))
            except StoreUnavailable:
                with self._lock:
                    self._ambiguous[name] = (token, result)
                    while len(self._ambiguous) > _PENDING_LIMIT:
                        self._ambiguous.popitem(last=False)
                raise
            if not isinstance(reply, list):
                return result
            now = int(reply[0]) + int(reply[1]) / 1e6
            rows = [_row(values) for values in reply[2:]]
            if any(row.token == mark for row in rows):  # the immediate resend found the first write applied
                return result
        raise StoreBusy(f"scrapy-polite could not write its pace table {self.uri}: {len(keys)} rows "
                        f"({', '.join(keys)}) changed under every one of its attempts (at most {MAX_ATTEMPTS}, "
                        f"{MAX_BUSY_SECONDS:g} s). Fix: fewer processes on these hosts, or a less loaded Redis.")

    def _expiry_ms(self, state: HostState, now: float) -> int:
        """When the row's key expires: ``POLITE_STORE_EXPIRE`` after the later of now, its write and its
        ``next_allowed`` (Unix ms); 0 for never (an expiry beyond what Redis can hold)."""
        at = (max(now, state.updated, state.next_allowed) + self.expire_after) * 1000.0
        return int(at) + 1 if at < 2**62 else 0

    def delete(self, key: str) -> bool:
        return bool(self._run("write", lambda: self._client.delete(self._key(key))))

    # -- the whole table --------------------------------------------------------------------------------

    def _scan(self) -> Iterator[list[tuple[str, _Row]]]:
        """Every row, in batches, as ``(key, row)``."""
        pattern = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in self._rows) + "*"
        cursor = 0
        while True:
            cursor, names = self._scan_batch(cursor, pattern)
            if names:
                rows = self._run("read", partial(self._hmget_all, names))
                batch = [(name[len(self._rows):], _row(values)) for name, values in zip(names, rows)]
                yield [(key, row) for key, row in batch if row.state is not None]
            if cursor == 0:
                return

    def _scan_batch(self, cursor: int, pattern: str) -> tuple[int, list[str]]:
        next_cursor, names = self._run("read", lambda: self._client.scan(cursor, match=pattern, count=1000))
        return int(next_cursor), [n.decode() if isinstance(n, bytes) else str(n) for n in names]

    def _hmget_all(self, names: list[str]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.hmget(name, _FIELDS)
        return pipe.execute()

    def items(self) -> Iterator[tuple[str, HostState]]:
        rows = sorted((key, row.state) for batch in self._scan() for key, row in batch if row.state is not None)
        return iter(rows)

    def expire(self, before: float) -> int:
        removed = 0
        for batch in self._scan():
            stale = [(key, row) for key, row in batch if row.state is not None
                     and row.state.updated < before and row.state.next_allowed < before]
            if stale:
                removed += int(self._run("write", partial(self._delete_if, keys=[self._key(k) for k, _ in stale],
                                                          args=[row.version for _, row in stale])))
        return removed

    # -- the event log --------------------------------------------------------------------------------

    def append_events(self, events: Sequence[Event]) -> None:
        """``XADD`` each event (one JSON field) to the table's stream, then ``XTRIM MAXLEN`` to the cap (exact)
        and refresh the stream's expiry (``POLITE_STORE_EXPIRE``), in one pipelined round trip. A batch whose
        connection was lost after it was sent may be appended twice (the log is diagnostic)."""
        if not events:
            return

        def call() -> list[Any]:
            pipe = self._client.pipeline(transaction=True)
            for event in events:
                pipe.xadd(self._events, {"e": json.dumps(list(event), separators=(",", ":"))})
            pipe.xtrim(self._events, maxlen=self.events_max, approximate=False)
            if self.expire_after * 1000 < 2**62:
                pipe.pexpire(self._events, max(1, int(self.expire_after * 1000)))
            return pipe.execute()

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
                event = Event._make(json.loads(fields[b"e"]))
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
