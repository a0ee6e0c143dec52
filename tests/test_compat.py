"""Tests of scrapy_polite._compat, the one module that uses private Scrapy/Twisted API, and of the dependency
floors it is checked against (tests/constraints-lowest.txt, tox env ``lowest``).

* the pinned agent: a request goes to the booked address (not to what the URL's host resolves to), keeps the
  URL's host in the Host header, and the shared keep-alive pool never hands a connection to one address to
  a request for another (nor across local bind addresses), while it does reuse one for the same address;
* the server-side failure types (DNS failures are not among them);
* waking the engine (and doing nothing when there is no engine slot);
* the Protego floor: a unit-less ``Request-rate`` is read in seconds.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import pytest_twisted
from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
)
from twisted.internet import error as txerror
from twisted.web.client import (
    BrowserLikePolicyForHTTPS,
    HTTPConnectionPool,
    ResponseFailed,
    ResponseNeverReceived,
    readBody,
)

from scrapy_polite._compat import pinned_agent, server_side_failure_types, stats_incrementer, wake_engine
from scrapy_polite.policy.robots import parse_robots_delay
from scrapy_polite.reports.counters import Report
from tests.support.server import ArrivalServer, Reply, always

# Twisted warns when a response's transport lacks abortConnection (its own proxy transport): not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")


@pytest.fixture
def two_addresses():
    """ArrivalServers on 127.0.0.2 and 127.0.0.3 on one port number, answering with their own address."""
    started: list[ArrivalServer] = []
    for _ in range(20):
        try:
            first = ArrivalServer("127.0.0.2")
            started.append(first)
            started.append(ArrivalServer("127.0.0.3", port=first.port))
            break
        except OSError:  # that port is taken on 127.0.0.3: try another one
            for srv in started:
                srv.stop()
            started.clear()
    assert len(started) == 2, "no common free port on 127.0.0.2 and 127.0.0.3"
    for srv in started:
        srv.route("/*", always(Reply.text(srv.address)))
    yield started
    for srv in started:
        srv.stop()


async def _get(agent, url: str) -> bytes:
    response = await agent.request(b"GET", url.encode())
    return await readBody(response)


def _agent(pool: HTTPConnectionPool, address: str, bind_address: tuple[str, int] | None = None):
    from twisted.internet import reactor

    return pinned_agent(reactor=reactor, address=address, context_factory=BrowserLikePolicyForHTTPS(),
                        connect_timeout=5.0, bind_address=bind_address, pool=pool)


@pytest_twisted.ensureDeferred
async def test_pinned_agent_connects_to_the_booked_address_and_keeps_the_host_name(two_addresses):
    from twisted.internet import reactor

    low, high = two_addresses
    pool = HTTPConnectionPool(reactor, persistent=True)
    try:
        # pinned.invalid resolves nowhere: only the pinned address can be reached.
        assert await _get(_agent(pool, "127.0.0.3"), f"http://pinned.invalid:{low.port}/a") == b"127.0.0.3"
    finally:
        await pool.closeCachedConnections()
    assert [(a.host, a.path) for a in high.arrivals()] == [("pinned.invalid", "/a")]
    assert low.arrivals() == []  # negative control: the other address of the same port saw nothing


@pytest_twisted.ensureDeferred
async def test_pinned_agent_pool_never_reuses_a_connection_across_addresses(two_addresses):
    from twisted.internet import reactor

    low, high = two_addresses
    url = f"http://pinned.invalid:{low.port}/"
    pool = HTTPConnectionPool(reactor, persistent=True)
    try:
        bodies = [await _get(_agent(pool, address), url) for address in ("127.0.0.2", "127.0.0.3", "127.0.0.2")]
    finally:
        await pool.closeCachedConnections()
    assert bodies == [b"127.0.0.2", b"127.0.0.3", b"127.0.0.2"]
    assert len(high.arrivals()) == 1  # not served on the pooled connection to 127.0.0.2
    first, again = low.arrivals()
    assert first.client_port == again.client_port  # the same address does reuse its keep-alive connection


@pytest_twisted.ensureDeferred
async def test_pinned_agent_builds_its_endpoint_only_to_connect(two_addresses, monkeypatch):
    # Agent asks for an endpoint per request; the HostnameEndpoint (an IDNA encoding each, and the resolver's
    # check at connect time) is built only when a connection is made, never for a kept-alive connection.
    from twisted.internet import reactor
    from twisted.internet.endpoints import HostnameEndpoint

    from scrapy_polite import _compat

    built: list[str] = []

    class Counted(HostnameEndpoint):
        def __init__(self, reactor_, host, port, **kwargs):
            built.append(host)
            super().__init__(reactor_, host, port, **kwargs)

    monkeypatch.setattr(_compat, "HostnameEndpoint", Counted)
    low, _high = two_addresses
    url = f"http://pinned.invalid:{low.port}/"
    pool = HTTPConnectionPool(reactor, persistent=True)
    try:
        assert [await _get(_agent(pool, "127.0.0.2"), url) for _ in range(3)] == [b"127.0.0.2"] * 3
        assert built == ["127.0.0.2"]  # three requests, one connection, one endpoint built
    finally:
        await pool.closeCachedConnections()
    # Negative control: a new connection (the pool emptied) builds its endpoint again.
    pool = HTTPConnectionPool(reactor, persistent=True)
    try:
        assert await _get(_agent(pool, "127.0.0.2"), url) == b"127.0.0.2"
    finally:
        await pool.closeCachedConnections()
    assert built == ["127.0.0.2", "127.0.0.2"]
    assert len({a.client_port for a in low.arrivals()}) == 2


@pytest_twisted.ensureDeferred
async def test_pinned_agent_pool_keys_by_local_bind_address(two_addresses):
    from twisted.internet import reactor

    low, _ = two_addresses
    url = f"http://pinned.invalid:{low.port}/"
    pool = HTTPConnectionPool(reactor, persistent=True)
    try:
        for bind in (None, ("127.0.0.5", 0), None, ("127.0.0.5", 0)):
            assert await _get(_agent(pool, "127.0.0.2", bind), url) == b"127.0.0.2"
    finally:
        await pool.closeCachedConnections()
    # The log is in completion order, and a server thread can log its answer after the next connection's:
    # in request order (start), a connection is its (client address, client port).
    conns = [(a.client_host, a.client_port) for a in sorted(low.arrivals(), key=lambda a: a.start)]
    assert len(conns) == 4 and conns[0] == conns[2] and conns[1] == conns[3], conns
    assert conns[1][0] == "127.0.0.5" and conns[0][0] != "127.0.0.5", conns  # each went out from its bind address
    assert conns[0] != conns[1]  # one connection per bind address, none shared between them


def test_server_side_failure_types_are_twisted_and_scrapy_connection_errors():
    types = server_side_failure_types()
    for cls in (txerror.TimeoutError, txerror.TCPTimedOutError, txerror.ConnectionRefusedError,
                txerror.ConnectionLost, txerror.ConnectionDone, txerror.ConnectError, ResponseFailed,
                ResponseNeverReceived, DownloadTimeoutError, DownloadConnectionRefusedError, DownloadFailedError):
        assert cls in types, cls
    assert isinstance(txerror.TCPTimedOutError(), types)


def test_dns_failures_are_not_server_side():
    types = server_side_failure_types()
    assert not isinstance(txerror.DNSLookupError(), types)
    assert not isinstance(CannotResolveHostError(), types)
    assert not isinstance(ValueError(), types)


def _engine(*, slot: bool = True, scraper_open: bool = True, calls: list[str]) -> SimpleNamespace:
    """A stand-in engine: its ``_slot.nextcall`` records each schedule; its scraper has a slot once open."""
    nextcall = SimpleNamespace(schedule=lambda: calls.append("schedule"))
    return SimpleNamespace(_slot=SimpleNamespace(nextcall=nextcall) if slot else None,
                           scraper=SimpleNamespace(slot=object() if scraper_open else None))


def test_wake_engine_schedules_the_engines_next_call():
    calls: list[str] = []
    wake_engine(SimpleNamespace(engine=_engine(calls=calls)))  # type: ignore[arg-type]
    assert calls == ["schedule"]


@pytest.mark.parametrize("state", ["no engine", "spider not open", "scraper not open"])
def test_wake_engine_does_nothing_before_the_spider_is_open(state):
    """Trial: a resumed JOBDIR woke the engine while it waited for the scheduler's ``open``, before its scraper had a
    slot, and Scrapy's ``needs_backout`` asserted. The control is the test above."""
    calls: list[str] = []
    engine = None if state == "no engine" else _engine(slot=state != "spider not open",
                                                        scraper_open=state != "scraper not open", calls=calls)
    wake_engine(SimpleNamespace(engine=engine))  # type: ignore[arg-type]
    assert calls == []


@pytest.mark.parametrize(("line", "expected"), [
    ("Request-rate: 1/20", 20.0),  # Protego < 0.6.1: 2.0 (the last digit taken for a unit)
    ("Request-rate: 5/1", 0.2),  # Protego < 0.6.1: None
    ("Request-rate: 1/20s", 20.0),
    ("Request-rate: 1/1m", 60.0),
])
def test_protego_floor_reads_request_rates_in_seconds(line, expected):
    assert parse_robots_delay(f"User-agent: *\n{line}\n", "bot") == pytest.approx(expected)


class _RefusingPolicy:
    """An ``IPolicyForHTTPS`` whose TLS setup fails for every host (as a bad TLS setting would)."""

    def creatorForNetloc(self, hostname: bytes, port: int):  # noqa: N802 - Twisted's interface
        raise ValueError(f"no TLS for {hostname!r}")


def test_the_pinned_h2_agent_builds_its_endpoint_at_once():
    # Scrapy's H2ConnectionPool marks a key pending before it connects: an endpoint whose build fails must fail
    # the request at once, never at connect time, or every later request of that key would wait on the
    # pending entry until its download timeout.
    pytest.importorskip("h2")
    from twisted.internet import reactor
    from twisted.web.client import URI

    from scrapy_polite._compat import _PinnedEndpointFactory, _PinnedH2Agent

    uri = URI.fromBytes(b"https://a.example.com/")
    agent = _PinnedH2Agent(reactor=reactor, pool=None, context_factory=_RefusingPolicy(),
                           connect_timeout=5.0, bind_address=None, address="127.0.0.1")
    with pytest.raises(ValueError, match="no TLS"):
        agent.get_endpoint(uri)
    # Negative control: HTTP/1.1's factory defers the build to the connect (Twisted's pool keeps nothing
    # pending before it), so asking for the endpoint does not fail; building it does.
    factory = _PinnedEndpointFactory(reactor=reactor, address="127.0.0.1", context_factory=_RefusingPolicy(),
                                     connect_timeout=5.0, bind_address=None)
    assert "a.example.com" in repr(factory.endpointForURI(uri))
    with pytest.raises(ValueError, match="no TLS"):
        factory.build(uri)


def test_the_pinned_agent_is_reused_for_the_same_address_bind_address_and_timeout():
    # A Twisted Agent is meant to be reused: a page of a known (address, bind address, connect timeout) gets the
    # agent built for the first one; any other of the three gets its own (so its own pool key and endpoint).
    from scrapy import Request
    from twisted.internet import reactor

    from scrapy_polite import _compat

    pool = HTTPConnectionPool(reactor, persistent=True)
    cache: dict = {}

    def agent_for(meta: dict, timeout: float = 5.0):
        scrapy_agent = _compat._PinnedScrapyAgent(contextFactory=BrowserLikePolicyForHTTPS(), pool=pool,
                                                  crawler=SimpleNamespace())  # type: ignore[arg-type]
        scrapy_agent.pinned_agents = cache
        return scrapy_agent._get_agent(Request("http://a.example/", meta=meta), timeout)

    first = agent_for({"polite_ip": "127.0.0.2"})
    assert agent_for({"polite_ip": "127.0.0.2"}) is first
    others = [agent_for({"polite_ip": "127.0.0.3"}), agent_for({"polite_ip": "127.0.0.2", "bindaddress": "127.0.0.5"}),
              agent_for({"polite_ip": "127.0.0.2"}, timeout=6.0)]
    assert len({id(a) for a in (first, *others)}) == 4
    assert set(cache) == {("127.0.0.2", None, 5.0), ("127.0.0.3", None, 5.0), ("127.0.0.2", ("127.0.0.5", 0), 5.0),
                          ("127.0.0.2", None, 6.0)}
    # Negative control: a request not booked on an address gets Scrapy's own agent, never a cached one.
    assert agent_for({}) not in (first, *others) and len(cache) == 4


def test_stats_are_added_as_inc_value_adds_them_and_other_collectors_get_their_own_calls():
    """Scrapy's own collectors are added to directly (no Python __getattribute__ per call in Scrapy 2.19), to the same
    values as their ``inc_value``, also after ``set_stats`` replaced their dict. Negative control: a project's
    collector (a subclass) gets its own ``inc_value`` call for every count."""
    from scrapy.settings import Settings  # noqa: PLC0415
    from scrapy.statscollectors import MemoryStatsCollector, StatsCollector  # noqa: PLC0415

    crawler = SimpleNamespace(settings=Settings())
    for cls in (StatsCollector, MemoryStatsCollector):
        fast, slow = cls(crawler), cls(crawler)
        inc = stats_incrementer(fast)
        for key, count in (("polite/requests", 1), ("polite/requests", 1), ("polite/wait_seconds", 0.25)):
            inc(key, count)
            slow.inc_value(key, count)
        assert fast.get_stats() == slow.get_stats() == {"polite/requests": 2, "polite/wait_seconds": 0.25}
        fast.set_stats({"polite/requests": 5})
        inc("polite/requests", 1)
        assert fast.get_stats() == {"polite/requests": 6}

    class ProjectStats(MemoryStatsCollector):
        def __init__(self, crawler):
            super().__init__(crawler)
            self.calls = []

        def inc_value(self, key, count=1, start=0, spider=None):
            self.calls.append((key, count))
            super().inc_value(key, count, start)

    own = ProjectStats(crawler)
    report = Report(own)
    report.inc("requests")
    report.inc("wait_seconds", 0.5)
    assert own.calls == [("polite/requests", 1), ("polite/wait_seconds", 0.5)]
    assert own.get_value("polite/requests") == 1
