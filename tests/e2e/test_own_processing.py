"""The process stage runs a command: the built-in resizer by default, byte for byte as before; the example
script of examples/ through `iobatch demo`; and every way a command can be wrong, each one line and its code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline import s3 as s3io
from pipeline.imaging import INDEX_NAME, SHARD_NAME
from pipeline.local.dataset import DatasetSpec
from pipeline.local.runner import LocalRun, run_local
from pipeline.local.s3server import EmbeddedS3
from pipeline.settings import S3Uri
from profiling import runfiles
from tests.support.data import ROOT, upload_dir
from tests.support.faults import TRAIN_SIZE, body, objects, reference_outputs

EXAMPLE = f"python {ROOT / 'examples' / 'image_stats.py'} {{input}} {{output}}"


@pytest.fixture
def images(s3: Any, bucket: str, small_dataset: tuple[DatasetSpec, Path]) -> list[str]:
    return upload_dir(s3, bucket, "images/", small_dataset[1])


def _run(server: EmbeddedS3, bucket: str, run_dir: Path, per_child: int = 4, **kw: Any) -> Any:
    run = LocalRun(input=S3Uri(bucket, "images/"), output=S3Uri(bucket, "out/"), endpoint=server.endpoint,
                   run_dir=run_dir, images_per_child=per_child, workers=2, env=server.env(), train_size=TRAIN_SIZE,
                   **kw)
    return run_local(run, progress=False, say=lambda _: None)


def _marker(s3: Any, bucket: str, child: int) -> dict[str, Any]:
    return dict(json.loads(body(s3, bucket, f"out/part-{child:05d}/{s3io.SUCCESS_MARKER}")))


def test_the_default_resizer_writes_todays_shards_and_lists_them(
        s3_server: EmbeddedS3, s3: Any, bucket: str, images: list[str],
        small_dataset: tuple[DatasetSpec, Path], tmp_path: Path) -> None:
    result = _run(s3_server, bucket, tmp_path / "run")
    assert result.failed == [] and result.succeeded == 2
    for child in range(2):
        expected = reference_outputs(small_dataset[1], images, child, 4, tmp_path)
        prefix = f"out/part-{child:05d}/"
        for name, data in expected.items():
            assert body(s3, bucket, prefix + name) == data
        listed = {o["key"]: o for o in _marker(s3, bucket, child)["objects"]}
        assert sorted(listed) == [INDEX_NAME, SHARD_NAME]
        for name, data in expected.items():
            stored = s3.head_object(Bucket=bucket, Key=prefix + name, ChecksumMode="ENABLED")
            assert listed[name]["size"] == len(data) == stored["ContentLength"]
            assert listed[name]["crc32c"] == stored["ChecksumCRC32C"]


def test_the_example_script_through_demo(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "demo", "--images", "4", "--image-mib", "0.2", "--images-per-child",
         "2", "--workers", "2", "--no-report", "--no-progress", "--run-dir", str(run_dir), "--process-command",
         EXAMPLE], cwd=ROOT, env={**os.environ, "IOBATCH_CACHE": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout
    assert "process/stats" in table and "process/write" in table
    outputs = run_dir / "s3" / "iobatch-output" / "train"
    profiles = list(runfiles.read_profiles(run_dir))
    for child in range(2):
        folder = outputs / f"part-{child:05d}"
        assert sorted(p.name for p in folder.iterdir()) == [s3io.SUCCESS_MARKER, "stats.npy"]
        stats = folder / "stats.npy"
        marker = json.loads((folder / s3io.SUCCESS_MARKER).read_text())
        assert [(o["key"], o["size"]) for o in marker["objects"]] == [("stats.npy", stats.stat().st_size)]
        assert marker["images"] == 2
        of_child = {p.stage: p for p in profiles if p.properties.get("ArrayIndex") == str(child)}
        assert {"download", "process", "process/stats", "process/write", "upload"} <= set(of_child)
        # The sub-stage's write bytes are exactly the file's: the kernel's count of the command's writes.
        assert of_child["process/write"].write_bytes == stats.stat().st_size
        assert of_child["process"].write_bytes >= stats.stat().st_size
        assert of_child["process/stats"].items == 2


def _case(tmp_path: Path, text: str, mode: int = 0o755) -> str:
    """A shell script as the command, so each case is one readable line."""
    path = tmp_path / "cmd.sh"
    path.write_text("#!/bin/sh\n" + text + "\n")
    path.chmod(mode)
    return f"{path} {{input}} {{output}}"


BAD_COMMANDS = [
    ("missing", lambda t: "no-such-program-iobatch {input} {output}", 64, "is not on PATH"),
    ("not executable", lambda t: _case(t, "exit 0", mode=0o644), 64, "is not executable"),
    ("bad input", lambda t: _case(t, 'echo "error: frame 7 is empty: drop it" >&2; exit 65'), 65,
     "exited 65, bad input, not retried: frame 7 is empty: drop it"),
    ("transient", lambda t: _case(t, 'echo "error: license server busy" >&2; exit 75'), 75,
     "exited 75, a transient fault: the child is retried: license server busy"),
    ("bug", lambda t: _case(t, 'echo "Traceback: boom" >&2; exit 3'), 1, "exited 3, a bug in the command"),
    ("nothing written", lambda t: _case(t, "exit 0"), 65, "wrote nothing to its output directory"),
    ("symlink", lambda t: _case(t, 'echo x > "$2/ok.txt"; ln -s /etc/hostname "$2/leak"'), 65,
     "left a symbolic link in its output, leak -> /etc/hostname"),
    ("marker name", lambda t: _case(t, 'echo x > "$2/_SUCCESS"'), 65, "wrote _SUCCESS"),
]


@pytest.mark.parametrize(("text", "code", "line"), [c[1:] for c in BAD_COMMANDS], ids=[c[0] for c in BAD_COMMANDS])
def test_a_bad_command_is_one_line_with_its_code_and_uploads_nothing(
        s3_server: EmbeddedS3, s3: Any, bucket: str, images: list[str], tmp_path: Path,
        text: Any, code: int, line: str) -> None:
    command = text(tmp_path)
    result = _run(s3_server, bucket, tmp_path / "run", per_child=8, process_command=command)
    [(index, exit_code, headline)] = result.failed
    assert (index, exit_code) == (0, code)
    assert line in headline and "\n" not in headline
    assert "part-00000" in headline and command[:40] in headline
    assert objects(s3, bucket, "out/part-") == {}


def test_a_command_killed_midway_leaves_no_marker_and_its_rerun_completes(
        s3_server: EmbeddedS3, s3: Any, bucket: str, images: list[str], tmp_path: Path) -> None:
    flag = tmp_path / "killed-once"
    command = _case(tmp_path, f'echo partial > "$2/part.bin"\nif [ ! -e {flag} ]; then touch {flag}; kill -9 $$; fi\n'
                              'echo whole > "$2/part.bin"')
    first = _run(s3_server, bucket, tmp_path / "one", per_child=8, process_command=command)
    [(_, code, headline)] = first.failed
    assert code == 1 and "was killed by signal 9" in headline
    assert objects(s3, bucket, "out/part-") == {}
    second = _run(s3_server, bucket, tmp_path / "two", per_child=8, process_command=command)
    assert second.failed == [] and second.succeeded == 1
    assert body(s3, bucket, "out/part-00000/part.bin") == b"whole\n"
    assert [o["key"] for o in _marker(s3, bucket, 0)["objects"]] == ["part.bin"]


def test_a_command_that_fills_scratch_fails_as_full_scratch(
        s3_server: EmbeddedS3, s3: Any, bucket: str, images: list[str], tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs as scratch")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(scratch)], check=True)
    try:
        command = _case(tmp_path, 'dd if=/dev/zero of="$2/big" bs=1M count=64 2>&1')
        result = _run(s3_server, bucket, tmp_path / "run", per_child=8, process_command=command,
                      scratch_root=scratch)
    finally:
        subprocess.run(["umount", str(scratch)], check=True)
    [(_, code, headline)] = result.failed
    assert code == 65 and "is full while running the process command" in headline, headline
    assert objects(s3, bucket, "out/part-") == {}
