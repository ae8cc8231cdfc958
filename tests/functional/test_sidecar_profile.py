"""`iobatch profile -- CMD`: one command as one stage, through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profiling.metrics import PROFILE_SCHEMA

REPO = Path(__file__).resolve().parents[2]


def _iobatch(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


def test_profile_prints_the_table_writes_json_and_emf_and_keeps_the_exit_code(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    writer = f"import os\nfd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)\n" \
             "for _ in range(250): os.write(fd, b'z' * 4096)\nraise SystemExit(3)\n"
    done = _iobatch("profile", "--interval", "0.1", "--json", str(tmp_path / "p.json"), "--emf",
                    str(tmp_path / "p.emf"), "--device", str(tmp_path), "--",
                    sys.executable, "-S", "-c", writer)
    assert done.returncode == 3, done.stderr
    assert "write calls" in done.stdout and "250" in done.stdout and "exit 3" in done.stdout
    body = json.loads((tmp_path / "p.json").read_text())
    assert body["schema"] == PROFILE_SCHEMA and body["stage"] == "command" and body["outcome"] == "failed"
    assert (body["write_calls"], body["write_bytes"]) == (250, 250 * 4096)
    doc = json.loads((tmp_path / "p.emf").read_text())
    assert doc["WriteCalls"] == 250 and doc["Stage"] == "command"
    assert doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Pipeline", "Stage"]]


@pytest.mark.parametrize(("args", "needle"), [
    (["--", "no-such-command-iobatch"], "command 'no-such-command-iobatch' not found"),
    (["--device", "/no/such/device", "--", "true"], "device path /no/such/device does not exist"),
    (["--interval", "0", "--", "true"], "interval 0.0 s is out of range"),
])
def test_bad_input_is_one_line_and_exit_64(args: list[str], needle: str) -> None:
    done = _iobatch("profile", *args)
    assert done.returncode == 64
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr


def test_overlay_or_tmpfs_gives_a_notice_and_no_device(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no separate tmpfs at /dev/shm")
    done = _iobatch("profile", "--device", str(shm), "--json", str(tmp_path / "p.json"), "--", "true")
    assert done.returncode == 0, done.stderr
    assert "notice:" in done.stderr and "not a block device" in done.stderr
    assert json.loads((tmp_path / "p.json").read_text())["device"] is None
