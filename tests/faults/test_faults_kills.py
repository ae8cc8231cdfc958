"""kill -9 of the job, its s5cmd or the profiler sidecar at seeded random points of each stage.

One frozen batch of one-image children; every trial is one child, killed once; several trials run at
once. Then the invariants are checked before and after one rerun of the whole batch:

- before: no `_SUCCESS` marker without both outputs, complete and byte-for-byte right;
- a killed sidecar never failed its job (exit 0); a killed s5cmd gave the retryable exit code;
- after the rerun: every child's outputs exist exactly once and match an unfaulted run byte for byte,
  no multipart upload is left open, scratch is clean.

Set IOBATCH_FAULT_MATRIX=<file> to write the trial table (target x stage landed x outcome) as JSON.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pipeline import s3 as s3io
from pipeline.errors import EXIT_RETRYABLE
from pipeline.imaging import INDEX_NAME, SHARD_NAME
from pipeline.local.proxy import ThrottledProxy
from pipeline.local.s3server import EmbeddedS3
from pipeline.settings import child_name
from tests.support.faults import (
    Batch,
    ChildRun,
    assert_child_complete,
    body,
    freeze,
    objects,
    open_uploads,
    reference_outputs,
    run_child,
    start_child,
)

SEED = 20261122
TARGETS = [("job", "download"), ("job", "process"), ("job", "upload"), ("s5cmd", "download"),
           ("sidecar", "download"), ("sidecar", "process"), ("sidecar", "upload")]
REPEATS = 5  # 7 x 5 = 35 trials
# How long after a stage starts the kill may come (uniform): within the stage's length in this setup
# (0.5 MiB images at 1 MiB/s take ~0.5 s; decoding one takes a few tens of milliseconds, the upload
# stage's six small requests about as long).
WINDOW_S = {"download": 0.45, "process": 0.012, "upload": 0.03}
CONCURRENT = 4


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def trial(batch: Batch, child: int, target: str, stage: str, delay: float, endpoint: str, run_dir: Path
          ) -> dict[str, Any]:
    # The sidecar runs where it is the target: each one costs a Python start on a busy machine.
    run: ChildRun = start_child(batch, child, run_dir, endpoint=endpoint, sidecar=target == "sidecar")
    killed = False
    landed = "missed"
    if run.wait_for("stage_start", stage, timeout=90):
        if target == "s5cmd":
            # s5cmd starts a moment after the stage does; the delay counts from its start.
            deadline = time.monotonic() + 5
            pid = None
            while pid is None and time.monotonic() < deadline and run.job.poll() is None:
                pid = next((c for c in children_of(run.job.pid) if process_name(c) == "s5cmd"), None)
                time.sleep(0.005)
            time.sleep(delay)
            landed = run.stage_now()
            if pid is not None and process_name(pid) == "s5cmd":
                os.kill(pid, signal.SIGKILL)
                killed = True
        else:
            time.sleep(delay)
            landed = run.stage_now()
            proc = run.job if target == "job" else run.sidecar
            assert proc is not None
            if proc.poll() is None:
                proc.kill()
                killed = True
    code = run.finish(timeout=120)
    if not killed:
        landed = "after"  # the target had exited before the kill: a trial that proves little, counted apart
    return {"child": child, "target": target, "stage": stage, "landed": landed, "delay_s": round(delay, 3),
            "exit_code": code, "tail": run.output[-400:]}


def test_kill_9_at_random_points_then_rerun_gives_exact_outputs(
    s3_server: EmbeddedS3, s3: Any, bucket: str, small_dataset: tuple[Any, Path], tmp_path: Path
) -> None:
    _, source = small_dataset
    files = sorted(p for p in source.rglob("*") if p.is_file())
    rng = random.Random(SEED)
    plans = [(target, stage) for _ in range(REPEATS) for target, stage in TARGETS]
    rng.shuffle(plans)
    keys = [f"images/k{i:03d}.png" for i in range(len(plans))]
    local = {key: files[i % len(files)] for i, key in enumerate(keys)}
    for key, path in local.items():
        s3.upload_file(str(path), bucket, key)
    batch = freeze(s3_server, s3, bucket, keys, source, "kills/", 1, tmp_path / "scratch")
    assert batch.children == len(plans)
    delays = [rng.uniform(0, WINDOW_S[stage]) for _, stage in plans]

    with ThrottledProxy(s3_server.port, 2**20) as slow, ThreadPoolExecutor(CONCURRENT) as pool:
        results = list(pool.map(lambda i: trial(batch, i, plans[i][0], plans[i][1], delays[i], slow.endpoint,
                                                tmp_path / "run"), range(len(plans))))

    expected = {c: reference_outputs(local, keys, c, 1, tmp_path / "ref") for c in range(len(plans))}
    # Before any rerun: a marker only beside complete, correct outputs.
    for c in range(len(plans)):
        prefix = f"kills/{child_name(c)}/"
        present = objects(s3, bucket, prefix)
        if prefix + s3io.SUCCESS_MARKER in present:
            for name in (SHARD_NAME, INDEX_NAME):
                assert body(s3, bucket, prefix + name) == expected[c][name], results[c]
    for r in results:
        if r["target"] == "sidecar":
            assert r["exit_code"] == 0, f"a killed sidecar failed its job: {r}"
        elif r["target"] == "s5cmd" and r["landed"] != "after":
            assert r["exit_code"] == EXIT_RETRYABLE, r
        elif r["target"] == "job" and r["landed"] != "after":
            assert r["exit_code"] == -signal.SIGKILL, r

    # The rerun is what the Batch retry strategy does: the children that did not finish, run again.
    done = set(objects(s3, bucket, "kills/part-"))
    unfinished = [c for c in range(len(plans)) if f"kills/{child_name(c)}/{s3io.SUCCESS_MARKER}" not in done]
    assert len(unfinished) >= 20  # the job and s5cmd kills
    with ThreadPoolExecutor(CONCURRENT) as pool:
        reruns = list(pool.map(lambda c: run_child(batch, c, tmp_path / "rerun", sidecar=False), unfinished))
    assert [code for code, _ in reruns] == [0] * len(unfinished), [out[-300:] for code, out in reruns if code]
    for c in range(len(plans)):
        assert_child_complete(s3, bucket, "kills/", c, expected[c])
    assert len(objects(s3, bucket, "kills/part-")) == 3 * len(plans)
    assert open_uploads(s3, bucket, "kills/") == []
    # Every attempt's directory is gone: removed by its job, or swept or reused by the rerun of a killed one.
    assert list((tmp_path / "scratch").iterdir()) == [], "scratch was not cleaned"

    matrix = Counter((r["target"], r["landed"], r["exit_code"]) for r in results)
    landed_in_stage = sum(1 for r in results if r["landed"] in ("download", "process", "upload"))
    # Most kills must land inside a stage, or the test proves little; the rest are reported.
    assert landed_in_stage >= 30, sorted(matrix.items())
    for target, stage in TARGETS:
        assert any(r["target"] == target and r["landed"] == stage for r in results), (target, stage, matrix)
    out = os.environ.get("IOBATCH_FAULT_MATRIX")
    if out:
        Path(out).write_text(json.dumps({"seed": SEED, "trials": results,
                                         "matrix": [[*k, n] for k, n in sorted(matrix.items())],
                                         "rerun": len(unfinished)}, indent=1))
