"""The whole pipeline through the local executor, with the real S3 server, s5cmd and the sidecar."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.local.dataset import DatasetSpec
from pipeline.local.proxy import ThrottledProxy
from pipeline.local.runner import LocalRun, run_local
from pipeline.local.s3server import EmbeddedS3
from pipeline.settings import ENV, PROFILER_OFF, S3Uri
from profiling import runfiles
from tests.support.data import upload_dir


def objects(s3: Any, bucket: str, prefix: str) -> dict[str, tuple[str, Any]]:
    """key -> (ETag, LastModified) for every object under prefix."""
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            out[item["Key"]] = (item["ETag"], item["LastModified"])
    return out


@pytest.fixture
def batch(s3_server: EmbeddedS3, s3: Any, bucket: str, small_dataset: tuple[DatasetSpec, Path]) -> dict[str, Any]:
    _, source = small_dataset
    keys = upload_dir(s3, bucket, "images/", source)
    sizes = {k: s3.head_object(Bucket=bucket, Key=k)["ContentLength"] for k in keys}
    return {"bucket": bucket, "keys": keys, "sizes": sizes}


def _run(s3_server: EmbeddedS3, bucket: str, run_dir: Path, **kw: Any) -> Any:
    run = LocalRun(input=S3Uri(bucket, "images/"), output=S3Uri(bucket, "train/"), endpoint=s3_server.endpoint,
                   run_dir=run_dir, images_per_child=2, workers=2, env=s3_server.env(),
                   train_size=(64, 48), **kw)
    return run_local(run, progress=False, say=lambda _: None)


def test_batch_outputs_profiles_rerun_and_determinism(
    s3_server: EmbeddedS3, s3: Any, batch: dict[str, Any], tmp_path: Path
) -> None:
    bucket = batch["bucket"]
    first = _run(s3_server, bucket, tmp_path / "one")
    assert first.failed == [] and first.succeeded == 4
    after_first = objects(s3, bucket, "train/part-")
    expected = {f"train/part-{c:05d}/{name}" for c in range(4) for name in ("shard.tar", "index.json", "_SUCCESS")}
    assert set(after_first) == expected

    marker = json.loads(s3.get_object(Bucket=bucket, Key="train/part-00003/_SUCCESS")["Body"].read())
    assert marker["images"] == 2
    index = json.loads(s3.get_object(Bucket=bucket, Key="train/part-00000/index.json")["Body"].read())
    assert [s["key"] for s in index["samples"]] == sorted(batch["keys"])[:2]

    # Every child was profiled: three stages each, with the bytes the kernel saw.
    profiles = list(runfiles.read_profiles(tmp_path / "one"))
    assert sorted((p.properties.get("ArrayIndex"), p.stage) for p in profiles) == sorted(
        (str(c), s) for c in range(4) for s in ("download", "process", "upload"))
    assert all(p.outcome == "ok" for p in profiles)
    for child in range(4):
        of_child = {p.stage: p for p in profiles if p.properties.get("ArrayIndex") == str(child)}
        image_bytes = sum(batch["sizes"][k] for k in sorted(batch["keys"])[2 * child:2 * child + 2])
        # s5cmd writes the objects, plus its JSON lines to a pipe and the run file we wrote: stated slack 64 KiB.
        assert image_bytes <= of_child["download"].write_bytes <= image_bytes + 64 * 1024
        assert of_child["process"].read_bytes >= image_bytes
        assert of_child["download"].items == 2
    assert all(runfiles.emf_path(tmp_path / "one", f"part-{c:05d}").stat().st_size > 0 for c in range(4))

    # A rerun is a no-op: every child skipped, no object rewritten.
    second = _run(s3_server, bucket, tmp_path / "two")
    assert second.skipped == 4 and second.succeeded == 0 and second.failed == []
    assert objects(s3, bucket, "train/part-") == after_first

    # Forced, the outputs come out byte for byte the same.
    third = _run(s3_server, bucket, tmp_path / "three", force=True)
    assert third.succeeded == 4
    after_third = objects(s3, bucket, "train/part-")
    assert {k: v[0] for k, v in after_third.items() if not k.endswith("_SUCCESS")} == {
        k: v[0] for k, v in after_first.items() if not k.endswith("_SUCCESS")}


def test_child_killed_mid_download_is_redone_without_duplicates(
    s3_server: EmbeddedS3, s3: Any, batch: dict[str, Any], tmp_path: Path
) -> None:
    bucket = batch["bucket"]
    # Freeze the batch and learn the child's environment through a normal run of another output prefix.
    run = LocalRun(input=S3Uri(bucket, "images/"), output=S3Uri(bucket, "killed/"), endpoint=s3_server.endpoint,
                   run_dir=tmp_path / "frozen", images_per_child=2, workers=1, env=s3_server.env(),
                   train_size=(64, 48))
    from pipeline import s3 as s3io

    frozen = s3io.freeze_batch(s3, input=run.input, manifest=None, output=run.output, per_child=2)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, **s3_server.env(), ENV.INPUT: str(run.input), ENV.OUTPUT: str(run.output),
           ENV.MANIFEST: str(frozen.manifest), ENV.IMAGES_PER_CHILD: "2", ENV.ARRAY_INDEX: "1",
           ENV.SCRATCH: str(scratch), ENV.TRAIN_SIZE: "64x48",
           ENV.PROFILER_SOCKET: PROFILER_OFF}  # no profiler runs beside it: the job would wait 5 s for one
    with ThrottledProxy(s3_server.port, 128 * 1024) as slow:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "job"],
                                env={**env, ENV.S3_ENDPOINT: slow.endpoint, ENV.TASK_ID: "attempt-1"},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"event": "start"' in line:
                break
        # Wait until s5cmd is part-way through: bytes on scratch, the download not finished.
        incoming = scratch / "task-attempt-1" / "input"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(p.stat().st_size for p in incoming.rglob("*") if p.is_file()):
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert objects(s3, bucket, "killed/part-00001/") == {}

    # The retry is a new attempt (a new task id): it sweeps the killed attempt's directory.
    rerun = subprocess.run([sys.executable, "-m", "pipeline.cli", "job"], env={**env, ENV.S3_ENDPOINT:
                           s3_server.endpoint, ENV.TASK_ID: "attempt-2"}, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert set(objects(s3, bucket, "killed/part-00001/")) == {
        "killed/part-00001/shard.tar", "killed/part-00001/index.json", "killed/part-00001/_SUCCESS"}
    # Scratch was cleaned after success, and of the killed attempt's files.
    assert '"attempts": ["task-attempt-1"]' in rerun.stdout
    assert list(scratch.iterdir()) == []


def test_bad_image_fails_its_child_only(
    s3_server: EmbeddedS3, s3: Any, batch: dict[str, Any], tmp_path: Path
) -> None:
    bucket = batch["bucket"]
    bad_key = sorted(batch["keys"])[5]  # child 2
    s3.put_object(Bucket=bucket, Key=bad_key, Body=b"\x89PNG\r\n\x1a\n truncated")
    result = _run(s3_server, bucket, tmp_path / "bad")
    assert [(i, code) for i, code, _ in result.failed] == [(2, 65)]
    assert f"image {bad_key} does not decode" in result.failed[0][2]
    assert result.succeeded == 3
    assert "train/part-00002/_SUCCESS" not in objects(s3, bucket, "train/part-00002/")
    lenient = _run(s3_server, bucket, tmp_path / "lenient", skip_bad_images=True)
    assert lenient.failed == []
    index = json.loads(s3.get_object(Bucket=bucket, Key="train/part-00002/index.json")["Body"].read())
    assert [s["key"] for s in index["skipped"]] == [bad_key]
