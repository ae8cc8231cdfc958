"""Headless Chromium for the report's tests and screenshots, over the DevTools protocol on a pipe
(--remote-debugging-pipe: commands on fd 3, replies on fd 4, NUL-separated JSON), so no port is opened and
no client library is needed.

`python -m tests.support.browser REPORT.html OUT_DIR SECTION_ID...` saves a PNG of each section (how the
screenshots in docs/ are made).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-pipe", "--window-size=1400,1800",
)


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class DevTools:
    """A minimal DevTools-protocol client over Chromium's debugging pipe."""

    def __init__(self, binary: str, user_data_dir: Path) -> None:
        to_child_r, self._to_child_w = os.pipe()
        self._from_child_r, from_child_w = os.pipe()

        def wire_fds() -> None:  # runs in the child: its fd 3 reads commands, fd 4 writes replies
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire_fds, pass_fds=(3, 4),  # preexec_fn runs before the other fds are closed
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._from_child_r, selectors.EVENT_READ)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not self._selector.select(left):
                raise TimeoutError("no reply from Chromium")
            chunk = os.read(self._from_child_r, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed the pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(message))

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
             timeout: float = 60) -> dict[str, Any]:
        self._next_id += 1
        request: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            request["sessionId"] = session
        os.write(self._to_child_w, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._read_message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 60) -> dict[str, Any]:
        for event in self.events:
            if event.get("method") == method:
                return event
        deadline = time.monotonic() + timeout
        while True:
            message = self._read_message(deadline)
            self.events.append(message)
            if message.get("method") == method:
                return message

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError, TimeoutError, EOFError):
            self.send("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child_w)
        os.close(self._from_child_r)




class Page:
    """One tab of a DevTools browser, with a report loaded."""

    def __init__(self, browser: DevTools, session: str) -> None:
        self.browser = browser
        self.session = session

    def evaluate(self, expression: str) -> Any:
        reply = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                  session=self.session)
        return reply["result"].get("value")

    def screenshot(self, out: Path, selector: str | None = None) -> Path:
        """A PNG of the element `selector` (the whole viewport without one)."""
        params: dict[str, Any] = {"format": "png"}
        if selector is not None:
            box = json.loads(self.evaluate(
                f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                " return JSON.stringify({x: r.left + window.scrollX, y: r.top + window.scrollY,"
                " width: r.width, height: r.height}); })()"))
            params["clip"] = {**box, "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.browser.send("Page.captureScreenshot", params, session=self.session)["data"]
        out.write_bytes(base64.b64decode(data))
        return out


@contextlib.contextmanager
def opened(report: Path, *, width: int = 1400, height: int = 1800, settle_s: float = 1.0) -> Iterator[Page]:
    """`report` loaded in headless Chromium; RuntimeError when there is no Chromium."""
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="iobatch-browser-") as profile:
        browser = DevTools(binary, Path(profile))
        try:
            browser.send("Target.setDiscoverTargets", {"discover": True})
            target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Network", "Page"):
                browser.send(f"{domain}.enable", session=session)
            browser.send("Emulation.setDeviceMetricsOverride",
                         {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                         session=session)
            browser.send("Page.navigate", {"url": report.resolve().as_uri()}, session=session)
            browser.wait_for("Page.loadEventFired")
            time.sleep(settle_s)  # let plotly finish its deferred layout passes
            yield Page(browser, session)
        finally:
            browser.close()


def main(argv: Sequence[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m tests.support.browser REPORT.html OUT_DIR SECTION_ID...", file=sys.stderr)
        return 64
    report, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with opened(report) as tab:
        for section in argv[2:]:
            print(tab.screenshot(out / f"{section}.png", f"#{section}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
