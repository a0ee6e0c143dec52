"""A scripted DNS server on loopback for the resolver tests (dnspython wire format, UDP and TCP).

Quick tour::

    with LocalDNSServer({"www.test": [("8.8.8.8", 300), ("2606:4700::1111", 300)]}) as dns_srv:
        resolver = PublicHostnameResolver(reactor, nameservers=[dns_srv.nameserver])
        # or settings: POLITE_DNS_NAMESERVERS = [dns_srv.address]     ("127.0.0.1:PORT")
        ...
        assert dns_srv.lookups("www.test") == 1        # A queries for the name
        assert "2130706433" in dns_srv.names()         # every name ever asked, in order

Records: ``{name: [(address, ttl), ...]}`` — names are compared lower-case without the trailing dot; an
A query is answered with the IPv4 entries, an AAAA query with the IPv6 ones (NOERROR and no answer when
the name has none of that type). Instead of a list, a name may map to a callable
``fn(count, qtype) -> list[(address, ttl)]`` where ``count`` is how many queries of that type for that
name came before (0 on the first): ``rebinding = lambda n, t: [("127.0.0.2", 0)] if n == 0 else
[("127.0.0.1", 0)]``. A name that is not in the table gets NXDOMAIN.

Modes (per server, per name, or per name and query type with :meth:`set_mode`): ``"answer"`` (default),
``"servfail"`` (SERVFAIL to every query) and ``"silent"`` (the query is read and counted, never answered:
a timeout). ``delay`` (seconds) is slept before each answer (queries are then answered in parallel).

In a test, import the :func:`dns_server` fixture: ``from tests.support.dns_server import dns_server``.

Every query is logged (:attr:`queries`, a list of ``(name, qtype, transport)``), answered or not. The server
binds only 127.0.0.1 (or another loopback address) on an ephemeral port; UDP and TCP share the port.
"""

from __future__ import annotations

import ipaddress
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest

__all__ = ["LocalDNSServer", "Records", "dns_server"]

Answer = list[tuple[str, int]]
Records = dict[str, Iterable[tuple[str, int]] | Callable[[int, str], Iterable[tuple[str, int]]]]

MODES = ("answer", "servfail", "silent")


def _norm(name: str) -> str:
    return name.strip().lower().rstrip(".")


class LocalDNSServer:
    """A DNS server on ``address`` (loopback) and an ephemeral port, answering from a per-test table.

    Args:
        records: name → list of ``(address, ttl)`` or callable ``(count, qtype) -> list``.
        mode: ``"answer"``, ``"servfail"`` or ``"silent"`` for every name (see :meth:`set_mode`).
        delay: seconds slept before each answer.
        address: the loopback address to bind (default 127.0.0.1).
        tcp: also serve TCP on the same port (default True).
    """

    def __init__(self, records: Records | None = None, *, mode: str = "answer", delay: float = 0.0,
                 address: str = "127.0.0.1", tcp: bool = True) -> None:
        if not ipaddress.ip_address(address).is_loopback:
            raise ValueError(f"LocalDNSServer binds only loopback addresses, got {address!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.host = address
        self.mode = mode
        self.delay = delay
        self._records: dict[str, object] = {}
        self._modes: dict[tuple[str, str | None], str] = {}
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        self.queries: list[tuple[str, str, str]] = []
        for name, value in (records or {}).items():
            self.set(name, value)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tcp: socketserver.ThreadingTCPServer | None = None
        if tcp:
            owner = self

            class _TCPHandler(socketserver.BaseRequestHandler):
                def handle(self) -> None:
                    self.request.settimeout(5)
                    try:
                        while True:
                            head = self._read(2)
                            if head is None:
                                return
                            (length,) = struct.unpack("!H", head)
                            wire = self._read(length)
                            if wire is None:
                                return
                            reply = owner._answer(wire, "tcp")
                            if reply is None:
                                continue
                            self.request.sendall(struct.pack("!H", len(reply)) + reply)
                    except OSError:
                        return

                def _read(self, n: int) -> bytes | None:
                    data = b""
                    while len(data) < n:
                        chunk = self.request.recv(n - len(data))
                        if not chunk:
                            return None
                        data += chunk
                    return data

            class _TCPServer(socketserver.ThreadingTCPServer):
                allow_reuse_address = True
                daemon_threads = True
                address_family = family

        # UDP and TCP share one port: when the TCP side of an ephemeral UDP port is taken, try another port.
        for _attempt in range(50):
            self._udp = socket.socket(family, socket.SOCK_DGRAM)
            self._udp.bind((address, 0))
            self.port: int = self._udp.getsockname()[1]
            self._udp.settimeout(0.05)
            if not tcp:
                break
            try:
                self._tcp = _TCPServer((address, self.port), _TCPHandler)
                break
            except OSError:
                self._udp.close()
        else:
            raise RuntimeError(f"no port on {address} is free for both UDP and TCP")
        self.start()

    # -- configuration -------------------------------------------------------------------------------

    def set(self, name: str, value: object) -> None:
        """Set (replace) the answer of ``name``: a list of ``(address, ttl)`` or a callable."""
        if not callable(value):
            value = [(str(ipaddress.ip_address(a)), int(ttl)) for a, ttl in value]  # type: ignore[union-attr]
        with self._lock:
            self._records[_norm(name)] = value

    def remove(self, name: str) -> None:
        with self._lock:
            self._records.pop(_norm(name), None)

    def set_mode(self, mode: str, name: str | None = None, qtype: str | None = None) -> None:
        """``mode`` for every name (``name=None``), for one name, or for one name's ``qtype`` queries only
        (``set_mode("servfail", "x.test", "AAAA")``: A is answered, AAAA fails)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        with self._lock:
            if name is None:
                self.mode = mode
            else:
                self._modes[(_norm(name), qtype.upper() if qtype else None)] = mode

    @property
    def nameserver(self) -> tuple[str, int]:
        """``(address, port)`` for ``PublicHostnameResolver(nameservers=[...])``."""
        return (self.host, self.port)

    @property
    def address(self) -> str:
        """``"127.0.0.1:PORT"`` for ``POLITE_DNS_NAMESERVERS``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    # -- the log ---------------------------------------------------------------------------------------

    def lookups(self, name: str, qtype: str = "A") -> int:
        """How many ``qtype`` queries for ``name`` arrived (answered or not)."""
        with self._lock:
            return self._counts[(_norm(name), qtype)]

    def total(self, name: str | None = None) -> int:
        """How many queries arrived in all (for ``name``, or for every name)."""
        with self._lock:
            if name is None:
                return len(self.queries)
            return sum(1 for n, _, _ in self.queries if n == _norm(name))

    def names(self) -> list[str]:
        """Every name asked, in order of first query."""
        with self._lock:
            seen: dict[str, None] = {}
            for n, _, _ in self.queries:
                seen.setdefault(n, None)
            return list(seen)

    def clear(self) -> None:
        with self._lock:
            self.queries.clear()
            self._counts.clear()

    # -- serving ---------------------------------------------------------------------------------------

    def _answer(self, wire: bytes, transport: str) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
        except Exception:  # garbage: ignore it
            return None
        if not query.question:
            return None
        question = query.question[0]
        name = _norm(question.name.to_text())
        qtype = dns.rdatatype.to_text(question.rdtype)
        with self._lock:
            count = self._counts[(name, qtype)]
            self._counts[(name, qtype)] += 1
            self.queries.append((name, qtype, transport))
            mode = self._modes.get((name, qtype), self._modes.get((name, None), self.mode))
            value = self._records.get(name)
        if mode == "silent":
            return None
        if self.delay:
            time.sleep(self.delay)
        response = dns.message.make_response(query)
        response.flags |= dns.flags.RA
        if mode == "servfail":
            response.set_rcode(dns.rcode.SERVFAIL)
            return response.to_wire()
        if value is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
            return response.to_wire()
        entries = value(count, qtype) if callable(value) else value
        version = {"A": 4, "AAAA": 6}.get(qtype)
        matching = [(str(address), int(ttl)) for address, ttl in entries
                    if ipaddress.ip_address(address).version == version]
        if matching:
            # One RRset per answer, and one TTL per RRset (RFC 2181 §5.2): the smallest TTL given.
            ttl = min(t for _, t in matching)
            response.answer.append(dns.rrset.from_text_list(
                question.name, ttl, dns.rdataclass.IN, question.rdtype, [a for a, _ in matching]))
        return response.to_wire()

    def _serve_udp(self) -> None:
        while not self._stopping.is_set():
            try:
                wire, peer = self._udp.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            if self.delay:  # a slow server still answers queries in parallel, like a real one
                threading.Thread(target=self._reply_udp, args=(wire, peer), daemon=True).start()
            else:
                self._reply_udp(wire, peer)

    def _reply_udp(self, wire: bytes, peer: object) -> None:
        reply = self._answer(wire, "udp")
        if reply is not None:
            try:
                self._udp.sendto(reply, peer)
            except OSError:
                pass

    def start(self) -> LocalDNSServer:
        if self._threads:
            return self
        t = threading.Thread(target=self._serve_udp, name=f"LocalDNS-udp-{self.port}", daemon=True)
        t.start()
        self._threads.append(t)
        if self._tcp is not None:
            t = threading.Thread(target=self._tcp.serve_forever, kwargs={"poll_interval": 0.05},
                                 name=f"LocalDNS-tcp-{self.port}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        """Stop serving and close the sockets (idempotent)."""
        self._stopping.set()
        if self._tcp is not None and len(self._threads) > 1:
            self._tcp.shutdown()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []
        if self._tcp is not None:
            self._tcp.server_close()
            self._tcp = None
        self._udp.close()

    def __enter__(self) -> LocalDNSServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<LocalDNSServer {self.address} queries={len(self.queries)}>"


@pytest.fixture
def dns_server():
    """Pytest fixture (import it into a test module): ``dns_server(records=None, **kwargs)`` starts a
    :class:`LocalDNSServer`; all are stopped at the end of the test."""
    servers: list[LocalDNSServer] = []

    def start(records: Records | None = None, **kwargs: object) -> LocalDNSServer:
        srv = LocalDNSServer(records, **kwargs)  # type: ignore[arg-type]
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()
