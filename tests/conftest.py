"""Shared test set-up.

* Makes the package (and ``tests.support``) importable from a source checkout: the package is not installed
  in the test venv, and pytest's default (``prepend``) import mode only puts ``tests/`` on ``sys.path``.
* ``arrival_server``: a factory fixture of loopback :class:`tests.support.server.ArrivalServer` instances,
  all stopped at the end of the test.

"""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture
def arrival_server():
    """``arrival_server(address="127.0.0.1", **kwargs)`` starts an ArrivalServer; all are stopped afterwards."""
    from tests.support.server import ArrivalServer

    servers = []

    def start(address: str = "127.0.0.1", **kwargs):
        srv = ArrivalServer(address, **kwargs)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()
