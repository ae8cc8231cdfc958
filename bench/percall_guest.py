"""What the eBPF probe costs per call where the kernel gives it fentry: bench.percall_overhead's loop in the cgroup v2
guest (Debian's 6.1, the AL2023 hosts' kernel line), bare and under the probe with each of its two hooks.

    python -m bench.percall_guest [--count 100000] [--rounds 5]

One boot. Inside it, for each hook in turn (fentry/fexit on the watched system calls, then the raw syscall
tracepoints that a kernel refusing fentry leaves the probe, as this project's own machine kind does), a holding
profiler loads the host's programs once and keeps them, and --rounds pairs of runs alternate: the static
writebench's --count x 4 KiB pwrite() within a 32 MiB region of the guest's tmpfs bare, then under a profiler of
its own on the shared programs (as a child of a packed host is). Each run is timed from a go signal to its exit
and its CPU (user + system) read by wait4: the programs run inside its system calls. Medians, and the median of
the per-pair ratios.

Under TCG (QEMU's emulation, wherever KVM cannot run a stock kernel) every instruction is emulated, the kernel's
entry path and the programs' alike: the ratios are the figure here, not the guest's speeds. The whole-process
target (`iobatch profile` around the program) is measured on this machine by bench.percall_overhead; in the guest
the CLI's Python start-up alone takes 8-15 s under TCG, so it is not timed there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.percall_overhead import TARGETS

REPO = Path(__file__).resolve().parents[1]
WRITEBENCH_STATIC = REPO / "profiling" / "interpose" / "writebench-static"
REGION = 32 << 20
BOOT_TIMEOUT_S = 1800


def _forced_tracepoints() -> None:
    """The programs loaded as on a kernel that refuses fentry: the fentry attempt fails here, so ebpf_slot.load
    takes the raw syscall tracepoints (its own fallback)."""
    from profiling.probes import ebpf_slot

    real = ebpf_slot.load_object

    def refusing_fentry(obj_path: Path, hooks: str) -> ebpf_slot.BpfObject:
        if hooks == "fentry":
            raise ebpf_slot.BpfError("fentry left out by bench.percall_guest")
        return real(obj_path, hooks)

    ebpf_slot.load_object = refusing_fentry  # type: ignore[assignment]


def inside(count: int, rounds: int) -> dict[str, Any]:
    """In the guest: {hooks: {"bare": [(s, cpu)], "probed": [(s, cpu)]}} for fentry, then tracepoint."""
    from bench.percall_overhead import LAST_CPU, timed_run
    from profiling.probes import ebpf

    target = Path("/tmp/iobatch-percall-guest.bin")
    workload = [str(WRITEBENCH_STATIC), str(target), str(count), "4096", f"region={REGION}"]
    env = dict(os.environ)
    out: dict[str, Any] = {"release": os.uname().release, "count": count, "runs": {}}
    for wanted in ("fentry", "tracepoint"):
        if wanted == "tracepoint":
            _forced_tracepoints()
        idle = subprocess.Popen(["sleep", "3600"])
        holder = ebpf.EbpfProbe(keep_running=True)
        try:
            holder.start(idle.pid)
            runs: dict[str, list[tuple[float, float]]] = {"bare": [], "probed": []}
            for round_no in range(rounds):
                for name, probe in (("bare", None), ("probed", ebpf.EbpfProbe())):
                    seconds = timed_run(workload, env, probe)
                    runs[name].append((seconds, LAST_CPU[0]))
                    target.unlink(missing_ok=True)
                    print(f"{holder.hooks} round {round_no + 1}: {name} {seconds:.2f} s", file=sys.stderr, flush=True)
            out["runs"][holder.hooks or wanted] = runs
        finally:
            holder.close()
            idle.kill()
            idle.wait()
    return out


def table(result: dict[str, Any], wall_s: float) -> str:
    count = result["count"]
    lines = [f"{count:,} x 4 KiB pwrite() within 32 MiB of tmpfs, in the guest ({result['release']}, TCG unless KVM "
             f"ran it), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; pairs of runs alternating, medians",
             "",
             "| hooks | bare s (runs) | probed s (runs) | wall ratio (paired) | CPU per call, bare / probed us "
             "| CPU ratio (paired) | target |",
             "|---|---|---|---|---|---|---|"]
    for hooks, runs in result["runs"].items():
        bare, probed = runs["bare"], runs["probed"]
        wall = [s for s, _ in bare], [s for s, _ in probed]
        cpu = [c for _, c in bare], [c for _, c in probed]
        paired_wall = statistics.median(p / b for b, p in zip(*wall, strict=True))
        paired_cpu = statistics.median(p / b for b, p in zip(*cpu, strict=True))
        per_call = [statistics.median(c) / count * 1e6 for c in cpu]
        lines.append(
            f"| {hooks} | {', '.join(f'{s:.2f}' for s in wall[0])} | {', '.join(f'{s:.2f}' for s in wall[1])} "
            f"| {statistics.median(wall[1]) / statistics.median(wall[0]):.2f}x ({paired_wall:.2f}x) "
            f"| {per_call[0]:.2f} / {per_call[1]:.2f} (+{per_call[1] - per_call[0]:.2f}) "
            f"| {per_call[1] / per_call[0]:.2f}x ({paired_cpu:.2f}x) | <= {TARGETS['ebpf']:.2f}x |")
    lines += ["", f"the whole boot: {wall_s:.0f} s; under TCG the ratios are the figure, not the speeds"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)  # the guest's half
    args = parser.parse_args()
    if args.inside:
        print(json.dumps(inside(args.count, args.rounds)))
        return 0
    from tuning.guest.machine import Guest, unavailable

    if reason := unavailable():
        print(f"percall_guest: skipped, the guest cannot boot: {reason}")
        return 0
    subprocess.run(["make", "-s", "-C", str(WRITEBENCH_STATIC.parent)], check=True)
    command = (f"cd {REPO} && PYTHONPATH={REPO} {sys.executable} -m bench.percall_guest --inside "
               f"--count {args.count} --rounds {args.rounds}")
    started = time.monotonic()
    with Guest(vcpus=2, memory_mib=1024) as guest:
        done = guest.run(command, timeout=BOOT_TIMEOUT_S,
                         on_output=lambda stream, text: print(text, end="", file=sys.stderr, flush=True)
                         if stream == "stderr" else None)
    wall = time.monotonic() - started
    if done.returncode != 0:
        print(f"percall_guest: the guest's run exited {done.returncode}:\n{done.stderr[-2000:]}")
        return 1
    print(table(json.loads(done.stdout.strip().splitlines()[-1]), wall))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
