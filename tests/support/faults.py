"""What the fault tests share: a frozen batch in a bucket, one child started as the executor starts it,
and the checks that a child's outputs are complete and byte for byte those of an unfaulted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import s3 as s3io
from pipeline.imaging import INDEX_NAME, SHARD_NAME, write_shard
from pipeline.local.s3server import EmbeddedS3
from pipeline.settings import ENV, PROFILER_OFF, JobSettings, S3Uri, child_name
from profiling import runfiles

TRAIN_SIZE = (64, 48)
OUTPUT_FILES = (SHARD_NAME, INDEX_NAME, s3io.SUCCESS_MARKER)


def objects(s3: Any, bucket: str, prefix: str) -> dict[str, str]:
    """key -> ETag of every object under prefix."""
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            out[item["Key"]] = item["ETag"]
    return out


def body(s3: Any, bucket: str, key: str) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def open_uploads(s3: Any, bucket: str, prefix: str) -> list[str]:
    return [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", []) or []]


def reference_outputs(source: Path | Mapping[str, Path], keys: list[str], child: int, per_child: int,
                      work: Path) -> dict[str, bytes]:
    """What an unfaulted child writes: the shard built in-process from the same bytes (shards are
    deterministic; the CRC32C test below holds this to a real run). `source` is the dataset folder
    (keys are images/<file>) or a mapping key -> local file."""
    ordered = sorted(keys)[child * per_child:(child + 1) * per_child]
    out = work / f"ref-{child}"
    items = [(k, source[k] if isinstance(source, Mapping) else source / k.split("/", 1)[1]) for k in ordered]
    write_shard(items, out, size=TRAIN_SIZE, child=child_name(child))
    return {SHARD_NAME: (out / SHARD_NAME).read_bytes(), INDEX_NAME: (out / INDEX_NAME).read_bytes()}


def assert_child_complete(s3: Any, bucket: str, output: str, child: int, expected: Mapping[str, bytes]) -> None:
    """Exactly the three outputs, byte for byte the expected ones, no open multipart upload."""
    prefix = f"{output}{child_name(child)}/"
    assert set(objects(s3, bucket, prefix)) == {prefix + name for name in OUTPUT_FILES}
    for name, data in expected.items():
        assert body(s3, bucket, prefix + name) == data, f"{prefix + name} differs from the unfaulted run"
    assert open_uploads(s3, bucket, prefix) == []


@dataclass
class Batch:
    """A frozen batch in a bucket, and the environment of each of its children."""

    server: EmbeddedS3
    bucket: str
    keys: list[str]
    source: Path
    output: str
    per_child: int
    scratch: Path
    manifest: S3Uri
    children: int

    def settings(self, child: int, endpoint: str | None = None) -> JobSettings:
        return JobSettings(input=S3Uri(self.bucket, "images/"), output=S3Uri(self.bucket, self.output),
                           manifest=self.manifest, scratch_root=self.scratch, images_per_child=self.per_child,
                           array_index=child, job_id=f"faults:{child}", s3_endpoint=endpoint or self.server.endpoint,
                           train_size=TRAIN_SIZE, volume_type="local")

    def env(self, child: int, endpoint: str | None = None, **extra: str) -> dict[str, str]:
        return {**os.environ, **self.server.env(), **self.settings(child, endpoint).to_env(),
                "PYTHONUNBUFFERED": "1", **extra}


def freeze(server: EmbeddedS3, s3: Any, bucket: str, keys: list[str], source: Path, output: str, per_child: int,
           scratch: Path) -> Batch:
    frozen = s3io.freeze_batch(s3, input=S3Uri(bucket, "images/"), manifest=None, output=S3Uri(bucket, output),
                               per_child=per_child)
    scratch.mkdir(parents=True, exist_ok=True)
    return Batch(server, bucket, keys, source, output, per_child, scratch, frozen.manifest, frozen.children)


@dataclass
class ChildRun:
    """`iobatch job` (and optionally `iobatch sidecar`) for one child, started as the executor does."""

    job: subprocess.Popen[str]
    sidecar: subprocess.Popen[bytes] | None
    lines: list[str] = field(default_factory=list)
    seen: threading.Condition = field(default_factory=threading.Condition)
    reader: threading.Thread | None = None

    def events(self) -> list[dict[str, Any]]:
        with self.seen:
            return list(self._events_locked())

    def wait_for(self, event: str, stage: str | None = None, timeout: float = 60) -> bool:
        """Block until the job logs `event` (for `stage`); False if it exited or timed out first."""
        deadline = time.monotonic() + timeout
        with self.seen:
            while True:
                if any(e.get("event") == event and (stage is None or e.get("stage") == stage)
                       for e in self._events_locked()):
                    return True
                if self.reader is not None and not self.reader.is_alive():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.seen.wait(min(left, 0.05))

    def _events_locked(self) -> Iterator[dict[str, Any]]:
        for line in self.lines:
            if line.startswith("{"):
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue

    def stage_now(self) -> str:
        """The stage the job is in, from its log: the last stage started and not ended, or done/before."""
        started = [e["stage"] for e in self.events() if e.get("event") == "stage_start"]
        ended = {e["stage"] for e in self.events() if e.get("event") == "stage_end"}
        if any(e.get("event") == "done" for e in self.events()):
            return "after"
        open_stages = [s for s in started if s not in ended]
        return open_stages[-1] if open_stages else ("before" if not started else "between")

    def finish(self, timeout: float = 60) -> int:
        code = self.job.wait(timeout=timeout)
        if self.reader is not None:
            self.reader.join(timeout=5)
        if self.sidecar is not None:
            try:
                self.sidecar.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.sidecar.kill()
                self.sidecar.wait()
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)


def start_child(batch: Batch, child: int, run_dir: Path, *, endpoint: str | None = None, sidecar: bool = True,
                **extra_env: str) -> ChildRun:
    env = batch.env(child, endpoint, **extra_env)
    settings = batch.settings(child, endpoint)
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    for sub in (runfiles.PROFILES, runfiles.EMF, runfiles.LOGS):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    python = [sys.executable, "-m", "pipeline.cli"]
    side = None
    if sidecar:
        name = settings.child
        log = runfiles.log_path(run_dir, name).open("ab")
        side = subprocess.Popen([*python, "sidecar", "--socket", str(settings.socket_path),
                                 "--emf", str(runfiles.emf_path(run_dir, name)),
                                 "--profile-out", str(runfiles.profile_path(run_dir, name)),
                                 "--scratch-dir", str(settings.work_dir)],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
    else:
        env[ENV.PROFILER_SOCKET] = PROFILER_OFF
    job = subprocess.Popen([*python, "job"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = ChildRun(job, side)

    def pump() -> None:
        assert job.stdout is not None
        for line in job.stdout:
            with run.seen:
                run.lines.append(line)
                run.seen.notify_all()
        with run.seen:
            run.seen.notify_all()

    run.reader = threading.Thread(target=pump, daemon=True)
    run.reader.start()
    return run


def run_child(batch: Batch, child: int, run_dir: Path, **kw: Any) -> tuple[int, str]:
    run = start_child(batch, child, run_dir, **kw)
    code = run.finish(timeout=120)
    return code, run.output
