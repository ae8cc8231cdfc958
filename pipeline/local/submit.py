"""`iobatch submit --local`: the same checked request and frozen manifest as a submission to AWS Batch, run
on this machine by the local executor, in the foreground.

The planning comes from pipeline.submit (pure); the running from pipeline.local. The AWS side never
imports this module.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from pipeline import s3 as s3io
from pipeline.interface import DEFAULT_PROCESS_COMMAND
from pipeline.local.executor import BatchResult
from pipeline.local.runjson import read_run
from pipeline.local.runner import LocalRun, prepared_run_dir, run_local
from pipeline.local.s3server import EmbeddedS3
from pipeline.manifest import children_for
from pipeline.process import find_command
from pipeline.settings import default_workers
from pipeline.submit.plan import SubmitRequest, SubmitResult, SubmittedJob, check_flags, job_name
from pipeline.submit.submission import scan_source

DEFAULT_LOCAL_DIR = ".iobatch/local"  # run directory of `iobatch submit --local`
DEFAULT_LOCAL_S3 = ".iobatch/s3"  # data directory of the embedded S3 server: <bucket>/<key> as plain files


def submit_local(
    *,
    manifest: str | None,
    prefix: str | None,
    images_per_child: int,
    output: str | None = None,
    force: bool = False,
    s3_endpoint: str | None = None,
    dry_run: bool = False,
    run_dir: Path | None = None,
    s3_data_dir: Path | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    process_command: str | None = None,
) -> tuple[SubmitResult, BatchResult | None]:
    """Freeze the batch and run it on this machine with the local executor, in the foreground.

    Without `s3_endpoint` the embedded S3 server serves `s3_data_dir` (objects as files under
    <dir>/<bucket>/<key>); with it, the credentials come from the environment as for any S3. Returns the
    submission and the executor's BatchResult (None on a dry run).
    """
    check_flags(manifest=manifest, prefix=prefix, images_per_child=images_per_child)
    request = SubmitRequest.build(manifest=manifest, prefix=prefix, images_per_child=images_per_child,
                                  output=output, force=force, process_command=process_command)
    if request.process_command:  # on this machine its program must be found here, before anything runs
        find_command(request.process_command, "", what="--process-command")
    run_dir = run_dir or Path(DEFAULT_LOCAL_DIR) / request.name
    with contextlib.ExitStack() as stack:
        if s3_endpoint:
            endpoint = s3_endpoint
            env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
        else:
            server = stack.enter_context(EmbeddedS3(s3_data_dir or Path(DEFAULT_LOCAL_S3)))
            endpoint, env = server.endpoint, server.env()
        if dry_run:
            images = scan_source(s3io.client(endpoint, env), request)
            result = SubmitResult(request, s3io.frozen_paths(request.output)[0],
                                  children_for(images, images_per_child), images, (), (), dry_run=True)
            return result, None
        stack.enter_context(prepared_run_dir(run_dir))
        run = LocalRun(input=request.input, output=request.output, endpoint=endpoint, run_dir=run_dir,
                       images_per_child=images_per_child, manifest=request.manifest,
                       workers=workers or default_workers(), env=env, force=force, job_id=f"local-{request.name}",
                       process_command=request.process_command or DEFAULT_PROCESS_COMMAND)
        outcome = run_local(run, progress=progress, say=lambda _line: None)
    manifest_uri = s3io.frozen_paths(request.output)[0]
    # The run file holds the frozen batch's totals; the outcomes count only what this run processed.
    images = int(read_run(run_dir)["images"])
    local_job = SubmittedJob(f"local:{run_dir}", job_name(request.name), 0, outcome.children, images)
    return SubmitResult(request, manifest_uri, outcome.children, images, (local_job,), ()), outcome


def outcome_json(outcome: BatchResult) -> dict[str, Any]:
    """The "local" member of `submit --local --json`: the run directory and how the children ended."""
    return {"runDir": str(outcome.run_dir), "succeeded": outcome.succeeded, "skipped": outcome.skipped,
            "elapsedS": round(outcome.elapsed_s, 3),
            "failed": [{"index": i, "exitCode": c, "headline": h} for i, c, h in outcome.failed]}


def outcome_lines(outcome: BatchResult) -> list[str]:
    """How a local run ended, in lines for a person: the counts, then one line per failed child."""
    lines = [f"ran locally in {outcome.elapsed_s:.1f} s: {outcome.succeeded} succeeded, "
             f"{outcome.skipped} skipped (already complete), {len(outcome.failed)} failed; "
             f"run directory {outcome.run_dir}"]
    return lines + [f"failed child {i}: exit {c}: {h}" for i, c, h in outcome.failed]
