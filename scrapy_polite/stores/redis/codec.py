"""The Redis table's rows: a :class:`~scrapy_polite.policy.HostState` as the fields of a hash and back, with the
row's version (docs/spec.md §6, "Formats")."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...policy import HostState

__all__ = ["FIELDS", "FIELD_ARGS", "STATE_FIELDS", "Row", "decode", "encode", "text"]

#: The hash field of each :class:`HostState` field (short: every booking reads a row). A field added to
#: HostState needs a name here (checked at import); a row written before a field existed reads its default.
STATE_FIELDS: dict[str, str] = {
    "next_allowed": "n", "consec": "c", "crawl_delay": "d", "ok_seen": "o", "throttled_at": "t", "updated": "u",
    "ratelimit_interval": "q", "ratelimit_until": "r",
    "quota_left": "ql", "quota_reset": "qr", "quota_limit": "qq", "quota_window": "qw", "quota_serial": "qs",
    "booked": "b",
    "latency": "l", "strain": "s",
    "run_retry_after": "m",
    "held_until": "hu", "held_by": "hb",
    "origin_delays": "od",
}
_STATE_TYPES: dict[str, type] = {f.name: type(f.default) for f in dataclasses.fields(HostState)}
if set(STATE_FIELDS) != set(_STATE_TYPES):  # pragma: no cover - a development error, caught by any test run
    raise RuntimeError(f"scrapy_polite.stores.redis: HostState fields {sorted(_STATE_TYPES)} and their hash "
                       f"fields {sorted(STATE_FIELDS)} differ: name the new field in STATE_FIELDS")

#: The fields of a row's hash: the version, then the :class:`HostState` fields. (Rows written by earlier
#: versions also hold a field ``w``, their write token, which is no longer read.)
FIELDS = ("v", *STATE_FIELDS.values())

#: The write arguments that name the state fields: their number, then their hash field names.
FIELD_ARGS = (len(STATE_FIELDS), *STATE_FIELDS.values())


@dataclass(frozen=True)
class Row:
    """A row as read: its version (``b"0"``: absent) and its state (None: absent)."""

    version: bytes
    state: HostState | None


#: An absent row.
ABSENT = Row(b"0", None)


def decode(values: Sequence[Any]) -> Row:
    """A row from the values of its hash's :data:`FIELDS`."""
    version, *fields = values
    if version is None:
        return ABSENT
    state: dict[str, Any] = {}
    for name, raw in zip(STATE_FIELDS, fields):
        if raw is not None:  # None: a field the writer's version did not have yet (its default)
            kind = _STATE_TYPES[name]
            state[name] = raw == b"1" if kind is bool else text(raw) if kind is str else kind(raw)
    return Row(bytes(version), HostState(**state))


def encode(state: HostState) -> list[Any]:
    """The state's field values in the order of :data:`STATE_FIELDS` (floats by ``repr``: exact; text as it is)."""
    out: list[Any] = []
    for name in STATE_FIELDS:
        value = getattr(state, name)
        kind = _STATE_TYPES[name]
        out.append(int(bool(value)) if kind is bool else int(value) if kind is int else value if kind is str
                   else repr(float(value)))
    return out


def text(value: Any) -> str:
    """A reply's bytes (or anything else) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
