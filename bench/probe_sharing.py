"""What other children's profilers on the same host cost a child: one copy of the eBPF programs is shared by every
profiler on the host (profiling/probes/ebpf_host.py), each reading its own slot, so a child's per-call cost should
not grow with the number of profilers beside it.

CPU (user + system, wait4) of --writes x 4 KiB write() to tmpfs: bare (no probe on the host at all), then under
the child's own probe with 0, 15 and 63 other profilers on the host, each selecting an idle process of its own;
alternating, medians. Also what a profiler waits for when the programs are already loaded (attach + first
reading, start()) against the first profiler on the host (load, verify, attach, pin). Root only.

    sudo .venv/bin/python -m bench.probe_sharing [--writes 200000] [--rounds 9] [--others 0,15,63]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.gate import gated, released_cpu_s
from bench.percall_overhead import TARGETS
from profiling.probes import ebpf, ebpf_host

REPO = Path(__file__).resolve().parents[1]
WRITEBENCH = REPO / "profiling" / "interpose" / "writebench"
OTHERS = (0, 15, 63)
TARGET_RATIO = TARGETS["ebpf"]  # per call vs bare (the per-call target), whatever the number of other profilers
TARGET_FLAT = 1.05  # the most profilers within 5 % of none
TARGET_ATTACH_S = 0.1  # attach + first reading when the host's programs are loaded

STARTS: dict[str, list[float]] = {"first on the host": [], "programs already loaded": []}


def cpu_of(others: int | None, writes: int, target: Path) -> float:
    """CPU seconds of the workload: bare (`others` None), or under its own probe with `others` more profilers."""
    idle = [subprocess.Popen(["sleep", "600"]) for _ in range(others or 0)]
    probes = []
    mine = None
    try:
        for proc in idle:
            probe = ebpf.EbpfProbe(keep_running=True)
            began = time.monotonic()
            probe.start(proc.pid)
            STARTS["programs already loaded" if probes else "first on the host"].append(time.monotonic() - began)
            probes.append(probe)
        job = gated([str(WRITEBENCH), str(target), str(writes), "4096"])
        if others is not None:
            mine = ebpf.EbpfProbe()
            began = time.monotonic()
            mine.start(job.pid)
            STARTS["programs already loaded" if probes else "first on the host"].append(time.monotonic() - began)
        return released_cpu_s(job)
    finally:
        if mine is not None:
            mine.stop()
        for probe in probes:
            probe.close()
        for proc in idle:
            proc.kill()
            proc.wait()
        target.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--others", default=",".join(map(str, OTHERS)),
                        help="other profilers on the host, comma-separated (default: %(default)s)")
    args = parser.parse_args()
    if (reason := ebpf.available()) is not None:
        raise SystemExit(f"the eBPF probe cannot run here: {reason}")
    others_list = [int(n) for n in args.others.split(",")]
    if ebpf_host.loaded_programs():
        print("note: another profiler on this host holds the programs already: the 'first on the host' row is "
              "not measured")
    subprocess.run(["make", "-s", "-C", str(WRITEBENCH.parent)], check=True)
    work = Path(tempfile.mkdtemp(prefix="iobatch-sharing-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    rows: list[int | None] = [None, *others_list]
    results: dict[int | None, list[float]] = {n: [] for n in rows}
    hooks = "-"
    try:
        for round_no in range(args.rounds):
            for n in rows:
                results[n].append(cpu_of(n, args.writes, work / "out.bin"))
                label = "bare" if n is None else f"{n} other profilers"
                print(f"round {round_no + 1}: {label} {results[n][-1]:.3f} s CPU", flush=True)
        probe = ebpf.EbpfProbe(keep_running=True)  # which hooks this kernel gave the programs
        idle = subprocess.Popen(["sleep", "60"])
        try:
            probe.start(idle.pid)
            assert probe._loaded is not None
            hooks = probe._loaded.slot.hooks
        finally:
            probe.close()
            idle.kill()
            idle.wait()
    finally:
        work.rmdir()
    print(f"\n{args.writes:,} x 4 KiB write() to tmpfs, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{os.cpu_count()} cores, per-call hooks: {hooks}; CPU of the workload, medians of {args.rounds} "
          "alternating rounds:")
    print("| other profilers on the host | CPU s | us per write | vs bare | target |")
    print("|---:|---:|---:|---:|---|")
    bare = statistics.median(results[None])
    for n, values in results.items():
        cpu = statistics.median(values)
        label = "bare (no probe)" if n is None else str(n)
        target = "" if n is None else f"<= {TARGET_RATIO:.2f}x"
        print(f"| {label} | {cpu:.3f} | {cpu / args.writes * 1e6:.2f} | {cpu / bare:.2f}x | {target} |")
    if 0 in results and others_list[-1] != 0:
        flat = statistics.median(results[others_list[-1]]) / statistics.median(results[0])
        print(f"\n{others_list[-1]} other profilers vs none: {flat:.2f}x (target <= {TARGET_FLAT:.2f}x)")
    print("\n| a profiler's start() (attach + first reading) | n | median s | max s | target |")
    print("|---|---:|---:|---:|---|")
    for label, times in STARTS.items():
        if times:
            target = f"<= {TARGET_ATTACH_S} s" if label == "programs already loaded" else ""
            print(f"| {label} | {len(times)} | {statistics.median(times):.3f} | {max(times):.3f} | {target} |")


if __name__ == "__main__":
    main()
