"""End-to-end adaptive pacing (docs/spec.md §2, "Adaptive pacing"; README "Adaptive pacing"): real Scrapy crawls
with ``POLITE_ADAPTIVE`` against loopback :class:`~tests.support.server.ArrivalServer` hosts whose responses
slow down and recover, judged on the server's arrival log, with the default SQLite pace table.

Latencies are scaled down (20 ms → 400 ms → 20 ms, a floor of 0.1 s) so each test takes seconds.
"""

from __future__ import annotations

import pytest_twisted

from tests.support.crawl import ListSpider, run_crawl
from tests.support.server import Reply, gaps, page, scripted
from tests.test_e2e_pacing import SLACK, TOL, describe, read_row, settings, timeline

FLOOR = 0.1
FAST = 0.02
SLOW = 0.4


def adaptive(tmp_path, **overrides):
    """The add-on with adaptive pacing, a 0.1 s floor and a factor of 2 (SQLite table in ``tmp_path``)."""
    return settings(tmp_path, POLITE_HOST_INTERVAL=FLOOR, POLITE_ADAPTIVE=True, POLITE_ADAPTIVE_FACTOR=2.0,
                    **overrides)


def slow(path_text: str = "slow") -> Reply:
    return Reply.html(f"<p>{path_text}</p>", delay=SLOW)


def fast(path_text: str = "fast") -> Reply:
    return Reply.html(f"<p>{path_text}</p>", delay=FAST)


async def warm_up(arrival_server, tmp_path):
    """One adaptive crawl of another host first, so this process has imported and compiled (a fresh
    virtualenv writes every ``.pyc`` on first import) what an adaptive crawl's first download imports:
    otherwise the first response's ``download_latency`` counts that start-up work too (CI's fresh venv saw
    0.3 s for a 20 ms answer, twice; the second time after a warm-up crawl without POLITE_ADAPTIVE)."""
    warm = arrival_server("127.0.1.79")
    warm.route("/*", fast())
    (tmp_path / "warm").mkdir()
    await run_crawl(ListSpider, adaptive(tmp_path / "warm"), urls=[warm.url(f"/w/{i}") for i in range(2)],
                    timeout=60)


@pytest_twisted.ensureDeferred
async def test_the_interval_rises_with_a_slowing_server_and_falls_back_never_below_the_floor(arrival_server,
                                                                                            tmp_path):
    """20 ms → 400 ms → 20 ms: the idle time the server sees after each response rises towards 2 × the smoothed
    latency (capped by POLITE_ADAPTIVE_MAX = 0.6 s), then falls back to the floor (or to 2 × the latency the
    add-on measures of the fast server, which a loaded machine lengthens)."""
    await warm_up(arrival_server, tmp_path)
    srv = arrival_server("127.0.1.80")
    srv.route("/*", scripted(*[fast()] * 8, *[slow()] * 5, then=fast()))
    urls = [srv.url(f"/p/{i}") for i in range(22)]
    crawler = await run_crawl(ListSpider, adaptive(tmp_path, POLITE_ADAPTIVE_MAX=0.6), urls=urls, timeout=60)
    hits = timeline(srv)
    assert len(hits) == 22 and all(a.status == 200 for a in hits), describe(hits)
    g = gaps(hits)
    row = read_row(f"sqlite:///{tmp_path}/pace.sqlite3", "127.0.1.80")
    assert row is not None
    assert min(g) >= FLOOR - TOL, f"below the floor: {describe(hits)}"
    # The fast server's interval as the add-on measured it in this run: a loaded machine lengthens Scrapy's
    # download_latency (seen: 0.1 s for a 20 ms answer, every gap 0.21 s), and the interval rightly follows.
    fast_interval = max(FLOOR, 2 * row.latency)
    # The median of the three gaps before the slow answers: one timer late on a loaded machine is not a
    # slowdown (a raised interval lengthens all three), and five fast answers before them let a first
    # latency that counted the crawl's start-up (0.3 s) decay to the fast server's (0.3 × 0.7**5 + 0.02 s).
    # Slowed = nearer the cap (0.6 s) than that interval.
    fast_gap = sorted(g[5:8])[1]
    assert fast_gap <= (fast_interval + 0.6) / 2, f"fast server, yet slowed: {describe(hits)}"
    raised = max(g[8:15])
    assert raised >= 0.45, f"the interval did not rise with the latency: {describe(hits)}"
    assert raised <= 0.6 + SLACK, f"above POLITE_ADAPTIVE_MAX: {describe(hits)}"
    # Fallen back = the last gaps within a third of the way from the fast start's (same server, same machine, same
    # run) to the raised: after 6-8 fast answers the smoothed latency keeps 0.7**6 of the slow phase's, about 0.05 s.
    assert min(g[-3:]) <= fast_gap + (raised - fast_gap) / 3, f"the interval did not fall back: {describe(hits)}"
    # The row's smoothed latency is the fast answers' again, as this crawl measured them (Scrapy's
    # download_latency, which a loaded machine lengthens): an average with weight 0.3 on the newest is at most
    # 0.7**k of what it was plus the largest of its last k samples. Not decayed, it would keep the slow answers' 0.4 s.
    measured = [f.latency for f in crawler.spider.fetched if f.latency is not None]
    assert len(measured) == 22
    after_slow = len(measured) - 13
    bound = 0.7 ** after_slow * max(measured) + max(measured[-after_slow:])
    assert 0 < row.latency <= bound + 1e-6, (row.latency, bound, measured)
    assert row.strain == 0


@pytest_twisted.ensureDeferred
async def test_a_second_crawl_on_the_table_starts_at_the_raised_interval(arrival_server, tmp_path):
    """The smoothed latency is in the host's row: a later crawl (another process would read the same row) paces
    the host at the raised interval from its first request, though the server is now fast."""
    srv = arrival_server("127.0.1.81")
    srv.route("/*", scripted(*[slow()] * 4, then=fast()))
    await run_crawl(ListSpider, adaptive(tmp_path), urls=[srv.url(f"/a/{i}") for i in range(4)], timeout=60)
    row = read_row(f"sqlite:///{tmp_path}/pace.sqlite3", "127.0.1.81")
    assert row is not None and row.latency >= 0.3
    srv.clear()
    await run_crawl(ListSpider, adaptive(tmp_path), urls=[srv.url(f"/b/{i}") for i in range(3)], timeout=60)
    hits = timeline(srv)
    assert len(hits) == 3, describe(hits)
    # After one 20 ms answer the smoothed latency is still >= 0.7 × 0.3 s: the next interval >= 0.42 s.
    from_table = gaps(hits)[0]
    assert from_table >= 0.4 - TOL, describe(hits)

    # Negative control: a fresh table, the same fast server: the interval of its own first latency (the floor,
    # 2 × a load-lengthened 20 ms answer), shorter than the gap above, so that gap is the table's doing (a load
    # that lengthens the answers lengthens both: 2 × m here, 2 × (0.7 × 0.3 + 0.3 × m) above).
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    srv.clear()
    await run_crawl(ListSpider, adaptive(fresh), urls=[srv.url(f"/c/{i}") for i in range(3)], timeout=60)
    hits = timeline(srv)
    assert len(hits) == 3 and gaps(hits)[0] < from_table - TOL, describe(hits)


@pytest_twisted.ensureDeferred
async def test_retry_after_wins_over_a_shorter_adaptive_interval(arrival_server, tmp_path):
    """Slow answers raise the interval to about 0.5 s; a 429 with Retry-After: 1.5 then holds the host 1.5 s."""
    srv = arrival_server("127.0.1.82")
    srv.route("/*", scripted(*[slow()] * 3, Reply.throttle(429, "1.5"), then=page()))
    await run_crawl(ListSpider, adaptive(tmp_path), urls=[srv.url(f"/p/{i}") for i in range(5)], timeout=60)
    hits = timeline(srv)
    assert [a.status for a in hits] == [200, 200, 200, 429, 200, 200], describe(hits)
    g = gaps(hits)
    assert max(g[:3]) >= 0.4, f"the adaptive interval did not rise: {describe(hits)}"
    assert g[3] >= 1.5 - TOL, f"Retry-After not honoured: {describe(hits)}"
    assert g[3] <= 1.5 + SLACK, describe(hits)
