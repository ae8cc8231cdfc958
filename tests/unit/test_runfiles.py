"""Run directories: the one reader and writer of run.json, profiles/*.jsonl and emf/*.emf."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from profiling import emf, runfiles
from profiling.metrics import StageProfile

T0 = float(int(time.time()) - 3600)  # EMF refuses timestamps older than 14 days


def _profile(stage: str, child: int) -> StageProfile:
    return StageProfile(stage=stage, outcome="ok", started_at=T0 + child, duration_s=2.0,
                        read_bytes=1000 * (child + 1), properties={"ArrayIndex": str(child)})


def test_run_file_round_trips_and_marks_a_run_dir(tmp_path: Path) -> None:
    assert not runfiles.is_run_dir(tmp_path)
    runfiles.write_run(tmp_path, {"children": 2, "started": 1.5, "dir": tmp_path})
    assert runfiles.is_run_dir(tmp_path)
    assert runfiles.read_run(tmp_path) == {"children": 2, "started": 1.5, "dir": str(tmp_path)}
    assert not list(tmp_path.glob("*.partial"))


def test_a_run_is_read_from_its_profiles_else_its_emf_files(tmp_path: Path) -> None:
    for child in range(2):
        runfiles.emf_path(tmp_path, f"part-{child:05d}").parent.mkdir(parents=True, exist_ok=True)
        runfiles.emf_path(tmp_path, f"part-{child:05d}").write_text(
            "a log line\n" + emf.serialize(_profile("upload", child))[0] + "\n")
    kept = runfiles.read_run_profiles(tmp_path)
    assert kept.from_emf and kept.kept == runfiles.EMF
    assert [(p.stage, child) for p, child in kept.profiles] == [("upload", "part-00000"), ("upload", "part-00001")]

    runfiles.profile_path(tmp_path, "part-00000").parent.mkdir()
    runfiles.profile_path(tmp_path, "part-00000").write_text(
        "\n".join(json.dumps(_profile(s, 0).to_dict()) for s in ("download", "process")) + "\n\n")
    kept = runfiles.read_run_profiles(tmp_path)
    assert not kept.from_emf and kept.kept == runfiles.PROFILES
    assert [p.stage for p, _ in kept.profiles] == ["download", "process"]
    assert [p.stage for p in runfiles.read_profiles(tmp_path)] == ["download", "process"]


def test_an_empty_directory_holds_no_profiles(tmp_path: Path) -> None:
    assert runfiles.read_run_profiles(tmp_path).profiles == []


def test_a_damaged_line_names_the_file_and_line(tmp_path: Path) -> None:
    damaged = tmp_path / "part-00000.jsonl"
    damaged.write_text(json.dumps(_profile("download", 0).to_dict()) + "\n{oops\n")
    with pytest.raises(runfiles.DamagedFileError, match=rf"^{damaged}:2: not a profile"):
        list(runfiles.read_profiles(damaged))
    with pytest.raises(runfiles.DamagedFileError, match=r"^x\.emf:2: not an EMF document"):
        runfiles.profiles_from_emf_lines(["text", '{"broken'], where="x.emf")


def test_emf_lines_keep_stage_documents_of_the_namespace_asked_for() -> None:
    line = emf.serialize(_profile("upload", 0))[0]
    lines = ["starting", line, '{"not": "emf"}', line.replace('"IoBatch"', '"Other"')]
    # Another producer's documents are not the pipeline's, unless every namespace is asked for (None).
    assert len(runfiles.profiles_from_emf_lines(lines, where="x")) == 1
    assert len(runfiles.profiles_from_emf_lines(lines, where="x", namespace="Other")) == 1
    assert len(runfiles.profiles_from_emf_lines(lines, where="x", namespace=None)) == 2
