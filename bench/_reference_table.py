"""A Python rendition of the reference pacer's persisted table — ONLY a benchmark baseline.

Nothing in scrapy-polite uses this module. It exists so that ``bench/store.py`` can measure our SQLite
store against the design it replaces, in the same process and on the same disk. It follows the reference
(the pacer reference of docs/spec.md, "The references": ``pace_load_tbl_into``, ``pace_save_tbl``, ``pace_slot``,
``pace_slot_or_evict``, ``pace_delay_after2``, ``pace_after_tbl``) in what costs time and what loses data:

* one fixed file of 4096 slots × 40-byte records
  (``host_hash | next_allowed_ms | consec | crawl_delay_ms | flags``, little-endian int64 each);
* djb2 host hash masked to 63 bits (0 reserved for "empty"), linear probing, eviction of the slot whose
  ``next_allowed`` is furthest in the past when the table is full;
* EVERY update loads the whole file into a zeroed buffer (a file shorter than the table is read as "no
  table": all zero) and rewrites the whole file with ``O_CREAT | O_WRONLY | O_TRUNC``. There is no lock,
  so concurrent writers overwrite each other and a reader can see a truncated file.

It does the I/O with whole-buffer ``os.read``/``os.write`` (the reference copies byte by byte), so it is
if anything faster than the original. The v1 (32-byte record) migration path is left out: a benchmark
table never has a v1 predecessor.
"""

from __future__ import annotations

import os
import struct
import time

SLOTS = 4096
REC = 40
TBL_BYTES = SLOTS * REC  # 163840 bytes = 160 KB
OFF_HASH, OFF_NEXT_ALLOWED, OFF_CONSEC, OFF_CRAWL_DELAY, OFF_FLAGS = 0, 8, 16, 24, 32
F_OKSEEN = 1
BASE_MS = 1000
MAX_BACKOFF_MS = 300_000
_MASK63 = 0x7FFF_FFFF_FFFF_FFFF
_I64 = struct.Struct("<q")


def _ld(tbl: bytearray, off: int) -> int:
    return _I64.unpack_from(tbl, off)[0]


def _st(tbl: bytearray, off: int, value: int) -> None:
    _I64.pack_into(tbl, off, value)


def pace_hash(host: bytes) -> int:
    """djb2, masked to a positive int64; 0 is reserved for an empty slot."""
    x = 5381
    for byte in host:
        x = ((x << 5) + x + byte) & _MASK63
    return x or 1


def pace_slot(tbl: bytearray, hh: int) -> int:
    """The slot holding ``hh`` or the first empty one on its probe sequence; -1 when the table is full."""
    s = hh % SLOTS
    for _ in range(SLOTS):
        stored = _ld(tbl, s * REC)
        if stored == 0 or stored == hh:
            return s
        s = (s + 1) % SLOTS
    return -1


def pace_slot_or_evict(tbl: bytearray, hh: int) -> int:
    """``pace_slot``, or on a full table the slot whose ``next_allowed`` is furthest in the past, cleared."""
    s = pace_slot(tbl, hh)
    if s >= 0:
        return s
    victim = min(range(SLOTS), key=lambda i: _ld(tbl, i * REC + OFF_NEXT_ALLOWED))
    tbl[victim * REC:(victim + 1) * REC] = bytes(REC)
    return victim


def pace_delay_after2(base_ms: int, crawl_delay_ms: int, consec_in: int, status: int, retry_after_s: int,
                      ok_seen: int) -> tuple[int, int]:
    """The reference policy: ``(delay_ms, consec')``."""
    eff = max(base_ms, crawl_delay_ms)
    throttle = status in (429, 503) or (status == 403 and ok_seen == 1)
    if throttle:
        if retry_after_s > 0:
            delay = retry_after_s * 1000
        else:
            delay = eff * (1 << min(consec_in, 10))  # the multiplier stops doubling at 1024
        return min(max(delay, eff), MAX_BACKOFF_MS), consec_in + 1
    consec = max(consec_in - 1, 0)
    if consec == 0:
        return eff, 0
    return min(eff * (1 << min(consec, 10)), MAX_BACKOFF_MS), consec


class ReferenceTable:
    """The reference's table file at ``path``: ``after`` is ``pace_after`` (load, decide, save)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> bytearray:
        """``pace_load_tbl``: a zeroed buffer, filled from the file only when it holds a whole table."""
        dst = bytearray(TBL_BYTES)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return dst
        try:
            chunks, size = [], 0
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        if size >= TBL_BYTES:
            dst[:] = b"".join(chunks)[:TBL_BYTES]
        return dst

    def save(self, tbl: bytearray) -> None:
        """``pace_save_tbl``: truncate, then write the whole table (in a loop, as a short write may happen)."""
        fd = os.open(self.path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            view, written = memoryview(tbl), 0
            while written < TBL_BYTES:
                written += os.write(fd, view[written:])
        finally:
            os.close(fd)

    def after(self, host: str, status: int, retry_after_s: int = 0) -> int:
        """``pace_after``: load the table, apply the policy to the host's record, save the table."""
        tbl = self.load()
        hh = pace_hash(host.encode())
        off = pace_slot_or_evict(tbl, hh) * REC
        consec = crawl_delay = flags = 0
        if _ld(tbl, off) == hh:
            consec = _ld(tbl, off + OFF_CONSEC)
            crawl_delay = _ld(tbl, off + OFF_CRAWL_DELAY)
            flags = _ld(tbl, off + OFF_FLAGS)
        delay, new_consec = pace_delay_after2(BASE_MS, crawl_delay, consec, status, retry_after_s,
                                              1 if flags & F_OKSEEN else 0)
        if 200 <= status < 300:
            flags |= F_OKSEEN
        _st(tbl, off, hh)
        _st(tbl, off + OFF_NEXT_ALLOWED, int(time.time() * 1000) + delay)
        _st(tbl, off + OFF_CONSEC, new_consec)
        _st(tbl, off + OFF_CRAWL_DELAY, crawl_delay)
        _st(tbl, off + OFF_FLAGS, flags)
        self.save(tbl)
        return delay

    def consec(self, host: str) -> int:
        """The host's persisted ``consec`` (0 when it has no record)."""
        tbl = self.load()
        hh = pace_hash(host.encode())
        s = pace_slot(tbl, hh)
        if s < 0 or _ld(tbl, s * REC) != hh:
            return 0
        return _ld(tbl, s * REC + OFF_CONSEC)
