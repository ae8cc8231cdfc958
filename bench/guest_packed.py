"""The advisor's closed loop on a child its container paces, in the cgroup v2 guest: predicted vs measured.

    python -m bench.guest_packed [--rounds 3]

Each round boots the guest tier's packed host (tests/support/packedhost.py: st1 500 GiB held at its baseline by
QEMU, the template's user data, Batch children as crun containers with the real sidecar): a child downloads 240 MiB
in a 256 MiB container under the stack's settings (its own writeback domain the tighter), `iobatch advise` is run
on its profile on this machine, and the child runs again under the advised host sysctls. Per run: the pause (the
sum of its writer's balance_dirty_pages pauses, from the kernel's tracepoint) and the download stage the advisor's
model predicted before the run, beside the measured ones; the floor the prediction takes (the default run's time
not waiting on the volume, from its profile) beside the run's own (its stage less the kernel's pauses); and the
child's own dirty limit as modelled and as the profiler read it; then the medians over the rounds. The whole round
(boot, three waves, power-off) is timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def _error(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured:+.0%}" if measured > 0 else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from tuning.guest.machine import unavailable

    if reason := unavailable():
        print(f"guest_packed: skipped, the guest cannot boot: {reason}")
        return 0
    from tests.support.packedhost import SMALL_MEMORY_MIB, SMALL_MIB, boot_packed_host, closed_loop
    from tuning.ebs import MIB

    print(f"# the closed loop on a container-paced child in the guest, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores; st1 500 GiB at baseline, "
          f"{SMALL_MIB} MiB downloaded in a {SMALL_MEMORY_MIB} MiB container, {args.rounds} rounds\n")
    print("| round | run | own limit MiB: modelled / profiler | pause s: predicted / kernel | error "
          "| stage s: predicted / measured | error | floor s: taken / the run's own |")
    print("|---|---|---|---|---:|---|---:|---|")
    errors: dict[str, list[tuple[float, float]]] = {}
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
                print(f"| {number} | {run.run} | {run.modelled_limit_bytes / MIB:.1f} / {own} | {run.pause_s:.2f} / "
                      f"{run.slept_s:.2f} | {_error(run.pause_s, run.slept_s)} | {run.stage_s:.2f} / "
                      f"{run.measured_s:.2f} | {_error(run.stage_s, run.measured_s)} | {run.floor_s:.2f} / "
                      f"{run.unpaused_s:.2f} |")
                if run.slept_s > 0 and run.measured_s > 0:
                    errors.setdefault(run.run, []).append(((run.pause_s - run.slept_s) / run.slept_s,
                                                           (run.stage_s - run.measured_s) / run.measured_s))
    print()
    names = ("pause", "stage")
    for setting, rows in errors.items():
        columns = [[row[i] for row in rows] for i in range(len(names))]
        print(f"{setting}: " + ", ".join(
            f"{what} error median {statistics.median(col):+.0%} ({min(col):+.0%} to {max(col):+.0%})"
            for what, col in zip(names, columns, strict=True)))
    print(f"a round (boot, three waves, advise, power-off): median {statistics.median(walls):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
