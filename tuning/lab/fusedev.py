"""The lab's slow disk on any kernel: a FUSE file system holding one file, `volume.img`, whose daemon serves every
request at a fixed rate, burst while its own credit count is positive and baseline otherwise, charging AWS's HDD
accounting by each request's offset (tuning.accounting.HddAccountant). The lab puts a loop device on that file.

In: DeviceRates (two constant rates, the bucket's size and its refill rate: the device does not run the simulator).
Out: the served file, and every STATS_EVERY_S a stats file replaced whole (`read_stats`: credits at the real volume's
scale, units charged, sequential and random bytes, bytes read and written, when the bucket first ran dry, whether it
bursts now). Invariants: one request at a time, each taking its units x 1 MiB / the rate; credits may go below zero,
so at an empty bucket the device moves exactly what the baseline allows; its data is in memory when it fits there.

    python -m tuning.lab fusedev MOUNT STORE SIZE STATS [rate options]   (the lab starts it, as root)
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from profiling.probes.procfs import PROC, read_mem_available, read_mounts, read_start_time
from tuning.accounting import HddAccountant
from tuning.ebs import HDD_IO_UNIT, MIB, Volume
from tuning.lab.config import LabError

FILE_NAME = "volume.img"
STATS_EVERY_S = 0.2
SHM = Path("/dev/shm")
STORE_NAME = "device.store"  # the store's name in the lab directory when it is on disk
STORE_MARGIN = 2 << 30  # memory left to everything else when the store is in memory


def store_path(lab_dir: Path, size: int, *, shm: Path = SHM, proc: Path = PROC) -> Path:
    """Where the device keeps its data: on `shm` when it is a tmpfs with room for `size` bytes and the
    machine has that much memory available besides STORE_MARGIN, else in `lab_dir`.

    tmpfs pages are never dirty in the kernel's accounting; on a disk the device's own writes come back as another
    device's dirty pages and writeout, at the device's rate, and take half the dirty limit's per-device shares from
    the volume under test, as nothing on a Batch host does."""
    in_memory = shm / f"iobatch-lab-{os.getpid()}.store"
    mounts, available = read_mounts(proc), read_mem_available(proc)
    try:
        room = os.statvfs(shm)
    except OSError:
        return lab_dir / STORE_NAME
    if (mounts is not None and mounts.get(str(shm)) == "tmpfs" and available is not None
            and room.f_bavail * room.f_frsize >= size and available >= size + STORE_MARGIN):
        return in_memory
    return lab_dir / STORE_NAME


@dataclass(frozen=True)
class DeviceRates:
    """What the fixed-rate device is told. Credits in MiB units at the lab's scale."""

    burst_bps: float
    base_bps: float
    capacity_mib: float
    initial_mib: float
    earn_mibps: float  # credits earned per second
    hdd: bool = True  # charge AWS's HDD units; else bytes (SSD kinds run at one rate anyway)
    time_scale: float = 1.0  # reported credits are multiplied back by this

    @classmethod
    def of(cls, volume: Volume, *, time_scale: float, initial_mib: float, hold_empty: bool) -> DeviceRates:
        """The rates of `volume` for sequential 1 MiB I/O (the units the accounting charges)."""
        return cls(
            burst_bps=volume.throughput_bps(io_size=HDD_IO_UNIT, bursting=True),
            base_bps=volume.throughput_bps(io_size=HDD_IO_UNIT, bursting=False),
            capacity_mib=0.0 if hold_empty else volume.credit_capacity / time_scale,
            initial_mib=0.0 if hold_empty else initial_mib / time_scale,
            earn_mibps=0.0 if hold_empty else volume.earn_rate(),
            hdd=volume.is_hdd, time_scale=time_scale)

    def to_args(self) -> list[str]:
        return [f"--{k.replace('_', '-')}={v}" for k, v in asdict(self).items()]


class RateDevice:
    """The device's arithmetic: when a request may complete, and the credit count. Pure (time passed in)."""

    def __init__(self, rates: DeviceRates, now: float) -> None:
        self.rates = rates
        self.credits = min(rates.initial_mib, rates.capacity_mib)
        self.accountant = HddAccountant()
        self.busy_until = now
        self.last = now
        self.started = now
        self.empty_at: float | None = None if self.credits > 0 or rates.capacity_mib <= 0 else 0.0
        self.read_bytes = 0
        self.write_bytes = 0
        self.unthrottled = False

    def _earn(self, now: float) -> None:
        if now > self.last:
            self.credits = min(self.rates.capacity_mib, self.credits + self.rates.earn_mibps * (now - self.last))
            self.last = now

    @property
    def bursting(self) -> bool:
        return self.credits > 0

    def serve(self, offset: int, size: int, now: float, *, write: bool) -> float:
        """Charge one request arriving at `now`; returns when it completes."""
        if self.unthrottled:
            return now
        self._earn(now)
        if write:
            self.write_bytes += size
        else:
            self.read_bytes += size
        units = self.accountant.charge(offset, size) if self.rates.hdd else size / MIB
        rate = self.rates.burst_bps if self.bursting else self.rates.base_bps
        self.credits -= units
        if self.credits <= 0 and self.empty_at is None and self.rates.capacity_mib > 0:
            self.empty_at = now - self.started
        done = max(now, self.busy_until) + units * MIB / rate
        self.busy_until = done
        return done

    def stats(self, now: float) -> dict[str, Any]:
        self._earn(now)
        a = self.accountant
        return {
            "t": round(now - self.started, 3), "credits_mib": self.credits * self.rates.time_scale,
            "bursting": self.bursting, "units": a.units, "sequential_bytes": a.sequential_bytes,
            "random_bytes": a.random_bytes, "read_bytes": self.read_bytes, "write_bytes": self.write_bytes,
            "empty_at": self.empty_at, "limit_bps": self.rates.burst_bps if self.bursting else self.rates.base_bps,
        }


def check_can_run() -> None:
    """LabError unless this machine can run the FUSE device: /dev/fuse, fusermount3 and mfusepy."""
    if not Path("/dev/fuse").exists():
        raise LabError("/dev/fuse is missing: the FUSE throttle needs the fuse module (or --throttle blkio "
                       "on cgroup v1)")
    if shutil.which("fusermount3") is None:
        raise LabError("fusermount3 is not installed: install the Debian package fuse3 (make setup does)")
    if importlib.util.find_spec("mfusepy") is None:
        raise LabError("the Python package mfusepy is not installed: run make setup")


def start_daemon(mount: Path, store: Path, size: int, stats: Path, rates: DeviceRates,
                 timeout_s: float = 10.0) -> tuple[int, str | None]:
    """Start the daemon in its own session (a Ctrl-C to the lab must not stop the device the lab still
    flushes through) and wait until its file is there. Returns its pid and start time."""
    with contextlib.suppress(FileNotFoundError):
        stats.unlink()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuning.lab", "fusedev", str(mount), str(store), str(size), str(stats),
         *rates.to_args()],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")) if p)})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
            raise LabError(f"the FUSE device did not start: {err[-1] if err else f'exit {proc.returncode}'}")
        if read_stats(stats) is not None and (mount / FILE_NAME).exists():
            start = read_start_time(proc.pid)
            return proc.pid, None if start is None else str(start)
        time.sleep(0.05)
    proc.terminate()
    raise LabError(f"the FUSE device did not mount {mount} within {timeout_s:g} s")


def read_stats(path: Path) -> dict[str, Any] | None:
    """The daemon's last figures, None before it wrote any."""
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (FileNotFoundError, ValueError):
        return None


# ---- the daemon (runs in its own process) ---------------------------------------------------------------


def serve(mount: Path, store: Path, size: int, stats_path: Path, rates: DeviceRates) -> None:
    """Mount the one-file FUSE file system at `mount` and serve it until unmounted."""
    import mfusepy  # the lab's only use of it; imported here so the rest of the package runs without it

    device = RateDevice(rates, time.monotonic())
    lock = threading.Lock()
    # A new file, never one that is there already (a link or a file someone else put in the shared /dev/shm).
    fd = os.open(store, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.ftruncate(fd, size)
    done = threading.Event()

    unthrottle = stats_path.with_suffix(".unthrottle")

    def write_stats() -> None:
        while not done.wait(STATS_EVERY_S):
            with lock:
                if unthrottle.exists():
                    device.unthrottled = True  # the lab is restoring: flush at full speed
                figures = device.stats(time.monotonic())
            tmp = stats_path.with_suffix(".partial")
            tmp.write_text(json.dumps(figures), encoding="utf-8")
            os.replace(tmp, stats_path)

    def wait(offset: int, nbytes: int, write: bool) -> None:
        with lock:
            until = device.serve(offset, nbytes, time.monotonic(), write=write)
        pause = until - time.monotonic()
        if pause > 0:
            time.sleep(pause)

    class SlowVolume(mfusepy.Operations):
        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            if path == "/":
                return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
            if path == "/" + FILE_NAME:
                return {"st_mode": stat.S_IFREG | 0o600, "st_nlink": 1, "st_size": size}
            raise mfusepy.FuseOSError(errno.ENOENT)

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", FILE_NAME]

        def open(self, path: str, flags: int) -> int:
            if path != "/" + FILE_NAME:
                raise mfusepy.FuseOSError(errno.ENOENT)
            return 0

        def read(self, path: str, nbytes: int, offset: int, fh: int) -> bytes:
            wait(offset, nbytes, False)
            return os.pread(fd, nbytes, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            wait(offset, len(data), True)
            return os.pwrite(fd, data, offset)

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            if length != size:
                raise mfusepy.FuseOSError(errno.EPERM)  # the volume's size is fixed
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            return 0  # scratch: what the emulation measures is the rate, not the host disk's flush

        def statfs(self, path: str) -> dict[str, int]:
            return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": size // 4096, "f_bfree": 0, "f_bavail": 0}

    threading.Thread(target=write_stats, name="stats", daemon=True).start()
    try:
        # Single-threaded: the device serves one request at a time, as its rate says. direct_io: the kernel does not
        # cache the backing file a second time (libfuse fuse_config.direct_io, include/fuse.h); mfusepy is FUSE's
        # high-level API over libfuse3 (ctypes).
        mfusepy.FUSE(SlowVolume(), str(mount), foreground=True, nothreads=True, direct_io=True,
                     allow_other=True, fsname="iobatch-lab")
    finally:
        done.set()
        os.close(fd)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuning.lab fusedev")
    parser.add_argument("mount", type=Path)
    parser.add_argument("store", type=Path)
    parser.add_argument("size", type=int)
    parser.add_argument("stats", type=Path)
    for name in DeviceRates.__dataclass_fields__:
        kind = (lambda v: v == "True") if name == "hdd" else float
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, required=name != "time_scale")
    args = parser.parse_args(argv)
    rates = DeviceRates(**{n: getattr(args, n) for n in DeviceRates.__dataclass_fields__
                           if getattr(args, n) is not None})
    serve(args.mount, args.store, args.size, args.stats, rates)
    return 0
