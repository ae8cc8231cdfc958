"""Where a local run keeps its files, and how to read them back. Used by the executor, report and advise.

    <run>/run.json                 what was run: settings, children, start and end
    <run>/profiles/part-NNNNN.jsonl one profile JSON object per stage ("schema": 1)
    <run>/emf/part-NNNNN.emf        the EMF documents the sidecar emitted, one per line
    <run>/logs/part-NNNNN.log       the child's stdout and stderr
    <run>/report.html               `iobatch report`
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from profiling.metrics import StageProfile

RUN_FILE = "run.json"
PROFILES = "profiles"
EMF = "emf"
LOGS = "logs"
REPORT = "report.html"


def profile_path(run_dir: Path, child: str) -> Path:
    return run_dir / PROFILES / f"{child}.jsonl"


def emf_path(run_dir: Path, child: str) -> Path:
    return run_dir / EMF / f"{child}.emf"


def log_path(run_dir: Path, child: str) -> Path:
    return run_dir / LOGS / f"{child}.log"


def read_profiles(path: Path) -> Iterator[StageProfile]:
    """Profiles from a .jsonl file, or from every .jsonl file under a run directory."""
    files = sorted((path / PROFILES).glob("*.jsonl")) if path.is_dir() else [path]
    for file in files:
        with file.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    yield StageProfile.from_dict(json.loads(line))
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"{file}:{number}: not a profile ({exc})") from None


def read_run(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8")))
