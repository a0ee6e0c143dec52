"""The sharded layout of the Redis pace table (``?layout=sharded``, docs/scale.md) on a real Redis Cluster of
three masters and on a single server.

The shared protocol suite runs on it too (the ``redis-sharded`` and ``redis-cluster-sharded`` entries of
tests/support/stores.py). Here: the URL option and its refusals; every key of one row (the row, its locks, its
idempotence records) in one slot, and the rows of many hosts and addresses spread over every slot and node
(negative control: ``layout=table`` keeps them in one); a booking over two slots applied whole by processes
racing on the same rows; a host whose address changes keeps one row; a lock left by a dead process blocks its
rows for the lease only; the resend of a lost reply applied once; a write half done when the lock was lost.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from redis.crc import key_slot

from scrapy_polite.policy import HostState
from scrapy_polite.stores import Again, StoreError, StoreOptions, StoreUnavailable, open_store
from scrapy_polite.stores.redis import sharded as redis_sharded
from scrapy_polite.stores.redis import split_layout
from tests.support.redis_cluster import flush_cluster_prefix, node_ports, redis_cluster_url  # noqa: F401
from tests.support.redis_server import redis_url, unique_prefix  # noqa: F401
from tests.support.redis_updates import bump, bump_both, cluster, expected_counts, run_booking_processes  # noqa: F401


@pytest.fixture
def prefix(redis_cluster_url):
    """A brace-free prefix of this test only (a sharded table's rows are on every node); deleted afterwards."""
    name = unique_prefix("sh")
    yield name
    flush_cluster_prefix(redis_cluster_url, name)


@pytest.fixture
def sharded(redis_cluster_url, prefix):
    s = open_store(redis_cluster_url + "?layout=sharded", StoreOptions(prefix=prefix))
    yield s
    s.close()


def names_on(cluster, prefix):
    """{node name: the table's key names on that primary}."""
    return {node.name: [n.decode() for n in cluster.get_redis_connection(node).scan_iter(match=prefix + "*")]
            for node in cluster.get_primaries()}


# --------------------------------------------------------------------------------------------------
# The option


def test_the_layout_option_is_read_and_removed_from_the_url():
    assert split_layout("redis://h:6379/0") == ("redis://h:6379/0", "table")
    assert split_layout("redis://h:6379/0?layout=sharded&ssl=x") == ("redis://h:6379/0?ssl=x", "sharded")
    assert split_layout("redis+cluster://h1:7000,h2:7000?layout=table") == ("redis+cluster://h1:7000,h2:7000",
                                                                             "table")
    assert split_layout("unix:///run/r.sock?db=1&layout=sharded") == ("unix:///run/r.sock?db=1", "sharded")
    with pytest.raises(ValueError):
        split_layout("redis://h/0?layout=rows")


def test_a_bad_layout_or_a_tagged_prefix_stops_the_crawl_at_start(redis_url):
    with pytest.raises(StoreError, match="Fix: layout=table"):
        open_store(redis_url + "?layout=rows")
    with pytest.raises(StoreError, match="hash tag") as info:
        open_store(redis_url + "?layout=sharded", StoreOptions(prefix="{crawl-a}:"))
    assert "Fix:" in str(info.value)
    # Negative control: the same prefix in the default layout, and a plain prefix sharded, open.
    for uri, options in ((redis_url, StoreOptions(prefix="{crawl-a}:")),
                         (redis_url + "?layout=sharded", StoreOptions(prefix=unique_prefix("ok")))):
        s = open_store(uri, options)
        assert s.layout == ("sharded" if "sharded" in uri else "table")
        s.close()


def test_a_prefix_holding_a_table_layout_table_is_refused_sharded(redis_url):
    prefix = unique_prefix("mix")
    table = open_store(redis_url, StoreOptions(prefix=prefix))
    try:
        table.update("a.example", bump)
        with pytest.raises(StoreError, match="holds a table of layout=table"):
            open_store(redis_url + "?layout=sharded", StoreOptions(prefix=prefix))
    finally:
        table.delete("a.example")
        table.server.client.delete(f"{prefix}{{pace}}")
        table.close()


# --------------------------------------------------------------------------------------------------
# Where the keys are


def test_each_rows_keys_share_a_slot_and_rows_spread_over_every_node(redis_cluster_url, cluster, prefix, sharded):
    hosts = [f"h{i}.example" for i in range(60)]
    for i, host in enumerate(hosts):
        sharded.update_many([host, f"ip:192.0.2.{i % 20}"], bump_both)  # a booking's shape: two slots
    by_node = names_on(cluster, prefix)
    rows = [n for names in by_node.values() for n in names if n.endswith("}")]
    assert len(rows) == 60 + 20
    # Every key of one row — the row, the idempotence records of the updates that wrote it — in the row's slot.
    for names in by_node.values():
        for name in names:
            row = name.partition("#")[0]
            assert key_slot(name.encode()) == key_slot(row.encode())
            assert "lk" not in {f.decode() for f in cluster.hkeys(row)}  # no lock left behind
    # The rows spread: every node holds some (60 hosts and 20 addresses on 3 nodes), many slots are used.
    assert all(sum(n.endswith("}") for n in names) >= 10 for names in by_node.values()), by_node
    assert len({key_slot(n.encode()) for n in rows}) >= 70
    assert {k for k, _ in sharded.items()} == {*hosts, *(f"ip:192.0.2.{i}" for i in range(20))}
    assert all(s.consec == 1 for k, s in sharded.items() if not k.startswith("ip:"))
    assert all(s.consec == 3 for k, s in sharded.items() if k.startswith("ip:"))


def test_negative_control_the_table_layout_keeps_every_row_in_one_slot(redis_cluster_url, cluster, prefix):
    s = open_store(redis_cluster_url, StoreOptions(prefix=prefix))
    try:
        for i in range(30):
            s.update_many([f"h{i}.example", f"ip:192.0.2.{i % 10}"], bump_both)
        by_node = names_on(cluster, prefix)
        assert sum(bool(names) for names in by_node.values()) == 1
        assert len({key_slot(n.encode()) for names in by_node.values() for n in names}) == 1
    finally:
        s.close()


def test_the_slot_groups_of_a_booking_follow_its_rows_slots(redis_cluster_url, sharded):
    keys = ["a.example", "ip:192.0.2.1", "ip:192.0.2.2"]
    groups = sharded.keys.slot_groups(keys)
    slots = [key_slot(sharded.keys.row(k).encode()) for k in keys]
    assert sorted(i for g in groups for i in g) == [0, 1, 2]
    assert [slots[g[0]] for g in groups] == sorted(set(slots))  # locked in the order of the slots
    assert all(len({slots[i] for i in g}) == 1 for g in groups)


# --------------------------------------------------------------------------------------------------
# Atomic bookings over several slots


def test_processes_booking_over_two_slots_lose_no_update(redis_cluster_url, prefix, tmp_path):
    counts, names = run_booking_processes(redis_cluster_url + "?layout=sharded", prefix, tmp_path, 200)
    assert len({key_slot(name.encode()) for name in names}) > 1  # the rows really were in several slots
    assert counts == expected_counts(200)


def test_a_host_whose_addresses_change_keeps_one_row(sharded):
    """The host's row is keyed by the host alone: booked on one address, then another, then on both, it is one
    row, and each address's row counts only its own bookings."""
    sharded.update_many(["a.example", "ip:192.0.2.1"], bump_both)
    sharded.update_many(["a.example", "ip:198.51.100.7"], bump_both)

    def bump_all(states, now):
        return {k: replace(v or HostState(), consec=(v or HostState()).consec + 1) for k, v in states.items()}, None

    sharded.update_many(["a.example", "ip:192.0.2.1", "ip:198.51.100.7"], bump_all)
    assert {k: s.consec for k, s in sharded.items()} == {"a.example": 3, "ip:192.0.2.1": 2, "ip:198.51.100.7": 2}


def test_a_lock_left_by_a_dead_process_blocks_its_rows_for_the_lease_only(sharded, monkeypatch):
    monkeypatch.setattr(redis_sharded, "LOCK_LEASE", 0.5)
    keys = ["a.example", "ip:192.0.2.1"]
    sharded.update_many(keys, bump_both)
    # A process locked the address's row and died before its write.
    name = sharded.keys.row("ip:192.0.2.1")
    reply = sharded.scripts.shard_lock(keys=[name, name + "#done:dead"], args=["dead", 500, "v"])
    assert int(reply[0]) == 1
    started = time.monotonic()
    # Waited for the lease, then booked (a lock held for good would end in StoreBusy).
    assert sharded.update_many(keys, bump_both) == 1
    waited = time.monotonic() - started
    assert waited >= 0.3, waited  # a lower bound: a loaded machine only waits longer
    assert {k: s.consec for k, s in sharded.items()} == {"a.example": 2, "ip:192.0.2.1": 2}
    # Negative control: without a stale lock, the same booking does not wait: its first step books (a count of
    # steps, not a time a loaded machine could stretch).
    assert not isinstance(sharded.update_many_steps(keys, bump_both).step(), Again)


def test_a_single_row_write_waits_for_a_live_lock(sharded, monkeypatch):
    """An optimistic one-slot write (a response's record on the host alone) must not slip under a booking that
    holds the row's lock: it is written after the lock is gone."""
    monkeypatch.setattr(redis_sharded, "LOCK_LEASE", 0.4)
    sharded.update("a.example", bump)
    name = sharded.keys.row("a.example")
    sharded.scripts.shard_lock(keys=[name, name + "#done:other"], args=["other", 400, "v"])
    started = time.monotonic()
    assert sharded.update("a.example", bump) == 1
    assert time.monotonic() - started >= 0.25
    assert sharded.get("a.example").consec == 2


def test_a_lost_reply_over_two_slots_is_applied_once(redis_cluster_url, prefix, sharded):
    other = open_store(redis_cluster_url + "?layout=sharded", StoreOptions(prefix=prefix))
    try:
        keys = ["a.example", "ip:192.0.2.1"]
        sharded.update_many(keys, bump_both)
        real = sharded.server.run_scripts
        lost = [1]

        def lose_the_write_reply(script, calls):
            replies = real(script, calls)
            if script is sharded.scripts.shard_write and lost:
                lost.pop()  # the write (and the store's resend) applied, the reply lost with the connection
                raise StoreUnavailable("reply lost (simulated) after the write was applied")
            return replies

        sharded.server.run_scripts = lose_the_write_reply

        def once(states, now):
            return bump_both(states, now)

        with pytest.raises(StoreUnavailable):
            sharded.update_many(keys, once)  # applied in the first slot at least, but we could not know
        assert sharded.update_many(keys, once) == 1  # the retry finishes it and returns the first result
        other.update_many(keys, bump_both)
        assert {k: s.consec for k, s in other.items()} == {"a.example": 3, "ip:192.0.2.1": 3}
        # Negative control: another update is applied.
        assert sharded.update_many(keys, bump_both) == 3
    finally:
        other.close()


def test_a_write_whose_lock_was_taken_is_not_applied_and_says_so(sharded, monkeypatch):
    """The process stalled past the lease after locking, another update took a row's lock: the write is refused
    in that slot (never written over another's lock), and the caller is told."""
    keys = ["a.example", "ip:192.0.2.1"]
    sharded.update_many(keys, bump_both)
    names = [sharded.keys.row(k) for k in keys]
    order = [names[g[0]] for g in sharded.keys.slot_groups(keys)]
    real = sharded.server.run_scripts

    def steal_then_write(script, calls):
        if script is sharded.scripts.shard_write:  # before the writes: the last slot's lock is taken
            sharded.server.client.hset(order[-1], mapping={"lk": "thief", "lx": str(int(time.time() * 1000) + 60_000)})
        return real(script, calls)

    sharded.server.run_scripts = steal_then_write
    with pytest.raises(StoreError, match="slots only") as info:
        sharded.update_many(keys, bump_both)
    assert "Nothing was sent" in str(info.value)
    sharded.server.client.hdel(order[-1], "lk", "lx")
    states = dict(sharded.items())
    first_key = keys[names.index(order[0])]
    last_key = keys[names.index(order[-1])]
    assert states[first_key].consec == 2 and states[last_key].consec == 1  # the thief's slot untouched


def test_a_node_that_lost_its_scripts_gets_them_again(cluster, sharded):
    keys = ["a.example", "ip:192.0.2.1"]
    sharded.update_many(keys, bump_both)
    for node in cluster.get_primaries():  # a node restarted, or a failover
        cluster.get_redis_connection(node).script_flush()
    assert sharded.update_many(keys, bump_both) == 1
    assert sharded.update("a.example", bump) == 2


def test_a_write_after_its_lock_expired_never_overwrites_a_newer_row(redis_cluster_url, prefix, sharded):
    """The lock lapsed (the process stalled past the lease) and another process wrote the row without waiting:
    the late write is refused there (its versions changed), the other process's update survives."""
    other = open_store(redis_cluster_url + "?layout=sharded", StoreOptions(prefix=prefix))
    try:
        keys = ["a.example", "ip:192.0.2.1"]
        sharded.update_many(keys, bump_both)
        names = [sharded.keys.row(k) for k in keys]
        last = [names[g[0]] for g in sharded.keys.slot_groups(keys)][-1]
        last_key = keys[names.index(last)]
        real = sharded.server.run_scripts

        def lapse_then_write(script, calls):
            if script is sharded.scripts.shard_write:
                sharded.server.client.hdel(last, "lk", "lx")  # the lease ended ...
                other.update(last_key, bump)  # ... and another process wrote the row
            return real(script, calls)

        sharded.server.run_scripts = lapse_then_write
        with pytest.raises(StoreError, match="slots only"):
            sharded.update_many(keys, bump_both)
        assert other.get(last_key).consec == 2  # 1 + the other's; not overwritten by the late write
    finally:
        other.close()
