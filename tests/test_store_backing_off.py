"""``SQLiteStore.backing_off``: the query behind the start-up listing of hosts in backoff (README, "Stats")."""

from __future__ import annotations

from scrapy_polite.policy import HostState
from scrapy_polite.stores import SQLiteStore

NOW = 1_800_000_000.0


def test_backing_off_lists_only_hosts_still_backing_off(tmp_path):
    store = SQLiteStore(str(tmp_path / "pace.sqlite3"))
    try:
        rows = {
            "throttled.example": HostState(next_allowed=NOW + 60, consec=2, updated=NOW),
            "also-throttled.example": HostState(next_allowed=NOW + 1, consec=1, updated=NOW),
            # negative controls: a polite host with the same wait, a backoff that has passed, an address row
            "polite.example": HostState(next_allowed=NOW + 60, consec=0, updated=NOW),
            "passed.example": HostState(next_allowed=NOW - 1, consec=3, updated=NOW),
            "ip:192.0.2.1": HostState(next_allowed=NOW + 60, consec=1, updated=NOW),
        }
        for key, state in rows.items():
            store.update(key, lambda _old, _now, state=state: (state, None))
        listed = list(store.backing_off(NOW))
        assert [key for key, _ in listed] == ["also-throttled.example", "throttled.example"]
        assert dict(listed)["throttled.example"] == rows["throttled.example"]
        # The same answer as filtering every row by hand.
        by_hand = [(k, s) for k, s in store.items()
                   if not k.startswith("ip:") and s.consec > 0 and s.next_allowed > NOW]
        assert listed == by_hand
    finally:
        store.close()
