"""`iobatch submit --local`: the whole batch through the local executor, on the real S3 server.

Submitting the same batch twice processes nothing twice (every child finds its _SUCCESS marker);
--force processes it again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pipeline.cli import app
from pipeline.local.dataset import DatasetSpec
from pipeline.local.s3server import EmbeddedS3
from pipeline.local.submit import submit_local
from tests.support.cli import CliRunner
from tests.support.data import upload_dir


def _submit(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["submit", *args, "--local", "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout.splitlines()[-1]))


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for item in listing.get("Contents", []))


def test_submit_local_twice_processes_nothing_twice(
    s3_server: EmbeddedS3, s3: Any, bucket: str, small_dataset: tuple[DatasetSpec, Path], tmp_path: Path
) -> None:
    spec, images = small_dataset
    upload_dir(s3, bucket, "images/", images)
    args = ["--prefix", f"s3://{bucket}/images/", "-k", "4", "--s3-endpoint", s3_server.endpoint,
            "--output", f"s3://{bucket}/out/", "--run-dir", str(tmp_path / "run"), "--workers", "2"]

    first = _submit(args)
    assert (first["children"], first["images"]) == (2, spec.images)
    assert first["local"]["failed"] == [] and (first["local"]["succeeded"], first["local"]["skipped"]) == (2, 0)
    markers = [k for k in _keys(s3, bucket, "out/") if k.endswith("/_SUCCESS")]
    assert markers == [f"out/part-{i:05d}/_SUCCESS" for i in range(2)]
    assert first["manifest"] == f"s3://{bucket}/out/_batch/manifest.jsonl"

    again = _submit(args)
    assert (again["local"]["succeeded"], again["local"]["skipped"], again["images"]) == (0, 2, spec.images)

    forced = _submit([*args, "--force"])
    assert (forced["local"]["succeeded"], forced["local"]["skipped"]) == (2, 0)


def test_submit_local_uses_the_embedded_server_by_default(
    small_dataset: tuple[DatasetSpec, Path], tmp_path: Path
) -> None:
    _, images = small_dataset
    data = tmp_path / "s3"
    (data / "camera-bucket").mkdir(parents=True)
    # The embedded server's POSIX backend: a bucket is a folder, an object a file.
    shutil.copytree(images, data / "camera-bucket" / "images")
    submitted, outcome = submit_local(
        manifest=None, prefix="s3://camera-bucket/images/", images_per_child=8, run_dir=tmp_path / "run",
        s3_data_dir=data, workers=1, progress=False)

    assert (submitted.children, outcome.succeeded, outcome.failed) == (1, 1, [])
    assert (data / "camera-bucket" / "iobatch-output" / "images-k8" / "part-00000" / "_SUCCESS").is_file()


def test_submit_local_bad_manifest_runs_nothing(s3_server: EmbeddedS3, s3: Any, bucket: str, tmp_path: Path) -> None:
    s3.put_object(Bucket=bucket, Key="m.jsonl", Body=b'{"key": "a.png"}\n{"key": \n')
    result = CliRunner().invoke(app, ["submit", "--manifest", f"s3://{bucket}/m.jsonl", "-k", "1", "--local",
                                      "--s3-endpoint", s3_server.endpoint, "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 65
    assert result.stderr == (f"error: s3://{bucket}/m.jsonl line 2 is not JSON: write one object a line, "
                             "e.g. {\"key\": \"images/a.png\"}\n")
    assert _keys(s3, bucket, "iobatch-output/") == [] and not (tmp_path / "run" / "logs").exists()


def test_submit_local_dry_run_writes_nothing(s3_server: EmbeddedS3, s3: Any, bucket: str, tmp_path: Path) -> None:
    for i in range(5):
        s3.put_object(Bucket=bucket, Key=f"images/{i}.png", Body=b"x")
    body = _submit(["--prefix", f"s3://{bucket}/images/", "-k", "2", "--s3-endpoint", s3_server.endpoint,
                    "--run-dir", str(tmp_path / "run"), "--dry-run"])
    assert (body["children"], body["images"], body["dryRun"]) == (3, 5, True)
    assert _keys(s3, bucket, "iobatch-output/") == [] and not (tmp_path / "run").exists()
