"""A large run read in worker processes gives what a read in one process gives: the same columns, traffic to
the last bit, contract rows, page and one-line errors; the workers end with the read, or on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import app
from profiling import fanout, runfiles
from profiling.report import DamagedInputError, ReportInputError, load_run_dir, render_html
from profiling.report.sources import ReportData
from tests.support.cli import CliRunner
from tests.support.fleet import write_fleet

runner = CliRunner()


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 16 files, so a few hundred children make many chunks over two workers."""
    monkeypatch.setattr(fanout, "CHUNK_FILES", 16)


def state(data: ReportData) -> dict[str, Any]:
    """Everything a report's page is drawn from."""
    fleet = data.fleet
    stages = {
        stage: (rows.names, [fleet.sources[i] for i in rows.source], rows.instance, rows.outcome, rows.children,
                rows.started.tobytes(), rows.duration.tobytes(), rows.throughput.tobytes(),
                {k: v.tobytes() for k, v in rows.values.items()})
        for stage, rows in fleet.stages.items()}
    groups = {k: (g.count, g.values, g.unit, sorted(g.sources), g.first_note) for k, g in fleet.contract_groups.items()}
    return {"stages": stages, "order": list(fleet.stages), "jobs": fleet.jobs, "traffic": fleet.traffic,
            "points": fleet.timeline_points, "groups": groups, "group order": list(fleet.contract_groups),
            "rows": fleet.contract_rows, "total": fleet.contract_total, "profiles": fleet.profiles,
            "entries": data.entries, "complete": data.complete, "source": data.source, "notes": data.notes,
            "timelines": data.has_timelines}


def page(data: ReportData) -> str:
    return re.sub(r"generated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "generated -", render_html(data))


@pytest.mark.parametrize("emf", [False, True], ids=["profiles", "emf"])
def test_a_parallel_read_is_the_serial_read(tmp_path: Path, emf: bool) -> None:
    write_fleet(tmp_path, 300 if not emf else 120, emf=emf)
    serial = load_run_dir(tmp_path, workers=1)
    calls: list[tuple[int, int]] = []
    parallel = load_run_dir(tmp_path, workers=2, progress=lambda done, total: calls.append((done, total)))
    assert not serial.complete and serial.fleet.child_count() == (300 if not emf else 120)
    assert state(parallel) == state(serial)
    if not emf:
        assert serial.fleet.contract_total == 600 and len(serial.fleet.contract_rows) == 500
        assert len({second for second, cell in serial.fleet.traffic.items() if cell[0]}) > 100
    # progress advances chunk by chunk to the last file
    files = 300 if not emf else 120
    assert calls == [(min(done, files), files) for done in range(16, files + 16, 16)]
    assert page(parallel) == page(serial)


def test_the_chunks_of_a_serial_read_are_summed_as_the_workers_sum_them(tmp_path: Path) -> None:
    # The traffic of 300 overlapping children, summed in one pass instead of chunk by chunk, differs in the last
    # bits: the serial read sums per chunk too, which is what makes the two reads equal above.
    write_fleet(tmp_path, 300)
    chunked = load_run_dir(tmp_path, workers=1).fleet.traffic
    fanout.CHUNK_FILES = 10_000  # one chunk (the fixture restores it)
    whole = load_run_dir(tmp_path, workers=1).fleet.traffic
    assert chunked.keys() == whole.keys()
    assert chunked != whole
    assert all(abs(chunked[k][0] - whole[k][0]) <= 1e-9 * whole[k][0] for k in whole)


def test_a_small_batch_in_many_files_is_kept_whole(tmp_path: Path) -> None:
    write_fleet(tmp_path, 10)
    for n in range(10, 80):
        runfiles.profile_path(tmp_path, f"part-{n:05d}").write_text("\n")  # files without a profile
    data = load_run_dir(tmp_path, workers=2)
    assert data.complete and len(data.entries) == 30


def _damage(files: list[Path], child: int, text: str) -> str:
    lines = files[child].read_text().splitlines()
    lines[1] = text
    files[child].write_text("\n".join(lines) + "\n")
    return f"error: {files[child]}:2: not a profile"


def test_a_damaged_line_is_the_same_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = write_fleet(tmp_path, 200)
    first = _damage(files, 150, '{"stage": "process", "broken')
    _damage(files, 190, "[]")  # a later one, in another chunk: the first in file order is named
    with pytest.raises(DamagedInputError) as serial:
        load_run_dir(tmp_path, workers=1)
    with pytest.raises(DamagedInputError) as parallel:
        load_run_dir(tmp_path, workers=2)
    assert str(parallel.value) == str(serial.value)
    assert type(parallel.value) is DamagedInputError and parallel.value.__cause__ is None
    monkeypatch.setattr(fanout, "PARALLEL_MIN_FILES", 1)
    monkeypatch.setenv(fanout.READ_WORKERS_ENV, "2")
    result = runner.invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 65, result.output
    assert result.output == f"error: {serial.value}\n" and result.output.startswith(first)
    assert not (tmp_path / "r.html").exists()


def test_an_unreadable_file_is_the_same_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = write_fleet(tmp_path, 100)
    files[70].unlink()
    os.mkfifo(files[70])
    with pytest.raises(ReportInputError) as serial:
        load_run_dir(tmp_path, workers=1)
    with pytest.raises(ReportInputError) as parallel:
        load_run_dir(tmp_path, workers=2)
    assert str(parallel.value) == str(serial.value) and str(serial.value).startswith(f"cannot read {files[70]} (")
    monkeypatch.setattr(fanout, "PARALLEL_MIN_FILES", 1)
    monkeypatch.setenv(fanout.READ_WORKERS_ENV, "2")
    result = runner.invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert (result.exit_code, result.output) == (64, f"error: {serial.value}\n")


def test_the_workers_setting_is_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write_fleet(tmp_path, 3)
    monkeypatch.setenv(fanout.READ_WORKERS_ENV, "two")
    result = runner.invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert (result.exit_code, result.output) == (64, f"error: {fanout.READ_WORKERS_ENV}='two' is not a number of "
                                                 "worker processes: set a whole number of 1 or more (1 reads in "
                                                 "one process), or unset it\n")
    threads = [1]  # the CLI's one thread (pytest's timeout may run its own)
    monkeypatch.setattr(fanout.threading, "active_count", lambda: threads[0])
    monkeypatch.setenv(fanout.READ_WORKERS_ENV, "64")
    assert fanout.read_workers(100_000) == min(64, fanout.cores())  # at most the cores
    assert fanout.read_workers(fanout.PARALLEL_MIN_FILES - 1) == 1  # a small run: one process
    assert fanout.read_workers(40, workers=3) == 3  # asked for (tests): whatever the size
    monkeypatch.delenv(fanout.READ_WORKERS_ENV)
    assert fanout.read_workers(100_000) == fanout.cores()
    threads[0] = 2  # a process running other threads is not forked unless asked to
    assert fanout.read_workers(100_000) == 1 and fanout.read_workers(100_000, workers=2) == 2


def _pid(task: int) -> tuple[int, int]:
    return task, os.getpid()


def test_ordered_map_runs_in_workers_and_keeps_the_order() -> None:
    results = list(fanout.ordered_map(_pid, list(range(40)), 2))
    assert [task for task, _ in results] == list(range(40))
    assert os.getpid() not in {pid for _, pid in results}


SCRIPT = textwrap.dedent("""
    import os, sys, time
    from profiling import fanout

    def slow(task):
        time.sleep(0.2 if task < 2 else 60)
        return os.getpid()

    for pid in fanout.ordered_map(slow, list(range(8)), 2):
        print(pid, flush=True)
""")


def _parent(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_ctrl_c_ends_the_workers_with_the_parent(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.readline()
    time.sleep(0.3)  # both workers are in their 60 s tasks
    workers = {int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat")
               if _parent(stat) == proc.pid}
    assert len(workers) == 2 and all(_alive(pid) for pid in workers)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the parent and its workers
    _, err = proc.communicate(timeout=20)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    # the parent's traceback only (a script's own; the CLI prints none): the workers ignore Ctrl-C
    assert err.count("KeyboardInterrupt") == 1 and err.count("Traceback") == 1, err
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers)


def _slowly(x: int) -> int:
    time.sleep(0.3)
    return x


@pytest.mark.timeout(60, method="thread")
def test_workers_end_whatever_sigterm_handler_the_parent_has() -> None:
    # A reader that stops early: the busy workers are killed at once, whatever handlers they inherited (with
    # multiprocessing.Pool, a SIGTERM handler left by an earlier test kept a worker alive and the pool's join
    # waiting for ever).
    old = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        started = time.monotonic()
        for _ in fanout.ordered_map(_slowly, list(range(40)), 2):
            break  # the reader stops early: the busy workers are terminated
        assert time.monotonic() - started < 10
    finally:
        signal.signal(signal.SIGTERM, old)
