"""The embedded default: a whole batch on this machine.

`run_local` freezes a batch (prefix or manifest) and runs it with the local executor against any S3
endpoint; `run_demo` adds the embedded S3 server and a synthetic training batch, and ends with the
per-stage summary and the report.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline import s3 as s3io
from pipeline.errors import UsageError
from pipeline.local.dataset import DatasetSpec, generate
from pipeline.local.executor import BatchResult, LocalBatch, run_batch
from pipeline.local.s3server import EmbeddedS3
from pipeline.settings import DEFAULT_TRAIN_SIZE, JobSettings, S3Uri, default_workers
from pipeline.transfer import Copy, run_copies
from profiling import runfiles
from profiling.metrics import StageProfile, summarize

INPUT_BUCKET = "iobatch-input"
OUTPUT_BUCKET = "iobatch-output"
CACHE_ENV = "IOBATCH_CACHE"


@dataclass(frozen=True)
class LocalRun:
    """A batch to run on this machine against an S3 endpoint."""

    input: S3Uri
    output: S3Uri
    endpoint: str | None
    run_dir: Path
    images_per_child: int
    manifest: S3Uri | None = None
    workers: int = field(default_factory=default_workers)
    scratch_root: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    force: bool = False
    skip_bad_images: bool = False
    train_size: tuple[int, int] = DEFAULT_TRAIN_SIZE
    slow_child: int | None = None
    slow_child_bps: float = 4 * 2**20  # the slow child's S3 traffic, each direction
    sidecar: bool = True
    job_id: str = ""
    contract: Path | None = None


def prepare_run_dir(run_dir: Path) -> None:
    """Empty a previous run's directory; refuse to empty anything that is not one of ours."""
    if run_dir.exists() and any(run_dir.iterdir()):
        if not (run_dir / runfiles.RUN_FILE).exists():
            raise UsageError(f"run directory {run_dir} is not empty and holds no {runfiles.RUN_FILE}: "
                             "give an empty or new directory with --run-dir")
        for child in run_dir.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)


def run_local(run: LocalRun, *, progress: bool | None = None, say: Callable[[str], None] = print) -> BatchResult:
    """Freeze the batch beside its outputs, then run its children with the local executor."""
    s3 = s3io.client(run.endpoint, run.env)
    frozen = s3io.freeze_batch(s3, input=run.input, manifest=run.manifest, output=run.output,
                               per_child=run.images_per_child)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    scratch = run.scratch_root or (run.run_dir / "scratch")
    scratch.mkdir(parents=True, exist_ok=True)
    job_id = run.job_id or f"local-{time.strftime('%Y%m%d-%H%M%S')}"
    template = JobSettings(input=run.input, output=run.output, manifest=frozen.manifest, scratch_root=scratch,
                           images_per_child=run.images_per_child, array_index=0, job_id=job_id,
                           s3_endpoint=run.endpoint, train_size=run.train_size, skip_bad_images=run.skip_bad_images,
                           force=run.force, volume_type="local")
    batch = LocalBatch(template=template, children=frozen.children, workers=run.workers, run_dir=run.run_dir,
                       env=run.env, sidecar=run.sidecar, slow_child=run.slow_child,
                       slow_child_bps=run.slow_child_bps, contract=run.contract)
    meta: dict[str, Any] = {"job_id": job_id, "input": str(run.input), "output": str(run.output),
                            "manifest": str(frozen.manifest), "children": frozen.children, "images": frozen.images,
                            "bytes": frozen.bytes, "workers": run.workers, "images_per_child": run.images_per_child,
                            "started": time.time(), "slow_child": run.slow_child}
    _write_run_file(run.run_dir, meta)
    say(f"batch {job_id}: {frozen.images} images ({frozen.bytes / 2**20:,.0f} MiB) in {frozen.children} children, "
        f"{run.workers} at a time")
    result = run_batch(batch, progress=progress, images_total=frozen.images)
    meta.update(finished=time.time(), elapsed_s=round(result.elapsed_s, 3),
                failed=[{"child": i, "exit_code": c, "error": h} for i, c, h in result.failed],
                succeeded=result.succeeded, skipped=result.skipped)
    _write_run_file(run.run_dir, meta)
    return result


def _write_run_file(run_dir: Path, meta: Mapping[str, Any]) -> None:
    tmp = run_dir / (runfiles.RUN_FILE + ".partial")
    tmp.write_text(json.dumps(meta, indent=1, default=str) + "\n", encoding="utf-8")
    tmp.replace(run_dir / runfiles.RUN_FILE)


@dataclass(frozen=True)
class DemoOptions:
    images: int = 40
    image_mib: float = 25.0
    images_per_child: int = 5
    workers: int = field(default_factory=default_workers)
    run_dir: Path = Path(".iobatch/demo")
    scratch_root: Path | None = None
    s3_endpoint: str | None = None  # None: the embedded versitygw
    slow_child: int | None = None
    report: bool = True
    seed: int = 0
    sidecar: bool = True
    train_size: tuple[int, int] = DEFAULT_TRAIN_SIZE
    contract: Path | None = None


@dataclass
class DemoResult:
    run_dir: Path
    batch: BatchResult
    output: S3Uri
    output_dir: Path | None  # where the outputs are as files (embedded server only)
    summary: dict[str, dict[str, float | None]]
    profiles: list[StageProfile]
    report: Path | None = None


def dataset_cache(spec: DatasetSpec) -> Path:
    root = Path(os.environ.get(CACHE_ENV) or ".iobatch/cache")
    return root / f"dataset-{spec.fingerprint}"


def _generate_with_progress(spec: DatasetSpec, cache: Path, progress: bool | None,
                            say: Callable[[str], None]) -> None:
    """Generate what the cache lacks, with a bar on a terminal and a line every 10 images otherwise."""
    missing = sum(1 for i in range(spec.images) if not (cache / spec.key(i)).exists())
    if not missing:
        return
    started = time.monotonic()
    if progress if progress is not None else sys.stdout.isatty():
        with Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
            task = bar.add_task("images", total=missing)
            generate(spec, cache, on_image=lambda _: bar.advance(task))
    else:
        done = 0

        def tick(_: int) -> None:
            nonlocal done
            done += 1
            if done % 10 == 0 or done == missing:
                say(f"  generated {done}/{missing} images ({time.monotonic() - started:.0f} s)")

        generate(spec, cache, on_image=tick)


def upload_dataset(spec: DatasetSpec, source: Path, prefix: S3Uri, endpoint: str | None, work: Path,
                   env: Mapping[str, str]) -> None:
    copies = [Copy(str(source / spec.key(i)), str(prefix.join(spec.key(i)))) for i in range(spec.images)]
    command_file = work / "upload-dataset.cmds"
    run_copies(copies, command_file=command_file, endpoint=endpoint, workers=16, env={**os.environ, **env})
    command_file.unlink()


def _ensure_bucket(s3: Any, name: str) -> None:
    existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if name not in existing:
        s3.create_bucket(Bucket=name)


def run_demo(options: DemoOptions, *, progress: bool | None = None, say: Callable[[str], None] = print) -> DemoResult:
    """Generate a training batch, serve it from the embedded S3 server, and run it end to end."""
    if options.images < 1 or options.image_mib <= 0 or options.images_per_child < 1 or options.workers < 1:
        raise UsageError("--images, --image-mib, --images-per-child and --workers must all be positive")
    if options.slow_child is not None and not 0 <= options.slow_child < -(-options.images // options.images_per_child):
        raise UsageError(f"--slow-child {options.slow_child} is not a child of this batch: give 0 to "
                         f"{-(-options.images // options.images_per_child) - 1}")
    run_dir = options.run_dir
    prepare_run_dir(run_dir)
    _write_run_file(run_dir, {"demo": True, "started": time.time()})
    spec = DatasetSpec(options.images, options.image_mib, options.seed)
    cache = dataset_cache(spec)
    width, height = spec.dimensions()
    say(f"dataset: {spec.images} synthetic camera images of {width}x{height} (~{spec.image_mib:g} MiB each) "
        f"in {cache}")
    _generate_with_progress(spec, cache, progress, say)

    def with_server(endpoint: str | None, env: Mapping[str, str], output_dir: Path | None) -> DemoResult:
        s3 = s3io.client(endpoint, env)
        for bucket in (INPUT_BUCKET, OUTPUT_BUCKET):
            _ensure_bucket(s3, bucket)
        images = S3Uri(INPUT_BUCKET, "images/")
        output = S3Uri(OUTPUT_BUCKET, "train/")
        upload_dataset(spec, cache, images, endpoint, run_dir, env)
        say(f"uploaded to {images}; outputs go to {output}")
        run = LocalRun(input=images, output=output, endpoint=endpoint, run_dir=run_dir,
                       images_per_child=options.images_per_child, workers=options.workers,
                       scratch_root=options.scratch_root, env=env, slow_child=options.slow_child,
                       sidecar=options.sidecar, train_size=options.train_size, force=True, contract=options.contract,
                       job_id=f"demo-{time.strftime('%Y%m%d-%H%M%S')}")
        batch = run_local(run, progress=progress, say=say)
        profiles = list(runfiles.read_profiles(run_dir)) if (run_dir / runfiles.PROFILES).exists() else []
        return DemoResult(run_dir, batch, output, output_dir, summarize(profiles), profiles)

    if options.s3_endpoint:
        result = with_server(options.s3_endpoint, {}, None)
    else:
        data_dir = run_dir / "s3"
        with EmbeddedS3(data_dir, log_file=run_dir / "s3server.log") as server:
            result = with_server(server.endpoint, server.env(), data_dir / OUTPUT_BUCKET / "train")
    return result
