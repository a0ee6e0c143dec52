"""The Redis pace table on a real Redis Cluster (scrapy_polite.stores.redis, docs/spec.md §6 "Redis Cluster").

Three ``redis-server --cluster-enabled yes`` on loopback (``.ci/run`` starts them and exports
``$POLITE_TEST_REDIS_CLUSTER_URL``; else tests/support/redis_cluster.py starts them). The protocol suite runs on
the cluster too (the ``redis-cluster`` entry of tests/support/stores.py); here: the URL form, the cluster
client, every key of a table in the one slot of its hash tag (on whichever node holds it), the wrong kind of
URL refused at start, the resend of a lost reply, and processes sharing a table on the cluster.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from scrapy_polite.policy import HostState
from scrapy_polite.stores import Event, StoreError, StoreOptions, StoreUnavailable, open_store, registered_schemes
from scrapy_polite.stores.redis import RedisStore, redact_uri
from scrapy_polite.stores.redis.uri import cluster_nodes as _cluster_nodes
from tests.support.redis_cluster import node_ports, redis_cluster_url  # noqa: F401
from tests.support.redis_server import free_port, redis_url, unique_prefix  # noqa: F401
from tests.support.redis_updates import (  # noqa: F401
    bump,
    check_a_retry_after_unavailable_is_applied_once,
    cluster,
    expected_counts,
    run_booking_processes,
)


def tagged_prefix(cluster, node):
    """A prefix with its own hash tag whose slot ``node`` holds (so the table lives on that node)."""
    for i in range(100_000):
        tag = f"t{i}-{unique_prefix('c').split(':')[2]}"
        if cluster.get_node_from_key("{" + tag + "}") == node:
            return "{" + tag + "}:"
    raise AssertionError("no tag found for the node")


@pytest.fixture
def prefixes(cluster):
    """One prefix per primary, each table on its node; their keys are deleted afterwards."""
    made = [tagged_prefix(cluster, node) for node in cluster.get_primaries()]
    yield made
    for prefix in made:
        conn = cluster.get_redis_connection(cluster.get_node_from_key(prefix))
        names = list(conn.scan_iter(match=prefix + "*", count=1000))
        if names:
            conn.delete(*names)


def test_cluster_schemes_are_registered():
    assert {"redis+cluster", "rediss+cluster"} <= set(registered_schemes())


def test_the_cluster_url_names_its_nodes():
    assert _cluster_nodes("redis+cluster://h1:7000,h2:7001,[::1]:7002") == (
        "redis://h1:7000", [("h2", 7001), ("::1", 7002)])
    assert _cluster_nodes("rediss+cluster://u:pw@h1,h2:7001/0?ssl_ca_certs=/ca.pem") == (
        "rediss://u:pw@h1:6379?ssl_ca_certs=/ca.pem", [("h2", 7001)])
    for bad in ("redis+cluster://", "redis+cluster://h1:port", "redis+cluster://h1:7000/3"):
        with pytest.raises(ValueError):
            _cluster_nodes(bad)
        with pytest.raises(StoreError, match="Fix:"):
            open_store(bad)
    assert redact_uri("redis+cluster://:s3cret@h1:7000,h2:7001") == "redis+cluster://:***@h1:7000,h2:7001"


def test_open_store_builds_a_store_on_the_cluster_client(redis_cluster_url, prefixes):
    s = open_store(redis_cluster_url, StoreOptions(prefix=prefixes[0]))
    try:
        assert isinstance(s, RedisStore) and s.cluster and isinstance(s.server.client, RedisCluster)
        assert s.uri == redis_cluster_url and s.server_clock
        assert abs(s.now() - time.time()) < 5
    finally:
        s.close()


def test_a_table_on_each_node_keeps_its_keys_in_one_slot(redis_cluster_url, cluster, prefixes):
    primaries = cluster.get_primaries()
    assert len(primaries) == 3  # a real cluster of three nodes, every table below on another node
    for prefix, node in zip(prefixes, primaries):
        s = open_store(redis_cluster_url, StoreOptions(prefix=prefix))
        try:
            now = s.now()
            s.update("a.example", bump)
            s.update_many(["a.example", "ip:192.0.2.1"],
                          lambda states, now: ({k: replace(v or HostState(), consec=9, updated=now)
                                                for k, v in states.items()}, None))
            s.update("old.example", lambda old, now: (HostState(next_allowed=1.0, updated=1.0), None))
            s.append_events([Event(at=now, kind="booking", host="a.example")])
            assert s.read(["a.example", "ip:192.0.2.1"]).states["ip:192.0.2.1"].consec == 9
            assert [k for k, _ in s.items()] == ["a.example", "ip:192.0.2.1", "old.example"]
            assert [e.host for e in s.events()] == ["a.example"]
            assert s.expire(now - 60) == 1 and [k for k, _ in s.items()] == ["a.example", "ip:192.0.2.1"]
            assert s.delete("ip:192.0.2.1") and not s.delete("ip:192.0.2.1")
            conn = cluster.get_redis_connection(node)
            names = [n.decode() for n in conn.scan_iter(match=prefix + "*")]
            assert {n.partition("#")[0] for n in names} >= {f"{prefix}{{pace}}", f"{prefix}{{pace}}:a.example"}
            assert any("#done:" in n for n in names) and any(n.endswith("#events") for n in names)
            assert len({key_slot(n.encode()) for n in names}) == 1  # rows, counter, records, events: one slot
            # Negative control: the other nodes hold none of them, and refuse them (MOVED): the client really
            # followed the slot to its node.
            for other in primaries:
                if other != node:
                    other_conn = cluster.get_redis_connection(other)
                    assert list(other_conn.scan_iter(match=prefix + "*")) == []
                    with pytest.raises(redis.exceptions.MovedError):
                        other_conn.hgetall(f"{prefix}{{pace}}:a.example")
        finally:
            s.close()


def test_the_default_prefix_shares_the_tag_pace(redis_cluster_url, cluster):
    prefix = unique_prefix("cl")
    s = open_store(redis_cluster_url, StoreOptions(prefix=prefix))
    try:
        s.update("a.example", bump)
        s.update("b.example", bump)
        slot = cluster.keyslot("{pace}")
        assert cluster.keyslot(f"{prefix}{{pace}}:a.example") == slot == cluster.keyslot(f"{prefix}{{pace}}")
        assert [k for k, _ in s.items()] == ["a.example", "b.example"]
    finally:
        conn = cluster.get_redis_connection(cluster.get_node_from_key("{pace}"))
        names = list(conn.scan_iter(match=prefix + "*"))
        if names:
            conn.delete(*names)
        s.close()


def test_a_lost_reply_on_the_cluster_is_not_applied_twice(redis_cluster_url, prefixes):
    s = open_store(redis_cluster_url, StoreOptions(prefix=prefixes[1]))
    other = open_store(redis_cluster_url, StoreOptions(prefix=prefixes[1]))
    try:
        check_a_retry_after_unavailable_is_applied_once(s, other)
    finally:
        s.close()
        other.close()


def test_a_redis_url_naming_a_cluster_node_is_refused_at_start(redis_cluster_url):
    host, port = node_ports(redis_cluster_url)[0]
    with pytest.raises(StoreError, match="redis\\+cluster://") as info:
        open_store(f"redis://{host}:{port}/0")
    assert "Fix:" in str(info.value)


def test_a_cluster_url_naming_a_single_server_is_refused_at_start(redis_url):
    host_port = redis_url.split("://", 1)[1].split("/", 1)[0]
    with pytest.raises(StoreError, match="not part of a Redis Cluster") as info:
        open_store(f"redis+cluster://{host_port}")
    assert "Fix: use redis://" in str(info.value)


def test_an_unreachable_cluster_at_start_names_the_url_and_the_fix():
    url = f"redis+cluster://:s3cret@127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    with pytest.raises(StoreError) as info:
        open_store(url, StoreOptions(timeout=1.0))
    message = str(info.value)
    assert "s3cret" not in message and "127.0.0.1" in message and "Fix:" in message
    assert not isinstance(info.value, StoreUnavailable)


def test_one_reachable_node_of_the_url_is_enough(redis_cluster_url, prefixes):
    (host, port), *_ = node_ports(redis_cluster_url)
    s = open_store(f"redis+cluster://127.0.0.1:{free_port()},{host}:{port}", StoreOptions(prefix=prefixes[2],
                                                                                        timeout=1.0))
    try:
        s.update("a.example", bump)
        assert s.get("a.example").consec == 1
    finally:
        s.close()


def test_processes_sharing_a_table_on_the_cluster_lose_no_update(redis_cluster_url, prefixes, tmp_path):
    counts, _ = run_booking_processes(redis_cluster_url, prefixes[0], tmp_path, 300)
    assert counts == expected_counts(300)


def test_a_stopped_cluster_is_unavailable_then_back():
    """The whole cluster down mid-crawl is an outage to wait out (StoreUnavailable, not a fatal error), and the
    same store works again once its nodes are back (the client relearns the slots; a node that lost its
    scripts gets them again)."""
    from tests.support.redis_cluster import LocalCluster

    with LocalCluster() as local:
        s = open_store(local.url, StoreOptions(prefix="t:", timeout=1.0))
        try:
            s.update("a.example", bump)
            local.stop()
            for _ in range(2):
                with pytest.raises(StoreUnavailable, match="Fix:"):
                    s.update("a.example", bump)
                with pytest.raises(StoreUnavailable):
                    s.read(["a.example"])
            local.restart()  # the nodes keep their slots; their data was not persisted
            deadline = time.monotonic() + 30
            while True:
                try:
                    s.update("a.example", bump)
                    break
                except StoreUnavailable:
                    assert time.monotonic() < deadline, "the store never came back"
                    time.sleep(0.2)
            assert s.get("a.example").consec == 1
            s.update("a.example", bump)
            assert s.get("a.example").consec == 2
        finally:
            s.close()
