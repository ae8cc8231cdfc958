"""The advisor's closed loop on a child its container paces, in the cgroup v2 guest: predicted vs measured.

    python -m bench.guest_packed [--rounds 3]

Each round boots the guest tier's packed host (tests/support/packedhost.py: st1 500 GiB held at its baseline by
QEMU, the template's user data, Batch children as crun containers with the real sidecar): a child downloads 240 MiB
in a 256 MiB container under the stack's settings (its own writeback domain the tighter), `iobatch advise` is run
on its profile on this machine, and the child runs again under the advised host sysctls. Per run: the pause (the
sum of its writer's balance_dirty_pages pauses, from the kernel's tracepoint) and the download stage the advisor's
model predicted before the run (the settled controller's, and the range the advice gives: the child's new
writeback context to writers held at the freerun point), beside the measured ones; the floor the prediction takes
(the default run's time not waiting on the volume, from its profile) beside the run's own (its stage less the
kernel's pauses); and the child's own dirty limit as modelled and as the profiler read it; then the medians over the
rounds. The whole round (boot, three waves, power-off) is timed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def _error(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured:+.0%}" if measured > 0 else "-"


def _span(ends: tuple[float, float]) -> str:
    return f"({ends[0]:.2f}-{ends[1]:.2f})"


def _mark(inside: bool) -> str:
    """A measured figure outside the predicted range (each end widened by the lab's agreement) is starred."""
    return "" if inside else " *"


def _native_dd_cpu(mib: int, runs: int = 3) -> list[float] | None:
    """dd's CPU time (user + system, s) writing `mib` MiB into a fresh XFS loop device's page cache here, as the
    guest's child does (no fsync), once per run; None where no loop device can be mounted (not root)."""
    with tempfile.TemporaryDirectory(prefix="iobatch-native-dd-") as folder:
        image, mount = Path(folder) / "xfs.img", Path(folder) / "mnt"
        with image.open("wb") as stream:
            stream.truncate((2 * mib) << 20)
        mount.mkdir()
        if subprocess.run(["mkfs.xfs", "-q", str(image)], capture_output=True).returncode != 0 or \
                subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True).returncode != 0:
            return None
        try:
            used = []
            for _ in range(runs):
                (mount / "data").unlink(missing_ok=True)
                subprocess.run(["sync"], check=True)
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'data'}", "bs=1M", f"count={mib}"], check=True,
                               capture_output=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                used.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            return used
        finally:
            subprocess.run(["umount", str(mount)], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from tuning.guest.machine import unavailable

    if reason := unavailable():
        print(f"guest_packed: skipped, the guest cannot boot: {reason}")
        return 0
    from tests.support.guest import pacing
    from tests.support.packedhost import RUNS, SMALL_MEMORY_MIB, SMALL_MIB, boot_packed_host, closed_loop
    from tuning.ebs import MIB
    from tuning.lab.loop import AGREEMENT, in_range

    print(f"# the closed loop on a container-paced child in the guest, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores; st1 500 GiB at baseline, "
          f"{SMALL_MIB} MiB downloaded in a {SMALL_MEMORY_MIB} MiB container, {args.rounds} rounds\n")
    print("| round | run | own limit MiB: modelled / profiler | pause s: predicted (range) / kernel | error "
          "| stage s: predicted (range) / measured | error | error, new context's end "
          "| floor s: taken / the run's own | dd's CPU s |")
    print("|---|---|---|---|---:|---|---:|---:|---|---:|")
    traced: list[str] = []
    errors: dict[str, list[tuple[float, float, float]]] = {}
    outside: list[str] = []
    walls = []
    for number in range(1, args.rounds + 1):
        with tempfile.TemporaryDirectory(prefix="iobatch-packed-") as work:
            started = time.monotonic()
            host = boot_packed_host(Path(work))
            walls.append(time.monotonic() - started)
            if host.result.returncode != 0 or host.advice is None:
                print(f"guest_packed: round {number} failed (exit {host.result.returncode}): "
                      f"{host.result.stderr[-500:]}")
                return 1
            for run in closed_loop(host):
                own = "-" if run.own_limit_bytes is None else f"{run.own_limit_bytes / MIB:.1f}"
                inside = {what: in_range(measured, *span) for what, measured, span in (
                    ("pause", run.slept_s, run.pause_range), ("stage", run.measured_s, run.stage_range))}
                print(f"| {number} | {run.run} | {run.modelled_limit_bytes / MIB:.1f} / {own} | {run.pause_s:.2f} "
                      f"{_span(run.pause_range)} / {run.slept_s:.2f}{_mark(inside['pause'])} | "
                      f"{_error(run.pause_s, run.slept_s)} | {run.stage_s:.2f} {_span(run.stage_range)} / "
                      f"{run.measured_s:.2f}{_mark(inside['stage'])} | {_error(run.stage_s, run.measured_s)} | "
                      f"{_error(run.stage_range[0], run.measured_s)} | {run.floor_s:.2f} / {run.unpaused_s:.2f} | "
                      f"{'-' if run.cpu_s is None else f'{run.cpu_s:.2f}'} |")
                paced = pacing(host.work / RUNS[run.run][1])
                if paced is not None:
                    cache = run.model.effective
                    traced.append(f"| {number} | {run.run} | {paced.dirty_mib[0]:.0f} / {paced.dirty_mib[1]:.0f} | "
                                  f"{cache.setpoint_bytes / MIB:.0f} / {cache.limit_bytes / MIB:.0f} | "
                                  f"{paced.ratelimit_mibps[0]:.0f} -> {paced.ratelimit_mibps[1]:.0f} |")
                if run.slept_s > 0 and run.measured_s > 0:
                    errors.setdefault(run.run, []).append(((run.pause_s - run.slept_s) / run.slept_s,
                                                           (run.stage_s - run.measured_s) / run.measured_s,
                                                           (run.stage_range[0] - run.measured_s) / run.measured_s))
                    outside.extend(what for what, ok in inside.items() if not ok)
    print("\nThe writer's pacing, traced (balance_dirty_pages from its first pause on):\n")
    print("| round | run | its domain's dirty count MiB: median / highest | modelled setpoint / limit MiB "
          "| dirty_ratelimit MiB/s: first -> last |")
    print("|---|---|---|---|---|")
    print("\n".join(traced))
    print()
    names = ("pause", "stage", "stage at the new context's end")
    for setting, rows in errors.items():
        columns = [[row[i] for row in rows] for i in range(len(names))]
        print(f"{setting}: " + ", ".join(
            f"{what} error median {statistics.median(col):+.0%} ({min(col):+.0%} to {max(col):+.0%})"
            for what, col in zip(names, columns, strict=True)))
    print(f"measured outside the predicted range widened by {AGREEMENT:.0%}: "
          + (", ".join(outside) if outside else "none"))
    native = _native_dd_cpu(SMALL_MIB)
    print("the same dd natively on this machine (into an XFS loop device's page cache, 3 runs): CPU " +
          ("-" if native is None else f"{statistics.median(native):.3f} s ({min(native):.3f}-{max(native):.3f})"))
    print(f"a round (boot, three waves, advise, power-off): median {statistics.median(walls):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
