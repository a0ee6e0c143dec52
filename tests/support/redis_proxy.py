"""A TCP proxy on loopback in front of a ``redis-server`` that can lose a reply after the server applied it.

:class:`LossyProxy` forwards every connection to the server. :meth:`LossyProxy.lose_reply_to` arms it: the
next command whose bytes contain ``marker`` (e.g. a script's SHA1) reaches the server, the server's reply
is read and thrown away, ``then()`` runs (while the client still waits: another writer can overwrite the
rows here), and the client's connection is closed — the client sees a lost connection for a write that
was applied. ``refuse`` more connections after that can be refused too (so the client's immediate resend
fails and the update raises ``StoreUnavailable``).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

__all__ = ["LossyProxy"]


class LossyProxy:
    """A proxy ``127.0.0.1:<port>`` → ``127.0.0.1:<upstream_port>``; :attr:`url` is its ``redis://`` URL.

    Use as a context manager, or call :meth:`stop` (it closes the listener and every connection, and joins
    its threads).
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._marker: bytes | None = None
        self._then: Callable[[], None] | None = None
        self._refuse = 0
        self._refuse_after = 0
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopped = False
        #: Replies lost so far, and connections refused.
        self.lost = 0
        self.refused = 0
        self._accepting = threading.Thread(target=self._accept, name="lossy-proxy-accept", daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def lose_reply_to(self, marker: bytes, then: Callable[[], None] | None = None, refuse: int = 0) -> None:
        """Lose the reply to the next command containing ``marker``, run ``then()``, close that connection,
        then refuse the next ``refuse`` connections."""
        with self._lock:
            self._marker, self._then, self._refuse_after = marker, then, refuse

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._refuse:
                    self._refuse -= 1
                    self.refused += 1
                    client.close()
                    continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            state = {"drop": False}
            for target, args in ((self._up, (client, upstream, state)), (self._down, (upstream, client, state))):
                t = threading.Thread(target=target, args=args, name="lossy-proxy-pump", daemon=True)
                self._threads.append(t)
                t.start()

    def _up(self, client: socket.socket, upstream: socket.socket, state: dict[str, bool]) -> None:
        """Client → server; arms the loss of the reply when the command carries the marker."""
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                with self._lock:
                    if self._marker is not None and self._marker in data:
                        self._marker = None
                        state["drop"] = True  # before the server can answer
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            _close(upstream)

    def _down(self, upstream: socket.socket, client: socket.socket, state: dict[str, bool]) -> None:
        """Server → client; loses the armed reply, runs the hook, closes the client's connection."""
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    break
                if state["drop"]:
                    with self._lock:
                        then, self._then = self._then, None
                        self._refuse, self.lost = self._refuse_after, self.lost + 1
                    if then is not None:
                        then()
                    break
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client)
            _close(upstream)

    def stop(self) -> None:
        self._stopped = True
        _close(self._listener)
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            _close(s)
        self._accepting.join(5)
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> LossyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
