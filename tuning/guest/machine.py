"""Boot a guest, run one command in it, get its output and files back, and always end QEMU.

    with Guest(vcpus=2, memory_mib=2048, scratch=ScratchDisk(image, scratch_throttle(Volume("st1", 500)))) as g:
        result = g.run("cat /sys/fs/cgroup/cgroup.controllers", timeout=300)

Each `run` is one boot: QEMU starts, the guest's stage 2 runs the command in the share (a host folder that is
the same path inside the guest, read-write), writes its stdout, stderr and exit code there, and powers off.
QEMU is killed when the timeout passes, when the guest's kernel says a CPU is stuck (GuestHung), when the caller
is interrupted, and (PR_SET_PDEATHSIG) when the process that started it dies: no QEMU outlives a run.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tuning.guest.assets import STAGE2_SCRIPT, TOOLS, GuestAssets
from tuning.guest.qemu import MachineSpec, ScratchDisk, qemu_argv

QEMU = "qemu-system-x86_64"
_PR_SET_PDEATHSIG = 1
_CONTROL = ".guest"
# Booting a stock kernel needs real KVM: a paravirtual one (some cloud VMs) fails at once (an MSR it does not
# emulate) or hangs with a silent console (this machine kind: its /dev/kvm opens, the guest never prints), so the
# probe boots to a first command and gives up quickly. Real KVM gets there in a few seconds; TCG takes 12-14 s.
_KVM_PROBE_SECONDS = 15


class GuestError(RuntimeError):
    """The guest did not run the command: QEMU failed, the boot failed or the timeout passed."""


class GuestHung(GuestError):
    """The guest's kernel said a CPU was stuck for HUNG_AFTER_S or more: QEMU was killed then (the console is read
    every half second), not at the timeout."""


# Seen under TCG on two busy host cores (in the test suite's boots, a few times in a hundred): both vCPUs stop making
# progress ("watchdog: BUG: soft lockup - CPU#0 stuck for 164s! [bash:141]", RCU stalls on the other CPU) until the
# timeout kills QEMU.
# The kernel's watchdog reports a CPU that has not scheduled for 2 x watchdog_thresh (20 s) and again every ~26 s
# while it stays stuck (Documentation/admin-guide/lockup-watchdogs.rst); a CPU stuck this long in a guest that
# runs a shell script is not coming back.
HUNG_AFTER_S = 60
_SOFT_LOCKUP = re.compile(r"soft lockup - CPU#(\d+) stuck for (\d+)s")


@dataclass(frozen=True)
class GuestResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float  # QEMU start to QEMU exit
    boot_seconds: float | None  # QEMU start to the guest's stage 2 (None when it was not reached)
    console: str  # the guest's serial console (the kernel log, the init's lines)


def unavailable() -> str | None:
    """Why no guest can boot here (one line), or None when it can."""
    if shutil.which(QEMU) is None:
        return f"{QEMU} is not installed (make setup installs qemu-system-x86 as root)"
    try:
        GuestAssets.find()
    except RuntimeError as exc:
        return str(exc)
    return None


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Guest:
    """A cgroup v2 host in QEMU; see the module docstring. Nothing runs until `run`."""

    def __init__(self, *, vcpus: int = 2, memory_mib: int = 2048, scratch: ScratchDisk | None = None,
                 share: Path | None = None, assets: GuestAssets | None = None, accel: str | None = None) -> None:
        self.assets = assets or GuestAssets.find()
        self._own_share = share is None
        self.share = Path(tempfile.mkdtemp(prefix="iobatch-guest-")) if share is None else share.resolve()
        self.spec = MachineSpec(kernel=self.assets.kernel, initramfs=self.assets.initramfs, vcpus=vcpus,
                                memory_mib=memory_mib, share=self.share, stage2=STAGE2_SCRIPT,
                                modules=self.assets.modules, scratch=scratch, accel=accel or accelerator(),
                                passthrough=os.geteuid() == 0)
        self.spec.validate()

    def __enter__(self) -> Guest:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._own_share:
            shutil.rmtree(self.share, ignore_errors=True)

    def run(self, command: str, *, timeout: float, env: Mapping[str, str] | None = None,
            on_output: Callable[[str, str], None] | None = None) -> GuestResult:
        """Boot, run `command` (bash) as root in the share, power off. GuestError if it did not run to its end.

        `on_output(stream, text)` is handed the command's stdout and stderr as they grow ("stdout"/"stderr"), for a
        long command's progress; the result holds them whole either way."""
        control = self.share / _CONTROL
        shutil.rmtree(control, ignore_errors=True)
        control.mkdir(parents=True)
        (control / "command").write_text(command + "\n")
        (control / "env").write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in (env or {}).items()))
        console = control / "console"
        argv = qemu_argv(self.spec, binary=shutil.which(QEMU) or QEMU, console=console)
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent)
        stuck: list[str] = []  # what the console said of a stuck CPU, once QEMU was killed for it

        def seen(stream: str, text: str) -> None:
            if stream != "console":
                if on_output is not None:
                    on_output(stream, text)
            elif not stuck and (why := _stuck(text)) is not None:
                stuck.append(why)
                proc.kill()

        follow = _Follower({name: control / name for name in ("stdout", "stderr", "console")}, seen)
        try:
            qemu_out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise GuestError(f"the guest did not finish within {timeout:.0f} s (QEMU killed); console tail:\n"
                             + _tail(console)) from None
        finally:
            if proc.poll() is None:  # interrupted: never leave a QEMU behind
                proc.kill()
                proc.wait()
            follow.stop()
        seconds = time.monotonic() - start
        if stuck:
            raise GuestHung(f"the guest's kernel hung ({stuck[0]}) after {seconds:.0f} s; QEMU killed; console "
                            "tail:\n" + _tail(console))
        booted = control / "booted"
        boot_seconds = booted.stat().st_mtime - (time.time() - (time.monotonic() - start)) \
            if booted.is_file() else None
        rc_file = control / "rc"
        if proc.returncode != 0 or not rc_file.is_file():
            raise GuestError(f"the guest did not run the command (QEMU exit {proc.returncode}): "
                             + (qemu_out.decode(errors="replace").strip()[-500:] or "") + "\nconsole tail:\n"
                             + _tail(console))
        return GuestResult(returncode=int(rc_file.read_text().strip()), stdout=_read(control / "stdout"),
                           stderr=_read(control / "stderr"), seconds=seconds, boot_seconds=boot_seconds,
                           console=_read(console))


class _Follower:
    """Hands on what grows in `paths` ({stream: file}: the command's stdout and stderr, the serial console), whole
    lines every half second and once more at the end (the share is not cached by the guest, so the host sees them
    grow)."""

    def __init__(self, paths: Mapping[str, Path], on_output: Callable[[str, str], None]) -> None:
        self._paths = dict(paths)
        self._offsets = dict.fromkeys(self._paths, 0)
        self._on_output = on_output
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._done.wait(0.5):
            self._poll()

    def _poll(self) -> None:
        for name, path in self._paths.items():
            try:
                with path.open("rb") as stream:
                    stream.seek(self._offsets[name])
                    data = stream.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # whole lines only
            if end:
                self._offsets[name] += end
                self._on_output(name, data[:end].decode(errors="replace"))

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        self._poll()


def _stuck(console: str) -> str | None:
    """A soft lockup of HUNG_AFTER_S or more that these console lines report, said in words; else None."""
    for cpu, seconds in _SOFT_LOCKUP.findall(console):
        if int(seconds) >= HUNG_AFTER_S:
            return f"soft lockup: CPU#{cpu} stuck for {int(seconds)} s"
    return None


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _tail(path: Path, lines: int = 25) -> str:
    return "\n".join(_read(path).splitlines()[-lines:])


# The probe's answer for this boot of this machine (a boot id, then the accelerator): `make guest` probes once, and
# every later process reads it instead of paying up to _KVM_PROBE_SECONDS again (what /dev/kvm can do changes only
# with a reboot or a new machine, and a new boot id comes with either).
ACCELERATOR_RECORD = ".accelerator"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _recorded(record: Path) -> str | None:
    """The accelerator `record` keeps for this boot; None when there is none, or it is another boot's."""
    boot = _read(_BOOT_ID).strip()
    kept = _read(record).split()
    return kept[1] if boot and len(kept) == 2 and kept[0] == boot and kept[1] in ("kvm", "tcg") else None


@functools.cache
def accelerator(record: Path | None = None) -> str:
    """'kvm' where /dev/kvm boots a stock kernel to a first command, 'tcg' otherwise (IOBATCH_GUEST_ACCEL forces).
    The probe's answer is kept for this boot in `record` (the guest assets' folder's ACCELERATOR_RECORD)."""
    forced = os.environ.get("IOBATCH_GUEST_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    record = record or TOOLS / ACCELERATOR_RECORD
    kept = _recorded(record)
    if kept is not None:
        return kept
    try:
        with Guest(vcpus=1, memory_mib=512, accel="kvm") as probe:
            found = "kvm" if probe.run("true", timeout=_KVM_PROBE_SECONDS).returncode == 0 else "tcg"
    except GuestError:
        found = "tcg"
    boot = _read(_BOOT_ID).strip()
    tmp = record.with_name(f"{record.name}.{os.getpid()}")
    try:  # only a saving: a folder this user cannot write probes again next time
        if boot:
            tmp.write_text(f"{boot} {found}\n")
            os.replace(tmp, record)
    except OSError:
        tmp.unlink(missing_ok=True)
    return found


def main() -> int:
    """`python -m tuning.guest.machine`: probe the accelerator once for this boot; say which the guest uses when
    it was probed (once a boot: `make guest` runs this each time)."""
    record = TOOLS / ACCELERATOR_RECORD
    probed = _recorded(record) is None
    found = accelerator(record)
    if probed and _recorded(record) is not None:  # nothing is probed (or kept) where /dev/kvm does not open
        print(f"guest accelerator: {found} (probed once for this boot: {record})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
