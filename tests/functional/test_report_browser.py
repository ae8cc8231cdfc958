"""The report renders in a real browser: headless Chromium (tests/support/browser.py) opens it offline,
every stage section and every plot is drawn, nothing is fetched from the network, the console stays free
of errors, and what a person reads has no "None" and no byte count without a unit. The contract rows are
the real evaluator's and the advice the real advisor's.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from profiling import runfiles
from profiling.contract import evaluate_stage, load_contract
from profiling.metrics import MIB, StageProfile, TimelinePoint
from profiling.report import STAGE_PLOTS, write_report
from profiling.report.fleet import PER_CHILD_LIMIT
from tests.support.browser import chromium, opened
from tuning.advise import advise
from tuning.plan import Plan

SLOW_CHILD = 2
CASE_STUDY = Path(__file__).resolve().parents[2] / "contracts" / "case-study.contract"


def make_run(run_dir: Path, children: int = 5, seed: int = 3) -> None:
    """A run directory with profiles and timelines; child SLOW_CHILD downloads 5x slower."""
    rng = random.Random(seed)
    contract = load_contract(CASE_STUDY)
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
                read_bytes=mib * MIB, write_bytes=mib * MIB, write_calls=mib * 64,
                device_write_latency_ms=rng.uniform(2, 5),
                device_queue_depth=rng.uniform(1, 2), peak_dirty_bytes=300 * MIB,
                dirty_threshold_bytes=2400 * MIB, io_stall_some_ms=40.0, io_stall_full_ms=5.0,
                properties={"JobId": "local-1", "ArrayIndex": str(child), "InstanceId": "local"},
                timeline=timeline,
            )
            profile = replace(profile, contract=evaluate_stage(contract, profile))
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
    points: Math.min(...((d.querySelector('.js-plotly-plot') || {data: []}).data || [])
      .filter(t => t.name === 'read').map(t => t.x.length)),
  }));
  const bad = [...document.querySelectorAll('#bad-apple-table tr.bad')].map(r => [r.dataset.stage, r.dataset.name]);
  const contract = [...document.querySelectorAll('#contract-table tr.contract-row')].map(
    r => [...r.cells].map(c => c.textContent));
  // What a person reads: every text node outside the plots, scripts and the commands to copy.
  const prose = document.querySelector('main').cloneNode(true);
  prose.querySelectorAll('pre, code, script, div.plot').forEach(n => n.remove());
  const walker = document.createTreeWalker(prose, NodeFilter.SHOW_TEXT);
  const parts = [];
  while (walker.nextNode()) parts.push(walker.currentNode.nodeValue);
  const text = parts.join(' ');
  return JSON.stringify({stages, plots, bad, contract, text, plotly: typeof Plotly,
                         findings: document.querySelectorAll('#findings-table tr.finding').length,
                         deploy: (document.querySelector('#cdk-deploy') || {}).innerText || ''});
})()
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if chromium() is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    root = tmp_path_factory.mktemp("browser")
    make_run(root / "run")
    profiles = list(runfiles.read_profiles(root / "run"))
    advice = advise(profiles, Plan(jobs_per_instance=2, memory_gib=16, jobs_per_day=500))
    report = write_report(root / "run", advice=advice)
    with opened(report) as page:
        dom = json.loads(page.evaluate(DOM_PROBE))
        screenshot = page.screenshot(root / "report.png")
        events = list(page.browser.events)
    return {"dom": dom, "events": events, "screenshot": screenshot, "report": report, "advice": advice.to_dict()}


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
    timelines = [p for p in dom["plots"] if p["name"].startswith("timeline:")]
    assert min(p["points"] for p in timelines) >= 4


def test_the_slow_child_is_the_one_bad_apple(rendered: dict[str, Any]) -> None:
    assert rendered["dom"]["bad"] == [["download", f"child {SLOW_CHILD}"]]


def test_what_a_person_reads_has_units_and_no_none(rendered: dict[str, Any]) -> None:
    text = rendered["dom"]["text"]
    assert "None" not in text and "null" not in text
    # a number of 7 digits or more not followed by a unit is a byte count a person cannot read
    assert re.findall(r"\d[\d,]{6,}(?![\d,])(?! ?(?:B|KiB|MiB|GiB|calls)\b)", text) == []


def test_the_contract_table_holds_the_evaluators_rows(rendered: dict[str, Any]) -> None:
    rows = rendered["dom"]["contract"]
    assert len(rows) == 5 * 3 * 3  # children x stages x the case study's rules
    by_label = {(r[0], r[1], r[2]): r for r in rows}
    assert by_label[("child 0", "download", "num_write")][3] == "6,400 calls"  # 100 MiB in 16 KiB writes
    assert by_label[("child 0", "download", "total_write")][3] == "104,857,600 B (100 MiB)"
    assert "latency unavailable" in by_label[("child 0", "download", "mean_lat_write")][3]
    assert all(r[5] == "procfs" for r in rows)


def test_the_recommendation_is_for_a_person(rendered: dict[str, Any]) -> None:
    dom, advice = rendered["dom"], rendered["advice"]
    assert dom["deploy"] == f"cdk deploy {advice['cdk_args']}"
    assert dom["findings"] == len(advice.get("findings") or [])


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


def test_a_large_batch_page_draws_every_plot_without_errors(tmp_path: Path) -> None:
    """Past PER_CHILD_LIMIT children: the batch's time axis, each stage's distributions and the drilled-down
    timelines, all drawn by plotly.js's basic bundle, with no console error."""
    if chromium() is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    make_run(tmp_path / "run", children=PER_CHILD_LIMIT + 16)
    report = write_report(tmp_path / "run")
    assert "plotly.js (basic - minified)" in report.read_text(encoding="utf-8")[:4000]
    with opened(report) as page:
        dom = json.loads(page.evaluate(DOM_PROBE))
        events = list(page.browser.events)
    names = {p["name"] for p in dom["plots"]}
    expected = {"fleet/time", *(f"{s}/{kind}" for s in dom["stages"] for kind in ("duration", "throughput"))}
    assert expected <= names and f"timeline:child {SLOW_CHILD}" in names
    assert [p["name"] for p in dom["plots"] if not p["drawn"] or p["traces"] == 0] == []
    assert dom["bad"] == [["download", f"child {SLOW_CHILD}"]]
    assert [e for e in events if e.get("method") == "Runtime.exceptionThrown"] == []
