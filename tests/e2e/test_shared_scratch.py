"""Two batches at once on one machine, with the same scratch root and the same child indices (as two
batches share a Batch host): both succeed, each child's outputs are byte for byte those of a batch run
alone, and the scratch root is empty afterwards."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pipeline.local.runner import LocalRun, run_local
from pipeline.local.s3server import EmbeddedS3
from pipeline.settings import S3Uri
from tests.support.data import upload_dir


def _run(s3_server: EmbeddedS3, bucket: str, output: str, run_dir: Path, scratch: Path) -> Any:
    run = LocalRun(input=S3Uri(bucket, "images/"), output=S3Uri(bucket, output), endpoint=s3_server.endpoint,
                   run_dir=run_dir, images_per_child=2, workers=2, env=s3_server.env(), train_size=(64, 48),
                   scratch_root=scratch)
    return run_local(run, progress=False, say=lambda _: None)


def _outputs(s3: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    keys = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in p.get("Contents", [])]
    return {k[len(prefix):]: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys
            if k.endswith(("shard.tar", "index.json"))}


def test_two_batches_sharing_a_scratch_root_and_indices_both_match_a_solo_run(
    s3_server: EmbeddedS3, s3: Any, bucket: str, small_dataset: tuple[Any, Path], tmp_path: Path
) -> None:
    _, source = small_dataset
    upload_dir(s3, bucket, "images/", source)
    shared = tmp_path / "scratch"
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda name: _run(s3_server, bucket, f"{name}/", tmp_path / name, shared),
                                 ["a", "b"])
    assert (first.failed, first.succeeded, second.failed, second.succeeded) == ([], 4, [], 4)
    assert list(shared.iterdir()) == [], "an attempt left its scratch directory behind"
    solo = _run(s3_server, bucket, "solo/", tmp_path / "solo", tmp_path / "solo-scratch")
    assert solo.succeeded == 4
    expected = _outputs(s3, bucket, "solo/")
    assert len(expected) == 8
    assert _outputs(s3, bucket, "a/") == expected and _outputs(s3, bucket, "b/") == expected


def test_two_demo_commands_at_once_with_the_same_scratch_root_match_one_run_alone(tmp_path: Path) -> None:
    """What the issue asks in its own words: two `iobatch demo` processes at once (each with its own S3
    server), the same --scratch root and the same child indices; then one alone. Same seed, same shards."""
    import json
    import os
    import subprocess
    import sys

    shared = tmp_path / "scratch"
    env = {**os.environ, "IOBATCH_CACHE": str(tmp_path / "cache")}

    def demo(name: str, scratch: Path) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "demo", "--images", "8", "--image-mib", "0.5",
                                 "--images-per-child", "2", "--workers", "2", "--no-report", "--no-progress",
                                 "--run-dir", str(tmp_path / name), "--scratch", str(scratch)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def shards(name: str) -> dict[str, bytes]:
        found = sorted((tmp_path / name).rglob("part-*/*"))
        return {str(p.relative_to(tmp_path / name)).split("part-", 1)[1]: p.read_bytes() for p in found
                if p.name in ("shard.tar", "index.json")}

    # The dataset is made once, before the race, as a user's first demo would have made it.
    first = demo("warm", tmp_path / "warm-scratch")
    assert first.wait(timeout=300) == 0, first.communicate()[0]
    both = [demo(name, shared) for name in ("a", "b")]
    for proc in both:
        assert proc.wait(timeout=300) == 0, proc.communicate()[0]
    # The two batches did run at the same time (each run file holds its batch's start and end).
    a, b = (json.loads((tmp_path / name / "run.json").read_text()) for name in ("a", "b"))
    assert a["started"] < b["finished"] and b["started"] < a["finished"], (a, b)
    assert list(shared.iterdir()) == [], "an attempt left its scratch directory behind"
    expected = shards("warm")
    assert len(expected) == 8
    assert shards("a") == expected and shards("b") == expected
