"""cdk.json's app runs the project's own Python whatever is on PATH (infra/app.sh), and says in one line what to do
when the project has no Python environment yet."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BARE_PATH = "/usr/bin:/bin"


def test_cdk_json_runs_the_launcher_with_sh() -> None:
    assert json.loads((ROOT / "cdk.json").read_text())["app"] == "sh infra/app.sh"


def test_without_a_virtualenv_the_launcher_says_how_to_set_up_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "infra").mkdir()
    shutil.copy(ROOT / "infra" / "app.sh", tmp_path / "infra" / "app.sh")
    done = subprocess.run(["sh", "infra/app.sh"], cwd=tmp_path, env={"PATH": BARE_PATH}, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 64
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert "make setup-deploy" in lines[0] and str(tmp_path / ".venv") in lines[0]


def test_the_launcher_runs_the_projects_python_with_no_virtualenv_on_path(tmp_path: Path) -> None:
    """The project's .venv runs the app even where PATH has no python at all: a stand-in interpreter records how it
    was called."""
    (tmp_path / "infra").mkdir()
    shutil.copy(ROOT / "infra" / "app.sh", tmp_path / "infra" / "app.sh")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    fake = tmp_path / ".venv" / "bin" / "python"
    fake.write_text('#!/bin/sh\necho "$0 $*"\n')
    fake.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(["sh", str(tmp_path / "infra" / "app.sh")], cwd=elsewhere,
                          env={"PATH": BARE_PATH, "HOME": os.environ.get("HOME", "/")}, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{fake} -m infra.app"
