"""What per-call profiling costs: 1,000,000 x 4 KiB write() with each probe, side by side with strace.

Rows, alternating within one run, median of N rounds each:
  baseline      the workload alone
  interposer    LD_PRELOAD profiling/interpose/libiobatch_interpose.so, recording to a directory
  ebpf          profiling.probes.ebpf.EbpfProbe on the workload's process tree (root + bpftrace)
  strace -c -f  strace counting calls
  strace -f -T  strace timing every call (output to /dev/null)

The workload is profiling/interpose/writebench writing to a file on tmpfs (/dev/shm when present), so
the disk of a shared machine does not set the figure; the file is removed after every run. Each run
starts from a shell waiting on stdin, so probes attach before the first call and only the workload is
timed (from the go signal to its exit), not the probe's start-up.

    python bench/percall_overhead.py [--count 1000000] [--rounds 5] [--strace-rounds 1]

Prints a markdown table for BENCHMARKS.md. The strace rows take ~15x longer, hence fewer rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from profiling.metrics import by_call  # noqa: E402
from profiling.probes import ebpf  # noqa: E402
from profiling.probes.interpose import library_path, preload_env  # noqa: E402

WRITEBENCH = REPO / "profiling" / "interpose" / "writebench"
TARGETS = {"interposer": 1.10, "ebpf": 1.6}


def timed_run(argv: list[str], env: dict[str, str], probe: ebpf.EbpfProbe | None = None) -> float:
    """Seconds from releasing a gated shell running `argv` to its exit."""
    quoted = " ".join(f"'{a}'" for a in argv)
    proc = subprocess.Popen(["sh", "-c", f"read go; exec {quoted}"], stdin=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    if probe is not None:
        probe.start(proc.pid)
    try:
        started = time.monotonic()
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        code = proc.wait()
        elapsed = time.monotonic() - started
    finally:
        if probe is not None:
            calls = probe.stop()
    if code != 0:
        raise SystemExit(f"{argv[0]} failed with exit code {code}")
    if probe is not None and (calls is None or by_call(calls).get("write", {}).get("count", 0) < 1):
        raise SystemExit("the eBPF probe saw no writes")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--strace-rounds", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=None,
                        help="Directory for the written file (default: tmpfs /dev/shm, else the temp dir). "
                             "A disk-backed directory gives page-cache writes, ~2-3x dearer per call.")
    args = parser.parse_args()

    subprocess.run(["make", "-s", "-C", str(WRITEBENCH.parent)], check=True)
    if library_path() is None:
        raise SystemExit("the interposer is not built: run `make setup`")
    tmp_root = str(args.dir) if args.dir else ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    work = Path(tempfile.mkdtemp(prefix="iobatch-percall-", dir=tmp_root))
    target = work / "out.bin"
    workload = [str(WRITEBENCH), str(target), str(args.count), "4096"]
    base_env = dict(os.environ)
    no_ebpf = ebpf.available()

    modes: dict[str, tuple[Callable[[], float], int]] = {
        "baseline": (lambda: timed_run(workload, base_env), args.rounds),
        "interposer": (lambda: timed_run(workload, {**base_env, **preload_env(work / "scratch")}), args.rounds),
        "strace -c -f": (lambda: timed_run(["strace", "-c", "-f", "-o", "/dev/null", *workload], base_env),
                         args.strace_rounds),
        "strace -f -T": (lambda: timed_run(["strace", "-f", "-T", "-o", "/dev/null", *workload], base_env),
                         args.strace_rounds),
    }
    if no_ebpf is None:
        modes["ebpf"] = (lambda: timed_run(workload, base_env, ebpf.EbpfProbe()), args.rounds)
    results: dict[str, list[float]] = {name: [] for name in modes}
    try:
        for round_no in range(max(args.rounds, args.strace_rounds)):
            for name, (run, rounds) in modes.items():
                if round_no < rounds:
                    results[name].append(run())
                    target.unlink(missing_ok=True)
                    print(f"round {round_no + 1}: {name} {results[name][-1]:.2f} s", file=sys.stderr, flush=True)
    finally:
        for path in sorted(work.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        work.rmdir()

    base = statistics.median(results["baseline"])
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(work.parent)], capture_output=True, text=True).stdout.strip()
    print(f"{args.count:,} x 4 KiB write() to a file on {fs or 'unknown fs'}, {datetime.now(UTC):%Y-%m-%d}, "
          f"{os.cpu_count()} cores; median of the runs, same run, alternating")
    print()
    print("| probe | runs (s, in order) | median s | ratio of medians | median of per-round ratios | target |")
    print("|---|---|---|---|---|---|")
    for name in ("baseline", "interposer", "ebpf", "strace -c -f", "strace -f -T"):
        if not results.get(name):
            reason = no_ebpf if name == "ebpf" and no_ebpf else "not run (--strace-rounds 0)"
            print(f"| {name} | - | - | - | - | {reason} |")
            continue
        median = statistics.median(results[name])
        target_text = f"<= {TARGETS[name]:.2f}x" if name in TARGETS else ""
        runs = ", ".join(f"{v:.2f}" for v in results[name])
        # Rounds alternate, so each run has a baseline run next to it: the paired ratio resists the
        # machine's swings better than the ratio of medians.
        paired = statistics.median(v / b for v, b in zip(results[name], results["baseline"], strict=False))
        print(f"| {name} | {runs} | {median:.2f} | {median / base:.2f}x | {paired:.2f}x | {target_text} |")


if __name__ == "__main__":
    main()
