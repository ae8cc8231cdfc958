"""Where the eBPF probe's per-call cost goes: each program's own run time per call, from the kernel's BPF statistics.

The kernel counts each program's runs and their time when kernel.bpf_stats_enabled is 1 (Documentation/bpf/
bpf_prog_run.rst; bpftool prog show prints run_time_ns and run_cnt). This sets it for the run, after recording its
value, and restores it on every way out. The figures include the statistics' own cost (two clock reads per run),
so they are upper bounds. Three kinds of call, each --calls times:

  watched, selected      4 KiB write() to tmpfs by the child the probe selects (what a profiled job pays)
  watched, not selected  the same writes by another process on the host (what the probe costs a neighbour)
  unwatched              getppid() by another process (with the raw-tracepoint fallback every system call of the
                         host runs the programs; with fentry only the watched calls do)

beside the bare write's CPU time per call (user + system, wait4), alternating, medians. Then what a host's first
profiler waits for to load the programs (what `iobatch profile -- true` pays each time it is the host's only
profiler), each way the loader tries: with fentry hooks (refused by some kernels, after the whole CO-RE relocation),
then with the raw tracepoints. A kernel that refuses fentry is asked once per boot: the host's bpffs keeps the
answer (ebpf_host's no-fentry), so later first profilers pay the tracepoints' row alone. Root only.

    sudo .venv/bin/python -m bench.probe_cost [--calls 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from bench.gate import gated, released_cpu_s
from profiling.probes import ebpf

REPO = Path(__file__).resolve().parents[1]
WRITEBENCH = REPO / "profiling" / "interpose" / "writebench"
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
KINDS = ("watched, selected", "watched, not selected", "unwatched")


def program_stats() -> dict[str, tuple[int, int]]:
    """{program name: (runs, ns)} of the probe's programs loaded on the host."""
    shown = json.loads(subprocess.run(["bpftool", "-j", "prog", "show"], check=True, capture_output=True,
                                      text=True).stdout)
    return {p["name"]: (p.get("run_cnt", 0), p.get("run_time_ns", 0)) for p in shown
            if p.get("name", "").startswith("iob_")}


def measured(kind: str, calls: int, target: Path) -> dict[str, tuple[int, int]]:
    """The programs' (runs, ns) during `calls` calls of `kind`, the probe selecting the writer or an idle process."""
    if kind == "unwatched":
        argv = [str(REPO / ".venv" / "bin" / "python"), "-c", f"import os\nfor _ in range({calls}): os.getppid()"]
    else:
        argv = [str(WRITEBENCH), str(target), str(calls), "4096"]
    job = gated(argv)
    idle = subprocess.Popen(["sleep", "600"])
    probe = ebpf.EbpfProbe()
    try:
        probe.start(job.pid if kind == "watched, selected" else idle.pid)
        before = program_stats()
        released_cpu_s(job)
        after = program_stats()
        probe.stop()
    finally:
        probe.close()
        idle.kill()
        idle.wait()
        job.kill()
        target.unlink(missing_ok=True)
    return {name: (runs - before.get(name, (0, 0))[0], ns - before.get(name, (0, 0))[1])
            for name, (runs, ns) in after.items() if runs > before.get(name, (0, 0))[0]}


@contextlib.contextmanager
def bpf_stats() -> Iterator[None]:
    """kernel.bpf_stats_enabled = 1 inside, its value recorded first and restored on every way out."""
    was = STATS.read_text().strip()
    STATS.write_text("1")
    try:
        yield
    finally:
        STATS.write_text(was)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    shm = Path("/dev/shm")
    target = Path(tempfile.mkdtemp(dir=shm if shm.is_dir() else None)) / "probe-cost.bin"
    bare: list[float] = []
    per_run: dict[tuple[str, str], list[float]] = {}
    runs_per_call: dict[tuple[str, str], list[float]] = {}

    try:
        with bpf_stats():
            for _ in range(opts.rounds):
                bare.append(released_cpu_s(gated([str(WRITEBENCH), str(target), str(opts.calls), "4096"]))
                            / opts.calls)
                target.unlink(missing_ok=True)
                for kind in KINDS:
                    for name, (runs, ns) in measured(kind, opts.calls, target).items():
                        per_run.setdefault((kind, name), []).append(ns / runs)
                        runs_per_call.setdefault((kind, name), []).append(runs / opts.calls)
    finally:
        target.unlink(missing_ok=True)
        target.parent.rmdir()
    hooks = "fentry/fexit" if any(name.startswith("iob_in_") for _kind, name in per_run) else "raw tracepoints"
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, hooks: {hooks}; {opts.calls:,} calls, "
          f"{opts.rounds} rounds, medians; bare 4 KiB write() to tmpfs: "
          f"{statistics.median(bare) * 1e9:,.0f} ns of CPU per call")
    print("| call | program | runs per call | ns per run (statistics on: an upper bound) |")
    print("|---|---|---:|---:|")
    for (kind, name), values in sorted(per_run.items(), key=lambda item: (KINDS.index(item[0][0]), item[0][1])):
        if statistics.median(runs_per_call[(kind, name)]) >= 0.5:  # the call's own programs, not stray runs
            print(f"| {kind} | {name} | {statistics.median(runs_per_call[(kind, name)]):.2f} | "
                  f"{statistics.median(values):,.0f} |")
    print()
    print(load_table(opts.rounds + 2))


def load_table(rounds: int) -> str:
    """What loading the programs costs a host's first profiler (libbpf's open and load: CO-RE relocation against
    the kernel's BTF, then the verifier), each way ebpf_slot.load tries: fentry first, then the raw tracepoints
    where the kernel refuses fentry. Loaded and closed, never attached."""
    from profiling.probes.ebpf_slot import load_object
    from profiling.probes.libbpf import BpfError

    path = ebpf.object_path()
    assert path is not None, "the eBPF object is not built: run `make setup`"
    times: dict[str, list[float]] = {"fentry": [], "tracepoint": []}
    outcome: dict[str, str] = {}
    for _ in range(rounds):
        for hooks in times:
            began = time.perf_counter()
            try:
                load_object(path, hooks).close()
                outcome[hooks] = "loaded"
            except BpfError as exc:
                outcome[hooks] = f"refused ({str(exc).rsplit(': ', 1)[-1]})"
            times[hooks].append(time.perf_counter() - began)
    lines = ["| loading the programs (a host's first profiler) | runs (ms) | median ms | outcome |",
             "|---|---|---:|---|"]
    for hooks, values in times.items():
        lines.append(f"| with {hooks} hooks | {', '.join(f'{v * 1e3:.0f}' for v in values)} | "
                     f"{statistics.median(values) * 1e3:.0f} | {outcome[hooks]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
