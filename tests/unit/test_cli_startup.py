"""`iobatch` starts cheap (issue 43): importing the CLI, and running `iobatch profile`, import none of the modules
of the other commands (AWS's, the report's, the advisor's, the local pipeline's). Each case runs in a fresh
interpreter, since this one has imported them all by now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What `profile` never needs: the report's (profiling.report, plotly, numpy, PIL) and the advisor's (tuning.plan) came
# with `import pipeline.cli` before issue 43; AWS's, the EMF library's and the local pipeline's must not come either.
OTHER_COMMANDS = ("boto3", "botocore", "profiling.report", "plotly", "numpy", "PIL", "pipeline.local",
                  "pipeline.submit", "pipeline.aws", "tuning.plan", "aws_embedded_metrics")

# Prints, as the interpreter exits (after the command's SystemExit), which of OTHER_COMMANDS were imported.
LOADED_AT_EXIT = """
import atexit, json, sys
atexit.register(lambda: print("LOADED " + json.dumps([m for m in json.loads(sys.argv[1]) if m in sys.modules]),
                              file=sys.stderr))
from pipeline.cli import main
main(sys.argv[2:]) if len(sys.argv) > 2 else None
"""


def _loaded(tmp_path: Path, *argv: str) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    # No eBPF probe: a unit test loads nothing into the kernel; the interposer's records go under tmp_path.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "IOBATCH_NO_EBPF": "1", "TMPDIR": str(tmp_path), "PYTHONPATH": path}
    result = subprocess.run([sys.executable, "-c", LOADED_AT_EXIT, json.dumps(OTHER_COMMANDS), *argv], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    line = next((x for x in result.stderr.splitlines() if x.startswith("LOADED ")), None)
    assert line is not None, result.stderr[-600:]
    return json.loads(line.removeprefix("LOADED ")), result


def test_importing_the_cli_imports_no_commands_work(tmp_path: Path) -> None:
    loaded, result = _loaded(tmp_path)
    assert result.returncode == 0, result.stderr[-600:]
    assert loaded == []


def test_profile_imports_only_what_profiling_a_command_needs(tmp_path: Path) -> None:
    loaded, result = _loaded(tmp_path, "profile", "--", "true")
    assert result.returncode == 0, result.stderr[-600:]
    assert "true (ok, exit 0" in result.stdout, result.stdout[-600:]
    assert loaded == []
    assert list(tmp_path.iterdir()) == []  # the interposer's records were removed with their directory


def test_another_command_still_imports_its_own(tmp_path: Path) -> None:
    """The check above can fail: a command that needs the report's modules imports them when it runs."""
    loaded, result = _loaded(tmp_path, "report", str(tmp_path / "none"))
    assert result.returncode != 0
    assert "profiling.report" in loaded
