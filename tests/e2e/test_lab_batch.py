"""The lab's batch (pipeline.local.demo.lab_batch), without the lab volume: each run keeps its profiles in a
directory named for its setting (a '/' as in 30/20 read as '-'), says in them the type of volume the lab
emulates, runs the process command it is given (`iobatch lab --process-command`), and deletes the embedded
server's data once the run succeeded, so a loop of many runs does not fill the disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.local.demo import lab_batch, lab_run_dir
from pipeline.local.runner import S3_DATA
from profiling import runfiles
from tuning.host import HostTuning
from tuning.lab import ComparePlan


def test_a_lab_run_keeps_its_profiles_not_its_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths: the sub-stage socket's path stays short
    plan = ComparePlan(tuned=HostTuning(), workers=2, images=4, image_mib=0.2, images_per_child=2)
    listing = "sh -c 'ls \"$0\" > \"$1/listing.txt\"' {input} {output}"
    run_batch = lab_batch(plan, Path("runs"), volume_type="st1", process_command=listing)
    scratch = Path("volume") / "run-1"
    scratch.mkdir(parents=True)
    summary = run_batch(1, "30/20", scratch)
    run_dir = lab_run_dir(Path("runs"), 1, "30/20")
    assert run_dir == Path("runs") / "run-1-30-20"
    assert "download" in summary
    profiles = list(runfiles.read_profiles(run_dir))
    assert {p.stage for p in profiles} >= {"download", "process", "upload"}
    # The profiles say the volume the lab emulates, so the advisor judges it as measured, not as a what-if.
    assert {p.properties["VolumeType"] for p in profiles} == {"st1"}
    assert (run_dir / runfiles.RUN_FILE).exists() and not (run_dir / S3_DATA).exists()
    # Each child's process stage ran the command given: its one output is the listing of its images.
    for log in sorted((run_dir / "logs").glob("*.log")):
        events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        [start] = [e for e in events if e["event"] == "stage_start" and e["stage"] == "process"]
        [end] = [e for e in events if e["event"] == "stage_end" and e["stage"] == "process"]
        assert start["command"] == listing and end["files"] == 1, events
