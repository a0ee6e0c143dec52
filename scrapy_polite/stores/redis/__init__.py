"""``redis://host:port/db`` (also ``rediss://`` and ``unix://``), or a Redis Cluster
(``redis+cluster://host:port[,host:port…]``, ``rediss+cluster://…``): one pace table shared by every process
on every machine that points ``POLITE_STORE`` at the same Redis (docs/spec.md §6). Needs the ``redis`` client
(``pip install scrapy-polite[redis]``; it uses ``hiredis`` when installed).

**One policy, optimistic writes.** The pacing rules stay in Python (:mod:`scrapy_polite.policy`); Redis only
stores rows and checks versions (docs/spec.md §6, "Redis: exactly once", "Redis: contention", "Redis Cluster",
"Redis: the sharded layout", "Outages"). One module per job:

* :mod:`.uri` — the URI: one server or a cluster, the ``layout=`` option, the password hidden;
* :mod:`.client` — the connection: the client, a call retried once on a lost connection, errors as
  :class:`~scrapy_polite.stores.base.StoreError` / :class:`~scrapy_polite.stores.base.StoreUnavailable`;
* :mod:`.scripts` — the Lua scripts (``lua/*.lua``, read once);
* :mod:`.codec` — a row's hash and back; :mod:`.keys` — the table's key names and slots;
* :mod:`.updates` — what every update shares and the optimistic algorithm (``layout=table``);
  :mod:`.sharded` — lock, decide, write (``layout=sharded``);
* :mod:`.events` — the event stream;
* :mod:`.store` — :class:`RedisStore`; :mod:`.table` — :class:`AsyncRedisStore`, its async table.
"""

from __future__ import annotations

from .sharded import LOCK_LEASE
from .store import RedisStore
from .table import AsyncRedisStore
from .updates import DONE_MARGIN, MAX_ATTEMPTS, MAX_BUSY_SECONDS
from .uri import CLUSTER_SCHEMES, LAYOUTS, redact_uri, split_layout

__all__ = ["AsyncRedisStore", "CLUSTER_SCHEMES", "DONE_MARGIN", "LAYOUTS", "LOCK_LEASE", "MAX_ATTEMPTS",
           "MAX_BUSY_SECONDS", "RedisStore", "redact_uri", "split_layout"]
