"""A loopback HTTP/2 (TLS, ALPN ``h2``) server that records when every request arrived, for Scrapy's HTTP/2
handler (which speaks HTTP/2 over TLS only).

Hypercorn serves a small ASGI app in a thread of its own (its own asyncio loop), on one port of one or more
loopback addresses, with a self-signed certificate made at start (Scrapy does not verify certificates by
default). The log is the same :class:`~tests.support.server.Arrival` records as
:class:`~tests.support.server.ArrivalServer`'s, and replies are scripted the same way (``route(path,
handler)`` with the :mod:`tests.support.server` handlers; an unrouted path gets a small page)::

    with H2ArrivalServer(["127.0.0.3", "127.0.0.4"]) as srv:
        srv.route("/api", sequence(Reply.throttle(429, "2"), page()))
        url = srv.url("/api", host="a.test")   # https://a.test:<port>/api
        ... run a crawl ...
        hits = srv.arrivals(host="a.test")
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.server import Arrival, Handler, Reply, RequestInfo, clock, page

__all__ = ["H2ArrivalServer"]


def _self_signed(directory: Path) -> tuple[str, str]:
    """A self-signed certificate and its key (PEM files in ``directory``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "polite.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


def _free_port(addresses: list[str]) -> int:
    """A port free on every address of ``addresses``."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = s.getsockname()[1]
        try:
            for address in addresses[1:]:
                with socket.socket() as s:
                    s.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {addresses}")


class H2ArrivalServer:
    """An HTTP/2-over-TLS server on ``addresses`` (loopback only), one port for all, logging arrivals.

    Raises:
        ValueError: an address that is not loopback.
    """

    def __init__(self, addresses: list[str]) -> None:
        for address in addresses:
            if not ipaddress.ip_address(address).is_loopback:
                raise ValueError(f"{address} is not a loopback address")
        self.addresses = list(addresses)
        self.port = _free_port(self.addresses)
        self._lock = threading.Lock()
        self._arrivals: list[Arrival] = []
        self._counts: Counter[tuple[str, str]] = Counter()
        self._routes: dict[str, Handler] = {}
        #: The HTTP version of every request (``"2"`` for HTTP/2), in arrival order.
        self.http_versions: list[str] = []
        self._dir = tempfile.TemporaryDirectory()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="h2-arrival-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._listening():
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError("the HTTP/2 server did not start")
            time.sleep(0.02)

    def _listening(self) -> bool:
        for address in self.addresses:
            try:
                socket.create_connection((address, self.port), timeout=0.5).close()
            except OSError:
                return False
        return True

    # -- lifecycle ------------------------------------------------------------------------------------
    def _run(self) -> None:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"{a}:{self.port}" for a in self.addresses]
        config.certfile, config.keyfile = _self_signed(Path(self._dir.name))
        config.alpn_protocols = ["h2"]
        config.accesslog = config.errorlog = None
        asyncio.set_event_loop(self._loop)
        # A connection the client aborts at its close makes hypercorn's HTTP/2 protocol log a KeyError: noise.
        self._loop.set_exception_handler(lambda loop, context: None)

        async def main() -> None:
            self._stop = asyncio.Event()
            await serve(self._app, config, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

        try:
            self._loop.run_until_complete(main())
        finally:
            self._loop.close()

    def stop(self) -> None:
        """Stop serving and wait for the thread (idempotent)."""
        if self._stop is not None and self._thread.is_alive():
            assert self._stop is not None
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
        self._dir.cleanup()

    def __enter__(self) -> H2ArrivalServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- scripting --------------------------------------------------------------------------------------
    def url(self, path: str = "/", host: str | None = None) -> str:
        return f"https://{host or self.addresses[0]}:{self.port}{path}"

    def route(self, path: str, handler: Handler | Reply) -> H2ArrivalServer:
        """Answer ``path`` (exact, without query) with ``handler`` (or always the same :class:`Reply`)."""
        self._routes[path] = handler if callable(handler) else (lambda info, count, r=handler: r)
        return self

    def arrivals(self, host: str | None = None) -> list[Arrival]:
        """The log (completion order), optionally of one Host."""
        with self._lock:
            out = list(self._arrivals)
        return [a for a in out if host is None or a.host == host]

    # -- the app ------------------------------------------------------------------------------------------
    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = (await receive())["type"]
                if message == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        start = clock()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", headers.get(":authority", "")).rsplit(":", 1)[0].lower()
        path = scope["path"]
        info = RequestInfo(method=scope["method"], host=host, path=path, target=path, headers=headers, body=b"",
                           server_address=scope["server"][0], client_port=scope["client"][1], start=start)
        with self._lock:
            count = self._counts[(host, path)]
            self._counts[(host, path)] += 1
            self.http_versions.append(scope.get("http_version", ""))
        handler = self._routes.get(path)
        reply = handler(info, count) if handler is not None else page(path)
        body = reply.body.encode() if isinstance(reply.body, str) else reply.body
        out_headers = [(k.lower().encode(), v.encode()) for k, v in reply.headers.items()]
        out_headers.append((b"content-length", str(len(body)).encode()))
        # Logged before the reply is sent: hypercorn may cancel the app as soon as the stream is complete.
        with self._lock:
            self._arrivals.append(Arrival(host=host, path=path, start=start, end=clock(), status=reply.status,
                                          server_address=info.server_address, client_port=info.client_port,
                                          method=info.method, target=path))
        await send({"type": "http.response.start", "status": reply.status, "headers": out_headers})
        await send({"type": "http.response.body", "body": body})
