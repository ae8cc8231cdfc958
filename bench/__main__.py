"""`make bench`: run every benchmark end to end, each making the inputs it needs, and print its table.

    python -m bench              all of them
    python -m bench NAME ...     some, e.g. `python -m bench download_compare stage_boundaries`
    python -m bench --list       what would run, with the BENCHMARKS.md section each result belongs in
    python -m bench --render     BENCHMARKS.md's current figures, rendered from bench/results/ (bench/results.py)

RUNS is the one list of what `make bench` measures: every figure in BENCHMARKS.md comes from one of these
commands, and each run names the section it belongs in. Each run's output is kept in bench/results/ with its
date, command and machine, and the page is rendered from there at the end. A run that needs root or a missing tool
is skipped with the reason, not failed; a run that fails makes the whole command exit 1 after the others have run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

from bench import results


@dataclass(frozen=True)
class Run:
    """One benchmark command and where its table goes."""

    name: str  # the module under bench/, and what `python -m bench NAME` selects
    section: str  # the BENCHMARKS.md heading its table belongs under
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    needs_root: bool = False
    needs_tools: tuple[str, ...] = ()

    def command(self) -> list[str]:
        return [sys.executable, "-m", f"bench.{self.name}", *self.args]

    def shown(self) -> str:
        env = " ".join(f"{key}={value}" for key, value in self.env.items())
        return " ".join(part for part in (env, "python -m", f"bench.{self.name}", *self.args) if part)

    def skip_reason(self) -> str | None:
        if self.needs_root and os.geteuid() != 0:
            return "needs root (loop devices, sysctls or eBPF): run `sudo make bench`"
        missing = [tool for tool in self.needs_tools if shutil.which(tool) is None]
        if missing:
            return f"needs {', '.join(missing)}: run `make setup` as root"
        return None


RUNS: tuple[Run, ...] = (
    Run("download_compare", "Download stage vs bare s5cmd vs `aws s3 cp`"),
    Run("download_compare", "Download stage vs bare s5cmd vs `aws s3 cp`: without the eBPF probe",
        env={"IOBATCH_NO_EBPF": "1"}),
    Run("submit_bench", "Submitting a 1,000,000-key batch"),
    Run("report_fleet", "Reports and advice at fleet size"),
    Run("sidecar_overhead", "Profiler sidecar overhead"),
    Run("sidecar_overhead", "Profiler sidecar overhead: the demo with and without the sidecar",
        args=("--workload", "demo", "--rounds", "5", "--images", "16", "--image-mib", "8", "--cpu-seconds", "20"),
        env={"IOBATCH_NO_EBPF": "1"}),
    Run("stage_boundaries", "Profiler sidecar overhead: what a stage boundary costs the job"),
    Run("stage_boundaries", "Profiler sidecar overhead: what a stage boundary costs the job, with the interposer",
        env={"IOBATCH_NO_EBPF": "1", "IOBATCH_INTERPOSE": "1"}),
    Run("percall_overhead", "Per-call probes: overhead and truth", needs_root=True, needs_tools=("strace",)),
    Run("probe_sharing", "Per-call probes: other children's probes on the same host", needs_root=True),
    Run("probe_cost", "Per-call probes: where the eBPF probe's cost goes", needs_root=True, needs_tools=("bpftool",)),
    Run("percall_guest", "Per-call probes: where the kernel gives fentry (the cgroup v2 guest)", args=("--rounds", "9"),
        needs_tools=("qemu-system-x86_64",)),
    Run("lab_case_study", "The case study in the lab", args=("--with-burst",), needs_root=True,
        needs_tools=("mkfs.xfs", "losetup")),
    Run("lab_advise", "The advisor in the lab: predicted vs measured", args=("--full",), needs_root=True,
        needs_tools=("mkfs.xfs", "losetup", "fusermount3")),
    Run("lab_guest", "The lab in the cgroup v2 guest", needs_tools=("qemu-system-x86_64",)),
    Run("guest_packed", "The lab in the cgroup v2 guest: a child its container paces",
        needs_tools=("qemu-system-x86_64",)),
    # The lab's part needs root and the guest's QEMU; each part says when it is skipped.
    Run("qualify_cost", "Qualification at boot: what it costs a new st1"),
)


def main(argv: list[str]) -> int:
    names = sorted({run.name for run in RUNS})
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if argv == ["--render"]:
        return render()
    listing = argv[:1] == ["--list"]
    chosen = argv[1:] if listing else argv
    unknown = [name for name in chosen if name not in names]
    if unknown:
        print(f"error: no benchmark named {', '.join(unknown)}: choose from {', '.join(names)}", file=sys.stderr)
        return 64
    runs = [run for run in RUNS if not chosen or run.name in chosen]
    if listing:
        for run in runs:
            print(f"{run.shown()}\n    -> BENCHMARKS.md: {run.section}")
        return 0
    failed, skipped = [], []
    for number, run in enumerate(runs, 1):
        print(f"\n=== [{number}/{len(runs)}] {run.shown()}\n    -> BENCHMARKS.md: {run.section}", flush=True)
        reason = run.skip_reason()
        if reason:
            print(f"skipped: {reason}", flush=True)
            skipped.append(run.name)
            continue
        began = time.monotonic()
        code, output = _tee(run.command(), {**os.environ, **run.env})
        seconds = time.monotonic() - began
        print(f"--- {run.name}: exit {code} after {seconds:.0f} s", flush=True)
        results.record(run.name, run.section, run.shown(), code, seconds, output)
        if code != 0:
            failed.append(run.shown())
    print(f"\n{len(runs) - len(failed) - len(skipped)} benchmarks ran, {len(skipped)} skipped, {len(failed)} failed")
    render()
    for shown in failed:
        print(f"error: failed: {shown}", file=sys.stderr)
    return 1 if failed else 0


def _tee(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run `command`, its output shown as it comes and kept: (exit code, output)."""
    kept: list[str] = []
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            kept.append(line)
    return proc.returncode, "".join(kept)


def render() -> int:
    """BENCHMARKS.md's generated part from bench/results/, in RUNS's order of sections."""
    sections = list(dict.fromkeys(run.section for run in RUNS))
    page = results.rendered_page(results.PAGE.read_text(encoding="utf-8"), results.render(results.load(), sections))
    results.PAGE.write_text(page, encoding="utf-8")
    print(f"rendered {results.PAGE.name} from {len(results.load())} results in bench/results/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
