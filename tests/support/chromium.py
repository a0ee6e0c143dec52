"""Headless Chromium driven over the DevTools protocol on a pipe (no port, no extra package), for the tests:
open a local page (the timeline's HTML or SVG), collect what it did — its console errors and every request it
made — and a PNG screenshot of it. Debian's ``chromium`` (``.ci/run`` installs it when missing).

It left the package with issue 17: the timeline is a standalone SVG any browser, editor or issue tracker shows,
so the add-on drives no browser; the tests still render it here to check it draws with no error and no request.
"""

from __future__ import annotations

import base64
import json
import math
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Chromium", "PageReport", "RenderError", "find_chromium"]


#: The Chromium flags of every render: headless, no sandbox (containers, root), and nothing that reaches the
#: network by itself (component updates, sync, background fetches), with a fresh profile each time.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--no-first-run", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--mute-audio", "--disable-extensions", "--disable-default-apps")


#: Child side of :meth:`Chromium.render`: fds argv[1], argv[2] become 3 and 4, then Chromium (argv[3:]) runs.
_TRAMPOLINE = ("import os, sys\n"
               "os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4)\n"
               "os.execv(sys.argv[3], sys.argv[3:])\n")


class RenderError(RuntimeError):
    """Chromium is missing, failed to start, or did not render the page in time. The message says which."""


def find_chromium() -> str | None:
    """The Chromium binary: ``$POLITE_CHROMIUM``, else ``chromium``, ``chromium-browser``, ``google-chrome``
    on ``PATH``, else None."""
    configured = os.environ.get("POLITE_CHROMIUM")
    if configured:
        return configured
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageReport:
    """What a page did in Chromium.

    Attributes:
        url: the page's ``file://`` URL.
        requests: the URL of every request the page made, its own document first.
        console_errors: console errors, uncaught exceptions and error log entries (CSP violations, failed
            loads), as text.
        screenshot: the whole page as PNG bytes (None when not asked).
        evaluated: the results of the ``evaluate`` expressions, in order.
    """

    url: str
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    screenshot: bytes | None = None
    evaluated: list[Any] = field(default_factory=list)

    @property
    def external_requests(self) -> list[str]:
        """Every request but the page's own document."""
        return [u for u in self.requests if u != self.url]


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``): no port is
    opened and no package is needed. One browser, with a fresh profile, per :meth:`render`.

    Args:
        binary: the Chromium executable (default :func:`find_chromium`).
        timeout: seconds one render may take.

    Raises:
        RenderError: no Chromium was found.
    """

    def __init__(self, binary: str | None = None, *, timeout: float = 60.0) -> None:
        found = binary or find_chromium()
        if not found:
            raise RenderError("this test needs headless Chromium, which was not found. Fix: apt-get install -y "
                              "chromium (or set POLITE_CHROMIUM to the browser's path)")
        self.binary = found
        self.timeout = timeout

    def render(self, path: str, *, width: int = 1440, height: int = 900, screenshot: bool = True,
               hover: str | None = None, evaluate: Sequence[str] = ()) -> PageReport:
        """Open the local file ``path``, wait for its load event (and half a second more), then take the
        screenshot of the whole page.

        Args:
            path: an HTML or SVG file.
            width, height: the viewport, CSS pixels.
            screenshot: take one (:attr:`PageReport.screenshot`).
            hover: a CSS selector; the mouse is moved over the centre of the first element it selects before
                ``evaluate`` runs (a tooltip then shows).
            evaluate: JavaScript expressions evaluated in the page, each result (JSON) in
                :attr:`PageReport.evaluated`.

        Raises:
            RenderError: Chromium could not start, crashed or timed out; ``hover`` selected nothing.
        """
        url = "file://" + os.path.abspath(path)
        report = PageReport(url)
        profile = tempfile.mkdtemp(prefix="polite-chromium-")
        commands_read, commands_write = os.pipe()
        replies_read, replies_write = os.pipe()
        errors = tempfile.TemporaryFile()  # noqa: SIM115  (Chromium's stderr; closed in the finally below)
        try:
            args = [self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                    "about:blank"]
            # The protocol runs on the child's fds 3 (commands) and 4 (replies): a two-line Python trampoline
            # puts them there and executes Chromium (no shell: dash cannot redirect fds above 9).
            proc = subprocess.Popen(
                [sys.executable, "-c", _TRAMPOLINE, str(commands_read), str(replies_write), *args],
                pass_fds=(commands_read, replies_write), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=errors)
        except OSError as exc:
            for fd in (commands_read, commands_write, replies_read, replies_write):
                os.close(fd)
            shutil.rmtree(profile, ignore_errors=True)
            errors.close()
            raise RenderError(f"cannot start Chromium ({self.binary}): {exc}") from exc
        os.close(commands_read)
        os.close(replies_write)
        session = _Session(commands_write, replies_read, time.monotonic() + self.timeout)
        try:
            session.run(report, url, width=width, height=height, screenshot=screenshot, hover=hover,
                        evaluate=evaluate)
        except (RenderError, OSError, queue.Empty) as exc:
            errors.seek(0)
            tail = errors.read()[-2000:].decode("utf-8", "replace")
            raise RenderError(f"Chromium did not render {path}: {exc or type(exc).__name__}\n{tail}") from exc
        finally:
            session.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            errors.close()
            shutil.rmtree(profile, ignore_errors=True)
        return report


class _Session:
    """The DevTools protocol over the two pipe ends: NUL-terminated JSON messages."""

    def __init__(self, write_fd: int, read_fd: int, deadline: float) -> None:
        self.write_fd = write_fd
        self.read_fd = read_fd
        self.deadline = deadline
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self.next_id = 0
        self.session_id: str | None = None
        self._reader = threading.Thread(target=self._read, name="polite-chromium-pipe", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = os.read(self.read_fd, 1 << 16)
                if not chunk:
                    break
                buffer += chunk
                while b"\0" in buffer:
                    message, buffer = buffer.split(b"\0", 1)
                    self.messages.put(json.loads(message))
        except OSError:
            pass
        finally:
            self.messages.put(None)

    def _next(self) -> dict[str, Any]:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise RenderError("timed out")
        message = self.messages.get(timeout=remaining)
        if message is None:
            raise RenderError("Chromium closed the connection (it exited)")
        return message

    def send(self, method: str, params: dict[str, Any] | None = None, *, browser: bool = False) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if not browser and self.session_id is not None:
            message["sessionId"] = self.session_id
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._next()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RenderError(f"{method}: {reply['error'].get('message', reply['error'])}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def wait_for(self, method: str) -> None:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._next())

    def drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                message = self.messages.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if message is None:
                break
            self.events.append(message)

    def run(self, report: PageReport, url: str, *, width: int, height: int, screenshot: bool, hover: str | None,
            evaluate: Sequence[str]) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, browser=True)["targetId"]
        self.session_id = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                    browser=True)["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                         "deviceScaleFactor": 1, "mobile": False})
        self.send("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")
        self.drain(0.5)
        if hover is not None:
            box = self.send("Runtime.evaluate", {"expression": (
                f"(function(){{var e=document.querySelector({json.dumps(hover)});if(!e)return null;"
                "var r=e.getBoundingClientRect();return [r.left+r.width/2,r.top+r.height/2];})()"),
                "returnByValue": True})["result"].get("value")
            if not box:
                raise RenderError(f"nothing to hover: {hover!r} selects no element")
            self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": box[0], "y": box[1]})
            self.drain(0.2)
        for expression in evaluate:
            result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
            report.evaluated.append(result.get("result", {}).get("value"))
        if screenshot:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            shot = self.send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": max(1, math.ceil(size["width"])),
                         "height": max(1, math.ceil(size["height"])), "scale": 1}})
            report.screenshot = base64.b64decode(shot["data"])
        self.drain(0.1)
        self._collect(report)
        try:
            self.send("Browser.close", browser=True)
        except RenderError:
            pass  # it closed the pipe on its way out

    def _collect(self, report: PageReport) -> None:
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Network.requestWillBeSent":
                report.requests.append(params["request"]["url"])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                report.console_errors.append(f"console.{params['type']}: {text}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                report.console_errors.append("uncaught: " + str(details.get("exception", {}).get(
                    "description", details.get("text", ""))))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                report.console_errors.append(f"{entry.get('source')}: {entry.get('text')}")

    def close(self) -> None:
        try:
            os.close(self.write_fd)
        except OSError:
            pass
        self._reader.join(timeout=10)
        try:
            os.close(self.read_fd)
        except OSError:
            pass
