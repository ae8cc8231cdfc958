"""What other children's eBPF probes on the same host cost a child: each child's profiler loads its own program,
and every loaded program runs on every system call of the host, selecting its own child's cgroup inside.

CPU (user + system, wait4) of 200,000 x 4 KiB write() to tmpfs under the child's own probe, with 0, 3 and 7
other probes loaded beside it, each selecting an idle process of its own; alternating, medians. Root only.

    sudo .venv/bin/python -m bench.probe_sharing [--writes 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from profiling.probes import ebpf

REPO = Path(__file__).resolve().parents[1]
WRITEBENCH = REPO / "profiling" / "interpose" / "writebench"
OTHERS = (0, 3, 7)


def cpu_of(others: int, writes: int, target: Path) -> float:
    """CPU seconds of the workload under its own probe with `others` more probes loaded on the host."""
    idle = [subprocess.Popen(["sleep", "600"]) for _ in range(others)]
    probes = []
    try:
        for proc in idle:
            probe = ebpf.EbpfProbe(keep_running=True)
            probe.start(proc.pid)
            probes.append(probe)
        job = subprocess.Popen(["sh", "-c", f'read go; exec "{WRITEBENCH}" "{target}" {writes} 4096'],
                               stdin=subprocess.PIPE)
        mine = ebpf.EbpfProbe()
        mine.start(job.pid)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert job.stdin is not None
        job.stdin.write(b"go\n")
        job.stdin.close()
        job.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        mine.stop()
        return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    finally:
        for probe in probes:
            probe.stop()
            probe.close()
        for proc in idle:
            proc.kill()
            proc.wait()
        target.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if (reason := ebpf.available()) is not None:
        raise SystemExit(f"the eBPF probe cannot run here: {reason}")
    subprocess.run(["make", "-s", "-C", str(WRITEBENCH.parent)], check=True)
    work = Path(tempfile.mkdtemp(prefix="iobatch-sharing-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    results: dict[int, list[float]] = {n: [] for n in OTHERS}
    try:
        for round_no in range(args.rounds):
            for n in OTHERS:
                results[n].append(cpu_of(n, args.writes, work / "out.bin"))
                print(f"round {round_no + 1}: {n} other probes {results[n][-1]:.3f} s CPU", flush=True)
    finally:
        work.rmdir()
    print(f"\n{args.writes:,} x 4 KiB write() to tmpfs, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{os.cpu_count()} cores; CPU of the workload, medians of {args.rounds} alternating rounds:")
    print("| other probes loaded | CPU s | us per write | vs none |")
    print("|---:|---:|---:|---:|")
    base = statistics.median(results[0])
    for n, values in results.items():
        cpu = statistics.median(values)
        print(f"| {n} | {cpu:.3f} | {cpu / args.writes * 1e6:.2f} | {cpu / base:.2f}x |")


if __name__ == "__main__":
    main()
