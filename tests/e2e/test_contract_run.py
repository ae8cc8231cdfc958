"""A batch run with a contract: every child's profiler evaluates the case-study rules per stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.local.dataset import DatasetSpec
from pipeline.local.runner import LocalRun, run_local
from pipeline.local.s3server import EmbeddedS3
from pipeline.settings import S3Uri
from profiling import runfiles
from tests.support.data import ROOT, upload_dir


def test_case_study_contract_is_evaluated_per_stage(
    s3_server: EmbeddedS3, s3: Any, bucket: str, small_dataset: tuple[DatasetSpec, Path], tmp_path: Path
) -> None:
    _, source = small_dataset
    upload_dir(s3, bucket, "images/", source)
    run = LocalRun(input=S3Uri(bucket, "images/"), output=S3Uri(bucket, "c/"), endpoint=s3_server.endpoint,
                   run_dir=tmp_path / "run", images_per_child=4, workers=2, env=s3_server.env(),
                   train_size=(64, 48), contract=ROOT / "contracts" / "case-study.contract")
    assert run_local(run, progress=False, say=lambda _: None).failed == []
    downloads = [p for p in runfiles.read_profiles(tmp_path / "run") if p.stage == "download"]
    assert len(downloads) == 2
    for profile in downloads:
        rows = {r["label"]: r for r in profile.contract}
        assert {"num_write", "total_write"} <= set(rows)
        # Whichever probe answered (eBPF as root, else procfs), the counts agree with the kernel's.
        assert rows["num_write"]["value"] == pytest.approx(profile.write_calls, rel=0.01)
        assert rows["total_write"]["value"] == pytest.approx(profile.write_bytes, rel=0.01)
        if rows["num_write"]["source"] == "procfs":
            assert rows["mean_lat_write"]["value"] is None  # latency needs eBPF for a static binary
        else:
            assert rows["mean_lat_write"]["value"] > 0
    emf = runfiles.emf_path(tmp_path / "run", "part-00000").read_text()
    assert '"num_write"' in emf
