"""One scratch volume shared by many attempts (pipeline/scratch.py), on this machine's filesystem: locks
held by live processes, attempts killed with SIGKILL, the host's marker, and a full volume judged by whose
files fill it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline import scratch as scratch_mod
from pipeline.errors import EXIT_PERMANENT, EXIT_RETRYABLE, ScratchError, ScratchUnavailable
from pipeline.interface import task_dir_name
from pipeline.scratch import LOCK_NAME, UNCLAIMED_AGE_S, Scratch, sweep
from tuning.host import SCRATCH_READY_MARKER

CLAIM_AND_WAIT = """
import sys, time
from pathlib import Path
from pipeline.scratch import Scratch
s = Scratch(Path(sys.argv[1]), Path(sys.argv[1]) / sys.argv[2], require_prepared=False)
s.claim()
(s.work_dir / "input" / "half-downloaded.jpg").write_bytes(b"x" * 65536)
print("claimed", flush=True)
time.sleep(60)
"""


def attempt(root: Path, task: str) -> Scratch:
    return Scratch(root, root / task_dir_name(task), require_prepared=False)


def start_claimer(root: Path, task: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", CLAIM_AND_WAIT, str(root), task_dir_name(task)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "claimed"
    return proc


def test_a_live_attempt_is_kept_and_one_killed_with_sigkill_is_swept_by_the_next_claim(tmp_path: Path) -> None:
    live = start_claimer(tmp_path, "live")
    killed = start_claimer(tmp_path, "killed")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        mine = attempt(tmp_path, "mine")
        assert mine.claim() == [task_dir_name("killed")]
        assert sorted(p.name for p in tmp_path.iterdir()) == [task_dir_name("live"), task_dir_name("mine")]
        assert (tmp_path / task_dir_name("live") / "input" / "half-downloaded.jpg").exists()
        mine.release()
        assert not mine.work_dir.exists()
    finally:
        live.kill()
        live.wait()
    # Its holder gone, the live attempt's directory goes with the next sweep.
    assert sweep(tmp_path) == [task_dir_name("live")]


def test_never_locked_directories_go_by_age_and_nothing_else_is_touched(tmp_path: Path) -> None:
    young, old = tmp_path / task_dir_name("young"), tmp_path / task_dir_name("old")
    for folder in (young, old, tmp_path / "user-data"):
        (folder / "sub").mkdir(parents=True)
    (tmp_path / task_dir_name("link")).symlink_to(tmp_path / "user-data")
    (tmp_path / SCRATCH_READY_MARKER).write_text("prepared\n")
    past = time.time() - UNCLAIMED_AGE_S - 60
    os.utime(old, (past, past))
    assert sweep(tmp_path) == [task_dir_name("old")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [task_dir_name("young"), task_dir_name("link"), "user-data", SCRATCH_READY_MARKER])
    assert (tmp_path / "user-data" / "sub").is_dir()


def test_a_held_lock_is_never_swept_whatever_its_age(tmp_path: Path) -> None:
    held = attempt(tmp_path, "held")
    held.claim()
    past = time.time() - 10 * UNCLAIMED_AGE_S
    os.utime(held.work_dir, (past, past))
    os.utime(held.work_dir / LOCK_NAME, (past, past))
    assert sweep(tmp_path) == [] and held.work_dir.is_dir()
    held.release()


def test_a_host_that_did_not_prepare_scratch_sends_the_child_elsewhere(tmp_path: Path) -> None:
    root = tmp_path / "scratch"
    root.mkdir()
    child = Scratch(root, root / task_dir_name("t"), require_prepared=True)
    with pytest.raises(ScratchUnavailable, match=f"has no {SCRATCH_READY_MARKER} marker") as raised:
        child.claim()
    assert raised.value.exit_code == EXIT_RETRYABLE
    assert list(root.iterdir()) == []  # nothing written on a volume that is not ours
    (root / SCRATCH_READY_MARKER).write_text("prepared\n")
    child.claim()
    child.release()
    with pytest.raises(ScratchError, match="does not exist"):
        Scratch(tmp_path / "absent", tmp_path / "absent" / "x", require_prepared=False).claim()


def test_a_full_volume_is_the_childs_fault_only_when_its_own_files_fill_it(
    tmp_path: Path, monkeypatch: Any
) -> None:
    child = attempt(tmp_path, "t")
    child.claim()
    (child.work_dir / "input" / "image").write_bytes(b"\0" * (4 << 20))
    own = scratch_mod.tree_bytes(child.work_dir)
    assert own >= 4 << 20

    def volume(total: int) -> None:
        monkeypatch.setattr(scratch_mod.shutil, "disk_usage",
                            lambda path: scratch_mod.shutil._ntuple_diskusage(total, total, 0))  # type: ignore[attr-defined]

    volume(8 << 20)  # half of the volume is this child's; its whole download needs 7.5 MiB of 8
    alone = child.full_error("downloading", at_least=15 << 19)
    assert alone.exit_code == EXIT_PERMANENT
    assert alone.headline == (f"scratch volume {tmp_path} (8.0 MiB) is full while downloading, this child's own "
                              "files need 7.5 MiB: use a bigger volume (see `iobatch advise`) or fewer images per job")
    volume(64 << 20)  # the neighbours hold the other 60 MiB
    shared = child.full_error("writing the shard")
    assert shared.exit_code == EXIT_RETRYABLE
    assert shared.headline == (f"scratch volume {tmp_path} (64.0 MiB) is full while writing the shard, but this "
                               f"child needs only {own / 2**20:.1f} MiB; other children hold "
                               f"{(64 * 2**20 - own) / 2**20:.1f} MiB: the child is retried")
    with pytest.raises(ScratchError, match=r"\(64.0 MiB\) is smaller than this child's 80.0 MiB of images"):
        child.check_fits(80 << 20)
    child.check_fits(60 << 20)
    child.release()
