"""The advisor against the lab: predicted vs measured download stage, the closed loop and a sweep. Root only.

    sudo .venv/bin/python -m bench.lab_advise [--full] [--rounds 3] [--images 32 --images-per-child 16 --workers 2]

1. The closed loop (`iobatch lab --advise --after-cliff`): the demo batch on the emulated st1 500 GiB at
   baseline under the kernel's defaults; its profiles to the advisor; the advised cache applied; the batch
   again. Per run the advisor's predicted download stage (median child) beside the measured one.
2. The sweep: memory emulated 2.5 and 8 GiB x volume at burst (full bucket) and at baseline (bucket held
   empty) x write cache default (20/10), the case study's 30/20 and the advisor's bytes, predicted vs
   measured per cell. Each (memory, volume) pair is one loop: its first run (default) gives the advisor its
   profiles, the other two runs are predicted before they run. The default run covers the baseline cells;
   `--full` adds the burst cells (about twice the time).
3. Workloads the model was not fitted to (HELD_OUT, each its own loop at baseline): a burst just past the
   default freerun point, one past the limit, more children in rounds. Per run the prediction with its range
   (a pacing controller not yet settled to writers held at the freerun point: tuning.writecache.WriteCache) and
   whether the measured time is within 25 % of it or inside the range. `--held-out-only` runs this part alone.
4. The largest held-out burst's default run advised for plans it did not run on (bench.advise_plans: instance
   types x vcpusPerJob): per child its own dirty limit, the tighter domain, and the knob DIRTY_PAUSE names.

Every setting runs `--rounds` times (round-robin); a cell's measured time is the median of its rounds, shown
with their range, since on stages of a few seconds runs of the same settings differ by as much as the error
judged. The advice comes from the very first run alone. Cells outside 25 % are shown as such. The batch is
the demo's synthetic camera images (embedded S3 server, s5cmd, profiler sidecar) on the lab volume; the lab
device is the FUSE fixed-rate device (tuning.lab.fusedev).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench import advise_plans
from tuning.ebs import Volume
from tuning.host import HostTuning
from tuning.lab import ComparePlan, LabConfig
from tuning.lab.loop import AGREEMENT, LoopResult, measured_cell, predicted_cell, render_loop, run_advise_loop

# Part 3, workloads the model was not fitted to (memory GiB, images, MiB each, per child), at baseline, 2 at once:
# a burst just past the default freerun point and short of its setpoint; the same past the limit; more children
# in rounds; a download of minutes (it needs the host's proactive reclaim paused: tuning.lab.damon).
HELD_OUT = ((3.0, 24, 20.0, 12), (2.0, 24, 20.0, 12), (3.0, 24, 20.0, 6), (3.0, 24, 80.0, 12))


def _loop(args: argparse.Namespace, memory_gib: float, baseline: bool, tag: str,
          also: list[tuple[str, HostTuning]], shape: tuple[int, float, int] | None = None) -> LoopResult:
    from pipeline.local.demo import lab_batch, lab_run_dir
    from profiling import runfiles

    images, image_mib, per_child = shape or (args.images, args.image_mib, args.images_per_child)
    plan = ComparePlan(tuned=HostTuning(), memory_gib=memory_gib, rounds=args.rounds, workers=args.workers,
                       images=images, image_mib=image_mib, images_per_child=per_child)
    run_dir = args.run_dir / tag
    run_batch = lab_batch(plan, run_dir, stdout=sys.stderr)

    def run_profiles(number: int, setting: str, scratch: Path) -> list:  # type: ignore[type-arg]
        run_batch(number, setting, scratch)
        return list(runfiles.read_profiles(lab_run_dir(run_dir, number, setting)))

    config = LabConfig(volume=Volume("st1", 500), hold_empty=baseline, lab_dir=args.lab_dir)
    return run_advise_loop(config, plan, run_profiles, also=also, say=lambda m: print(m, file=sys.stderr))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--image-mib", type=float, default=25.0)
    parser.add_argument("--images-per-child", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each setting per cell (median, range)")
    parser.add_argument("--full", action="store_true", help="also the cells at burst")
    parser.add_argument("--loop-only", action="store_true", help="only the closed loop (part 1)")
    parser.add_argument("--held-out-only", action="store_true", help="only the workloads not fitted to (part 3)")
    parser.add_argument("--lab-dir", type=Path, default=Path("/var/tmp/iobatch-lab"))
    parser.add_argument("--run-dir", type=Path, default=Path(".iobatch/lab-advise"))
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    if os.geteuid() != 0:
        print("lab_advise: skipped, it needs root (loop device, mounts, sysctls)")
        return 0
    print(f"# the advisor in the lab, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, kernel "
          f"{os.uname().release}, {os.cpu_count()} cores; {args.images} images of ~{args.image_mib:g} MiB, "
          f"{args.images_per_child} per child, {args.workers} children at once; {args.rounds} rounds of each setting\n")
    started = time.monotonic()
    if args.held_out_only:
        return _held_out(args, started)
    case_study = ("30/20", HostTuning())
    # The closed loop is the sweep's (2.5 GiB, baseline) cell pair, with the case study's 30/20 run between.
    print("## 1. The closed loop: `iobatch lab --advise --after-cliff --memory-gib 2.5` (plus a 30/20 run)\n")
    loop = _loop(args, 2.5, True, "sweep-2.5-base", [case_study])
    print(render_loop(loop) + "\n")
    if args.loop_only:
        return 0
    print("## 2. The sweep: predicted vs measured download stage (median child), st1 500 GiB\n")
    rows = [(2.5, True, loop)]
    cells = [(8.0, True)] + ([(2.5, False), (8.0, False)] if args.full else [])
    for memory, baseline in cells:
        tag = f"sweep-{memory:g}-{'base' if baseline else 'burst'}"
        rows.append((memory, baseline, _loop(args, memory, baseline, tag, [case_study])))
    print("| memory GiB | volume | cache | dirty_bytes MiB | predicted s | measured s (median, range) | error |")
    print("|---:|---|---|---:|---:|---:|---|")
    outside = 0
    for memory, baseline, result in rows:
        for run in result.runs:
            flag = "" if run.agrees else " **outside 25 %**"
            outside += 0 if run.agrees else 1
            error = "-" if run.error is None else f"{run.error:+.0%}{flag}"
            print(f"| {memory:g} | {'baseline 19.5 MiB/s' if baseline else 'burst 122 MiB/s'} | {run.setting} | "
                  f"{int(run.sysctls.get('vm.dirty_bytes', 0)) / 2**20:,.0f} | {run.predicted_s:.1f} | "
                  f"{measured_cell(run)} | {error} |")
    cells = sum(len(r.runs) for _, _, r in rows)
    print(f"\n{cells - outside} of {cells} cells within {AGREEMENT:.0%}; wall time "
          f"{time.monotonic() - started:.0f} s\n")
    return _held_out(args, started)


def _held_out(args: argparse.Namespace, started: float) -> int:
    """Part 3: each workload of HELD_OUT is its own loop (its default run's profiles advise); per run the settled
    model's prediction, its range from the unsettled controller's to writers held at the freerun point
    (tuning.writecache.WriteCache), and the measured."""
    from pipeline.local.demo import lab_run_dir

    print("## 3. Workloads not fitted to: st1 500 GiB at baseline, 2 children at once\n")
    print("| memory GiB | batch | cache | predicted s (range) | measured s (median, range) | error | in range |")
    print("|---:|---|---|---:|---:|---|---|")
    within = inside = cells = 0
    for memory, images, image_mib, per_child in HELD_OUT:
        tag = f"held-{memory:g}-{images}x{image_mib:g}-{per_child}"
        result = _loop(args, memory, True, tag, [], (images, image_mib, per_child))
        for run in result.runs:
            cells += 1
            within += run.agrees
            inside += run.agrees or run.within_range
            error = "-" if run.error is None else f"{run.error:+.0%}"
            print(f"| {memory:g} | {images} x {image_mib:g} MiB, {per_child} per child | {run.setting} | "
                  f"{predicted_cell(run)} | {measured_cell(run)} | {error} | "
                  f"{'yes' if run.agrees or run.within_range else '**no**'} |")
    print(f"\n{within} of {cells} cells within {AGREEMENT:.0%} of the prediction, {inside} within it or the range; "
          f"wall time {time.monotonic() - started:.0f} s")
    # Part 4: the largest burst's default run advised for the hosts Batch picks (instance types x job sizes).
    memory, images, image_mib, per_child = max(HELD_OUT, key=lambda w: w[2] * w[3])
    profiles = lab_run_dir(args.run_dir / f"held-{memory:g}-{images}x{image_mib:g}-{per_child}", 1, "default")
    print("\n## 4. A default run advised for plans it did not run on (`bench.advise_plans`)\n")
    print("\n".join(advise_plans.table(profiles)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
