"""The rendered host script's failure path, run for real with stand-ins for systemctl and shutdown: a
host that could not prepare its scratch volume removes the ready marker, masks the ECS agent and shuts
down; on a machine without the ECS agent it only says so."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tuning.host import SCRATCH_READY_MARKER, HostTuning

RECORDER = """#!/bin/bash
echo "$(basename "$0") $*" >> {log}
if [ "$(basename "$0")" = systemctl ] && [ "$1" = cat ]; then exit {cat_exit}; fi
exit 0
"""


def run_failing_setup(tmp_path: Path, *, ecs_agent: bool) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in ("systemctl", "shutdown"):
        (bin_dir / tool).write_text(RECORDER.format(log=log, cat_exit=0 if ecs_agent else 1))
        (bin_dir / tool).chmod(0o755)
    mount_point = tmp_path / "scratch"
    mount_point.mkdir()
    (mount_point / SCRATCH_READY_MARKER).write_text("prepared on an earlier boot\n")
    script = HostTuning(mount_point=str(mount_point)).render_script(device="/dev/iobatch-no-such-disk")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "IOBATCH_FSTAB": "", "IOBATCH_IMDS": "",
           "IOBATCH_SYSCTL_CONF": str(tmp_path / "90-iobatch.conf")}
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False)
    calls = log.read_text().splitlines() if log.exists() else []
    assert not (mount_point / SCRATCH_READY_MARKER).exists(), "a failed setup left the ready marker"
    return result, calls


@pytest.mark.parametrize("ecs_agent", [True, False])
def test_a_failed_scratch_setup_keeps_the_host_out_of_the_cluster(tmp_path: Path, ecs_agent: bool) -> None:
    result, calls = run_failing_setup(tmp_path, ecs_agent=ecs_agent)
    assert result.returncode == 1
    assert "FATAL: scratch device /dev/iobatch-no-such-disk is not a block device" in result.stderr
    if ecs_agent:
        assert calls == ["systemctl cat ecs.service", "systemctl mask --now ecs.service",
                         "shutdown -h now iobatch: scratch setup failed"]
        assert "masking the ECS agent and shutting this host down" in result.stderr
    else:
        assert calls == ["systemctl cat ecs.service"]
        assert "no ECS agent here, nothing to fence" in result.stderr
