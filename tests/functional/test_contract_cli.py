"""Acceptance: `iobatch profile --contract contracts/case-study.contract -- s5cmd ... cp ...`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from profiling.probes import ebpf

REPO = Path(__file__).resolve().parents[2]
CASE_STUDY = REPO / "contracts" / "case-study.contract"
OBJECTS = 12
OBJECT_BYTES = 1 << 20


@pytest.fixture
def download(s3: Any, bucket: str, s3_server: Any, tmp_path: Path) -> list[str]:
    if shutil.which("s5cmd") is None:
        pytest.skip("s5cmd not installed")
    body = os.urandom(OBJECT_BYTES)
    for i in range(OBJECTS):
        s3.put_object(Bucket=bucket, Key=f"in/{i:03d}.bin", Body=body)
    return ["s5cmd", "--endpoint-url", s3_server.endpoint, "cp", f"s3://{bucket}/in/*", f"{tmp_path}/out/"]


def profile(command: list[str], tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "profile", "--contract", str(CASE_STUDY), "--json", str(out), "--",
         *command],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True, text=True,
        check=False, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text())


def test_case_study_from_ebpf_as_root(download: list[str], tmp_path: Path) -> None:
    reason = ebpf.available()
    if reason is not None:
        pytest.skip(reason)
    proc, body = profile(download, tmp_path)
    rows = {r["label"]: r for r in body["contract"]}
    assert set(rows) == {"mean_lat_write", "num_write", "total_write"}
    assert all(r["source"] == "ebpf" for r in rows.values())
    assert rows["mean_lat_write"]["value"] > 0 and rows["mean_lat_write"]["unit"] == "us"
    assert rows["total_write"]["value"] >= OBJECTS * OBJECT_BYTES
    # The same download's write calls from the kernel's own counter (syscw) agree within 1 %.
    assert abs(rows["num_write"]["value"] - body["write_calls"]) <= 0.01 * body["write_calls"]
    assert body["sources"]["calls"] == "ebpf"
    for label in rows:
        assert label in proc.stdout


def test_case_study_without_ebpf_says_latency_is_unavailable(download: list[str], tmp_path: Path) -> None:
    proc, body = profile(download, tmp_path, IOBATCH_NO_EBPF="1")
    rows = {r["label"]: r for r in body["contract"]}
    assert rows["mean_lat_write"]["value"] is None
    assert "latency unavailable (static binary, no eBPF)" in proc.stdout
    assert rows["num_write"] == {**rows["num_write"], "value": body["write_calls"], "source": "procfs"}
    assert rows["total_write"]["value"] == body["write_bytes"] >= OBJECTS * OBJECT_BYTES
    assert "IOBATCH_NO_EBPF" in proc.stderr  # the one-line notice
