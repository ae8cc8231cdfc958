"""`iobatch profile` in an 80-column terminal: per-call latency without being asked (a contract is not needed
to start the probe), or one notice that it is off; the table fits the terminal without cutting a number."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_profile_starts_a_call_probe_without_a_contract_and_fits_80_columns(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "profile", "--json", str(out), "--",
         "dd", "if=/dev/zero", f"of={tmp_path / 'f'}", "bs=4k", "count=2000"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"}, capture_output=True,
        text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    profile = json.loads(out.read_text(encoding="utf-8"))
    if profile["calls"] is None:  # neither eBPF nor the interposer could run here: said once
        assert sum("no per-call latency" in line for line in done.stderr.splitlines()) == 1, done.stderr
    else:
        assert profile["calls"]["probe"] in ("ebpf", "interpose")
        assert profile["write_call_latency_us"] is not None and profile["calls"]["calls"]["write"]["count"] >= 2000
    table = [line for line in done.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 80, done.stdout
    assert "…" not in done.stdout and "7.81" in done.stdout  # 8,192,000 B written, in MiB
