"""The case study on this machine: write cache vs the st1 volume, and the credit cliff. Root only.

    sudo .venv/bin/python bench/lab_case_study.py [--memory-gib 2.5] [--skip-pipeline]

Four parts, each printed as a table:

1. the model's worked examples (tuning.ebs): st1 500 GiB rates, burst time of a full bucket and of
   54 GiB of credits, and why credits / burst underestimates it;
2. a plain writer (the download burst of one instance as files), on the st1 at baseline (bucket held
   empty, as after the credit cliff), under the kernel's default write cache
   (dirty_ratio 20 / background 10) and the case study's (30 / 20), both as bytes for the emulated memory,
   alternating: time until every write returned vs time until the data is durable;
3. `iobatch lab --after-cliff`: the real pipeline (embedded S3, s5cmd, profiler sidecar) on the lab volume
   under both settings, with the profiles' peak dirty, dirty limit, io stall and dirty-throttle pause
   (and with --with-burst, the same with a full bucket);
4. the credit cliff: rounds of write + sync on an st1 whose bucket is shrunk by a time scale, before and
   after it runs dry, next to the simulator's prediction.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuning.ebs import GIB, MIB, Volume  # noqa: E402
from tuning.host import KERNEL_DEFAULTS, HostTuning  # noqa: E402
from tuning.lab import Lab, LabConfig, write_files  # noqa: E402
from tuning.simulator import StageLoad, simulate  # noqa: E402
from tuning.writecache import WriteCache  # noqa: E402


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join(lines)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def part_models() -> None:
    v = Volume("st1", 500)
    print("## 1. Model (tuning.ebs)\n")
    print(table(["figure", "value"], [
        ["st1 500 GiB baseline", f"{v.baseline_mibps:.2f} MiB/s"],
        ["st1 500 GiB burst", f"{v.burst_mibps:.2f} MiB/s"],
        ["full bucket (500 GiB of credits) at burst", f"{v.burst_seconds() / 60:.1f} min"],
        ["54 GiB of credits: credits / (burst - baseline)", f"{v.burst_seconds(54 * 1024) / 60:.1f} min"],
        ["54 GiB of credits: naive credits / burst", f"{v.naive_burst_seconds(54 * 1024) / 60:.1f} min"],
    ]))
    print("\n" + v.explain_burst(54 * 1024) + "\n")


def part_writer(args: argparse.Namespace, lab: Lab) -> None:
    memory = int(args.memory_gib * GIB)
    files = args.workers * args.images_per_child
    bucket = "bucket held empty (baseline)" if lab.config.hold_empty else "full bucket"
    print(f"## 2. Plain writer: {files} x {args.image_mib:g} MiB by {args.workers} threads, emulated memory "
          f"{args.memory_gib:g} GiB, {lab.config.volume.label}, {bucket}\n")
    rows = []
    results: dict[str, list[tuple[float, float]]] = {"default": [], "tuned": []}
    for round_ in range(args.rounds):
        for name, tuning in (("default", KERNEL_DEFAULTS), ("tuned", HostTuning())):
            lab.drain()
            sysctls = lab.apply_cache(tuning, memory)
            credits = lab.credits_gib
            r = write_files(lab, files=files, file_mib=args.image_mib, threads=args.workers)
            results[name].append((r.written_s, r.durable_s))
            rows.append([str(round_ + 1), name, f"{int(sysctls['vm.dirty_bytes']) / MIB:,.0f}",
                         f"{credits:,.1f}", f"{r.written_s:.2f}", f"{r.durable_s:.2f}",
                         f"{r.peak_dirty_bytes / MIB:,.0f}", f"{r.dirty_threshold_bytes / MIB:,.0f}",
                         f"{r.io_stall_ms:,.0f}"])
    print(table(["round", "setting", "dirty_bytes MiB", "credits GiB", "all written s", "durable s",
                 "peak dirty MiB", "dirty limit MiB", "io stall ms"], rows))
    dw = median([w for w, _ in results["default"]])
    tw = median([w for w, _ in results["tuned"]])
    dd = median([d for _, d in results["default"]])
    td = median([d for _, d in results["tuned"]])
    print(f"\nmedians: all written default {dw:.2f} s vs tuned {tw:.2f} s = {dw / tw:.2f}x; "
          f"durable default {dd:.2f} s vs tuned {td:.2f} s = {dd / td:.2f}x\n")


def part_pipeline(args: argparse.Namespace, *, after_cliff: bool) -> None:
    bucket = "bucket held empty (after the cliff: baseline)" if after_cliff else "full bucket (burst)"
    print(f"## 3{'b' if after_cliff else 'a'}. `iobatch lab`: the pipeline, {args.images} images of "
          f"~{args.image_mib:g} MiB, {args.images_per_child} per child, {args.workers} children at once, emulated "
          f"memory {args.memory_gib:g} GiB, {args.volume}, {bucket}\n")
    command = [sys.executable, "-m", "pipeline.cli", "lab", "--where", "host", "--json", "--volume", args.volume,
               "--memory-gib", str(args.memory_gib), "--workers", str(args.workers), "--images", str(args.images),
               "--image-mib", str(args.image_mib), "--images-per-child", str(args.images_per_child),
               "--rounds", str(args.rounds), "--run-dir", str(args.run_dir)]
    if args.credits_gib is not None:
        command += ["--credits-gib", str(args.credits_gib)]
    if after_cliff:
        command += ["--after-cliff"]
    print("command: " + " ".join(command[1:]) + "\n")
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"iobatch lab failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        return
    # The JSON is the last thing on stdout: an array starting on a line of its own.
    start = done.stdout.find("\n[\n") + 1 if not done.stdout.startswith("[") else 0
    runs = json.loads(done.stdout[start:])
    rows = []
    downloads: dict[str, list[float]] = {"default": [], "tuned": []}
    durable: dict[str, list[float]] = {"default": [], "tuned": []}
    for number, run in enumerate(runs, 1):
        for stage in ("download", "process", "upload"):
            row = run["stages"].get(stage) or {}

            def cell(name: str, scale: float = 1.0, row: dict[str, float | None] = row) -> str:
                value = row.get(name)
                return "-" if value is None else f"{value / scale:,.1f}"
            rows.append([str(number), run["setting"], stage, cell("StageDuration"), cell("PeakDirtyBytes", MIB),
                         cell("DirtyThresholdBytes", MIB), cell("IoStallSome"), cell("DirtyThrottle")])
        if run["stages"].get("download", {}).get("StageDuration") is not None:
            downloads[run["setting"]].append(run["stages"]["download"]["StageDuration"])
        if run.get("writer"):
            durable[run["setting"]].append(run["writer"]["durable_s"])
    print(table(["run", "setting", "stage", "median s", "peak dirty MiB", "dirty limit MiB", "io stall ms",
                 "dirty pause ms"], rows))
    if downloads["default"] and downloads["tuned"]:
        d, t = median(downloads["default"]), median(downloads["tuned"])
        print(f"\ndownload stage (median child): default {d:.1f} s vs tuned {t:.1f} s = {d / t:.2f}x")
    if durable["default"] and durable["tuned"]:
        d, t = median(durable["default"]), median(durable["tuned"])
        print(f"same burst as files, time to durable: default {d:.1f} s vs tuned {t:.1f} s = {d / t:.2f}x")
    print(f"(lab wall time {time.monotonic() - started:.0f} s)\n")


def part_cliff(args: argparse.Namespace) -> None:
    volume = Volume("st1", 500)
    scale = args.time_scale
    round_mib = args.cliff_round_mib
    print(f"## 4. Credit cliff: {volume.label}, full bucket shrunk {scale:g}x (83 min of burst -> "
          f"{volume.burst_seconds() / scale:.0f} s), rounds of {round_mib} MiB write + sync\n")
    config = LabConfig(volume=volume, time_scale=scale, lab_dir=args.lab_dir, loop_size_mib=args.loop_size_mib)
    rows = []
    with Lab(config, say=lambda _: None) as lab:
        lab.apply_cache(HostTuning(), int(args.memory_gib * GIB))
        start = time.monotonic()
        after_empty = 0
        number = 0
        while after_empty < args.cliff_rounds_after and number < 60:
            number += 1
            credits = lab.credits_gib
            was_empty = lab.empty_at is not None
            r = write_files(lab, files=max(1, round_mib // 64), file_mib=64, threads=2, subdir=f"cliff-{number}")
            empty = lab.empty_at
            rows.append([str(number), f"{time.monotonic() - start:.1f}",
                         f"{(time.monotonic() - start) * scale / 60:.0f}", f"{credits:,.1f}", f"{r.durable_s:.2f}",
                         f"{round_mib / r.durable_s:.1f}", f"{lab.limit_mibps:.1f}"])
            if was_empty and empty is not None:
                after_empty += 1
        empty_at = lab.empty_at
    print(table(["round", "lab s", "volume min", "credits GiB at start", "durable s", "MiB/s", "limit after MiB/s"],
                rows))
    # The simulator on the same load, back to back, no cache (durable is what the volume does).
    stage = StageLoad("write", round_mib * MIB)
    sim = simulate(volume, [stage], waves=len(rows), cache=WriteCache(0, 0),
                   initial_credits=volume.credit_capacity / scale, dt=0.05)
    print(f"\nmeasured: bucket empty after {empty_at if empty_at is None else round(empty_at, 1)} lab s; "
          f"simulator (same rounds, bucket / {scale:g}): after {sim.credits_empty_at:.1f} s; "
          f"model: {volume.burst_seconds() / scale:.1f} s at full burst.")
    times = sim.stage_times("write")
    print(f"simulator round time before / after: {times[0]:.2f} s / {times[-1]:.2f} s "
          f"(= {round_mib / times[0]:.1f} / {round_mib / times[-1]:.1f} MiB/s)\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--volume", default="st1:500")
    parser.add_argument("--memory-gib", type=float, default=2.5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--images", type=int, default=40)
    parser.add_argument("--image-mib", type=float, default=25.0)
    parser.add_argument("--images-per-child", type=int, default=10)
    parser.add_argument("--credits-gib", type=float, default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=400.0)
    parser.add_argument("--cliff-round-mib", type=int, default=256)
    parser.add_argument("--cliff-rounds-after", type=int, default=2)
    parser.add_argument("--loop-size-mib", type=int, default=4096)
    parser.add_argument("--lab-dir", type=Path, default=Path("/var/tmp/iobatch-lab"))
    parser.add_argument("--run-dir", type=Path, default=Path(".iobatch/lab-bench"))
    parser.add_argument("--skip-pipeline", action="store_true")
    parser.add_argument("--with-burst", action="store_true", help="also run the pipeline with a full bucket")
    parser.add_argument("--skip-cliff", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("lab_case_study: skipped, it needs root (loop device, mount, sysctls, blkio cgroup)")
        return
    print(f"# lab case study, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, kernel {os.uname().release}, "
          f"{os.cpu_count()} cores\n")
    part_models()
    from tuning.plan import parse_candidate

    config = LabConfig(volume=parse_candidate(args.volume), lab_dir=args.lab_dir, loop_size_mib=args.loop_size_mib,
                       initial_credits_mib=None if args.credits_gib is None else args.credits_gib * 1024,
                       hold_empty=True)
    with Lab(config, say=lambda _: None) as lab:
        part_writer(args, lab)
    if not args.skip_pipeline:
        part_pipeline(args, after_cliff=True)
        if args.with_burst:
            part_pipeline(args, after_cliff=False)
    if not args.skip_cliff:
        part_cliff(args)


if __name__ == "__main__":
    main()
