"""Store calls that never block the reactor, with results as Twisted ``Deferred`` objects."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, TypeVar

from twisted.internet import defer, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from ..policy import HostState
from ..reactor import installed_reactor
from .base import (
    Again,
    Event,
    ManyUpdateFn,
    PaceStore,
    Snapshot,
    SteppedStore,
    StoreBusy,
    StoreClosed,
    StoreError,
    UpdateFn,
    UpdateSteps,
)
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = ["AsyncStore"]

T = TypeVar("T")

#: The most calls one group commit runs in one transaction (docs/spec.md §6, "Group commit").
GROUP_MAX = 512


class AsyncStore:
    """A store whose calls never block the reactor; every method returns a ``Deferred`` of its result.

    * :class:`~scrapy_polite.stores.memory.MemoryStore`: called inline (no I/O).
    * :class:`~scrapy_polite.stores.sqlite.SQLiteStore`: **group commit** (docs/spec.md §6, "Group
      commit"): the updates (and the reads behind them) made in one reactor turn wait for the next turn
      (``callLater(0)``), then run in call order in **one** ``BEGIN IMMEDIATE`` transaction
      (:meth:`SQLiteStore.run_group <scrapy_polite.stores.sqlite.SQLiteStore.run_group>`, at most
      ``group_max`` calls), each caller getting its own result or its own exception; a read with nothing
      waiting before it runs inline at once. The group is first tried inline on a no-wait connection (a WAL
      transaction without fsync, tens of microseconds); when another writer holds the lock
      (:class:`~scrapy_polite.stores.base.StoreBusy`), the whole group runs on the store's own thread, which
      may wait for the lock; the calls made meanwhile wait on the reactor's side and then run inline again
      (one round trip through the thread, not one for every call of a busy crawl). Calls complete in call
      order. The store's thread checkpoints the WAL while the calls made meanwhile wait on the reactor's
      side (no write lands in the WAL while it is copied back, so the next write starts it over) and then
      run inline again: first when the WAL's file has grown past ``restart_frames`` pages (looked at
      every 250 inline writes), then after as many writes as made the WAL that long, going by the pages
      per write the last checkpoint found.
      The WAL is not checkpointed more often, because each hold lets
      Scrapy's engine start more downloads meanwhile (its downloader then stays full for the rest of the
      crawl, at about three times the garbage collections per page: ``bench/overhead.py``), and a
      checkpoint that does not hold the calls never lets a busy WAL start over. A table of few hosts (a
      few pages, rewritten) is checkpointed about every 8000 writes; a table of 100,000 hosts, whose
      writes touch pages all over the file, about every 1500 (``bench/booking.py``).
    * any other backend (a network server): every call runs on the store's thread pool of
      ``threads`` threads. The updates of a :class:`~scrapy_polite.stores.base.SteppedStore` (Redis) run
      step by step: each step (a round trip or two) on the pool, and the wait after a lost race on the
      reactor's clock (``callLater``), so a contended row never holds a thread while it waits and delays
      only its own updates, not the other hosts' (docs/spec.md §6, "Redis: contention"). An update still waiting
      to retry when the store is closed fails with :class:`~scrapy_polite.stores.base.StoreError`.

    The threads are started when first needed (a crawl refused at its start never starts one, so none can
    keep the process alive) and stopped by :meth:`close` / :meth:`close_async`. From the close on, every
    call fails at once with :class:`~scrapy_polite.stores.base.StoreClosed` and touches no connection: a
    late call never writes, nor meets a connection being closed on another thread (docs/spec.md §6).

    The event log (:meth:`append_events`): inline for memory. For SQLite, inline on the no-wait connection
    too, in transactions of at most ``event_chunk`` events, one per reactor turn (under a millisecond
    each), so it never holds the file's write lock while the pace table's calls want it (a thread of its
    own would hold it across its waits for the GIL, and every pace write meeting it would go through the
    thread). A batch that finds another process's write under way, or is still waiting at the close, is
    written on a connection and a thread of its own, which waits for the lock. During a checkpoint the
    batches wait with the calls. For a server, on the pool.

    Args:
        store: the backend (opened).
        reactor: the Twisted reactor (defaults to the installed one).
        restart_frames: about how many WAL pages (4 KiB each by default) the WAL may hold before it is
            checkpointed and starts over: 8192 keeps a lookup of a page that is not in the WAL to two
            segments of the WAL's index (a longer WAL makes every read of a large table slower) and the
            file near 32 MiB.
        event_chunk: the most events one inline event-log transaction writes.
        threads: size of the thread pool for backends that are not called inline.
        group_max: the most calls one SQLite group commit runs in one transaction.
    """

    def __init__(self, store: PaceStore, reactor: Any = None, *, restart_frames: int = 8192,
                 event_chunk: int = 250, threads: int = 1, group_max: int = GROUP_MAX) -> None:
        if reactor is None:
            reactor = installed_reactor()
        self.store = store
        self._reactor = reactor
        self._pool: ThreadPool | None = None  # started when first needed (:meth:`_start_pool`)
        self._threads = max(1, threads)
        #: Set by the close (on the reactor's thread): every later call fails with StoreClosed.
        self._closed = False
        self._inline: PaceStore | None = None
        self._queued = 0
        #: Calls made while a checkpoint or a busy call runs on the thread, in call order:
        #: ``(method name, args, Deferred of the result)``.
        self._held: deque[tuple[str, tuple[Any, ...], defer.Deferred[Any]]] = deque()
        #: A checkpoint runs on the thread: calls (and event batches) wait.
        self._checkpointing = False
        self._restart_frames = max(1, restart_frames)
        #: Inline writes between two checkpoints (set from the WAL's pages per write at each one), and the
        #: writes since the last one.
        self._checkpoint_every = restart_frames
        self._since_checkpoint = 0
        self._learned = False  # no checkpoint yet: the WAL file's length decides the first
        self._frames_after = 0  # the WAL's length at the last checkpoint
        self._event_chunk = max(1, event_chunk)
        #: Event batches waiting for the inline writer, in order: ``[events not yet written, Deferred]``.
        self._events_waiting: deque[tuple[list[Event], defer.Deferred[None]]] = deque()
        self._events_turn: Any = None  # the reactor turn scheduled for the next chunk
        self._events_writing = False  # a chunk is being written (a batch appended meanwhile waits its turn)
        self._events_on_thread = 0  # batches on the event log's thread: later ones follow them there, in order
        self._events_pool: ThreadPool | None = None
        self._events_store: SQLiteStore | None = None
        #: Updates of a stepped store waiting on the reactor's clock for their next step: timer → result.
        self._retrying: dict[Any, defer.Deferred[Any]] = {}
        self._stepped: SteppedStore | None = None
        #: SQLite's group commit: the calls of one reactor turn wait in ``_held`` for :meth:`_flush`.
        self._grouped = False
        self._group_max = max(1, group_max)
        self._flush_turn: Any = None  # the reactor turn scheduled for the next group
        #: Write transactions run on the pace table's file (groups, event-log chunks, calls that ran alone),
        #: for ``bench/overhead.py``.
        self.transactions = 0
        if isinstance(store, MemoryStore):
            self._inline = store
            return
        if isinstance(store, SQLiteStore):
            self._inline = store.nowait()
            self._grouped = True
        elif isinstance(store, SteppedStore):
            self._stepped = store

    def _start_pool(self) -> ThreadPool:
        """The store's thread pool, started on first use (never after the close)."""
        if self._pool is None:
            self._pool = ThreadPool(minthreads=1, maxthreads=self._threads, name="scrapy-polite-store")
            self._pool.start()
        return self._pool

    def _call(self, name: str, *args: Any) -> defer.Deferred[Any]:
        if self._closed:
            return defer.fail(self._closed_error())
        if self._grouped and (name in ("update", "update_many") or self._held or self._checkpointing
                              or self._queued):
            # Group commit: behind the calls already waiting, in the next group (a read with nothing
            # waiting before it runs inline at once: it sees every write already delivered).
            g: defer.Deferred[Any] = defer.Deferred()
            self._held.append((name, args, g))
            self._schedule_flush()
            return g
        # Behind the checkpoint, behind an inline call handed to the thread, and behind the calls already held.
        if self._checkpointing or self._held or (self._queued and self._inline is not None):
            d: defer.Deferred[Any] = defer.Deferred()
            self._held.append((name, args, d))
            return d
        return self._run(name, args)

    def _run(self, name: str, args: tuple[Any, ...]) -> defer.Deferred[Any]:
        if self._inline is not None and not self._queued:
            try:
                result = getattr(self._inline, name)(*args)
            except StoreBusy:
                pass
            except Exception:
                return defer.fail()
            else:
                if name in ("update", "update_many") and self._inline is not self.store:
                    self._wrote()
                return defer.succeed(result)
        if self._stepped is not None and name in ("update", "update_many"):
            return self._steps(name, args)
        return self._threaded(name, *args)

    def _steps(self, name: str, args: tuple[Any, ...]) -> defer.Deferred[Any]:
        """An update of a stepped store: its steps on the pool, the waits between them on the reactor."""
        if self._closed or self._stepped is None:
            return defer.fail(self._closed_error())
        try:
            if name == "update":
                steps: UpdateSteps[Any] = self._stepped.update_steps(*args)
            else:
                steps = self._stepped.update_many_steps(*args)
        except Exception:
            return defer.fail()
        result_d: defer.Deferred[Any] = defer.Deferred()
        self._step(steps, result_d)
        return result_d

    def _step(self, steps: UpdateSteps[Any], result_d: defer.Deferred[Any]) -> None:
        if self._closed:  # closed while the update waited for its next step
            result_d.errback(self._closed_error())
            return
        d: defer.Deferred[Any] = threads.deferToThreadPool(self._reactor, self._start_pool(), steps.step)
        d.addCallbacks(self._stepped_once, result_d.errback, callbackArgs=(steps, result_d))

    def _stepped_once(self, out: Any, steps: UpdateSteps[Any], result_d: defer.Deferred[Any]) -> None:
        """A step is done: the update's result, or its next step now (behind the calls already queued) or
        after the delay it asked for (on the reactor's clock: no thread waits)."""
        if not isinstance(out, Again):
            result_d.callback(out)
            return
        if out.delay <= 0:
            self._step(steps, result_d)
            return
        timer: Any = None

        def due() -> None:
            self._retrying.pop(timer, None)
            self._step(steps, result_d)

        timer = self._reactor.callLater(out.delay, due)
        self._retrying[timer] = result_d

    def _wrote(self) -> None:
        """One inline write landed in the WAL. Until the first checkpoint, every 250 writes the WAL file's
        length is looked at (a fresh file is as long as the WAL); a checkpoint when it passes
        ``restart_frames`` pages. After it, a checkpoint every ``_checkpoint_every`` writes."""
        self._since_checkpoint += 1
        self.transactions += 1
        if self._checkpointing or not isinstance(self.store, SQLiteStore):
            return
        if self._learned:
            if self._since_checkpoint >= self._checkpoint_every:
                self._checkpoint()
        elif self._since_checkpoint % 250 == 0 and self.store.wal_pages() > self._restart_frames:
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Checkpoint the WAL on the store's thread; calls wait on the reactor's side until it is done (no
        write lands in the WAL meanwhile, so the next write starts it over)."""
        if self._closed or not isinstance(self.store, SQLiteStore):
            return
        self._checkpointing = True
        d: defer.Deferred[tuple[int, int] | None] = threads.deferToThreadPool(
            self._reactor, self._start_pool(), self.store.checkpoint)
        d.addErrback(lambda _failure: None)  # a failed checkpoint leaves the WAL as it was; the next one retries
        d.addCallback(self._checkpointed)

    def _checkpointed(self, frames: tuple[int, int] | None) -> None:
        """The checkpoint is done: set the writes until the next one from the pages per write it found,
        then run the calls (and event batches) held meanwhile, in order, inline while they can be."""
        self._checkpointing = False
        if frames is not None and frames[0] > 0 and self._since_checkpoint > 0:
            # Pages added since the last checkpoint: all of them when that one copied the whole WAL back
            # (the WAL started over after it), else those past its length (it could not: it kept growing).
            added = frames[0] - self._frames_after if frames[0] > self._frames_after else frames[0]
            per_write = max(1.0, added / self._since_checkpoint)  # a write appends at least one page
            # Never more often than every 1000 writes: other processes' pages count in the WAL's length.
            self._checkpoint_every = max(1000, min(100_000, int(self._restart_frames / per_write)))
            self._frames_after = frames[0] if frames[1] < frames[0] else 0
            self._learned = True
        self._since_checkpoint = 0
        if self._closed:  # closed meanwhile: the held calls went to the thread
            return
        self._drain()
        self._write_events()

    def _schedule_flush(self) -> None:
        """The next group runs on the next reactor turn, unless one is scheduled, or a checkpoint or a busy
        group on the thread holds them (its end schedules it)."""
        if self._flush_turn is None and not self._closed and not self._checkpointing and not self._queued:
            self._flush_turn = self._reactor.callLater(0, self._flush)

    def _flush(self) -> None:
        """Run the waiting calls (at most ``group_max``) as one group, one transaction (docs/spec.md §6,
        "Group commit"), inline on the no-wait connection; a group that finds another writer's lock goes
        whole to the store's thread, which waits for it. Each caller's Deferred fires in call order."""
        self._flush_turn = None
        if self._closed or self._checkpointing or self._queued or not self._held or self._inline is None:
            return
        batch = [self._held.popleft() for _ in range(min(self._group_max, len(self._held)))]
        calls = [(name, args) for name, args, _ in batch]
        try:
            outcomes = self._inline.run_group(calls)  # type: ignore[attr-defined]
        except StoreBusy:
            self._group_threaded(batch, calls)
            return
        except Exception as exc:
            self._fail_all(batch, exc)
        else:
            if any(name in ("update", "update_many") for name, _ in calls):
                self._wrote()
            self._deliver(batch, outcomes)
        if self._held:
            self._schedule_flush()

    @staticmethod
    def _deliver(batch: Sequence[tuple[str, tuple[Any, ...], defer.Deferred[Any]]],
                 outcomes: Sequence[tuple[bool, Any]]) -> None:
        """Each caller its own result or its own exception, in call order."""
        for (_, _, d), (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                d.callback(value)
            else:
                d.errback(value)

    @staticmethod
    def _fail_all(batch: Sequence[tuple[str, tuple[Any, ...], defer.Deferred[Any]]],
                  failure: Failure | Exception) -> None:
        """The group's transaction failed (nothing of it was written): every caller gets the error."""
        for _, _, d in batch:
            d.errback(failure)

    def _group_threaded(self, batch: list[tuple[str, tuple[Any, ...], defer.Deferred[Any]]],
                        calls: list[tuple[str, tuple[Any, ...]]]) -> None:
        """A group that met another writer's lock: whole on the store's thread (it waits for the lock);
        the calls made meanwhile wait, then run inline again."""
        self._queued += 1
        assert isinstance(self.store, SQLiteStore)
        d: defer.Deferred[list[tuple[bool, Any]]] = threads.deferToThreadPool(
            self._reactor, self._start_pool(), self.store.run_group, calls)

        def done(result: Any) -> None:
            self._queued -= 1
            if isinstance(result, Failure):
                self._fail_all(batch, result)
            else:
                self.transactions += 1
                self._deliver(batch, result)
            if not self._queued:
                self._drain()

        d.addBoth(done)

    def _drain(self) -> None:
        """Run the held calls in order, inline while they can be; stop when one starts a checkpoint or is
        handed to the thread (the rest wait for it). With group commit: the next group."""
        if self._grouped:
            self._schedule_flush()
            return
        while self._held and not self._checkpointing and not (self._queued and self._inline is not None):
            name, args, d = self._held.popleft()
            self._run(name, args).chainDeferred(d)

    def _threaded(self, name: str, *args: Any) -> defer.Deferred[Any]:
        if self._closed:
            return defer.fail(self._closed_error())
        pool = self._start_pool()
        self._queued += 1
        result_d: defer.Deferred[Any] = defer.Deferred()

        def done(result: Any) -> None:
            self._queued -= 1
            # The caller sees this result before any call held behind it runs: calls complete in call order.
            if isinstance(result, Failure):
                result_d.errback(result)
            else:
                result_d.callback(result)
            if not self._queued and self._inline is not None:
                self._drain()

        d: defer.Deferred[Any] = threads.deferToThreadPool(self._reactor, pool, getattr(self.store, name), *args)
        d.addBoth(done)
        return result_d

    def _closed_error(self) -> StoreClosed:
        return StoreClosed(f"scrapy-polite's pace table {self.store.uri} is closed")

    @property
    def closed(self) -> bool:
        """The store was closed (:meth:`close`, :meth:`close_async`): every call fails with
        :class:`~scrapy_polite.stores.base.StoreClosed`."""
        return self._closed

    @property
    def uri(self) -> str:
        """The backend's URI."""
        return self.store.uri

    def get(self, key: str) -> defer.Deferred[HostState | None]:
        """See :meth:`PaceStore.get <scrapy_polite.stores.base.PaceStore.get>`."""
        return self._call("get", key)

    def read(self, keys: Sequence[str]) -> defer.Deferred[Snapshot]:
        """See :meth:`PaceStore.read <scrapy_polite.stores.base.PaceStore.read>`."""
        return self._call("read", keys)

    def update(self, key: str, fn: UpdateFn[T]) -> defer.Deferred[T]:
        """See :meth:`PaceStore.update <scrapy_polite.stores.base.PaceStore.update>`."""
        return self._call("update", key, fn)

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> defer.Deferred[T]:
        """See :meth:`PaceStore.update_many <scrapy_polite.stores.base.PaceStore.update_many>`."""
        return self._call("update_many", keys, fn)

    def append_events(self, events: list[Event]) -> defer.Deferred[None]:
        """See :meth:`PaceStore.append_events <scrapy_polite.stores.base.PaceStore.append_events>`; how
        each backend writes it: see the class. Fires once every event of the batch is written."""
        if self._closed:
            return defer.fail(self._closed_error())
        if isinstance(self.store, MemoryStore):
            try:
                self.store.append_events(events)
            except Exception:
                return defer.fail()
            return defer.succeed(None)
        if not isinstance(self.store, SQLiteStore):
            return self._threaded("append_events", events)  # fails as closed once the pool is gone
        if self._inline is None:
            return defer.fail(self._closed_error())
        d: defer.Deferred[None] = defer.Deferred()
        self._events_waiting.append((list(events), d))
        if self._events_turn is None and not self._events_writing:
            self._write_events()
        return d

    def _write_events(self) -> None:
        """Write one chunk of the waiting event batches inline, and schedule the next reactor turn for the
        rest. A batch that finds the lock held goes to the event log's thread, and the batches after it
        follow it there until it is written (in order). During a checkpoint they wait for it."""
        if self._events_turn is not None and self._events_turn.active():  # called before its turn came
            self._events_turn.cancel()
        self._events_turn = None
        if self._events_writing or self._checkpointing or self._inline is None or self._closed:
            return
        self._events_writing = True
        try:
            while self._events_waiting:
                events, d = self._events_waiting[0]
                if self._events_on_thread:
                    self._events_waiting.popleft()
                    self._events_threaded(events).chainDeferred(d)
                    continue
                chunk = events[:self._event_chunk]
                try:
                    self._inline.append_events(chunk)
                except StoreBusy:
                    self._events_waiting.popleft()
                    self._events_threaded(events).chainDeferred(d)
                    continue
                except Exception:
                    self._events_waiting.popleft()
                    d.errback()
                    continue
                del events[:len(chunk)]
                if not events:
                    self._events_waiting.popleft()
                    d.callback(None)  # a batch its callbacks append waits for the next turn
                self._wrote()
                break
        finally:
            self._events_writing = False
        if self._events_waiting and not self._checkpointing and not self._events_on_thread:
            self._events_turn = self._reactor.callLater(0, self._write_events)

    def _events_threaded(self, events: list[Event]) -> defer.Deferred[None]:
        """Write a batch on the event log's own connection and thread (it waits for the lock; the
        connection is opened there too, since opening it also waits)."""
        if not isinstance(self.store, SQLiteStore):
            return defer.fail(self._closed_error())
        if self._events_pool is None:
            self._events_pool = ThreadPool(minthreads=1, maxthreads=1, name="scrapy-polite-events")
            self._events_pool.start()
        self._events_on_thread += 1
        d: defer.Deferred[None] = threads.deferToThreadPool(self._reactor, self._events_pool,
                                                            self._append_on_thread, events)

        def written(result: Any) -> Any:
            self._events_on_thread -= 1
            if not self._events_on_thread and self._events_waiting and self._events_turn is None:
                self._write_events()  # the thread is done: inline again
            return result

        d.addBoth(written)
        return d

    def _append_on_thread(self, events: list[Event]) -> None:
        """On the event log's thread: open its connection the first time, then append."""
        if self._events_store is None:
            assert isinstance(self.store, SQLiteStore)
            self._events_store = self.store.sibling()
        self._events_store.append_events(events)

    def close(self) -> None:
        """Stop the thread (after the calls already queued), checkpoint and close the backend. Blocks until
        the calls already queued are done: for a crawl, :meth:`close_async` does the same off the reactor.
        Idempotent; from here on every call fails with :class:`~scrapy_polite.stores.base.StoreClosed`."""
        self._queue_held()
        self._close_parts(*self._detach())

    def close_async(self) -> defer.Deferred[None]:
        """:meth:`close` without blocking the reactor: the calls held on the reactor's side are queued and
        the store is marked closed here (a later call fails with
        :class:`~scrapy_polite.stores.base.StoreClosed`), and the waits (the store's threads finishing the
        calls already queued — a Redis call in an outage may take its socket timeout —, the WAL
        checkpoint, the backend's close) run on a thread of the reactor's pool. Fires when the store is
        closed; errors of the close are the Deferred's. Blocking when the reactor is not running (nothing
        to keep responsive, and its pool may be gone), and for the memory store (no I/O)."""
        self._queue_held()
        parts = self._detach()
        if isinstance(self.store, MemoryStore) or not getattr(self._reactor, "running", False):
            try:
                self._close_parts(*parts)
            except Exception:
                return defer.fail()
            return defer.succeed(None)
        d: defer.Deferred[None] = threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(),
                                                            self._close_parts, *parts)
        return d

    def _queue_held(self) -> None:
        if self._closed:
            return
        self._checkpointing = False
        if self._flush_turn is not None and self._flush_turn.active():
            self._flush_turn.cancel()
        self._flush_turn = None
        while self._held:  # calls held behind a checkpoint or a busy call: queued on the thread, in order
            name, args, d = self._held.popleft()
            self._threaded(name, *args).chainDeferred(d)
        if self._events_turn is not None and self._events_turn.active():
            self._events_turn.cancel()
        self._events_turn = None
        while self._events_waiting:  # event batches not written yet: on the event log's thread, in order
            events, ed = self._events_waiting.popleft()
            self._events_threaded(events).chainDeferred(ed)

    def _detach(self) -> tuple[ThreadPool | None, ThreadPool | None]:
        """On the reactor's thread: take the threads out of use (later calls see the store closed) and hand
        them to :meth:`_close_parts`. From here on every call fails with StoreClosed."""
        self._closed = True
        parts = (self._pool, self._events_pool)
        self._pool = self._events_pool = None
        retrying, self._retrying = self._retrying, {}
        for timer, result_d in retrying.items():  # updates waiting to retry a lost race: stopped, failed
            if timer.active():
                timer.cancel()
            result_d.errback(self._closed_error())
        return parts

    def _close_parts(self, pool: ThreadPool | None, events_pool: ThreadPool | None) -> None:
        """Join the threads (after the calls already queued), checkpoint, close every connection; each step
        runs even when an earlier one failed (the first error is raised at the end)."""
        try:
            if events_pool is not None:  # the event batches already queued are written first
                events_pool.stop()
        finally:
            try:
                events_store, self._events_store = self._events_store, None  # its thread is done
                if events_store is not None:
                    events_store.close()
            finally:
                try:
                    if pool is not None:
                        pool.stop()
                    if isinstance(self.store, SQLiteStore):
                        try:
                            self.store.checkpoint()
                        except StoreError:
                            pass
                finally:
                    try:
                        if self._inline is not None and self._inline is not self.store:
                            self._inline.close()
                    finally:
                        self.store.close()
