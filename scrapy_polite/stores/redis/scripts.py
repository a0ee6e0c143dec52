"""The Redis table's Lua scripts: the files of ``lua/`` (package data), read once at import, and how a client
runs them (:class:`Script`, :class:`Scripts`).

A script's file may say ``--!include <name>`` on a line of its own: the fragment ``lua/<name>.lua`` goes there
(the fragments are pasted into each script's text, so one script still runs atomically). Comment lines are
left out of the text sent to the server. The scripts only compare versions and copy fields: no pacing rule
lives on the server (docs/spec.md §6).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis import exceptions as redis_errors

__all__ = ["DELETE_IF_UNCHANGED", "READ", "SHARD_LOCK", "SHARD_UNLOCK", "SHARD_WRITE", "Script", "Scripts",
           "WRITE_IF_UNCHANGED", "load"]

_INCLUDE = "--!include "


def load(name: str) -> str:
    """The text of ``lua/<name>.lua``, its fragments included and its comment lines left out."""
    source = resources.files(__package__).joinpath("lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")
    lines: list[str] = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith(_INCLUDE):
            lines.append(load(stripped[len(_INCLUDE):].strip()).rstrip("\n"))
        elif stripped and not stripped.startswith("--"):
            lines.append(line)
    return "\n".join(lines) + "\n"


#: Reads the clock and rows (and an update's idempotence record), atomically.
READ = load("read")
#: Writes an update's rows if every row read still has the version read (the ``table`` layout).
WRITE_IF_UNCHANGED = load("write_if_unchanged")
#: Deletes the rows whose version is still the one read (the expiry of stale rows).
DELETE_IF_UNCHANGED = load("delete_if_unchanged")
#: The ``sharded`` layout: writes an update's rows in one slot, once.
SHARD_WRITE = load("shard_write")
#: The ``sharded`` layout: locks and reads an update's rows in one slot.
SHARD_LOCK = load("shard_lock")
#: The ``sharded`` layout: releases an update's locks in one slot.
SHARD_UNLOCK = load("shard_unlock")


class Script:
    """A Lua script run by ``EVALSHA``, or by ``EVAL`` (its text) when the node does not know it: a node
    restarted, or a cluster client whose view of the nodes is partial after an outage (redis-py 5 then loads
    the script on the nodes it knows, not always on the slot's).

    Attributes:
        script: redis-py's registered script (its ``sha``).
        text: the script's text.
    """

    def __init__(self, client: Any, text: str) -> None:
        self._client = client
        self.script = client.register_script(text)
        self.text = text

    def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return self.script(keys=keys, args=args)
        except redis_errors.NoScriptError:
            return self._client.eval(self.text, len(keys), *keys, *args)


class Scripts:
    """Every script of the table, registered with one client. An update calls them through this object (a test
    may put a stand-in in place of one).

    Attributes:
        read, write, delete_if, shard_write, shard_lock, shard_unlock: the scripts above.
    """

    def __init__(self, client: Any) -> None:
        self.read = Script(client, READ)
        self.write = Script(client, WRITE_IF_UNCHANGED)
        self.delete_if = Script(client, DELETE_IF_UNCHANGED)
        self.shard_write = Script(client, SHARD_WRITE)
        self.shard_lock = Script(client, SHARD_LOCK)
        self.shard_unlock = Script(client, SHARD_UNLOCK)
