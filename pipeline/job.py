"""One array child: download -> process -> upload, each stage announced to the profiler sidecar.

The container entrypoint (`iobatch job`) in AWS Batch and the local executor's worker, both with the same
environment (pipeline/settings.py). In: the child's shard of the frozen manifest (or of a sorted prefix listing).
Out: every file the process command (pipeline/process.py) wrote, uploaded under the child's output prefix with a
CRC32C checksum S3 verifies, then `_SUCCESS` listing each with its size and checksum; the exit code, which the
job's last message hands the profiler. Invariants (why and how: docs/reliability.md):
- `_SUCCESS` goes last, so no marker exists without complete outputs; a child with one is skipped (unless
  IOBATCH_FORCE is set). Multipart uploads a killed run left under its prefix are aborted before the upload.
- Each attempt works in its own scratch directory (pipeline/scratch.py), removed on every exit path.
- A download that differs from the frozen manifest (its size; its MD5 against a single-part object's ETag) fails
  the child for good (65), naming the key.
- Exit 75, which Batch retries: an unprepared scratch volume, one the neighbours filled (65 when the child's own
  files do), SIGTERM, and the soft deadline before Batch's timeout (pipeline.interface.soft_deadline_s).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from pipeline import s3 as s3io
from pipeline.downloadcheck import DownloadCheck
from pipeline.errors import Interrupted, IobatchError, ManifestError, ScratchError, print_error
from pipeline.interface import EXIT_BUG, EXIT_OK, soft_deadline_s
from pipeline.manifest import ManifestEntry, shard_bounds
from pipeline.process import (
    Command,
    Output,
    collect_outputs,
    failure,
    find_command,
    run_command,
    scratch_filled,
    write_images_file,
)
from pipeline.s5cmd import Copy, run_copies
from pipeline.scratch import Scratch, tree_bytes
from pipeline.settings import ENV, JobSettings, env_yes
from profiling.probes.interpose import ENV_LIB, LIB_NAME, preload_env, record_dir, recording_into
from profiling.protocol import StageReporter


def log(event: str, **fields: Any) -> None:
    """One structured line on stdout: CloudWatch Logs in AWS, the child's log (and progress) locally."""
    print(json.dumps({"event": event, "time": round(time.time(), 3), **fields}, default=str), flush=True)


@dataclass(frozen=True)
class ChildResult:
    child: str
    skipped: bool
    images: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


def _stop_with(why: str) -> Callable[[int, FrameType | None], None]:
    """A handler for SIGTERM, SIGINT or the soft deadline's SIGALRM: the first one stops the child (exit 75);
    any later one is ignored, so cleaning up is not cut short."""

    def handler(signum: int, frame: FrameType | None) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(why)

    return handler


def arm_deadline(timeout_s: int | None) -> float | None:
    """Stop the child at its soft deadline (SIGALRM), before Batch's timeout; return the seconds until it."""
    if not timeout_s:
        return None
    soft = soft_deadline_s(timeout_s)
    signal.signal(signal.SIGALRM, _stop_with(
        f"the child reached its soft deadline ({soft:.0f} s of the {timeout_s} s attempt timeout): stopped so "
        "that it is retried (Batch does not retry an attempt it stops for its timeout)"))
    signal.setitimer(signal.ITIMER_REAL, max(soft, 0.001))
    return soft


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


def local_name(key: str, position: int) -> str:
    """A flat, unique file name on scratch for an object key."""
    return f"{position:05d}-{key.rsplit('/', 1)[-1]}"


def run_stages(settings: JobSettings, reporter: StageReporter) -> ChildResult:
    """Run one child's three stages (download, process, upload) in this process, or raise an IobatchError; each
    stage is announced to the profiler through `reporter`.

    The process command is found first (a usage error: nothing has run); then the attempt's scratch directory is
    claimed, and removed on every way out, failures included."""
    command = find_command(settings.process_command, settings.child)
    scratch = Scratch(settings.scratch_root, settings.work_dir, require_prepared=settings.require_prepared_scratch)
    try:
        swept = scratch.claim()
    except IobatchError:
        # record_calls made the interposer's directory before the claim: leave nothing behind.
        shutil.rmtree(record_dir(settings.work_dir), ignore_errors=True)
        with contextlib.suppress(OSError):
            settings.work_dir.rmdir()
        raise
    if swept:
        log("swept", scratch=str(settings.scratch_root), attempts=swept)
    try:
        return _run_claimed(settings, scratch, command, reporter)
    finally:
        scratch.release()


def _run_claimed(settings: JobSettings, scratch: Scratch, command: Command, reporter: StageReporter) -> ChildResult:
    s3 = s3io.client(settings.s3_endpoint)
    success = settings.child_output.join(s3io.SUCCESS_MARKER)
    if not settings.force and s3io.exists(s3, success):
        log("skipped", child=settings.child, reason=f"{success} exists", output=str(settings.child_output))
        return ChildResult(settings.child, skipped=True)

    entries = child_entries(s3, settings)
    needed = sum(e.size or 0 for e in entries)
    scratch.check_fits(needed)
    incoming, outgoing = settings.work_dir / "input", settings.work_dir / "output"
    log("start", child=settings.child, images=len(entries), job_id=settings.job_id,
        profiled=reporter.active, scratch=str(settings.work_dir))
    log("stage_start", stage="download")
    with reporter.stage("download") as stage:
        paths = [incoming / local_name(e.key, i) for i, e in enumerate(entries)]
        copies = [Copy(f"s3://{settings.input.bucket}/{e.key}", str(path))
                  for e, path in zip(entries, paths, strict=True)]
        # The built-in command checks the bytes as it reads them; another's are checked here as each lands.
        with DownloadCheck(entries, paths, bucket=settings.input.bucket, content=not command.is_builtin) as check:
            try:
                results = run_copies(copies, command_file=settings.work_dir / "download.cmds",
                                     endpoint=settings.s3_endpoint, workers=settings.s5cmd_workers,
                                     retries=settings.s5cmd_retries, on_copied=check.copied)
            except ScratchError:
                raise scratch.full_error("downloading", at_least=needed) from None
            check.finish()
        bytes_in = sum(r.size or 0 for r in results)
        stage.items = len(entries)
    log("stage_end", stage="download", images=len(entries), bytes=bytes_in)

    images_file = settings.work_dir / "images.jsonl"  # written before the stage: not the command's bytes
    write_images_file(images_file, [(local_name(e.key, i), e) for i, e in enumerate(entries)])
    log("stage_start", stage="process", command=command.text)
    with reporter.stage("process") as stage:
        outputs = _process(settings, scratch, command, incoming, outgoing, images_file,
                           profiled=reporter.active)
        stage.items = len(entries)
    bytes_out = sum(o.size for o in outputs)
    log("stage_end", stage="process", images=len(entries), files=len(outputs), bytes=bytes_out)

    log("stage_start", stage="upload")
    with reporter.stage("upload") as stage:
        _upload(settings, s3, outputs, images=len(entries))
        stage.items = len(entries)
    log("stage_end", stage="upload", images=len(entries), files=len(outputs), bytes=bytes_out)
    log("done", child=settings.child, images=len(entries), output=str(settings.child_output))
    return ChildResult(settings.child, False, len(entries), bytes_in, bytes_out)


def _process(settings: JobSettings, scratch: Scratch, command: Command, incoming: Path, outgoing: Path,
             images_file: Path, *, profiled: bool) -> list[Output]:
    """Run the process command; return what it wrote, or raise the error its exit code or output calls for."""
    code, last_line = run_command(command, incoming, outgoing, images_file=images_file, cwd=settings.work_dir,
                                  socket_path=settings.socket_path if profiled else None)
    if code != 0:
        if scratch_filled(settings.scratch_root):
            raise scratch.full_error(f"running the process command {command.text[:80]!r}",
                                     at_least=tree_bytes(scratch.work_dir))
        raise failure(command, code, last_line)
    return collect_outputs(command, outgoing, prefix=settings.child_output.key)


UPLOAD_THREADS = 4  # files at once: many small outputs are bound by round trips, not bandwidth


def _upload(settings: JobSettings, s3: Any, outputs: list[Output], *, images: int) -> None:
    """Every output under the child's prefix with its CRC32C, then the marker that lists them all."""
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
    # boto3 rather than s5cmd here: s5cmd 2.3 cannot send CRC32C checksums. A failed multipart upload is
    # aborted by boto3's transfer manager; nothing counts as uploaded until the marker below exists.
    with ThreadPoolExecutor(max_workers=UPLOAD_THREADS, thread_name_prefix="upload") as pool:
        checksums = list(pool.map(lambda o: s3io.upload_verified(s3, str(o.path), out.join(o.name)), outputs))
    # The marker goes last: its presence means every output it lists is complete.
    objects = [{"key": o.name, "size": o.size, "crc32c": crc} for o, crc in zip(outputs, checksums, strict=True)]
    marker = {"child": settings.child, "job_id": settings.job_id, "images": images,
              "command": settings.process_command, "objects": objects}
    s3io.put_bytes(s3, settings.child_output.join(s3io.SUCCESS_MARKER), json.dumps(marker, sort_keys=True).encode())


def record_calls(settings: JobSettings) -> None:
    """With IOBATCH_INTERPOSE=1 (the job definition's profilerInterpose), start this job again, in the same
    process, with the LD_PRELOAD interposer recording into its attempt's scratch directory, where its profiler
    reads (the profiler derives the same directory from the same task id). The job itself and every
    dynamically linked program it starts are then recorded; the library is the image's (IOBATCH_INTERPOSE_LIB).
    A value other than yes or no is a usage error (exit 64).
    Returns when already recording, when the profiler is off, or with one warning when it cannot."""
    if not env_yes(os.environ, ENV.INTERPOSE) or settings.socket_path is None:
        return
    if recording_into(settings.work_dir):
        return
    try:
        env = preload_env(settings.work_dir)
        if not env:
            raise OSError(f"the library {LIB_NAME} is not built (make setup) nor named by {ENV_LIB}")
        sys.stdout.flush()
        sys.stderr.flush()
        # The task id too, so the job finds the same directory without asking the task metadata again.
        pinned = {ENV.TASK_ID: settings.task_id} if settings.task_id else {}
        os.execve(sys.executable, sys.orig_argv, {**os.environ, **env, **pinned})
    except OSError as exc:
        log("warning", error=f"{ENV.INTERPOSE}=1, but the calls are not recorded ({exc}); the job goes on")


def main(settings: JobSettings | None = None) -> int:
    """Entrypoint: returns the process exit code (see pipeline/errors.py), which the job's last message tells the
    profiler on every way out once the settings are read, so that its container ends with the same code."""
    signal.signal(signal.SIGTERM, _stop_with(
        "the child was stopped by SIGTERM (Spot reclaim, a job cancelled, or Batch's timeout): it will be retried"))
    # Ctrl-C stops it the same way (exit 75, the stage recorded as interrupted), not with a traceback.
    signal.signal(signal.SIGINT, _stop_with("the child was interrupted (SIGINT, Ctrl-C): run it again to finish it"))
    reporter: StageReporter | None = None
    code, outcome = EXIT_BUG, "failed"  # what an unexpected exception leaves (Python exits 1 on one)
    try:
        settings = settings or JobSettings.from_env()
        record_calls(settings)  # before the deadline's timer, which would outlive an exec, and before connecting
        arm_deadline(settings.timeout_s)
        if settings.socket_path is not None and settings.socket_path.is_relative_to(settings.scratch_root) \
                and not settings.scratch_root.is_dir():
            # No profiler can be listening under a scratch root that is not there: the volume's error now, not
            # after the reporter's wait for a socket that cannot appear (5 s).
            Scratch(settings.scratch_root, settings.work_dir,
                    require_prepared=settings.require_prepared_scratch).check_volume()
        reporter = StageReporter(settings.socket_path,
                                 identity={"JobId": settings.job_id, "ArrayIndex": str(settings.array_index)})
        run_stages(settings, reporter)
        code, outcome = EXIT_OK, "ok"
    except IobatchError as exc:
        log("failed", error=exc.headline, exit_code=exc.exit_code, retryable=exc.retryable)
        print_error(exc.headline)
        code, outcome = exc.exit_code, getattr(exc, "stage_outcome", "failed")
    finally:
        if reporter is not None:
            reporter.close(outcome, code)
    return code
