"""The CDK CLI synthesizes from the project folder as a user runs it: the pinned CLI from node_modules, no
virtualenv on PATH (cdk.json's app finds the project's Python itself: infra/app.sh)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CDK = ROOT / "node_modules" / ".bin" / "cdk"


def _path_without_virtualenvs() -> str:
    """PATH with every virtualenv's bin (this project's .venv above all) left out, node's folder kept."""
    node = shutil.which("node")
    assert node is not None
    keep = [Path(node).parent.as_posix()]
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if entry and not (Path(entry) / "activate").exists() and entry not in keep:
            keep.append(entry)
    return os.pathsep.join(keep)


@pytest.mark.skipif(not CDK.exists(), reason="the pinned CDK CLI is not installed (make setup-deploy)")
def test_cdk_synth_runs_from_the_project_folder_with_no_virtualenv_on_path(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items()
           if key not in ("VIRTUAL_ENV", "CDK_VALIDATION") and not key.startswith("PYTEST")}
    env["PATH"] = _path_without_virtualenvs()
    env.update(CDK_DISABLE_VERSION_CHECK="1", CDK_DISABLE_CLI_TELEMETRY="1")
    python_on_path = subprocess.run(["sh", "-c", "command -v python || true"], env=env, capture_output=True,
                                    text=True, check=True).stdout.strip()
    assert ".venv" not in python_on_path
    done = subprocess.run([str(CDK), "synth", "--quiet", "--output", str(tmp_path / "cdk.out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    template = json.loads((tmp_path / "cdk.out" / "iobatch.template.json").read_text())
    assert any(r["Type"] == "AWS::Batch::JobDefinition" for r in template["Resources"].values())
