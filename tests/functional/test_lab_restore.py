"""The lab restores every kernel setting it changed, however it ends: exception, SIGINT, SIGTERM, SIGKILL.

Root only: it attaches a small loop device, mounts XFS, slows it (the FUSE device, or the root blkio throttle
on cgroup v1: every test runs on both) and sets the dirty sysctls. The dirty limits written are large
(3 GiB) so that other work on the machine is not slowed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tuning.ebs import Volume
from tuning.host import HostTuning
from tuning.lab import Lab, LabConfig, damon, fusedev, recover
from tuning.lab.restore import BLKIO_ROOT, DIRTY_SYSCTLS, read_state, read_sysctl

# untimed: it restores settings and times nothing: it runs beside the guest's boots (tests/conftest.py)
pytestmark = [pytest.mark.root, pytest.mark.untimed]

ROOT_OK = os.geteuid() == 0
TOOLS_OK = all(shutil.which(t) for t in ("losetup", "mkfs.xfs", "mount", "umount"))
BLKIO_OK = (BLKIO_ROOT / "blkio.throttle.write_bps_device").exists()
FUSE_OK = Path("/dev/fuse").exists() and shutil.which("fusermount3") is not None
if not (ROOT_OK and TOOLS_OK):
    pytest.skip("needs root, util-linux and xfsprogs", allow_module_level=True)
THROTTLES = [
    pytest.param("fuse", marks=pytest.mark.skipif(not FUSE_OK, reason="needs /dev/fuse and fusermount3")),
    pytest.param("blkio", marks=pytest.mark.skipif(not BLKIO_OK, reason="needs the cgroup v1 blkio controller")),
]

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3
CACHE = HostTuning(dirty_ratio=None, dirty_background_ratio=None, dirty_bytes=3 * GIB,
                   dirty_background_bytes=GIB + GIB // 2)

CHILD = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from tuning.ebs import Volume
    from tuning.host import HostTuning
    from tuning.lab import Lab, LabConfig

    lab_dir, state_dir, guard, throttle = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
    config = LabConfig(volume=Volume("st1", 500), lab_dir=lab_dir, state_dir=state_dir, loop_size_mib=320,
                       guard=guard, tick_s=0.05, throttle=throttle)
    with Lab(config, say=lambda _: None) as lab:
        lab.apply_cache(HostTuning(dirty_ratio=None, dirty_background_ratio=None, dirty_bytes=3 * 1024**3,
                                   dirty_background_bytes=3 * 1024**3 // 2))
        time.sleep(0.3)  # let the controller set the throttle
        print(json.dumps({"device": lab.device, "devno": lab.devno, "mount": str(lab.mount),
                          "fuse": str(lab.fuse_mount or ""),
                          "store": str(lab.store or "")}), flush=True)
        with open(lab.mount / "data", "wb") as out:
            while True:  # keep the volume busy until killed
                out.write(b"x" * 1024 * 1024)
                out.flush()
                time.sleep(0.01)
""")


def snapshot() -> dict[str, str]:
    """The sysctls and every DAMON switch (on this machine kind a kdamond pages out idle memory: tuning.lab.damon)."""
    switches = [*damon.KDAMONDS.glob("*/state"), damon.RECLAIM_ENABLED]
    return {**{key: read_sysctl(key) for key in DIRTY_SYSCTLS},
            **{str(p): p.read_text().strip() for p in switches if p.exists()}}


def throttle_rules(devno: str) -> list[str]:
    rules = []
    for name in ("blkio.throttle.write_bps_device", "blkio.throttle.read_bps_device"):
        for line in (BLKIO_ROOT / name).read_text().splitlines():
            if line.split() and line.split()[0] == devno:
                rules.append(f"{name}: {line}")
    return rules


def mounted(path: str) -> bool:
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == path for line in mounts)


def attached(backing: Path) -> str:
    return subprocess.run(["losetup", "-j", str(backing)], capture_output=True, text=True).stdout.strip()


def fuse_daemons(lab_dir: Path) -> list[str]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"fusedev" in cmd and str(lab_dir).encode() in b" ".join(cmd):
            found.append(proc.name)
    return found


def assert_restored(before: dict[str, str], info: dict[str, str], lab_dir: Path, state_dir: Path) -> None:
    assert snapshot() == before
    assert throttle_rules(info["devno"]) == []
    assert not mounted(info["mount"])
    assert attached(lab_dir / "volume.img") == ""
    assert not (lab_dir / "volume.img").exists()
    assert read_state(state_dir) is None
    # The FUSE device: unmounted, its daemon gone, its store deleted.
    assert not mounted(str(lab_dir / "device"))
    assert wait_for(lambda: not fuse_daemons(lab_dir), 5), "the FUSE daemon is still running"
    assert not (lab_dir / fusedev.STORE_NAME).exists()
    assert not info["store"] or not Path(info["store"]).exists()  # in /dev/shm when memory allows


def start_child(tmp_path: Path, guard: bool, throttle: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "lab"), str(tmp_path / "state"),
                             "1" if guard else "0", throttle], stdout=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=10)
        pytest.fail(f"the lab did not start (exit {proc.returncode})")
    info = json.loads(line)
    return proc, info


def wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


@pytest.mark.timeout(60)
@pytest.mark.parametrize("throttle", THROTTLES)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_restores_everything(tmp_path: Path, sig: signal.Signals, throttle: str) -> None:
    before = snapshot()
    proc, info = start_child(tmp_path, guard=False, throttle=throttle)
    try:
        # While running: the sysctls, the throttle and the mount are in place, the proactive reclaim paused.
        assert read_sysctl("vm.dirty_bytes") == str(3 * GIB)
        assert damon.reclaiming() == {}
        if throttle == "blkio":
            assert throttle_rules(info["devno"]) != []
        else:
            assert mounted(info["fuse"]) and fuse_daemons(tmp_path / "lab") and Path(info["store"]).exists()
        assert mounted(info["mount"])
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        recover(tmp_path / "state", say=lambda _: None)
    assert_restored(before, info, tmp_path / "lab", tmp_path / "state")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("throttle", THROTTLES)
def test_sigkill_is_restored_by_the_guard(tmp_path: Path, throttle: str) -> None:
    before = snapshot()
    proc, info = start_child(tmp_path, guard=True, throttle=throttle)
    try:
        assert read_sysctl("vm.dirty_bytes") == str(3 * GIB)
        proc.kill()
        proc.wait(timeout=10)
        assert wait_for(lambda: read_state(tmp_path / "state") is None, 30), "the guard did not restore"
    finally:
        recover(tmp_path / "state", say=lambda _: None)
    assert_restored(before, info, tmp_path / "lab", tmp_path / "state")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("throttle", THROTTLES)
def test_sigkill_without_guard_is_cleaned_up_by_the_next_run(tmp_path: Path, throttle: str) -> None:
    before = snapshot()
    proc, info = start_child(tmp_path, guard=False, throttle=throttle)
    proc.kill()
    proc.wait(timeout=10)
    # Left behind: the state file names what to undo.
    state = read_state(tmp_path / "state")
    assert state is not None and state["device"] == info["device"]
    assert read_sysctl("vm.dirty_bytes") == str(3 * GIB)
    messages: list[str] = []
    assert recover(tmp_path / "state", say=messages.append) is True
    assert "earlier lab run" in messages[0]
    assert_restored(before, info, tmp_path / "lab", tmp_path / "state")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("throttle", THROTTLES)
def test_exception_inside_the_lab_restores(tmp_path: Path, throttle: str) -> None:
    before = snapshot()
    config = LabConfig(volume=Volume("st1", 500), lab_dir=tmp_path / "lab", state_dir=tmp_path / "state",
                       loop_size_mib=320, guard=False, tick_s=0.05, throttle=throttle)
    info: dict[str, str] = {}
    with pytest.raises(RuntimeError, match="boom"), Lab(config, say=lambda _: None) as lab:
        lab.apply_cache(CACHE)
        info = {"device": lab.device, "devno": lab.devno, "mount": str(lab.mount), "store": str(lab.store or "")}
        assert read_sysctl("vm.dirty_background_bytes") == str(GIB + GIB // 2)
        assert throttle == "blkio" or Path(info["store"]).exists()
        raise RuntimeError("boom")
    assert_restored(before, info, tmp_path / "lab", tmp_path / "state")
