"""The report of real demo runs, in headless Chromium: every stage of every child has a curve, a clean run
has no bad apple and beside `--slow-child` nobody else is one, the contract rows carry values, and the
comparison of the two runs shows both per stage."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.local.demo import DemoOptions, demo_advice, run_demo
from profiling.metrics import STAGES
from profiling.report import load_run_dir, write_comparison, write_report
from tests.support.browser import chromium, opened

SLOW_CHILD = 1
CASE_STUDY = Path(__file__).resolve().parents[2] / "contracts" / "case-study.contract"
PROBE = """
(() => JSON.stringify({
  timelines: [...document.querySelectorAll('div.timeline')].map(d => ({
    child: d.dataset.child,
    points: d.querySelector('.js-plotly-plot').data.filter(t => t.name === 'read').map(t => t.x.length),
  })),
  bad: [...document.querySelectorAll('#bad-apple-table tr.bad')].map(r => [r.dataset.stage, r.dataset.name]),
  noBad: !!document.querySelector('#no-bad-apples'),
  contract: [...document.querySelectorAll('#contract-table tr.contract-row')].map(r => r.cells[3].textContent),
  compared: [...document.querySelectorAll('section.compare-stage')].map(s => ({
    stage: s.dataset.stage,
    heads: [...s.querySelectorAll('table.compare-table th')].map(h => h.textContent),
    boxes: s.querySelector('.js-plotly-plot').data.filter(t => t.type === 'box').map(t => t.name),
  })),
}))()
"""


def demo(run_dir: Path, slow_child: int | None) -> Path:
    """A small demo run with the case-study contract, and its report: 6 children of 2 images of ~1 MiB."""
    options = DemoOptions(images=12, image_mib=1.0, images_per_child=2, workers=2, run_dir=run_dir,
                          slow_child=slow_child, contract=CASE_STUDY.resolve())
    result = run_demo(options, progress=False, say=lambda _: None)
    assert result.batch.failed == []
    return write_report(run_dir, advice=demo_advice(result.profiles, 2, say=lambda _: None))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if chromium() is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    root = tmp_path_factory.mktemp("report-demo")
    saved = os.environ.get("IOBATCH_CACHE")
    os.environ["IOBATCH_CACHE"] = str(root / "cache")
    try:
        pages = {"clean": demo(root / "clean", None), "slow": demo(root / "slow", SLOW_CHILD)}
        pages["compare"] = write_comparison(root / "clean", root / "slow", root / "compare.html")
        doms = {}
        for name, page in pages.items():
            with opened(page, settle_s=0.5) as tab:
                doms[name] = json.loads(tab.evaluate(PROBE))
        for name in ("clean", "slow"):  # what each child's profiles carry, stage by stage in time order
            entries = sorted((x for stage in STAGES for x in load_run_dir(root / name).of_stage(stage)),
                             key=lambda x: x.profile.started_at)
            doms[name]["sampled"] = {x.child: [] for x in entries}
            for x in entries:
                doms[name]["sampled"][x.child].append(len(x.profile.timeline))
        yield doms
    finally:
        if saved is None:
            os.environ.pop("IOBATCH_CACHE", None)
        else:
            os.environ["IOBATCH_CACHE"] = saved


def test_every_stage_of_every_child_has_a_curve(runs: dict[str, Any]) -> None:
    for name in ("clean", "slow"):
        timelines = runs[name]["timelines"]
        assert len(timelines) == 6
        for t in timelines:
            # Every sample the child's profiles carry is drawn, and each stage is at least a line: the sampler
            # takes one every 10 ms while a stage is young, and the download of 2 MiB here can be over in 20 ms.
            assert t["points"] == runs[name]["sampled"][t["child"]], (name, t)
            assert len(t["points"]) == len(STAGES) and min(t["points"]) >= 2, (name, t)


def test_a_clean_demo_has_no_bad_apple(runs: dict[str, Any]) -> None:
    assert runs["clean"]["bad"] == [] and runs["clean"]["noBad"]


def test_beside_a_slow_child_nobody_else_is_flagged(runs: dict[str, Any]) -> None:
    # Stages this short (tens of milliseconds to 0.4 s) vary up to 2x between children, so the
    # robust test may not single the slow child out here (the full demo's 25 MiB images do: README); but
    # the children that ran beside it, on the same cores, must never be flagged for it.
    bad = runs["slow"]["bad"]
    assert {child for _, child in bad} <= {f"child {SLOW_CHILD}"}
    assert {stage for stage, _ in bad} <= {"download", "upload"}


def test_the_contract_rows_carry_values(runs: dict[str, Any]) -> None:
    values = runs["clean"]["contract"]
    assert len(values) >= 6 * len(STAGES)
    assert any(v.endswith(" calls") for v in values) and any(" B" in v for v in values)


def test_the_comparison_shows_both_runs_per_stage(runs: dict[str, Any]) -> None:
    compared = runs["compare"]["compared"]
    assert [c["stage"] for c in compared] == list(STAGES)
    for c in compared:
        assert c["heads"][1:] == ["clean", "slow", "slow / clean"]
        assert c["boxes"][:2] == ["clean", "slow"] and set(c["boxes"]) == {"clean", "slow"}
