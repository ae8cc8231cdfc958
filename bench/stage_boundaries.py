"""What each stage boundary of a local run cost the job: the time it waited for the sidecar's ack.

The job logs `stage_start` just before it announces a stage and `stage_end` just after the sidecar
acknowledged the end; the sidecar's profile records when its sampler started (`started_at`, after
the probes started) and the stage's duration (to the closing snapshot, before the probes stop). So

    start cost = started_at - stage_start log time
    end cost   = stage_end log time - (started_at + duration_s)

both bounded by the job's log resolution (1 ms). The first stage of a child is shown apart: it is
where a per-call probe attaches (the eBPF program loads).

    python -m bench.stage_boundaries            runs the demo below into a temporary directory first
    python -m bench.stage_boundaries RUN        a finished run, e.g. of
    python -m pipeline.cli demo --images 8 --image-mib 4 --images-per-child 2 --run-dir RUN --no-report
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from profiling import runfiles

# A later stage's start and any end: a reading of the profiler's own maps. The first start attaches the probe
# (programs already loaded on the host: <= 100 ms, bench/probe_sharing.py; the host's first profiler loads them).
TARGETS_MS = {"later start": 20, "end": 20}


def _events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(encoding="utf-8").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def boundary_costs(run_dir: Path) -> dict[str, list[float]]:
    """Seconds per boundary: "first start", "later start", "end" (all children of the run)."""
    costs: dict[str, list[float]] = {"first start": [], "later start": [], "end": []}
    for log in sorted((run_dir / "logs").glob("*.log")):
        profile = runfiles.profile_path(run_dir, log.stem)
        if not profile.exists():
            continue
        stages = [json.loads(line) for line in profile.read_text(encoding="utf-8").splitlines() if line.strip()]
        events = _events(log)
        for index, stage in enumerate(stages):
            name = stage["stage"]
            began = [e["time"] for e in events if e.get("event") == "stage_start" and e.get("stage") == name]
            ended = [e["time"] for e in events if e.get("event") == "stage_end" and e.get("stage") == name]
            if began:
                costs["first start" if index == 0 else "later start"].append(stage["started_at"] - began[0])
            if ended:
                costs["end"].append(ended[0] - (stage["started_at"] + stage["duration_s"]))
    return costs


DEMO_ARGS = ("--images", "8", "--image-mib", "4", "--images-per-child", "2", "--no-report")


def run_demo(run_dir: Path) -> None:
    """The demo this benchmark reads: 4 children x 3 stages, with the sidecar (eBPF as root)."""
    print(f"running: python -m pipeline.cli demo {' '.join(DEMO_ARGS)} --run-dir {run_dir}", flush=True)
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "demo", *DEMO_ARGS, "--run-dir", str(run_dir)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"error: the demo failed with exit {done.returncode}:\n{done.stderr[-2000:]}", file=sys.stderr)
        raise SystemExit(done.returncode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, nargs="?", help="a local run directory (logs/ and profiles/); "
                        "without it, the demo runs first into a temporary one")
    args = parser.parse_args()
    if args.run_dir is None:
        with tempfile.TemporaryDirectory(prefix="iobatch-bench-") as tmp:
            run_demo(Path(tmp) / "run")
            report(Path(tmp) / "run")
        return
    report(args.run_dir)


def report(run_dir: Path) -> None:
    """Print the boundary-cost table of one finished run."""
    if not (run_dir / "logs").is_dir() or not (run_dir / "profiles").is_dir():
        print(f"error: {run_dir} is not a run directory (no logs/ and profiles/): give the --run-dir of a "
              "finished demo or run", file=sys.stderr)
        raise SystemExit(64)
    costs = boundary_costs(run_dir)
    if not any(costs.values()):
        print(f"error: {run_dir} has no profiled stages: run it with the sidecar on", file=sys.stderr)
        raise SystemExit(65)
    print("| boundary | job's wait, ms: median | min | max | n | target |\n|---|---|---|---|---|---|")
    for label, values in costs.items():
        if values:
            ms = [v * 1000 for v in values]
            target = TARGETS_MS.get(label, "")
            print(f"| {label} | {statistics.median(ms):.0f} | {min(ms):.0f} | {max(ms):.0f} | {len(ms)} | "
                  f"{target and f'<= {target} ms'} |")


if __name__ == "__main__":
    main()
