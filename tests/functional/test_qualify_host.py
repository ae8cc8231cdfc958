"""A host's qualification as the user data runs it: the compressed program (`hostpy qualify`) on a directory of this
machine against a stand-in for IMDS and CloudWatch Logs (tests/support/hoststandin.py): the figures in the file every
child's profiler reads, one event in the log group, and the fence's decision with its hourly cap. As root, the whole
rendered script on a loop device: a host below its ratio with hostQualification=fence fails its setup with the reason
and shuts down as a failed setup does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from profiling.qualification import host_properties, read_qualification
from profiling.qualifyio import FENCED, QUALIFIED, SLOW_CAPPED
from tests.support.hoststandin import HostWorld, host_stand_in
from tuning.host import HostReport, HostTuning
from tuning.hostprogram import LAUNCHER, program_blob
from tuning.hostqualify import EVENT_PREFIX, EXIT_FENCE, FENCE_PREFIX
from tuning.qualify import QualifyPolicy

GROUP = "/aws/batch/iobatch"
FAST, SLOW = [0.001, 0.001], [1e6, 1e6]  # expectations no disk misses, and none meets


@pytest.fixture
def world() -> Iterator[tuple[HostWorld, str]]:
    found = HostWorld()
    with host_stand_in(found) as base:
        yield found, base


def run_qualify(tmp_path: Path, base: str, *, mode: str, expected: list[float], per_hour: int = 2
                ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    target = tmp_path / "scratch"
    target.mkdir(exist_ok=True)
    tuning = HostTuning(mount_point=str(target), qualification=QualifyPolicy(mode=mode, fences_per_hour=per_hour))
    conf = json.loads(tuning.qualify_conf(HostReport(GROUP, "iobatch"), tuning_volume(), ["m6i.2xlarge"]))
    conf.update(seconds=1.0, max_bytes=64 << 20, expected={"*": expected})
    out = tmp_path / "lib" / "qualification.json"
    env = {"PATH": os.environ["PATH"], "IOBATCH_IMDS": base, "IOBATCH_LOG_GROUP": GROUP,
           "IOBATCH_LOGS_ENDPOINT": f"{base}/", "IOBATCH_QUALIFICATION_FILE": str(out)}
    done = subprocess.run([sys.executable, "-I", "-c", LAUNCHER, program_blob(), "qualify", json.dumps(conf),
                           "i-0123456789abcdef0", "m6i.2xlarge"], env=env, capture_output=True, text=True, timeout=60)
    if "refuses O_DIRECT" in done.stdout:
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    assert not (target / ".iobatch-qualify").exists(), "the probe file was left"
    return done, json.loads(out.read_text()) if out.exists() else {}


def tuning_volume() -> Any:
    from tuning.ebs import Volume

    return Volume("st1", 500)


def test_a_host_that_meets_its_expectation_qualifies_and_says_so_once(tmp_path: Path,
                                                                       world: tuple[HostWorld, str]) -> None:
    found, base = world
    done, record = run_qualify(tmp_path, base, mode="fence", expected=FAST)
    assert done.returncode == 0, done.stdout + done.stderr
    assert record["verdict"] == QUALIFIED and record["ratio"] >= 1 and record["write"]["ios"] > 0
    assert record["instance_id"] == "i-0123456789abcdef0" and record["volume"] == "st1 500 GiB"
    [event] = found.messages(EVENT_PREFIX)
    assert event["HostQualification"] == QUALIFIED and event["InstanceId"] == "i-0123456789abcdef0"
    assert "DescribeLogStreams" not in found.targets and not any(s.startswith(FENCE_PREFIX) for s in found.streams)
    # What each child's profiler reads of it.
    props = host_properties(tmp_path / "lib" / "qualification.json")
    quality = read_qualification(props)
    assert quality is not None and not quality.slow and props["QualifiedRatio"] == f"{record['ratio']:.3f}"


def test_a_slow_host_with_fence_is_fenced_with_the_reason(tmp_path: Path, world: tuple[HostWorld, str]) -> None:
    found, base = world
    done, record = run_qualify(tmp_path, base, mode="fence", expected=SLOW)
    assert done.returncode == EXIT_FENCE, done.stdout + done.stderr
    assert done.stdout.startswith("scratch qualified at 0.0") and "below qualifyMinRatio 0.5" in done.stdout
    assert record["verdict"] == FENCED
    assert [s for s in found.streams if s.startswith(FENCE_PREFIX)] == [
        f"{FENCE_PREFIX}{time.strftime('%Y-%m-%dT%H', time.gmtime())}/i-0123456789abcdef0"]
    assert found.messages(EVENT_PREFIX)[0]["HostQualification"] == FENCED


def test_a_slow_host_with_flag_works_flagged(tmp_path: Path, world: tuple[HostWorld, str]) -> None:
    found, base = world
    done, record = run_qualify(tmp_path, base, mode="flag", expected=SLOW)
    assert done.returncode == 0, done.stdout + done.stderr
    assert record["verdict"] == "slow" and found.messages(EVENT_PREFIX)[0]["HostQualification"] == "slow"
    assert "DescribeLogStreams" not in found.targets


@pytest.mark.parametrize(("earlier_min", "fenced"), [((5, 20), False), ((5, 70), True), ((90, 100), True)])
def test_the_fence_cap_counts_the_pipelines_fences_of_the_last_hour(
        tmp_path: Path, world: tuple[HostWorld, str], earlier_min: tuple[int, int], fenced: bool) -> None:
    """Two fences per hour: two other hosts fenced 5 and 20 minutes ago leave this one flagged; one of them 70
    minutes ago, or both over an hour ago, do not."""
    found, base = world
    now = time.time()
    for n, minutes in enumerate(earlier_min):
        made = now - minutes * 60
        found.streams[f"{FENCE_PREFIX}{time.strftime('%Y-%m-%dT%H', time.gmtime(made))}/i-00000000000000{n}"] = \
            int(made * 1000)
    done, record = run_qualify(tmp_path, base, mode="fence", expected=SLOW, per_hour=2)
    assert done.returncode == (EXIT_FENCE if fenced else 0), done.stdout + done.stderr
    assert record["verdict"] == (FENCED if fenced else SLOW_CAPPED)


TOOLS = ("losetup", "mkfs.xfs", "blkid", "findmnt", "mount", "umount")
RECORDER = """#!/bin/bash
echo "$(basename "$0") $*" >> {log}
exit 0
"""


@pytest.mark.root
def test_the_user_data_fences_a_slow_host_as_a_failed_setup(tmp_path: Path, world: tuple[HostWorld, str]) -> None:
    if os.geteuid() != 0 or any(shutil.which(t) is None for t in TOOLS):
        pytest.skip("needs root and " + ", ".join(TOOLS))
    found, base = world
    image = tmp_path / "scratch.img"
    with image.open("wb") as stream:
        stream.truncate(320 << 20)
    attached = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True)
    if attached.returncode != 0:
        pytest.skip(f"no loop device: {attached.stderr.strip()}")
    device, mount_point = attached.stdout.strip(), tmp_path / "scratch"
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in ("systemctl", "shutdown"):
        (bin_dir / tool).write_text(RECORDER.format(log=log))
        (bin_dir / tool).chmod(0o755)
    # An io2 volume of 4,000 MiB/s on an m6i.12xlarge (1,788 MiB/s of EBS) expects far more than a loop device on
    # this machine's disk gives at 1 MiB, from the one model: the host is slow.
    from tuning.ebs import Volume

    tuning = HostTuning(dirty_ratio=None, dirty_background_ratio=None, mount_point=str(mount_point),
                        qualification=QualifyPolicy(mode="fence", min_ratio=0.99))
    script = tuning.render_script(device=device, report=HostReport(GROUP, "iobatch"),
                                  volume=Volume("io2", 4096, iops=256_000), instance_types=["m6i.12xlarge"])
    found.instance_type = "m6i.12xlarge"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "IOBATCH_FSTAB": "", "IOBATCH_IMDS": base,
           "IOBATCH_LOGS_ENDPOINT": f"{base}/", "IOBATCH_SYSCTL_CONF": str(tmp_path / "90-iobatch.conf"),
           "IOBATCH_QUALIFICATION_FILE": str(tmp_path / "lib" / "qualification.json")}
    try:
        result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True)
        subprocess.run(["losetup", "-d", device], capture_output=True)
    assert result.returncode == 1, result.stderr
    assert "FATAL: scratch qualified at" in result.stderr and "below qualifyMinRatio 0.99" in result.stderr
    assert log.read_text().splitlines() == ["systemctl cat ecs.service", "systemctl mask --now ecs.service",
                                            "shutdown -h now iobatch: scratch setup failed"]
    [failure] = found.messages("host-setup/")
    assert failure["HostSetup"] == "failed" and failure["Reason"].startswith("scratch qualified at 0.")
    assert found.messages(EVENT_PREFIX)[0]["HostQualification"] == FENCED
