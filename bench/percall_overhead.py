"""What per-call profiling costs: 1,000,000 x 4 KiB write() with each probe, side by side with strace.

Rows, alternating within one run, median of N rounds each:
  baseline      the workload alone
  interposer    LD_PRELOAD profiling/interpose/libiobatch_interpose.so, recording to a directory
  ebpf          profiling.probes.ebpf.EbpfProbe (the CO-RE program, root) on the workload's cgroup
  strace -c -f  strace counting calls
  strace -f -T  strace timing every call (output to /dev/null)

Then the eBPF probe's cost per call as CPU time, which a shared machine's load moves far less than wall
time: --cpu-rounds pairs of (bare, probed) runs of 200,000 writes, alternating, user + system CPU seconds
of the workload (the probe's programs run inside its system calls, so their time is the workload's).
And what the user waits for: start() (load, attach, first reading) and stop()
(last reading, detach; here each run is the host's only profiler, so start() loads the programs: what a
profiler waits for when they are loaded already is bench/probe_sharing.py's), and whole processes, start-up
included: `iobatch profile --contract` around a static program (writebench-static) doing 2 x --count
4 KiB pwrite()s within a 32 MiB region of tmpfs, against the bare program, and `iobatch profile --contract
-- true`. The region keeps page allocation from hiding the per-call cost (FACTS: 8 GiB of fresh pages
hid it at 1.02x).

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
WRITEBENCH_STATIC = REPO / "profiling" / "interpose" / "writebench-static"
TARGETS = {"interposer": 1.10, "ebpf": 1.15}  # per call in the loop, the probe's over the bare program's
# iobatch profile --contract around the static program / the bare program, by the hooks the kernel gave the programs:
# the raw syscall tracepoints run on every system call of the host, fentry only on the watched ones
WHOLE_TARGETS = {"tracepoint": 1.35, "fentry": 1.15}
TRUE_TARGET_S = 0.2  # iobatch profile -- true, whole
REGION = 32 << 20
CONTRACT = REPO / "contracts" / "case-study.contract"


PROBE_TIMES: dict[str, list[float]] = {"start": [], "stop": []}
HOOKS: set[str] = set()  # what the eBPF probe's programs were given (EbpfProbe.hooks)
# CPU seconds (user + system) of each run's process tree, by mode: the probe's work runs in the traced
# process's own system calls, so this is its cost without the waits a shared machine adds to wall time.
CPU: dict[str, list[float]] = {}


LAST_CPU = [0.0]


def timed_run(argv: list[str], env: dict[str, str], probe: ebpf.EbpfProbe | None = None) -> float:
    """Seconds from releasing a gated shell running `argv` to its exit."""
    quoted = " ".join(f"'{a}'" for a in argv)
    proc = subprocess.Popen(["sh", "-c", f"read go; exec {quoted}"], stdin=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    if probe is not None:
        began = time.monotonic()
        probe.start(proc.pid)
        PROBE_TIMES["start"].append(time.monotonic() - began)
        HOOKS.add(probe.hooks or "-")
    try:
        started = time.monotonic()
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        _pid, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.monotonic() - started
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        LAST_CPU[0] = usage.ru_utime + usage.ru_stime
    finally:
        if probe is not None:
            began = time.monotonic()
            calls = probe.stop()
            PROBE_TIMES["stop"].append(time.monotonic() - began)
    if code != 0:
        raise SystemExit(f"{argv[0]} failed with exit code {code}")
    if probe is not None and (calls is None or by_call(calls).get("write", {}).get("count", 0) < 1):
        raise SystemExit("the eBPF probe saw no writes")
    return elapsed


def whole_process(argv: list[str], env: dict[str, str]) -> float:
    """Seconds a whole process takes, start-up included."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    LAST_CPU[0] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--strace-rounds", type=int, default=1)
    parser.add_argument("--cpu-rounds", type=int, default=15)
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
        twice = [str(WRITEBENCH_STATIC), str(target), str(2 * args.count), "4096", f"region={REGION}"]
        profile = [sys.executable, "-m", "pipeline.cli", "profile", "--contract", str(CONTRACT), "--"]
        py_env = {**base_env, "PYTHONPATH": str(REPO)}
        modes["whole: bare static program, 2x count"] = (lambda: whole_process(twice, base_env), args.rounds)
        modes["whole: iobatch profile, 2x count"] = (lambda: whole_process([*profile, *twice], py_env), args.rounds)
        modes["whole: iobatch profile -- true"] = (lambda: whole_process([*profile, "true"], py_env), args.rounds)
        # what profile -- true cannot go below in Python: the interpreter and the CLI's own imports, no probe
        modes["whole: iobatch --help"] = (lambda: whole_process([*profile[:3], "--help"], py_env), args.rounds)
    results: dict[str, list[float]] = {name: [] for name in modes}
    small = [str(WRITEBENCH), str(target), "200000", "4096"]
    cpu_pairs: list[tuple[float, float]] = []
    try:
        for round_no in range(max(args.rounds, args.strace_rounds)):
            for name, (run, rounds) in modes.items():
                if round_no < rounds:
                    results[name].append(run())
                    CPU.setdefault(name, []).append(LAST_CPU[0])
                    target.unlink(missing_ok=True)
                    print(f"round {round_no + 1}: {name} {results[name][-1]:.2f} s", file=sys.stderr, flush=True)
        for _ in range(args.cpu_rounds if no_ebpf is None else 0):
            timed_run(small, base_env)
            bare_cpu = LAST_CPU[0]
            target.unlink(missing_ok=True)
            timed_run(small, base_env, ebpf.EbpfProbe())
            cpu_pairs.append((bare_cpu, LAST_CPU[0]))
            target.unlink(missing_ok=True)
    finally:
        for path in sorted(work.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        work.rmdir()

    base = statistics.median(results["baseline"])
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(work.parent)], capture_output=True, text=True).stdout.strip()
    print(f"{args.count:,} x 4 KiB write() to a file on {fs or 'unknown fs'}, {datetime.now(UTC):%Y-%m-%d}, "
          f"{os.cpu_count()} cores; median of the runs, same run, alternating")
    print()
    print("| probe | runs (s, in order) | median s | ratio of medians | median of per-round ratios | CPU s (median) "
          "| CPU ratio | target |")
    print("|---|---|---|---|---|---|---|---|")
    for name in ("baseline", "interposer", "ebpf", "strace -c -f", "strace -f -T"):
        if not results.get(name):
            reason = no_ebpf if name == "ebpf" and no_ebpf else "not run (--strace-rounds 0)"
            print(f"| {name} | - | - | - | - | - | - | {reason} |")
            continue
        median = statistics.median(results[name])
        target_text = f"<= {TARGETS[name]:.2f}x" if name in TARGETS else ""
        runs = ", ".join(f"{v:.2f}" for v in results[name])
        # Rounds alternate, so each run has a baseline run next to it: the paired ratio resists the
        # machine's swings better than the ratio of medians.
        paired = statistics.median(v / b for v, b in zip(results[name], results["baseline"], strict=False))
        cpu = statistics.median(CPU[name])
        cpu_ratio = cpu / statistics.median(CPU["baseline"])
        print(f"| {name} | {runs} | {median:.2f} | {median / base:.2f}x | {paired:.2f}x | {cpu:.2f} | {cpu_ratio:.2f}x "
              f"| {target_text} |")
    if no_ebpf is None:
        hooks = "/".join(sorted(HOOKS))
        whole_target = f"<= {WHOLE_TARGETS[hooks]:.2f}x" if hooks in WHOLE_TARGETS else "-"
        print(f"\nthe eBPF probe's hooks for the watched calls here: {hooks} (whole-process targets: "
              + ", ".join(f"{kind} <= {ratio:.2f}x" for kind, ratio in WHOLE_TARGETS.items()) + ")")
        bare = results["whole: bare static program, 2x count"]
        profiled = results["whole: iobatch profile, 2x count"]
        print()
        print("| eBPF probe, what the user waits for | runs (s, in order) | median | target |")
        print("|---|---|---|---|")
        for name, target_text in (("start", "load (first on the host), attach, first reading"),
                                  ("stop", "last reading, leave (last out: unpin)")):
            runs = ", ".join(f"{v:.3f}" for v in PROBE_TIMES[name])
            print(f"| probe {name}() | {runs} | {statistics.median(PROBE_TIMES[name]):.3f} s | {target_text} |")
        for name, target_text in (("whole: bare static program, 2x count", ""),
                                  ("whole: iobatch profile, 2x count", f"{whole_target} the bare program"),
                                  ("whole: iobatch profile -- true", f"<= {TRUE_TARGET_S} s"),
                                  ("whole: iobatch --help", "the interpreter and the CLI, no probe")):
            runs = ", ".join(f"{v:.2f}" for v in results[name])
            print(f"| {name} | {runs} | {statistics.median(results[name]):.2f} s "
                  f"(CPU {statistics.median(CPU[name]):.2f} s) | {target_text} |")
        paired = statistics.median(p / b for p, b in zip(profiled, bare, strict=False))
        print(f"| whole: profile / bare | - | {statistics.median(profiled) / statistics.median(bare):.2f}x "
              f"(paired {paired:.2f}x) | {whole_target} |")
    if cpu_pairs:
        bare_cpu = statistics.median(b for b, _ in cpu_pairs)
        probed_cpu = statistics.median(p for _, p in cpu_pairs)
        paired_cpu = statistics.median(p / b for b, p in cpu_pairs)
        print()
        print(f"CPU per call, {len(cpu_pairs)} alternating pairs of 200,000 x 4 KiB write(): bare "
              f"{bare_cpu / 0.2:.2f} us, with the eBPF probe {probed_cpu / 0.2:.2f} us "
              f"(+{(probed_cpu - bare_cpu) / 0.2:.2f} us); ratio of medians {probed_cpu / bare_cpu:.2f}x, "
              f"paired {paired_cpu:.2f}x (target <= {TARGETS['ebpf']:.2f}x)")


if __name__ == "__main__":
    main()
