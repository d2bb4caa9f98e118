"""A headless Chromium driven over the DevTools protocol on a pipe, for tests of the HTML reports.

``--remote-debugging-pipe``: commands on fd 3, replies on fd 4, each a JSON message ending in NUL, so it
needs only the standard library. `CHROMIUM` is None when no binary is installed (tests skip; CI sets
REQUIRE_CHROMIUM=1 and installs Debian's ``chromium``).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM = next((path for path in map(shutil.which, BROWSERS) if path), None)
TIMEOUT_S = 60.0

if CHROMIUM is None and os.environ.get("REQUIRE_CHROMIUM") == "1":  # CI installs it: never skip there
    raise RuntimeError(f"REQUIRE_CHROMIUM=1 but no Chromium binary on PATH (looked for {', '.join(BROWSERS)})")
skip_without_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason=f"no Chromium binary on PATH (looked for {', '.join(BROWSERS)}; apt-get install chromium)"
)


class DevTools:
    """A minimal DevTools-protocol client over Chromium's debugging pipe."""

    def __init__(self, binary: str, profile_dir: Path, extra_args: tuple[str, ...] = ()) -> None:
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # Copies above 10 so moving them onto fds 3 and 4 in the child cannot clobber one another.
        high_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        high_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)

        def child_fds() -> None:  # dup2 leaves 3 and 4 inheritable; the CLOEXEC originals close at exec
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", f"--user-data-dir={profile_dir}", "--remote-debugging-pipe", *extra_args,
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # close_fds would run after preexec_fn and close 3 and 4 again; Python's own fds are CLOEXEC anyway.
            preexec_fn=child_fds, close_fds=False,
        )
        os.close(high_r)
        os.close(high_w)
        self._write_fd, self._read_fd = to_chrome_w, from_chrome_r
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no reply from Chromium")
            ready, _, _ = select.select([self._read_fd], [], [], remaining)
            if ready:
                chunk = os.read(self._read_fd, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed the debugging pipe")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        request = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            request["sessionId"] = session
        os.write(self._write_fd, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            message = self._read_message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str) -> dict:
        deadline = time.monotonic() + TIMEOUT_S
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            message = self._read_message(deadline)
            self.events.append(message)
            if message.get("method") == method:
                return message

    def evaluate(self, session: str, expression: str) -> object:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        if "exceptionDetails" in result:
            raise AssertionError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error/assert calls and error log entries seen so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"uncaught: {params['exceptionDetails']}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(f"console.{params['type']}: {[a.get('value') for a in params.get('args', [])]}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append(f"log: {params['entry'].get('text')}")
        return found

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._write_fd)
        os.close(self._read_fd)



    def open_page(self, url: str) -> str:
        """A new tab at `url`, loaded, with Runtime, Page and Log events recorded; returns its session."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Page", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.call("Page.navigate", {"url": url}, session)
        self.wait_for("Page.loadEventFired")
        return session


# Flags for a browser without WebGL, and for one with it (SwiftShader, a CPU implementation).
NO_WEBGL_ARGS = ("--disable-webgl", "--disable-3d-apis")
WEBGL_ARGS = ("--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist")
