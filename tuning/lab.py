"""An st1-like volume on this machine, to see the write cache and the credit cliff before paying for them.

The lab (root only) builds:

- a sparse file attached to a loop device (O_DIRECT to the backing file, so the host's own page cache
  does not buffer the volume a second time), with XFS mounted with the tuned options from
  tuning.host.HostTuning;
- a throughput limit on that loop device through the ROOT blkio cgroup (v1). Only the root cgroup works:
  writeback runs in the root cgroup, so a child cgroup's limit would only slow O_DIRECT writes;
- a controller thread that follows the volume's credit bucket (tuning.ebs): it reads the device's
  completed I/O from /proc/diskstats, charges it in the volume's accounting (HDD: an I/O <= 1 MiB costs
  1 MiB), and sets the limit to burst while credits last, then to baseline. `time_scale` shrinks the
  bucket so that hours of credits fit in minutes; throughputs stay real;
- page-cache settings that act like an instance with less memory: vm.dirty_bytes and
  vm.dirty_background_bytes computed from the chosen memory and the tuning's ratios.

Every kernel setting is recorded in a state file before it is changed, and restored on every exit path:
normal exit, exception, SIGINT and SIGTERM (handled here), and SIGKILL (a small guard process waits on
the lab's pid and restores when it dies). A later run finds the state file of a crashed one and cleans
up first. `recover()` does the same by hand.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from tuning.ebs import DIRTYABLE_FRACTION, HDD_IO_UNIT, MIB, Volume
from tuning.host import HostTuning, sysctl_path

DEFAULT_STATE_DIR = Path("/run/iobatch-lab")
DEFAULT_LAB_DIR = Path("/var/tmp/iobatch-lab")
STATE_NAME = "state.json"
BLKIO_ROOT = Path("/sys/fs/cgroup/blkio")
# Bytes per second only. An I/O-rate limit (HDD: one I/O <= 1 MiB per MiB/s) would act on bios before
# the block layer merges them, and so slow sequential writeback far below what st1 delivers (EBS merges
# sequential I/O). Small I/O is charged in full against the credits instead (CreditController.charge).
THROTTLE_FILES = ("blkio.throttle.write_bps_device", "blkio.throttle.read_bps_device")
# Every page-cache sysctl the lab may write; all are recorded before the first write.
DIRTY_SYSCTLS: tuple[str, ...] = (
    "vm.dirty_ratio", "vm.dirty_background_ratio", "vm.dirty_bytes", "vm.dirty_background_bytes",
    "vm.dirty_expire_centisecs", "vm.dirty_writeback_centisecs",
)
SECTOR = 512


class LabError(Exception):
    """The lab cannot run here or was misused; the message names the cause and the fix."""


class LabInterrupted(BaseException):
    """SIGTERM or SIGINT arrived; raised in the main thread so every `finally` runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


# ---- configuration -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabConfig:
    """What to build. The defaults are the case study's volume: st1, 500 GiB."""

    volume: Volume = field(default_factory=lambda: Volume("st1", 500))
    lab_dir: Path = DEFAULT_LAB_DIR  # holds the backing file and the mount point
    state_dir: Path = DEFAULT_STATE_DIR
    loop_size_mib: int = 4096  # the file system's size (sparse: only written blocks take space)
    time_scale: float = 1.0  # the bucket is 1/time_scale of the real one: burst minutes shrink by it
    initial_credits_mib: float | None = None  # at the real volume's scale; default a full bucket
    tuning: HostTuning = field(default_factory=HostTuning)  # filesystem and mount options
    tick_s: float = 0.1
    # Hold the bucket empty: the volume runs at baseline throughout, as after the credit cliff under
    # sustained load (idle time in the lab, e.g. while the demo uploads its dataset, earns nothing).
    hold_empty: bool = False
    guard: bool = True  # start the guard process that restores after SIGKILL

    def validate(self) -> None:
        if not self.volume.bursts and self.volume.kind not in ("gp3", "io2"):
            raise LabError(f"{self.volume.label} cannot be emulated")
        if self.loop_size_mib < 300:
            raise LabError(f"loop size {self.loop_size_mib} MiB is too small for XFS: give at least 300")
        if self.time_scale < 1:
            raise LabError(f"time scale {self.time_scale} must be at least 1 (1 = real time)")
        if self.initial_credits_mib is not None and not 0 <= self.initial_credits_mib <= \
                self.volume.credit_capacity:
            raise LabError(f"initial credits {self.initial_credits_mib:.0f} MiB are outside 0-"
                           f"{self.volume.credit_capacity:.0f} MiB for {self.volume.label}")
        if self.tuning.filesystem != "xfs":
            raise LabError("the lab builds XFS: use a tuning with filesystem xfs")
        self.tuning.validate(os.uname().release)


def emulated_sysctls(tuning: HostTuning, memory_bytes: int | None) -> dict[str, str]:
    """The page-cache sysctls that make this machine act like an instance with `memory_bytes`.

    A tuning in ratio form becomes the bytes form for that memory (ratio x dirtyable memory); a tuning
    already in bytes form is used as is. With memory None the tuning's own sysctls are returned.
    """
    values = tuning.sysctls()
    if memory_bytes is None:
        return values
    dirtyable = memory_bytes * DIRTYABLE_FRACTION
    out = {k: v for k, v in values.items() if "ratio" not in k}
    if tuning.dirty_ratio is not None:
        out["vm.dirty_bytes"] = str(int(dirtyable * tuning.dirty_ratio / 100))
    if tuning.dirty_background_ratio is not None:
        out["vm.dirty_background_bytes"] = str(int(dirtyable * tuning.dirty_background_ratio / 100))
    return out


# ---- kernel reads --------------------------------------------------------------------------------------


def read_sysctl(key: str) -> str:
    return Path(sysctl_path(key)).read_text(encoding="ascii").strip()


def write_sysctl(key: str, value: str) -> None:
    Path(sysctl_path(key)).write_text(value + "\n", encoding="ascii")


@dataclass(frozen=True)
class DiskCounters:
    read_ops: int
    read_bytes: int
    write_ops: int
    write_bytes: int


def read_diskstats(name: str) -> DiskCounters:
    """Completed I/O of one block device from /proc/diskstats."""
    with open("/proc/diskstats", encoding="ascii") as stats:
        for line in stats:
            parts = line.split()
            if len(parts) >= 10 and parts[2] == name:
                return DiskCounters(int(parts[3]), int(parts[5]) * SECTOR, int(parts[7]), int(parts[9]) * SECTOR)
    raise LabError(f"{name} is not in /proc/diskstats: was the loop device detached?")


@dataclass(frozen=True)
class HostSample:
    """Host-wide page-cache and pressure figures at one moment."""

    t: float
    dirty_bytes: int
    writeback_bytes: int
    dirty_threshold_bytes: int
    background_threshold_bytes: int
    io_some_us: int


def read_host_sample(t: float) -> HostSample:
    page = os.sysconf("SC_PAGE_SIZE")
    vm: dict[str, int] = {}
    with open("/proc/vmstat", encoding="ascii") as vmstat:
        for line in vmstat:
            key, _, value = line.partition(" ")
            if key in ("nr_dirty", "nr_writeback", "nr_dirty_threshold", "nr_dirty_background_threshold"):
                vm[key] = int(value)
    some = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/pressure/io").read_text(encoding="ascii").splitlines():
            if line.startswith("some"):
                some = int(line.rsplit("total=", 1)[1])
    return HostSample(t, vm.get("nr_dirty", 0) * page, vm.get("nr_writeback", 0) * page,
                      vm.get("nr_dirty_threshold", 0) * page, vm.get("nr_dirty_background_threshold", 0) * page,
                      some)


# ---- the credit controller -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ControlPoint:
    """One controller tick: lab seconds, credits (at the real volume's scale), the limit and the traffic."""

    t: float
    credits_mib: float
    limit_bps: int
    device_bps: float
    host: HostSample


class CreditController(threading.Thread):
    """Follows the volume's credit bucket and sets the root blkio throttle to burst or baseline."""

    def __init__(self, *, volume: Volume, device_name: str, set_limit: Callable[[int], None],
                 time_scale: float, initial_credits_mib: float, tick_s: float, hold_empty: bool = False) -> None:
        super().__init__(name="iobatch-lab-credits", daemon=True)
        self.volume = volume
        self.device_name = device_name
        self.set_limit = set_limit
        self.time_scale = time_scale
        self.tick_s = tick_s
        self.hold_empty = hold_empty
        # The lab's bucket: the real one divided by the time scale.
        self.capacity = volume.credit_capacity / time_scale
        self.credits = initial_credits_mib / time_scale
        self.burst_bps = int(volume.throughput_bps(io_size=HDD_IO_UNIT, bursting=True))
        self.base_bps = int(volume.throughput_bps(io_size=HDD_IO_UNIT, bursting=False))
        self.points: list[ControlPoint] = []
        self._dry = self.credits <= 0
        # One second of burst above baseline (at least two ticks).
        self.resume_credits = (volume.spend_limit(True) - volume.earn_rate()) * max(1.0, 2 * tick_s)
        self.empty_at: float | None = None
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.started_at = time.monotonic()
        self.error: BaseException | None = None

    @property
    def bursting(self) -> bool:
        if not self.volume.bursts or self.hold_empty:
            return False
        if self._dry:
            # Once empty, burst again only with enough credits for a while at burst: a bucket that
            # flips between burst and baseline every tick would average the two instead of baseline.
            return self.credits >= self.resume_credits
        return self.credits > 0

    def current_limit(self) -> int:
        return self.burst_bps if self.bursting else self.base_bps

    def charge(self, before: DiskCounters, after: DiskCounters) -> float:
        """Credit units (MiB) the I/O between two readings costs: HDD counts each I/O as >= 1 MiB."""
        cost = 0.0
        for ops, nbytes in ((after.read_ops - before.read_ops, after.read_bytes - before.read_bytes),
                            (after.write_ops - before.write_ops, after.write_bytes - before.write_bytes)):
            if nbytes <= 0:
                continue  # flushes and other zero-byte requests move no data
            per_byte = self.volume.cost_per_byte(nbytes / ops) if ops > 0 else 1 / MIB
            cost += nbytes * per_byte
        return cost

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # reported by the owner; the lab still restores on exit
            self.error = exc

    def _loop(self) -> None:
        applied = self.current_limit()
        self.set_limit(applied)
        last = read_diskstats(self.device_name)
        last_t = time.monotonic()
        while not self._halt.wait(self.tick_s):
            now = time.monotonic()
            counters = read_diskstats(self.device_name)
            dt = now - last_t
            moved = (counters.read_bytes - last.read_bytes) + (counters.write_bytes - last.write_bytes)
            with self._lock:
                if self.volume.bursts and not self.hold_empty:
                    self.credits += self.volume.earn_rate() * dt - self.charge(last, counters)
                    self.credits = min(max(self.credits, 0.0), self.capacity)
                    if self.credits <= 0:
                        self._dry = True
                        if self.empty_at is None:
                            self.empty_at = now - self.started_at
                    elif self.credits >= self.resume_credits:
                        self._dry = False
                limit = self.current_limit()
                self.points.append(ControlPoint(now - self.started_at, self.credits * self.time_scale, limit,
                                                moved / dt if dt > 0 else 0.0, read_host_sample(now)))
            if limit != applied:
                # Only on change: every write to the throttle file restarts blk-throttle's time slice.
                self.set_limit(limit)
                applied = limit
            last, last_t = counters, now

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)

    def window(self, start: float, end: float) -> list[ControlPoint]:
        """Points between two time.monotonic() readings."""
        a, b = start - self.started_at, end - self.started_at
        with self._lock:
            return [p for p in self.points if a <= p.t <= b]


# ---- state file ----------------------------------------------------------------------------------------


def _state_path(state_dir: Path) -> Path:
    return state_dir / STATE_NAME


def _write_state(state_dir: Path, state: Mapping[str, Any]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / (STATE_NAME + ".partial")
    tmp.write_text(json.dumps(state, indent=1), encoding="utf-8")
    os.replace(tmp, _state_path(state_dir))


def read_state(state_dir: Path = DEFAULT_STATE_DIR) -> dict[str, Any] | None:
    path = _state_path(state_dir)
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except ValueError:
        # A torn write cannot happen (os.replace), but a hand-edited file can: treat it as empty state.
        return {}


def _pid_alive(pid: int) -> bool:
    # A zombie (exited, not yet reaped by its parent) is dead for our purposes.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False)


def restore(state: Mapping[str, Any], *, say: Callable[[str], None] = lambda _: None) -> list[str]:
    """Undo everything a state records, in the safe order; returns the problems (empty when all went well).

    Throttle off first (so unmounting flushes at full speed), then unmount, detach, delete the backing
    file, and restore the sysctls in the form (ratio or bytes) they had.
    """
    problems: list[str] = []
    devno = state.get("devno")
    for name, original in (state.get("throttle") or {}).items():
        path = BLKIO_ROOT / name
        try:
            path.write_text(f"{devno} {original}\n", encoding="ascii")
        except OSError as exc:
            # Writing 0 for a device without a rule fails with ENODEV on some kernels: that is the goal.
            if original != 0 or _has_rule(path, str(devno)):
                problems.append(f"{path}: {exc}")
    mount = state.get("mount")
    if mount and _is_mounted(mount):
        for attempt in range(10):
            result = _run(["umount", mount])
            if result.returncode == 0:
                break
            if attempt == 9:
                # Something still has files open (a killed child's leftovers): detach lazily.
                lazy = _run(["umount", "-l", mount])
                if lazy.returncode != 0:
                    problems.append(f"umount {mount}: {result.stderr.strip() or lazy.stderr.strip()}")
            time.sleep(0.3)
    backing = state.get("backing")
    if backing:
        listed = _run(["losetup", "-j", backing, "-O", "NAME", "-n"])
        for device in listed.stdout.split():
            result = _run(["losetup", "-d", device])
            if result.returncode != 0:
                problems.append(f"losetup -d {device}: {result.stderr.strip()}")
        with contextlib.suppress(FileNotFoundError):
            Path(backing).unlink()
    sysctls: Mapping[str, str] = state.get("sysctls") or {}
    problems.extend(_restore_sysctls(sysctls))
    if problems:
        say("lab restore problems: " + "; ".join(problems))
    return problems


def _restore_sysctls(original: Mapping[str, str]) -> list[str]:
    # dirty_bytes and dirty_ratio exclude each other: writing one zeroes the other. Write back the one
    # that was in force (non-zero), which also resets its partner to what it was (zero).
    problems: list[str] = []
    order: list[str] = []
    for ratio, nbytes in (("vm.dirty_ratio", "vm.dirty_bytes"),
                          ("vm.dirty_background_ratio", "vm.dirty_background_bytes")):
        if ratio in original and nbytes in original:
            order.append(nbytes if original[nbytes] != "0" else ratio)
    order += [k for k in ("vm.dirty_expire_centisecs", "vm.dirty_writeback_centisecs") if k in original]
    for key in order:
        try:
            if read_sysctl(key) != original[key]:
                write_sysctl(key, original[key])
        except OSError as exc:
            problems.append(f"{key}: {exc}")
    for key, value in original.items():
        with contextlib.suppress(OSError):
            if read_sysctl(key) != value:
                problems.append(f"{key} is {read_sysctl(key)} after restore, not {value}")
    return problems


def _has_rule(path: Path, devno: str) -> bool:
    with contextlib.suppress(OSError):
        return any(line.split()[0] == devno for line in path.read_text(encoding="ascii").splitlines() if line)
    return False


def _is_mounted(mount: str) -> bool:
    target = os.path.realpath(mount)
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        return any(line.split()[1] == target for line in mounts if len(line.split()) > 1)


def recover(state_dir: Path = DEFAULT_STATE_DIR, *, say: Callable[[str], None] = print) -> bool:
    """Clean up after a lab that died. Returns True if there was something to clean up.

    Refuses (LabError) when the lab that wrote the state is still running.
    """
    state = read_state(state_dir)
    if state is None:
        return False
    pid = int(state.get("pid", 0))
    if pid and pid != os.getpid() and _pid_alive(pid) and _looks_like_lab(pid, state):
        raise LabError(f"another lab (pid {pid}) is running with state in {state_dir}: wait for it or stop it")
    say(f"cleaning up after an earlier lab run (pid {pid}): {state.get('mount')} on {state.get('device')}")
    problems = restore(state, say=say)
    if problems:
        raise LabError("could not restore everything: " + "; ".join(problems))
    with contextlib.suppress(FileNotFoundError):
        _state_path(state_dir).unlink()
    return True


def _looks_like_lab(pid: int, state: Mapping[str, Any]) -> bool:
    # A reused pid is another program: compare the process start time recorded with the state.
    return _start_time(pid) == state.get("pid_start")


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


# ---- the lab -------------------------------------------------------------------------------------------


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
        if os.geteuid() != 0:
            raise LabError("the lab needs root (loop devices, mounts, sysctls, blkio cgroup): run it with sudo")
        for tool in ("losetup", "mkfs.xfs", "mount", "umount"):
            if _run(["sh", "-c", f"command -v {tool}"]).returncode != 0:
                raise LabError(f"{tool} is not installed: install util-linux and xfsprogs")
        for name in THROTTLE_FILES:
            if not (BLKIO_ROOT / name).exists():
                raise LabError(f"{BLKIO_ROOT / name} is missing: the lab needs the cgroup v1 blkio controller")
        recover(self.config.state_dir, say=self.say)
        self._install_signal_handlers()
        # Record first, change second: the state names every setting before it is touched.
        self._state = {
            "pid": os.getpid(), "pid_start": _start_time(os.getpid()), "started": time.time(),
            "sysctls": {key: read_sysctl(key) for key in DIRTY_SYSCTLS},
            "backing": str(self.backing), "mount": str(self.mount),
        }
        self._save()
        if self.config.guard:
            self._start_guard()
        self.config.lab_dir.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        with open(self.backing, "wb") as image:
            image.truncate(self.config.loop_size_mib * MIB)
        attach = _run(["losetup", "--find", "--show", "--direct-io=on", str(self.backing)])
        if attach.returncode != 0:
            raise LabError(f"losetup failed: {attach.stderr.strip()}")
        self.device = attach.stdout.strip()
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
        # The throttle rules for this device did not exist (a fresh loop device): restore writes 0.
        self._state["throttle"] = {name: self._current_rule(name) for name in THROTTLE_FILES}
        self._save()
        volume = self.config.volume
        initial = volume.credit_capacity if self.config.initial_credits_mib is None \
            else self.config.initial_credits_mib
        if self.config.hold_empty:
            initial = 0.0
        self.controller = CreditController(
            volume=volume, device_name=Path(self.device).name, set_limit=self._set_limit,
            time_scale=self.config.time_scale, initial_credits_mib=initial, tick_s=self.config.tick_s,
            hold_empty=self.config.hold_empty)
        self.controller.start()
        self.say(f"lab: {volume.label} on {self.device} ({self.config.loop_size_mib} MiB XFS at {self.mount}, "
                 f"-o {options}); burst {volume.burst_mibps:.1f} MiB/s, baseline {volume.baseline_mibps:.1f} "
                 f"MiB/s, credits " + ("held empty (baseline only)" if self.config.hold_empty else
                                        f"{initial / 1024:.1f} GiB (time scale {self.config.time_scale:g})"))

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
        _write_state(self.config.state_dir, self._state)

    def _start_guard(self) -> None:
        package_root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)}
        subprocess.Popen(
            [sys.executable, "-m", "tuning.lab", "guard", str(self.config.state_dir), str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd="/", env=env, start_new_session=True, close_fds=True,
        )

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            raise LabInterrupted(signum)

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._old_handlers[signum] = signal.signal(signum, handler)

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

    @property
    def credits_gib(self) -> float:
        """Credits left, at the real volume's scale (GiB of 1 MiB I/O)."""
        if self.controller is None:
            return 0.0
        return self.controller.credits * self.controller.time_scale / 1024

    @property
    def limit_mibps(self) -> float:
        """The throughput limit in force now."""
        return 0.0 if self.controller is None else self.controller.current_limit() / MIB

    def check(self) -> None:
        """Raise if the controller thread died."""
        if self.controller is not None and self.controller.error is not None:
            raise LabError(f"the credit controller failed: {self.controller.error}")

    # -- teardown --

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Ignore further SIGINT/SIGTERM while restoring: a second Ctrl-C must not leave half a restore.
        blocked = {s: signal.signal(s, signal.SIG_IGN) for s in self._old_handlers}
        try:
            if self.controller is not None:
                self.controller.stop()
            if self._state:
                problems = restore(self._state, say=self.say)
                if not problems:
                    with contextlib.suppress(FileNotFoundError):
                        _state_path(self.config.state_dir).unlink()
                else:
                    self.say(f"lab: state kept in {self.config.state_dir} for `iobatch lab --recover`")
            with contextlib.suppress(OSError):
                self.mount.rmdir()
        finally:
            for signum, old in self._old_handlers.items():
                signal.signal(signum, old if old is not None else signal.SIG_DFL)
            del blocked


# ---- a plain writer workload ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WriterResult:
    """N files written by P threads: when the writes returned, and when the data was on the volume."""

    files: int
    file_mib: float
    written_s: float  # until every write() returned (the stage as a job sees it)
    durable_s: float  # until syncfs returned (the data is on the device)
    peak_dirty_bytes: int
    dirty_threshold_bytes: int
    io_stall_ms: float
    device_mib: float


def write_files(lab: Lab, *, files: int, file_mib: float, threads: int = 2, subdir: str = "writer") -> WriterResult:
    """Write `files` files of `file_mib` MiB on the lab volume, then syncfs; timed from the first write."""
    root = lab.mount / subdir
    root.mkdir(exist_ok=True)
    block = b"\xa5" * MIB
    size = int(file_mib * MIB)
    names = [root / f"f{i:05d}.bin" for i in range(files)]
    device = Path(lab.device).name
    before = read_diskstats(device)
    start = time.monotonic()
    host0 = read_host_sample(start)

    def worker(mine: list[Path]) -> None:
        for path in mine:
            with open(path, "wb") as out:
                left = size
                while left > 0:
                    left -= out.write(block[: min(left, MIB)])

    pool = [threading.Thread(target=worker, args=(names[i::threads],)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    written = time.monotonic()
    at_written = read_host_sample(written)
    lab.sync()
    durable = time.monotonic()
    host1 = read_host_sample(durable)
    after = read_diskstats(device)
    points = lab.controller.window(start, durable) if lab.controller else []
    peak = max([p.host.dirty_bytes for p in points] + [at_written.dirty_bytes])
    threshold = max((p.host.dirty_threshold_bytes for p in points), default=host1.dirty_threshold_bytes)
    for path in names:
        path.unlink()
    return WriterResult(files, file_mib, written - start, durable - start, peak, threshold,
                        (host1.io_some_us - host0.io_some_us) / 1000,
                        (after.write_bytes - before.write_bytes) / MIB)


# ---- comparing runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabRun:
    """One workload run under one write-cache setting, as the lab comparison shows it."""

    setting: str  # "default" or "tuned"
    sysctls: dict[str, str]
    stages: dict[str, dict[str, float | None]]  # per stage: metric name -> value (profiling summarize)
    elapsed_s: float
    credits_before_gib: float
    credits_after_gib: float
    limit_mibps_after: float
    writer: WriterResult | None = None


# The columns of the comparison: (metric name, heading, divisor).
COMPARE_COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("StageDuration", "median s", 1.0),
    ("PeakDirtyBytes", "peak dirty MiB", MIB),
    ("DirtyThresholdBytes", "dirty limit MiB", MIB),
    ("IoStallSome", "io stall ms", 1.0),
    ("DirtyThrottle", "dirty pause ms", 1.0),
)


def render_comparison(runs: list[LabRun], stages: tuple[str, ...] = ("download", "process", "upload")) -> str:
    """Per-stage figures of each run side by side, and the download ratio of default over tuned."""
    lines: list[str] = []
    header = ["run", "setting", "credits GiB", "limit MiB/s", "stage"] + [h for _, h, _ in COMPARE_COLUMNS]
    rows: list[list[str]] = []
    for number, run in enumerate(runs, 1):
        for stage in stages:
            row = run.stages.get(stage)
            if row is None:
                continue
            cells = [str(number), run.setting, f"{run.credits_before_gib:,.1f}", f"{run.limit_mibps_after:,.1f}",
                     stage]
            for name, _, scale in COMPARE_COLUMNS:
                value = row.get(name)
                cells.append("-" if value is None else f"{value / scale:,.1f}")
            rows.append(cells)
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    writers = [r for r in runs if r.writer is not None]
    if writers:
        lines.append("")
        lines.append("plain writer, same burst: setting  all written s  durable s  peak dirty MiB  dirty limit MiB"
                     "  io stall ms")
        for run in writers:
            w = run.writer
            assert w is not None
            lines.append(f"  {run.setting:<8} {w.files} x {w.file_mib:g} MiB: {w.written_s:8.2f}  {w.durable_s:9.2f}"
                         f"  {w.peak_dirty_bytes / MIB:14,.0f}  {w.dirty_threshold_bytes / MIB:15,.0f}"
                         f"  {w.io_stall_ms:11,.0f}")
    ratio = download_ratio(runs)
    if ratio is not None:
        lines.append("")
        lines.append(f"download stage, median over runs: default / tuned = {ratio:.2f}x")
    return "\n".join(lines)


def download_ratio(runs: list[LabRun]) -> float | None:
    """Median default download time over median tuned download time (None without both)."""
    def med(setting: str) -> float | None:
        values = sorted(v for r in runs if r.setting == setting
                        for v in [r.stages.get("download", {}).get("StageDuration")] if v is not None)
        if not values:
            return None
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    default, tuned = med("default"), med("tuned")
    if default is None or tuned is None or tuned <= 0:
        return None
    return default / tuned


# ---- the guard process ---------------------------------------------------------------------------------


def _guard(state_dir: Path, owner: int) -> int:
    """Wait for the lab process to end; if its state is still there, restore it."""
    try:
        pidfd = os.pidfd_open(owner)
    except ProcessLookupError:
        pidfd = -1
    try:
        while pidfd >= 0:
            ready, _, _ = select.select([pidfd], [], [], 0.5)
            if ready:
                break
            if read_state(state_dir) is None:
                return 0  # the lab cleaned up itself
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    state = read_state(state_dir)
    if state is None or int(state.get("pid", 0)) != owner:
        return 0
    try:
        recover(state_dir, say=lambda _: None)
    except LabError:
        return 1
    return 0


@contextlib.contextmanager
def interrupt_as_exit() -> Iterator[None]:
    """Turn LabInterrupted into KeyboardInterrupt for callers that only know that one."""
    try:
        yield
    except LabInterrupted as exc:
        raise KeyboardInterrupt(f"signal {exc.signum}") from None


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "guard":
        sys.exit(_guard(Path(sys.argv[2]), int(sys.argv[3])))
    print("usage: python -m tuning.lab guard STATE_DIR PID", file=sys.stderr)
    sys.exit(64)
