"""End-to-end: per-spider, per-host and per-request overrides, ``dont_pace``, and the start-up checks
(docs/spec.md §2, §5, §6): a real Scrapy crawl against loopback servers, asserted on the server-side arrival log."""

from __future__ import annotations

import pytest
import pytest_twisted

from scrapy_polite.settings import SettingsError
from scrapy_polite.stores import StoreError
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.server import gaps

TOL = 0.02


def settings(**overrides):
    """The add-on with a 0.2 s host interval and no per-IP pacing: overrides are what makes gaps longer."""
    return polite_settings(**{"POLITE_HOST_INTERVAL": 0.2, "POLITE_IP_INTERVAL": 0, **overrides})


def hits(srv):
    return sorted((a for a in srv.arrivals() if a.path != "/robots.txt"), key=lambda a: a.start)


class SlowSpider(ListSpider):
    crawl_delay = 0.8  # seconds, for every host of this spider


@pytest_twisted.ensureDeferred
async def test_spider_crawl_delay_attribute(arrival_server):
    srv = arrival_server("127.0.3.10")
    await run_crawl(SlowSpider, settings(), urls=[srv.url(f"/p/{i}") for i in range(4)])
    got = gaps(hits(srv))
    assert len(got) == 3 and min(got) >= 0.8 - TOL, got


@pytest_twisted.ensureDeferred
async def test_spider_attribute_negative_control(arrival_server):
    """The same crawl with the plain ListSpider is paced by the 0.2 s interval only (the test above can fail)."""
    srv = arrival_server("127.0.3.11")
    await run_crawl(ListSpider, settings(), urls=[srv.url(f"/p/{i}") for i in range(4)])
    got = gaps(hits(srv))
    assert min(got) >= 0.2 - TOL and max(got) < 0.6, got


class CustomSettingsSpider(ListSpider):
    custom_settings = {"POLITE_HOST_INTERVAL": 0.7}


@pytest_twisted.ensureDeferred
async def test_custom_settings_per_spider(arrival_server):
    srv = arrival_server("127.0.3.12")
    await run_crawl(CustomSettingsSpider, settings(), urls=[srv.url(f"/p/{i}") for i in range(4)])
    got = gaps(hits(srv))
    assert min(got) >= 0.7 - TOL, got


@pytest_twisted.ensureDeferred
async def test_host_delays_apply_to_their_host_only(arrival_server):
    slow = arrival_server("127.0.3.13")
    fast = arrival_server("127.0.3.14")
    urls = [s.url(f"/p/{i}") for i in range(4) for s in (slow, fast)]
    await run_crawl(ListSpider, settings(POLITE_HOST_DELAYS={"127.0.3.13": 0.9}), urls=urls)
    slow_gaps, fast_gaps = gaps(hits(slow)), gaps(hits(fast))
    assert min(slow_gaps) >= 0.9 - TOL, slow_gaps
    assert max(fast_gaps) < 0.6, fast_gaps  # negative control: the other host keeps the base interval


@pytest_twisted.ensureDeferred
async def test_meta_polite_delay_slows_the_next_request(arrival_server):
    srv = arrival_server("127.0.3.15")
    urls = [(srv.url("/expensive"), {"polite_delay": 1.0}), srv.url("/after")]
    await run_crawl(ListSpider, settings(), urls=urls, priority=0)
    timeline = hits(srv)
    assert [a.path for a in timeline][0] in ("/expensive", "/after")
    by_path = {a.path: a for a in timeline}
    if timeline[0].path == "/expensive":
        assert by_path["/after"].start - by_path["/expensive"].end >= 1.0 - TOL
    else:  # /after went first: the expensive page is paced by the base interval only
        assert by_path["/expensive"].start - by_path["/after"].end >= 0.2 - TOL


@pytest_twisted.ensureDeferred
async def test_invalid_meta_polite_delay_is_counted_and_ignored(arrival_server):
    srv = arrival_server("127.0.3.16")
    crawler = await run_crawl(ListSpider, settings(), urls=[srv.url("/a"), srv.url("/b")],
                              meta={"polite_delay": "soon"})
    assert len(hits(srv)) == 2
    assert crawler.stats.get_value("polite/invalid_meta") >= 1
    assert min(gaps(hits(srv))) >= 0.2 - TOL  # still paced


@pytest_twisted.ensureDeferred
async def test_dont_pace_exempts_and_counts(arrival_server):
    srv = arrival_server("127.0.3.17")
    crawler = await run_crawl(ListSpider, settings(POLITE_HOST_INTERVAL=2.0),
                              urls=[srv.url(f"/p/{i}") for i in range(4)], meta={"dont_pace": True})
    timeline = hits(srv)
    assert len(timeline) == 4
    assert timeline[-1].start - timeline[0].start < 1.0  # four requests inside one 2 s interval
    assert crawler.stats.get_value("polite/dont_pace") == 4


@pytest_twisted.ensureDeferred
async def test_negative_interval_stops_the_crawl_at_start(arrival_server):
    srv = arrival_server("127.0.3.18")
    with pytest.raises(SettingsError, match="POLITE_HOST_INTERVAL"):
        await run_crawl(ListSpider, settings(POLITE_HOST_INTERVAL=-1), urls=[srv.url("/")])
    assert srv.arrivals() == []


@pytest_twisted.ensureDeferred
async def test_unwritable_store_stops_the_crawl_at_start(arrival_server, tmp_path):
    srv = arrival_server("127.0.3.19")
    (tmp_path / "file").write_text("a file where a directory should be")
    with pytest.raises(StoreError, match="Fix:") as info:
        await run_crawl(ListSpider, settings(POLITE_STORE=f"sqlite:///{tmp_path}/file/pace.sqlite3"),
                        urls=[srv.url("/")])
    assert str(tmp_path / "file") in str(info.value)
    assert srv.arrivals() == []


@pytest_twisted.ensureDeferred
async def test_corrupt_store_stops_the_crawl_at_start(arrival_server, tmp_path):
    srv = arrival_server("127.0.3.20")
    path = tmp_path / "pace.sqlite3"
    path.write_bytes(b"this is not a SQLite database" * 100)
    with pytest.raises(StoreError, match="move it away"):
        await run_crawl(ListSpider, settings(POLITE_STORE=f"sqlite:///{path}"), urls=[srv.url("/")])
    assert srv.arrivals() == []
    assert path.read_bytes().startswith(b"this is not")  # never discarded


class DnsSpider(ListSpider):
    custom_settings = {"POLITE_DNS_OVERRIDES": {"spider.test": ["127.0.3.22"]}, "POLITE_DNS_TIMEOUT": 2}


@pytest_twisted.ensureDeferred
async def test_a_spider_s_dns_settings_are_said_not_to_be_used(arrival_server, caplog):
    """Trial: a spider's ``POLITE_DNS_OVERRIDES`` (the DNS settings are per process) was ignored without a word, and
    its lookups failed. One WARNING names them; the control: a spider without them is not warned."""
    import logging

    srv = arrival_server("127.0.3.22")
    caplog.set_level(logging.WARNING)
    await run_crawl(DnsSpider, settings(), urls=[srv.url("/")])
    warned = [r.getMessage() for r in caplog.records if "DNS settings are per process" in r.getMessage()]
    assert len(warned) == 1 and "POLITE_DNS_OVERRIDES, POLITE_DNS_TIMEOUT in the spider" in warned[0], warned
    caplog.clear()
    await run_crawl(ListSpider, settings(), urls=[srv.url("/again")])
    assert not [r for r in caplog.records if "DNS settings are per process" in r.getMessage()]


class WideningSpider(ListSpider):
    custom_settings = {"POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8", "10.0.0.0/8"]}


@pytest_twisted.ensureDeferred
async def test_spider_cannot_widen_the_process_address_rules(arrival_server, caplog):
    """The resolver is per process: a spider allowing 10.0.0.0/8 on top of the process's 127.0.0.0/8 is warned
    that 10.0.0.0/8 stays refused; a spider repeating the process's networks is not (negative control)."""
    import logging

    srv = arrival_server("127.0.3.21")
    caplog.set_level(logging.WARNING)
    process = settings(POLITE_ALLOWED_NETWORKS=["127.0.0.0/8"])
    await run_crawl(WideningSpider, process, urls=[srv.url("/")])
    warned = [r.getMessage() for r in caplog.records if "beyond the process-wide resolver" in r.getMessage()]
    assert len(warned) == 1 and "10.0.0.0/8" in warned[0] and "127.0.0.0/8" not in warned[0].split("allow ")[1].split(",")[0], warned
    caplog.clear()
    await run_crawl(ListSpider, process, urls=[srv.url("/again")])
    assert not [r for r in caplog.records if "beyond the process-wide resolver" in r.getMessage()]


@pytest_twisted.ensureDeferred
async def test_an_allowed_network_holding_public_addresses_is_warned_about(arrival_server, caplog):
    """Trial: ``POLITE_ALLOWED_NETWORKS = ["0.0.0.0/0"]`` was accepted without a word, though public addresses need no
    entry and it admits every private one. One WARNING names it at start, and the crawl runs as configured; the
    control: loopback alone is not warned about."""
    import logging

    srv = arrival_server("127.0.3.23")
    caplog.set_level(logging.WARNING)
    crawler = await run_crawl(ListSpider, settings(POLITE_ALLOWED_NETWORKS=["0.0.0.0/0", "::1/128"]),
                              urls=[srv.url("/")])
    warned = [r.getMessage() for r in caplog.records if "network that holds public addresses too" in r.getMessage()]
    assert len(warned) == 1 and "admits 0.0.0.0/0:" in warned[0], warned
    assert crawler.stats.get_value("downloader/response_status_count/200") == 1
    caplog.clear()
    await run_crawl(ListSpider, settings(POLITE_ALLOWED_NETWORKS=["127.0.0.0/8", "::1/128"]), urls=[srv.url("/again")])
    assert not [r for r in caplog.records if "public addresses too" in r.getMessage()]
