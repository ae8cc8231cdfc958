"""One array child: download -> process -> upload, each stage announced to the profiler sidecar.

This is the container entrypoint (`iobatch job`) in AWS Batch and the worker of the local executor;
both give it the same environment (pipeline/settings.py).

Promises:
- A child whose `_SUCCESS` marker exists is skipped (unless IOBATCH_FORCE is set).
- `_SUCCESS` is written last, after every output object, so no marker exists without complete outputs;
  a child killed half-way leaves none, and a rerun redoes it from the start.
- Scratch is cleaned before the child starts, after it succeeds, and when scratch runs full.
- Every download is checked against the frozen manifest (size, and MD5 == ETag for single-part objects):
  an object whose bytes changed after the batch was frozen fails the child as permanent, naming the key.
- Outputs are uploaded with CRC32C checksums that S3 verifies; multipart uploads a killed run left under
  the child's output prefix are aborted before the upload stage.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from pipeline import s3 as s3io
from pipeline.errors import IntegrityError, Interrupted, IobatchError, ManifestError, ScratchError, print_error
from pipeline.imaging import INDEX_NAME, SHARD_NAME, write_shard
from pipeline.manifest import ManifestEntry, shard_bounds
from pipeline.s5cmd import Copy, run_copies
from pipeline.settings import ENV, JobSettings
from profiling.protocol import StageReporter

# s5cmd's own retry count (its default is 10, with exponential back-off); the fault tests lower it.


def log(event: str, **fields: Any) -> None:
    """One structured line on stdout: CloudWatch Logs in AWS, the child's log (and progress) locally."""
    print(json.dumps({"event": event, "time": round(time.time(), 3), **fields}, default=str), flush=True)


@dataclass(frozen=True)
class ChildResult:
    child: str
    skipped: bool
    images: int = 0
    bad_images: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted("the child was stopped by SIGTERM (Batch timeout or Spot reclaim): it will be retried")


def _prepare_scratch(settings: JobSettings) -> tuple[Path, Path]:
    root = settings.scratch_root
    if not root.is_dir():
        raise ScratchError(f"scratch directory {root} does not exist: mount the scratch volume or set "
                           "IOBATCH_SCRATCH")
    work = settings.work_dir
    try:
        work.mkdir(parents=True, exist_ok=True)
        probe = work / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ScratchError(f"scratch directory {work} is not writable ({exc.strerror}): fix its owner or "
                           "mode, or set IOBATCH_SCRATCH") from None
    incoming, outgoing = work / "input", work / "output"
    for path in (incoming, outgoing):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
    return incoming, outgoing


def _clean_scratch(settings: JobSettings) -> None:
    for name in ("input", "output", "download.cmds", "upload.cmds"):
        path = settings.work_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def scratch_full(settings: JobSettings, what: str) -> ScratchError:
    usage = shutil.disk_usage(settings.scratch_root)
    size = f"{usage.total / 2**30:.1f} GiB" if usage.total >= 2**30 else f"{usage.total / 2**20:.1f} MiB"
    return ScratchError(
        f"scratch volume {settings.scratch_root} ({size}) is full while {what}: "
        "use a bigger volume (see `iobatch advise`) or fewer images per job"
    )


def child_entries(s3: Any, settings: JobSettings) -> list[ManifestEntry]:
    """This child's slice of the batch: from the frozen manifest, or from a sorted prefix listing."""
    if settings.manifest is not None:
        return s3io.read_child_entries(s3, settings.manifest, settings.array_index, bucket=settings.input.bucket)
    listing = list(s3io.list_images(s3, settings.input))
    start, stop = shard_bounds(settings.array_index, settings.images_per_child, len(listing))
    if start >= stop:
        # A child that does not exist must not write an empty shard and a _SUCCESS marker for itself.
        children = -(-len(listing) // settings.images_per_child)
        raise ManifestError(f"array index {settings.array_index} is beyond the batch: {settings.input} has "
                            f"{len(listing)} images, {children} children of {settings.images_per_child}; "
                            "submit with an array size of at most that")
    return listing[start:stop]


_CHANGED = "the object changed after the batch was frozen: restore it, or submit the batch again to refreeze it"


def verify_size(entry: ManifestEntry, path: Path, *, bucket: str) -> None:
    """The downloaded file has the size the batch was frozen with (download stage: a stat, no read)."""
    size = path.stat().st_size
    if entry.size is not None and size != entry.size:
        raise IntegrityError(f"s3://{bucket}/{entry.key} is {size} bytes, the batch listed {entry.size}: {_CHANGED}")


def verify_content(entry: ManifestEntry, data: bytes, *, bucket: str) -> None:
    """For a single-part object (an ETag without '-'), the bytes have the MD5 the batch was frozen with.

    Called by the process stage on the bytes it reads anyway, so each image is read once, not twice.
    Raises IntegrityError (permanent) naming the key.
    """
    etag = entry.etag
    if etag and "-" not in etag and len(etag) == 32:
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if md5 != etag.lower():
            raise IntegrityError(f"s3://{bucket}/{entry.key} has MD5 {md5}, the batch listed ETag {etag}: {_CHANGED}")


def _s5cmd_retries() -> int | None:
    raw = os.environ.get(ENV.S5CMD_RETRIES, "").strip()
    return int(raw) if raw.isdigit() else None


def local_name(key: str, position: int) -> str:
    """A flat, unique file name on scratch for an object key."""
    return f"{position:05d}-{key.rsplit('/', 1)[-1]}"


def run_stages(settings: JobSettings) -> ChildResult:
    """Run one child's three stages (download, process, upload) in this process, or raise an IobatchError."""
    s3 = s3io.client(settings.s3_endpoint)
    success = settings.child_output.join(s3io.SUCCESS_MARKER)
    if not settings.force and s3io.exists(s3, success):
        log("skipped", child=settings.child, reason=f"{success} exists", output=str(settings.child_output))
        return ChildResult(settings.child, skipped=True)

    entries = child_entries(s3, settings)
    incoming, outgoing = _prepare_scratch(settings)
    reporter = StageReporter(settings.socket_path)
    log("start", child=settings.child, images=len(entries), job_id=settings.job_id,
        profiled=reporter.active, scratch=str(settings.work_dir))
    outcome = "failed"
    try:
        log("stage_start", stage="download")
        with reporter.stage("download") as stage:
            copies = [Copy(f"s3://{settings.input.bucket}/{e.key}", str(incoming / local_name(e.key, i)))
                      for i, e in enumerate(entries)]
            try:
                results = run_copies(copies, command_file=settings.work_dir / "download.cmds",
                                     endpoint=settings.s3_endpoint, workers=settings.s5cmd_workers,
                                     retries=_s5cmd_retries())
            except ScratchError:
                _clean_scratch(settings)
                raise scratch_full(settings, "downloading") from None
            for i, entry in enumerate(entries):
                verify_size(entry, incoming / local_name(entry.key, i), bucket=settings.input.bucket)
            bytes_in = sum(r.size or 0 for r in results)
            stage.items = len(entries)
        log("stage_end", stage="download", images=len(entries), bytes=bytes_in)

        log("stage_start", stage="process")
        with reporter.stage("process") as stage:
            items = [(e.key, incoming / local_name(e.key, i)) for i, e in enumerate(entries)]
            listed = {e.key: e for e in entries}
            try:
                shard = write_shard(items, outgoing, size=settings.train_size,
                                    skip_bad_images=settings.skip_bad_images, child=settings.child,
                                    check=lambda key, data: verify_content(listed[key], data,
                                                                           bucket=settings.input.bucket))
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    _clean_scratch(settings)
                    raise scratch_full(settings, "writing the shard") from None
                raise
            stage.items = shard.images
        for bad in shard.skipped:
            log("bad_image", key=bad["key"], error=bad["error"])
        log("stage_end", stage="process", images=shard.images, bad_images=len(shard.skipped),
            bytes=shard.shard_bytes)

        log("stage_start", stage="upload")
        with reporter.stage("upload") as stage:
            out = settings.child_output
            # A run killed mid-upload may have left multipart uploads behind: they cost storage until aborted.
            try:
                orphans = s3io.abort_multipart_uploads(s3, out)
            except IobatchError as exc:
                if exc.retryable:
                    raise
                # Not allowed to list them (s3:ListBucketMultipartUploads): the bucket's lifecycle
                # rule still aborts incomplete uploads, so this is no reason to fail the child.
                log("warning", error=f"could not clean up multipart uploads under {out}: {exc.headline}")
                orphans = []
            if orphans:
                log("aborted_multipart_uploads", keys=orphans)
            # boto3 rather than s5cmd here: two files, and s5cmd 2.3 cannot send CRC32C checksums.
            checksums = {name: s3io.upload_verified(s3, str(outgoing / name), out.join(name))
                         for name in (SHARD_NAME, INDEX_NAME)}
            # The marker goes last: its presence means every output above is complete.
            marker = {"child": settings.child, "job_id": settings.job_id, "images": shard.images,
                      "bad_images": len(shard.skipped), "shard_bytes": shard.shard_bytes,
                      "crc32c": checksums}
            s3io.put_bytes(s3, success, json.dumps(marker, sort_keys=True).encode())
            stage.items = shard.images
        log("stage_end", stage="upload", images=shard.images, bytes=shard.shard_bytes + shard.index_bytes)
        outcome = "ok"
    except Interrupted:
        outcome = "interrupted"
        raise
    finally:
        reporter.close(outcome)
    _clean_scratch(settings)
    log("done", child=settings.child, images=shard.images, output=str(settings.child_output))
    return ChildResult(settings.child, False, shard.images, len(shard.skipped), bytes_in,
                       shard.shard_bytes + shard.index_bytes)


def main(settings: JobSettings | None = None) -> int:
    """Entrypoint: returns the process exit code (see pipeline/errors.py)."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        run_stages(settings or JobSettings.from_env())
        return 0
    except IobatchError as exc:
        log("failed", error=exc.headline, exit_code=exc.exit_code, retryable=exc.retryable)
        print_error(exc.headline)
        return exc.exit_code


