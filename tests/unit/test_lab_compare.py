"""The lab's default-versus-tuned loop (with a stand-in volume) and the comparison of its runs. No root needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from profiling.metrics import MIB
from tests.support.lab import StandInLab
from tuning.host import KERNEL_DEFAULTS, HostTuning
from tuning.lab.compare import ComparePlan, LabRun, WriterResult, download_ratio, render_comparison, run_comparison
from tuning.lab.config import LabConfig, emulated_sysctls


def test_runs_alternate_default_and_tuned_with_the_batch_then_the_writer(tmp_path: Path) -> None:
    events: list[str] = []
    stand_in = StandInLab(tmp_path, events)
    writes: list[dict[str, Any]] = []

    def write(lab: StandInLab, **kwargs: Any) -> WriterResult:
        writes.append(kwargs)
        lab.credits_gib -= 10
        return WriterResult(kwargs["files"], kwargs["file_mib"], 1.0, 2.0, 0, 0, 0.0, 0.0)

    def run_batch(number: int, setting: str, scratch: Path) -> dict[str, dict[str, float | None]]:
        assert scratch == tmp_path / f"run-{number}" and scratch.is_dir()
        events.append(f"batch {number} {setting}")
        return {"download": {"StageDuration": 10.0 if setting == "default" else 4.0}}

    tuned = HostTuning(dirty_ratio=30, dirty_background_ratio=20)
    plan = ComparePlan(tuned=tuned, memory_gib=4.0, rounds=2, workers=3, images=25, image_mib=5.0,
                       images_per_child=10)
    messages: list[str] = []
    runs = run_comparison(LabConfig(), plan, run_batch=run_batch, say=messages.append,
                          open_lab=lambda config, say: stand_in, write=write)
    assert [r.setting for r in runs] == ["default", "tuned", "default", "tuned"]
    default_bytes = emulated_sysctls(KERNEL_DEFAULTS, plan.memory_bytes)["vm.dirty_bytes"]
    assert events[:6] == ["open", "drain", f"cache {default_bytes}", "batch 1 default", "check", "drain"]
    assert events[-1] == "close"
    assert runs[1].sysctls == emulated_sysctls(tuned, 4 * 1024**3)
    # 3 children of 10 images, 3 at once: the writer writes the 30 files they download together.
    assert writes[0] == {"files": 30, "file_mib": 5.0, "threads": 3, "subdir": "writer-1"}
    assert (runs[0].credits_before_gib, runs[0].credits_after_gib) == (500.0, 490.0)
    assert download_ratio(runs) == pytest.approx(2.5)
    assert "3 children" in messages[0] and messages[-1].startswith("lab: run 4 (tuned")


def test_writer_only_runs_no_batch(tmp_path: Path) -> None:
    def write(lab: StandInLab, **kwargs: Any) -> WriterResult:
        return WriterResult(kwargs["files"], kwargs["file_mib"], 1.0, 2.0, 0, 0, 0.0, 0.0)

    runs = run_comparison(LabConfig(), ComparePlan(tuned=HostTuning()), say=lambda _: None,
                          open_lab=lambda config, say: StandInLab(tmp_path, []), write=write)
    assert [r.stages for r in runs] == [{}, {}]
    assert all(r.writer is not None for r in runs)
    assert not any(tmp_path.iterdir())


def test_download_ratio_is_median_default_over_median_tuned() -> None:
    def run(setting: str, seconds: float) -> LabRun:
        return LabRun(setting, {}, {"download": {"StageDuration": seconds}}, 1.0, 0.0, 0.0, 19.5)

    runs = [run("default", 12.0), run("tuned", 3.0), run("default", 10.0), run("tuned", 4.0)]
    assert download_ratio(runs) == pytest.approx(11.0 / 3.5)
    assert download_ratio([run("default", 1.0)]) is None


def test_comparison_shows_each_metric_at_its_display_scale() -> None:
    stages: dict[str, dict[str, float | None]] = {
        "download": {"StageDuration": 12.0, "PeakDirtyBytes": 300 * MIB, "DirtyThresholdBytes": 512 * MIB,
                     "IoStallSome": 1500.0, "DirtyThrottle": None}}
    text = render_comparison([LabRun("default", {}, stages, 1.0, 54.0, 54.0, 19.5),
                              LabRun("tuned", {}, {"download": {"StageDuration": 4.0}}, 1.0, 54.0, 54.0, 19.5)])
    first = text.splitlines()[1].split()
    assert first == ["1", "default", "54.0", "19.5", "download", "12.0", "300.0", "512.0", "1,500.0", "-"]
    assert text.endswith("default / tuned = 3.00x")
