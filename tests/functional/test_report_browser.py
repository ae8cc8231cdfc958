"""The report renders in a real browser: headless Chromium opens it offline, every stage section and
every plot is drawn, nothing is fetched from the network and the console stays free of errors.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: commands on fd 3,
replies on fd 4, NUL-separated JSON), so no port is opened and no client library is needed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import selectors
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from profiling import runfiles
from profiling.metrics import MIB, StageProfile, TimelinePoint
from profiling.report import STAGE_PLOTS, write_report

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-pipe", "--window-size=1400,1800",
)
SLOW_CHILD = 2


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


def make_run(run_dir: Path, children: int = 5, seed: int = 3) -> None:
    """A run directory with profiles and timelines; child SLOW_CHILD downloads 5x slower."""
    rng = random.Random(seed)
    (run_dir / runfiles.PROFILES).mkdir(parents=True)
    for child in range(children):
        start = 1_790_000_000.0 + child
        lines = []
        for stage, mib, rate in (("download", 100, 240.0), ("process", 100, 45.0), ("upload", 16, 90.0)):
            rate *= rng.uniform(0.9, 1.1) * (0.2 if child == SLOW_CHILD and stage == "download" else 1)
            duration = mib / rate
            steps = max(4, int(duration * 10))
            timeline = [
                TimelinePoint(t=(i + 1) * duration / steps, read_bps=rate * MIB, write_bps=rate * MIB,
                              device_write_bps=rate * MIB * 0.8, device_queue_depth=1.5,
                              dirty_bytes=min(i, 10) * 30 * MIB, writeback_bytes=20 * MIB,
                              io_stall_some_ms=rng.uniform(0, 8))
                for i in range(steps)
            ]
            profile = StageProfile(
                stage=stage, outcome="ok", started_at=start, duration_s=duration,
                read_bytes=mib * MIB, write_bytes=mib * MIB, device_write_latency_ms=rng.uniform(2, 5),
                device_queue_depth=rng.uniform(1, 2), peak_dirty_bytes=300 * MIB,
                dirty_threshold_bytes=2400 * MIB, io_stall_some_ms=40.0, io_stall_full_ms=5.0,
                properties={"JobId": "local-1", "ArrayIndex": str(child), "InstanceId": "local"},
                contract=[{"rule": "Throughput >= 100 MiB/s", "passed": rate >= 100}] if stage == "download" else [],
                timeline=timeline,
            )
            lines.append(json.dumps(profile.to_dict()))
            start += duration
        runfiles.profile_path(run_dir, f"part-{child:05d}").write_text("\n".join(lines) + "\n")


DOM_PROBE = """
(() => {
  const stages = [...document.querySelectorAll('section.stage')].map(s => s.dataset.stage);
  const plots = [...document.querySelectorAll('div.plot')].map(d => ({
    name: d.dataset.plot || ('timeline:' + d.dataset.child),
    drawn: d.querySelectorAll('.js-plotly-plot .main-svg').length > 0,
    traces: (d.querySelector('.js-plotly-plot') || {data: []}).data?.length ?? 0,
  }));
  const bad = [...document.querySelectorAll('#bad-apple-table tr.bad')].map(r => [r.dataset.stage, r.dataset.name]);
  return JSON.stringify({stages, plots, bad, plotly: typeof Plotly, height: document.body.scrollHeight});
})()
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    binary = chromium()
    if binary is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    root = tmp_path_factory.mktemp("browser")
    make_run(root / "run")
    report = write_report(root / "run", advice={"volume": "gp3", "dirty_bytes": 1 << 30})
    browser = DevTools(binary, root / "profile")
    try:
        browser.send("Target.setDiscoverTargets", {"discover": True})
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1400, "height": 1800, "deviceScaleFactor": 1, "mobile": False}, session=session)
        browser.send("Page.navigate", {"url": report.as_uri()}, session=session)
        browser.wait_for("Page.loadEventFired")
        time.sleep(1.0)  # let plotly finish its deferred layout passes
        dom = json.loads(browser.send("Runtime.evaluate", {"expression": DOM_PROBE, "returnByValue": True},
                                      session=session)["result"]["value"])
        shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
        screenshot = root / "report.png"
        screenshot.write_bytes(base64.b64decode(shot))
        events = list(browser.events)
    finally:
        browser.close()
    return {"dom": dom, "events": events, "screenshot": screenshot, "report": report}


def test_every_stage_section_and_plot_is_drawn(rendered: dict[str, Any]) -> None:
    dom = rendered["dom"]
    assert dom["plotly"] == "object"
    assert dom["stages"] == ["download", "process", "upload"]
    names = {p["name"] for p in dom["plots"]}
    expected = {f"{stage}/{plot_id}" for stage in dom["stages"] for plot_id, _, _ in STAGE_PLOTS}
    assert expected <= names
    assert {f"timeline:child {n}" for n in range(5)} <= names
    undrawn = [p["name"] for p in dom["plots"] if not p["drawn"] or p["traces"] == 0]
    assert undrawn == []


def test_the_slow_child_is_in_the_bad_apple_table(rendered: dict[str, Any]) -> None:
    assert ["download", f"child {SLOW_CHILD}"] in rendered["dom"]["bad"]


def test_no_console_errors(rendered: dict[str, Any]) -> None:
    errors = []
    for event in rendered["events"]:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append(params["exceptionDetails"].get("text"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in {"error", "assert"}:
            errors.append(params.get("args"))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            errors.append(params["entry"].get("text"))
    assert errors == []


def test_opens_offline(rendered: dict[str, Any]) -> None:
    urls = [e["params"]["request"]["url"] for e in rendered["events"] if e.get("method") == "Network.requestWillBeSent"]
    assert rendered["report"].as_uri() in urls
    assert [u for u in urls if not u.startswith(("file:", "data:", "about:"))] == []


def test_screenshot_is_a_png(rendered: dict[str, Any]) -> None:
    data = rendered["screenshot"].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # a blank page compresses to a few KiB
