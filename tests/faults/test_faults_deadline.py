"""The soft deadline: a child with an attempt timeout stops itself before Batch's timeout (which Batch does
not retry), exits 75 so the retry strategy runs it again, flushes its profile as interrupted and leaves
nothing on scratch."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pipeline.errors import EXIT_RETRYABLE
from pipeline.interface import ENV, soft_deadline_s
from pipeline.local.proxy import ThrottledProxy
from pipeline.local.s3server import EmbeddedS3
from profiling import runfiles
from tests.support.data import upload_dir
from tests.support.faults import freeze, objects, start_child

TIMEOUT_S = 5  # the soft deadline is 4 s in; 2 MiB at 256 KiB/s keeps the download going for 8 s


def test_soft_deadline_stops_the_child_with_exit_75_and_an_interrupted_profile(
    s3_server: EmbeddedS3, s3: Any, bucket: str, small_dataset: tuple[Any, Path], tmp_path: Path
) -> None:
    _, source = small_dataset
    keys = upload_dir(s3, bucket, "images/", source)
    batch = freeze(s3_server, s3, bucket, keys, source, "deadline/", 4, tmp_path / "scratch")
    run_dir = tmp_path / "run"
    with ThrottledProxy(s3_server.port, 256 * 1024) as slow:
        run = start_child(batch, 0, run_dir, endpoint=slow.endpoint, **{ENV.TIMEOUT_S: str(TIMEOUT_S)})
        assert run.wait_for("stage_start", "download"), run.output
        started = time.monotonic()
        code = run.finish(timeout=30)
        stopped_after_s = time.monotonic() - started
    assert code == EXIT_RETRYABLE, run.output
    soft = soft_deadline_s(TIMEOUT_S)
    assert f"error: the child reached its soft deadline ({soft:.0f} s of the {TIMEOUT_S} s attempt timeout)" \
        in run.output
    assert stopped_after_s < TIMEOUT_S, f"the child ran {stopped_after_s:.1f} s into its download"
    profiles = list(runfiles.read_profiles(run_dir))
    assert [(p.stage, p.outcome) for p in profiles] == [("download", "interrupted")]
    assert objects(s3, bucket, "deadline/part-") == {}
    assert list((tmp_path / "scratch").iterdir()) == []
