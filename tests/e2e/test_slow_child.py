"""`--slow-child`: one child's S3 traffic goes through the throttling proxy, and the bad-apple test the
report uses picks out that child, and only it, from real profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.local.dataset import DatasetSpec
from pipeline.local.runner import LocalRun, run_local
from pipeline.local.s3server import EmbeddedS3
from pipeline.settings import S3Uri
from profiling import runfiles
from profiling.outliers import find_outliers
from tests.support.data import upload_dir


def test_slow_child_is_the_one_bad_apple(
    s3_server: EmbeddedS3, s3: Any, bucket: str, small_dataset: tuple[DatasetSpec, Path], tmp_path: Path
) -> None:
    _, source = small_dataset
    upload_dir(s3, bucket, "images/", source)
    run = LocalRun(input=S3Uri(bucket, "images/"), output=S3Uri(bucket, "slow/"), endpoint=s3_server.endpoint,
                   run_dir=tmp_path / "run", images_per_child=2, workers=2, env=s3_server.env(),
                   train_size=(64, 48), slow_child=2, slow_child_bps=256 * 1024)
    result = run_local(run, progress=False, say=lambda _: None)
    assert result.failed == []
    downloads = {p.properties["ArrayIndex"]: p for p in runfiles.read_profiles(tmp_path / "run")
                 if p.stage == "download"}
    throughput = {child: p.throughput_bps or 0.0 for child, p in downloads.items()}
    # ~1 MiB through a 256 KiB/s proxy vs loopback speed for the others: slow by far more than the
    # bad-apple rule's margin (half the median), even when a busy machine slows the others too.
    assert throughput["2"] < min(v for k, v in throughput.items() if k != "2") / 3
    flagged = find_outliers(throughput, low_only=True)
    assert [o.key for o in flagged] == ["2"], throughput
