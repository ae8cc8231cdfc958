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
