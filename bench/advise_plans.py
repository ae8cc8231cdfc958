"""The advisor on plans it did not run on: one run's profiles advised for several instance types and job sizes.

    python -m bench.advise_plans RUN_DIR    (bench.lab_advise runs it on its held-out runs' default profiles)

Per plan (instance type x the stack's vcpusPerJob), through `iobatch advise RUN_DIR --json` as a user runs it:
children per host and each child's memory limit (tuning/instances.py), a child's own dirty limit under the stack's
settings now and under the advised cache, the host's share per child, which domain is the tighter
(tuning/cachedomain.py, the kernel's formula), and what DIRTY_PAUSE says and which knob it names. The run's children
were paused on its own host; whether they would be on each plan's hosts is what the table shows: the knob follows
the domain, and a plan whose children have room for their burst names none.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tuning.cachedomain import domains
from tuning.ebs import GIB
from tuning.host import HostTuning

PLANS = tuple((t, v) for t in ("m6i.large", "c6i.2xlarge", "m6i.2xlarge", "r6i.2xlarge", "m6i.32xlarge")
              for v in (1, 2, 4))


def knob(finding: dict[str, Any] | None) -> str:
    """What DIRTY_PAUSE's fix turns, in a few words ('-' without the finding)."""
    if finding is None:
        return "- (no pause)"
    fix = str(finding["fix"])
    if fix.startswith("none needed"):
        return "none (room on these hosts)"
    if "vcpusPerJob" in fix:
        return "job memory, or host vm.dirty_bytes with bdi max_bytes"
    return "host vm.dirty_bytes"


def advise_row(run: Path, instance_type: str, vcpus: int) -> str:
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "advise", str(run), "--instance-type", instance_type,
                           "--vcpus-per-job", str(vcpus), "--json"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        line = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"| {instance_type} | {vcpus} | refused: {line.removeprefix('error: ')[:110]} |||||||"
    advice = json.loads(done.stdout)
    plan = advice["plan"]
    children, job_gib, memory = plan["jobs_per_instance"], plan["job_memory_gib"], plan["memory_gib"]
    job = None if job_gib is None else int(job_gib * GIB)
    advised = HostTuning.from_context(advice["cdk_context"])  # the sysctls the advice deploys
    now = domains(HostTuning(), int(memory * GIB), job, children)  # the stack's settings now: dirtyRatio 30/20
    then = domains(advised, int(memory * GIB), job, children)
    own_now = "-" if now.container is None else f"{now.container.limit_bytes / GIB:.2f}"
    own_then = "-" if then.container is None else f"{then.container.limit_bytes / GIB:.2f}"
    pause = next((f for f in advice["findings"] if f["code"] == "DIRTY_PAUSE"), None)
    said = "-" if pause is None else f"{pause['severity']}: {pause['title'].split(' (')[0]}"
    return (f"| {instance_type} | {vcpus} | {children} | {job_gib if job_gib is not None else '-'} | {own_now} | "
            f"{now.host.limit_bytes / children / GIB:.2f} | {now.tighter} | {own_then} | {said} | {knob(pause)} |")


def table(run: Path) -> list[str]:
    burst = _burst_gib(run)
    lines = [f"Profiles: {run.parent.name}/{run.name} (a child's download burst {burst:.2f} GiB; each plan at the "
             "stack's settings now, "
             "dirtyRatio 30 / dirtyBackgroundRatio 20)", "",
             "| instance | vCPUs per job | children | job GiB | own limit now GiB | host's per child GiB | tighter | "
             "own limit advised GiB | DIRTY_PAUSE | knob |",
             "|---|---:|---:|---:|---:|---:|---|---:|---|---|"]
    lines += [advise_row(run, t, v) for t, v in PLANS]
    return lines


def _burst_gib(run: Path) -> float:
    """The median child's bytes to scratch in its download, as the advisor reads them (tuning.plan)."""
    from profiling import runfiles
    from tuning.plan import workload_from_profiles

    download = workload_from_profiles(list(runfiles.read_profiles(run))).stage("download")
    return 0.0 if download is None else download.write_bytes / GIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a run directory whose profiles to advise")
    args = parser.parse_args()
    print("\n".join(table(args.run_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
