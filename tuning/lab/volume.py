"""The lab volume: an st1-like volume on this machine, to see the write cache and the credit cliff before
paying for them. Root only.

`Lab` builds:

- a sparse file attached to a loop device (O_DIRECT to the backing file, so the host's own page cache
  does not buffer the volume a second time), with XFS mounted with the tuned options from
  tuning.host.HostTuning;
- a throughput limit on that loop device through the ROOT blkio cgroup (v1). Only the root cgroup works:
  writeback runs in the root cgroup, so a child cgroup's limit would only slow O_DIRECT writes;
- the credit controller (tuning.lab.credits), which moves that limit between burst and baseline;
- page-cache settings that act like an instance with less memory: vm.dirty_bytes and
  vm.dirty_background_bytes computed from the chosen memory and the tuning's ratios (`apply_cache`).

Every setting is recorded in the state file before it is changed and restored on every exit path
(tuning.lab.restore).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuning.ebs import MIB
from tuning.host import SCRATCH_DEVICE_NAME, HostTuning
from tuning.lab import damon, fusedev
from tuning.lab.config import LabConfig, LabError, emulated_sysctls
from tuning.lab.credits import CreditController
from tuning.lab.restore import (
    BLKIO_ROOT,
    THROTTLE_FILES,
    close_state,
    install_interrupt_handlers,
    new_state,
    recover,
    start_guard,
    write_state,
    write_sysctl,
)

REQUIRED_TOOLS = ("losetup", "mkfs.xfs", "mount", "umount")


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False)


class Lab:
    """The emulated volume, as a context manager. Root only."""

    def __init__(self, config: LabConfig, *, say: Callable[[str], None] = print) -> None:
        config.validate()
        self.config = config
        self.say = say
        self.mount = config.lab_dir / "mnt"
        self.backing = config.lab_dir / "volume.img"
        self.device = ""
        self.devno = ""
        self.controller: CreditController | None = None
        self._state: dict[str, Any] = {}
        self._old_handlers: dict[int, Any] = {}
        self._closed = False
        self.fuse_mount: Path | None = None
        self.store: Path | None = None  # the FUSE device's data (fusedev.store_path)
        self.stats_path = config.lab_dir / "device-stats.json"

    # -- setup --

    def __enter__(self) -> Lab:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Check the machine, clean up after a crashed lab, then build the volume and start the controller."""
        if os.geteuid() != 0:
            raise LabError("the lab needs root (loop devices, mounts, sysctls, blkio cgroup): run it with sudo")
        for tool in REQUIRED_TOOLS:
            if _run(["sh", "-c", f"command -v {tool}"]).returncode != 0:
                raise LabError(f"{tool} is not installed: install util-linux and xfsprogs")
        fuse = self.config.throttle == "fuse"
        hypervisor = self.config.throttle == "hypervisor"
        given = self.config.device or Path(SCRATCH_DEVICE_NAME)
        if fuse:
            fusedev.check_can_run()
        elif hypervisor:
            if not given.is_block_device():
                raise LabError(f"{given} is not a block device: the hypervisor throttle runs inside the guest "
                               "(iobatch lab --where guest), on the disk QEMU throttles")
        else:
            for name in THROTTLE_FILES:
                if not (BLKIO_ROOT / name).exists():
                    raise LabError(f"{BLKIO_ROOT / name} is missing: the blkio throttle needs the cgroup v1 blkio "
                                   "controller; use the FUSE throttle (--throttle fuse) on cgroup v2")
        recover(self.config.state_dir, say=self.say)
        self._old_handlers = install_interrupt_handlers()
        # Record first, change second: the state names every setting before it is touched.
        self._state = new_state(backing=None if hypervisor else self.backing, mount=self.mount)
        self._state["damon"] = damon.reclaiming()
        self._save()
        for problem in damon.pause(self._state["damon"]):
            self.say(f"lab: could not pause the host's proactive reclaim: {problem}")
        if self.config.guard:
            start_guard(self.config.state_dir)
        self.config.lab_dir.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        if fuse:
            self._start_fuse()
        elif not hypervisor:
            with open(self.backing, "wb") as image:
                image.truncate(self.config.loop_size_mib * MIB)
        self.device = str(given.resolve()) if hypervisor else self._attach_loop()
        rdev = os.stat(self.device).st_rdev
        self.devno = f"{os.major(rdev)}:{os.minor(rdev)}"
        self._state.update(device=self.device, devno=self.devno)
        self._save()
        mkfs = _run(["mkfs.xfs", "-q", "-f", self.device])
        if mkfs.returncode != 0:
            raise LabError(f"mkfs.xfs {self.device} failed: {mkfs.stderr.strip()}")
        options = self.config.tuning.mount_option_string()
        mounted = _run(["mount", "-t", "xfs", "-o", options, self.device, str(self.mount)])
        if mounted.returncode != 0:
            raise LabError(f"mount -o {options} failed: {mounted.stderr.strip()}")
        os.chmod(self.mount, 0o1777)
        if not (fuse or hypervisor):
            # The throttle rules for this device did not exist (a fresh loop device): restore writes 0.
            self._state["throttle"] = {name: self._current_rule(name) for name in THROTTLE_FILES}
            self._save()
        volume = self.config.volume
        initial = self.config.initial_credits
        # With the FUSE device the controller only samples the host (the device keeps its own credits); with the
        # hypervisor's throttle it keeps the model's count of QEMU's bucket, which cannot be read from inside.
        self.controller = CreditController(
            volume=volume, device_name=Path(self.device).name,
            set_limit=(lambda _: None) if fuse or hypervisor else self._set_limit,
            time_scale=self.config.time_scale, initial_credits_mib=initial, tick_s=self.config.tick_s,
            hold_empty=self.config.hold_empty or fuse)
        self.controller.start()
        size = "the hypervisor-throttled disk" if hypervisor else f"{self.config.loop_size_mib} MiB"
        self.say(f"lab: {volume.label} on {self.device} ({size} XFS at {self.mount}, "
                 f"-o {options}); burst {volume.burst_mibps:.1f} MiB/s, baseline {volume.baseline_mibps:.1f} "
                 f"MiB/s, credits " + ("held empty (baseline only)" if self.config.hold_empty else
                                        f"{initial / 1024:.1f} GiB (time scale {self.config.time_scale:g})")
                 + self._store_note() + damon.describe(self._state.get("damon") or {}))

    def _attach_loop(self) -> str:
        attach = _run(["losetup", "--find", "--show", "--direct-io=on", str(self.backing)])
        if attach.returncode != 0:
            raise LabError(f"losetup failed: {attach.stderr.strip()}")
        return attach.stdout.strip()

    def _store_note(self) -> str:
        if self.store is None:
            return ""
        if self.store.parent == fusedev.SHM:
            return f"; the device's data in memory ({fusedev.SHM})"
        return (f"; the device's data on disk ({self.store}): its writeback shares the dirty limits (see "
                "tuning.lab.fusedev)")

    def _start_fuse(self) -> None:
        """Start the FUSE device's daemon (recorded first) and wait for its file; the loop device attaches it."""
        config = self.config
        rates = fusedev.DeviceRates.of(config.volume, time_scale=config.time_scale,
                                       initial_mib=config.initial_credits, hold_empty=config.hold_empty)
        self.fuse_mount = config.lab_dir / "device"
        self.fuse_mount.mkdir(parents=True, exist_ok=True)
        self.stats_path = config.lab_dir / "device-stats.json"
        self.store = store = fusedev.store_path(config.lab_dir, config.loop_size_mib * MIB)
        self.backing = self.fuse_mount / fusedev.FILE_NAME
        fuse_state: dict[str, Any] = {"mount": str(self.fuse_mount), "store": str(store),
                                      "stats": str(self.stats_path)}
        self._state.update(backing=str(self.backing), fuse=fuse_state)
        self._save()
        pid, start = fusedev.start_daemon(self.fuse_mount, store, config.loop_size_mib * MIB, self.stats_path,
                                          rates)
        fuse_state.update(pid=pid, pid_start=start)
        self._save()

    def _current_rule(self, name: str) -> int:
        with contextlib.suppress(OSError):
            for line in (BLKIO_ROOT / name).read_text(encoding="ascii").splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == self.devno:
                    return int(parts[1])
        return 0

    def _set_limit(self, bps: int) -> None:
        for name in THROTTLE_FILES:
            (BLKIO_ROOT / name).write_text(f"{self.devno} {bps}\n", encoding="ascii")

    def _save(self) -> None:
        write_state(self.config.state_dir, self._state)

    # -- use --

    def apply_cache(self, tuning: HostTuning, memory_bytes: int | None = None) -> dict[str, str]:
        """Set the page-cache sysctls of `tuning`, as on an instance with `memory_bytes` of memory."""
        values = emulated_sysctls(tuning, memory_bytes)
        # Bytes before ratios is not needed: each write zeroes its partner; write what is asked.
        for key, value in values.items():
            if key not in self._state["sysctls"]:
                raise LabError(f"{key} was not recorded before the lab started: not changing it")
            write_sysctl(key, value)
        return values

    def sync(self) -> float:
        """Flush the volume (syncfs); returns the seconds it took."""
        start = time.monotonic()
        fd = os.open(self.mount, os.O_RDONLY)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syncfs(fd) != 0:
                raise LabError(f"syncfs {self.mount} failed: errno {ctypes.get_errno()}")
        finally:
            os.close(fd)
        return time.monotonic() - start

    def drain(self) -> None:
        """Flush and drop the volume's page cache, so the next run starts clean."""
        self.sync()
        with contextlib.suppress(OSError):
            Path("/proc/sys/vm/drop_caches").write_text("1\n", encoding="ascii")

    def device_stats(self) -> dict[str, Any] | None:
        """The FUSE device's last figures (tuning.lab.fusedev), None with the blkio throttle."""
        return fusedev.read_stats(self.stats_path) if self.config.throttle == "fuse" else None

    @property
    def credits_gib(self) -> float:
        """Credits left, at the real volume's scale (GiB of 1 MiB I/O)."""
        stats = self.device_stats()
        if stats is not None:
            return max(0.0, float(stats["credits_mib"])) / 1024
        return 0.0 if self.controller is None else self.controller.credits_gib

    @property
    def limit_mibps(self) -> float:
        """The throughput limit in force now."""
        stats = self.device_stats()
        if stats is not None:
            return float(stats["limit_bps"]) / MIB
        return 0.0 if self.controller is None else self.controller.current_limit() / MIB

    @property
    def empty_at(self) -> float | None:
        """Seconds into the lab when the bucket first ran dry (None while it has not)."""
        stats = self.device_stats()
        if stats is not None:
            return None if stats["empty_at"] is None else float(stats["empty_at"])
        return None if self.controller is None else self.controller.empty_at

    def check(self) -> None:
        """Raise if the controller thread died."""
        if self.controller is not None and self.controller.error is not None:
            raise LabError(f"the credit controller failed: {self.controller.error}")

    # -- teardown --

    def close(self) -> None:
        """Stop the controller and restore everything; idempotent."""
        if self._closed:
            return
        self._closed = True
        # Ignore further SIGINT/SIGTERM while restoring: a second Ctrl-C must not leave half a restore.
        blocked = {s: signal.signal(s, signal.SIG_IGN) for s in self._old_handlers}
        try:
            if self.controller is not None:
                self.controller.stop()
            if self._state:
                close_state(self.config.state_dir, self._state, say=self.say)
            with contextlib.suppress(OSError):
                self.mount.rmdir()
        finally:
            for signum, old in self._old_handlers.items():
                signal.signal(signum, old if old is not None else signal.SIG_DFL)
            del blocked
