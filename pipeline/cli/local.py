"""Local runs: `iobatch demo`, `iobatch run` and `iobatch job` (pipeline/local, pipeline/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pipeline.errors import EXIT_CODES_HELP, IobatchError, UsageError, print_error
from pipeline.settings import ENV, JobSettings, S3Uri, default_workers, parse_train_size
from profiling.protocol import SOCKET_NAME


def _print_batch(result: Any, profiles: Any, title: str) -> None:
    from rich.console import Console

    from profiling.metrics import summarize
    from profiling.table import render_stage_table

    console = Console(width=200)
    summary = summarize(profiles)
    if summary:
        console.print(render_stage_table(summary, title))
    else:
        console.print("no stage profiles were recorded (was the profiler off?)")
    console.print(f"{result.succeeded} children done, {result.skipped} skipped (already complete), "
                  f"{len(result.failed)} failed, in {result.elapsed_s:.1f} s")
    for index, code, headline in result.failed:
        console.print(f"  part-{index:05d}: exit {code}: {headline}")


def _checked_contract(path: Path | None) -> Path | None:
    """Parse the contract before anything runs: a malformed one is one line naming the line and field."""
    if path is None:
        return None
    from profiling.contract import ContractError, load_contract

    try:
        load_contract(path)
    except (ContractError, OSError) as exc:
        raise UsageError(f"--contract: {exc}") from None
    return path.resolve()


def _write_report(run_dir: Path, advice: Any | None = None) -> Path | None:
    from profiling.report import ReportInputError, write_report

    try:
        return write_report(run_dir, advice=advice)
    except ReportInputError as exc:
        print(f"report:   not written ({exc})")
        return None


def demo(
    images: int = typer.Option(40, min=1, help="Synthetic camera images in the training batch."),
    image_mib: float = typer.Option(25.0, min=0.01, help="Approximate size of each image in MiB (PNG)."),
    images_per_child: int = typer.Option(5, min=1, help="Images each array child takes."),
    workers: int = typer.Option(default_workers(), min=1, help="Children running at once (default: one per core)."),
    run_dir: Path = typer.Option(Path(".iobatch/demo"), help="Where profiles, EMF, logs, the S3 data and the report "
                                 "go. Emptied first if it holds an earlier run."),
    scratch: Path | None = typer.Option(None, help="Scratch root for the children (default RUN_DIR/scratch)."),
    s3_endpoint: str | None = typer.Option(None, help="Use this S3 endpoint (e.g. LocalStack, or AWS with "
                                           "https://s3.REGION.amazonaws.com) instead of the embedded server; "
                                           "credentials from the usual AWS_* variables."),
    slow_child: int | None = typer.Option(None, min=0, help="Throttle this child's S3 traffic (4 MiB/s) to show "
                                          "bad-apple detection in the report."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write RUN_DIR/report.html at the end."),
    seed: int = typer.Option(0, help="Seed of the synthetic images."),
    progress: bool | None = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a TTY)."),
    contract: Path | None = typer.Option(None, help="Contract rules every child's profiler evaluates per stage, "
                                         "e.g. contracts/case-study.contract."),
) -> None:
    """Run the main job on this machine: an embedded S3 server (versitygw), a synthetic training batch,
    the local executor with a profiler beside every child; then print the per-stage table and where
    the outputs and the report are."""
    from pipeline.local.demo import DemoOptions, demo_advice, run_demo

    options = DemoOptions(images=images, image_mib=image_mib, images_per_child=images_per_child, workers=workers,
                          run_dir=run_dir, scratch_root=scratch, s3_endpoint=s3_endpoint, slow_child=slow_child,
                          report=report, seed=seed, contract=_checked_contract(contract))
    result = run_demo(options, progress=progress)
    _print_batch(result.batch, result.profiles, f"per-stage profile of {result.batch.children} children "
                 "(durations and rates: median per child; bytes and calls: totals)")
    print(f"outputs:  {result.output}" + (f"  (as files: {result.output_dir})" if result.output_dir else ""))
    print(f"profiles: {run_dir / 'profiles'}  EMF: {run_dir / 'emf'}  logs: {run_dir / 'logs'}")
    if report:
        path = _write_report(run_dir, demo_advice(result.profiles, workers))
        if path:
            print(f"report:   {path}")
    if result.batch.failed:
        raise typer.Exit(result.batch.exit_code)


def run(
    input: str = typer.Option(..., help="s3://bucket/prefix/ the images are under."),
    output: str = typer.Option(..., help="s3://bucket/prefix/ the shards go to."),
    manifest: str | None = typer.Option(None, help="s3://bucket/key.jsonl listing the images (default: list INPUT)."),
    images_per_child: int = typer.Option(5, min=1, help="Images each array child takes."),
    workers: int = typer.Option(default_workers(), min=1, help="Children running at once (default: one per core)."),
    s3_endpoint: str | None = typer.Option(None, help="S3 endpoint URL (default: AWS)."),
    run_dir: Path = typer.Option(Path(".iobatch/run"), help="Where profiles, EMF and logs go."),
    scratch: Path | None = typer.Option(None, help="Scratch root (default RUN_DIR/scratch)."),
    train_size: str = typer.Option("512x384", help="WIDTHxHEIGHT of the training images."),
    force: bool = typer.Option(False, help="Redo children whose _SUCCESS marker exists."),
    skip_bad_images: bool = typer.Option(False, help="Record undecodable images in the index instead of failing."),
    progress: bool | None = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a TTY)."),
    contract: Path | None = typer.Option(None, help="Contract rules every child's profiler evaluates per stage."),
) -> None:
    """Run a batch on this machine against any S3 endpoint, with the local executor."""
    from pipeline.local.runner import LocalRun, prepare_run_dir, run_local
    from profiling import runfiles

    prepare_run_dir(run_dir)
    local = LocalRun(input=S3Uri.parse(input, what="--input").as_prefix(),
                     output=S3Uri.parse(output, what="--output").as_prefix(),
                     manifest=S3Uri.parse(manifest, what="--manifest") if manifest else None,
                     endpoint=s3_endpoint, run_dir=run_dir, images_per_child=images_per_child, workers=workers,
                     scratch_root=scratch, force=force, skip_bad_images=skip_bad_images,
                     train_size=parse_train_size(train_size), contract=_checked_contract(contract))
    result = run_local(local, progress=progress)
    _print_batch(result, list(runfiles.read_profiles(run_dir)), f"per-stage profile of {result.children} children")
    if result.failed:
        raise typer.Exit(result.exit_code)


JOB_HELP = f"""Run one array child (the container entrypoint): download its images with s5cmd, process them
into a training shard, upload the shard, its index and then the _SUCCESS marker.

All settings come from the environment, as AWS Batch and the local executor set it:

\b
  {ENV.INPUT:<26} s3://bucket/prefix/ of the images (required)
  {ENV.OUTPUT:<26} s3://bucket/prefix/ for the shards (required)
  {ENV.MANIFEST:<26} frozen manifest s3://.../_batch/manifest.jsonl (default: list INPUT)
  {ENV.IMAGES_PER_CHILD:<26} images per child (required)
  {ENV.ARRAY_INDEX:<26} this child's index in the array job (default 0)
  {ENV.ARRAY_OFFSET:<26} added to the index when a batch spans several array jobs
  {ENV.JOB_ID:<26} the job id (properties of every metric)
  {ENV.SCRATCH:<26} scratch volume root (default /scratch); the child uses a subdirectory
  {ENV.S3_ENDPOINT:<26} S3 endpoint URL (default AWS)
  {ENV.TRAIN_SIZE:<26} WIDTHxHEIGHT of the training images (default 512x384)
  {ENV.SKIP_BAD_IMAGES:<26} 1: record undecodable images in the index instead of failing
  {ENV.FORCE:<26} 1: redo the child even if its _SUCCESS marker exists
  {ENV.S5CMD_WORKERS:<26} s5cmd --numworkers for the download (default 16)
  {ENV.S5CMD_RETRIES:<26} s5cmd --retry-count for throttling and network errors (default 10)
  {ENV.PROFILER_SOCKET:<26} the sidecar's socket (default <child scratch>/{SOCKET_NAME}); off: none
  {ENV.PIPELINE:<26} the Pipeline dimension of the metrics (default iobatch)
  {ENV.VOLUME_TYPE:<26} reported with the metrics (st1, gp3, ...)

{EXIT_CODES_HELP}"""


def job() -> None:
    # Registered with help=JOB_HELP. No handles_errors: the job sets its own SIGTERM handler and exit code.
    from pipeline.job import main as job_main

    try:
        settings = JobSettings.from_env()
    except IobatchError as exc:
        print_error(exc.headline)
        raise typer.Exit(exc.exit_code) from None
    raise typer.Exit(job_main(settings))
