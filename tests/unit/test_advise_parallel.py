"""The advisor's read of a large run in worker processes: the same profiles, in the same order, the same
advice and the same one-line errors as a read in one process."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import app
from profiling import fanout, runfiles
from tests.support.cli import CliRunner
from tests.support.fleet import write_fleet

runner = CliRunner()
ADVISE = ("--jobs-per-instance", "8", "--memory-gib", "32", "--jobs-per-day", "500", "--json")


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fanout, "CHUNK_FILES", 16)


@pytest.mark.parametrize("emf", [False, True], ids=["profiles", "emf"])
def test_a_parallel_read_gives_the_serial_profiles(tmp_path: Path, emf: bool) -> None:
    write_fleet(tmp_path, 150, emf=emf)
    serial = runfiles.read_run_profiles(tmp_path, timeline=False, workers=1)
    parallel = runfiles.read_run_profiles(tmp_path, timeline=False, workers=2)
    assert parallel == serial and serial.from_emf is emf and len(serial.profiles) == 450
    assert [name for _, name in parallel.profiles][::3] == [f"part-{n:05d}" for n in range(150)]


def _advise(run: Path, monkeypatch: pytest.MonkeyPatch, workers: str) -> tuple[int, str]:
    monkeypatch.setattr(fanout, "PARALLEL_MIN_FILES", 1)
    monkeypatch.setenv(fanout.READ_WORKERS_ENV, workers)
    result = runner.invoke(app, ["advise", str(run), *ADVISE])
    return result.exit_code, result.output


def test_the_advice_is_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_fleet(tmp_path, 120)
    serial = _advise(tmp_path, monkeypatch, "1")
    assert serial[0] == 0, serial[1]
    assert _advise(tmp_path, monkeypatch, "2") == serial


def test_a_damaged_line_is_the_same_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = write_fleet(tmp_path, 100)
    for child in (60, 90):  # the first in file order is named
        lines = files[child].read_text().splitlines()
        files[child].write_text("\n".join([lines[0], "{broken", *lines[1:]]) + "\n")
    serial = _advise(tmp_path, monkeypatch, "1")
    assert serial[0] == 65 and serial[1].startswith(f"error: {files[60]}:2: not a profile (")
    assert serial[1].endswith(f"): {runfiles.DamagedFileError.fix}\n") and serial[1].count("\n") == 1
    assert _advise(tmp_path, monkeypatch, "2") == serial


def test_the_workers_setting_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_fleet(tmp_path, 3)
    code, output = _advise(tmp_path, monkeypatch, "0")
    assert code == 64 and output.startswith(f"error: {fanout.READ_WORKERS_ENV}='0' is not a number of worker ")
