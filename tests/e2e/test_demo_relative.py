"""`make demo` runs `iobatch demo` with its default run directory, a relative path: every path the job hands its
process command (input, output, the images file, the sub-stage socket) must mean the same in the child's own
directory, where the command runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_runs_in_a_relative_run_directory(tmp_path: Path) -> None:
    # The example command announces sub-stages over the profiler's socket; under pytest's deep temporary
    # directory that socket's absolute path is longer than a Unix socket path may be.
    command = f"{sys.executable} {REPO / 'examples' / 'image_stats.py'} {{input}} {{output}}"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "demo", "--images", "4", "--image-mib", "0.2",
         "--images-per-child", "2", "--run-dir", "relative/demo", "--no-report", "--process-command", command],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 children done, 0 skipped (already complete), 0 failed" in done.stdout
    profiles = tmp_path / "relative" / "demo" / "profiles"
    assert sorted(p.name for p in profiles.iterdir()) == ["part-00000.jsonl", "part-00001.jsonl"], done.stdout
    for path in profiles.iterdir():
        stages = {json.loads(line)["stage"] for line in path.read_text().splitlines()}
        assert stages == {"download", "process", "process/stats", "process/write", "upload"}, path
