"""Local runs: `iobatch demo`, `iobatch run` and `iobatch job` (pipeline/local, pipeline/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pipeline.cli import checks
from pipeline.errors import EXIT_CODES_HELP, IobatchError, UsageError, print_error
from pipeline.interface import DEFAULT_PROCESS_COMMAND, PROCESS_ENV
from pipeline.settings import (
    ENV,
    MAX_DEMO_IMAGES,
    MAX_IMAGE_MIB,
    MAX_IMAGES_PER_CHILD,
    MAX_S5CMD_RETRIES,
    MAX_TRAIN_SIDE,
    MAX_WORKERS,
    MIN_TRAIN_SIDE,
    JobSettings,
    S3Uri,
    check_output_outside_input,
    counted,
    default_workers,
    parse_manifest_uri,
    parse_train_size,
)
from profiling.protocol import SOCKET_NAME, SUBSTAGE_SOCKET_ENV


def _print_batch(result: Any, profiles: Any, title: str) -> None:
    from rich.console import Console

    from profiling.metrics import summarize
    from profiling.report.summary import ebpf_absent
    from profiling.table import render_stage_table

    console = Console()  # the terminal's width (COLUMNS, else 80 when not a terminal)
    summary = summarize(profiles)
    if summary:
        console.print(render_stage_table(summary, title, console.width))
    else:
        console.print("no stage profiles were recorded (was the profiler off?)")
    missing = ebpf_absent(profiles) if summary else None
    if missing is not None:  # the per-call columns are empty: one line says why, as the profilers said it
        console.print(f"note: no per-call figures from the eBPF probe: {missing}", markup=False, highlight=False)
    console.print(f"{counted(result.succeeded, 'child', 'children')} done, {result.skipped} skipped (already "
                  f"complete), {len(result.failed)} failed, in {result.elapsed_s:.1f} s")
    for index, code, headline in result.failed:
        console.print(f"  part-{index:05d}: exit {code}: {headline}", markup=False, highlight=False)


def _checked_contract(path: Path | None) -> Path | None:
    """Parse the contract before anything runs, with the one reader `profile` and the sidecar use: a
    malformed one is one line naming the line and field."""
    if path is None:
        return None
    from profiling.finish import load_rules

    try:
        load_rules(path)
    except ValueError as exc:
        raise UsageError(f"--contract: {exc}") from None
    return path.resolve()


def _write_report(run_dir: Path, advice: Any | None = None) -> Path | None:
    from profiling.report import ReportInputError, write_report

    try:
        return write_report(run_dir, advice=advice)
    except ReportInputError as exc:
        print(f"report:   not written ({exc})")
        return None


def lab_hint(options: Any, written_bytes: float, elapsed_s: float) -> str:
    """The lab command that reruns this demo's batch on an emulated st1 held at its baseline, with an
    absolute path to this iobatch (sudo does not keep a virtualenv's PATH)."""
    import shlex
    import sys

    from tuning.ebs import MIB, Volume

    # The lab's default volume, held at baseline (its credits gone): the case study's slow downloads.
    st1 = Volume("st1", 500)
    here = Path(sys.executable).with_name("iobatch")
    program = shlex.quote(str(here)) if here.exists() else f"{shlex.quote(sys.executable)} -m pipeline.cli"
    shape = (f"--images {options.images} --image-mib {options.image_mib:g} --images-per-child "
             f"{options.images_per_child} --workers {options.workers}")
    return (f"the case study, as root, on an emulated {st1.label} held at its {st1.baseline_mibps:.1f} MiB/s "
            f"baseline: sudo {program} lab --after-cliff {shape}\n"
            f"  (runs this batch twice, kernel defaults then tuned: about "
            f"{written_bytes / MIB / st1.baseline_mibps:.0f} s to write each run's {written_bytes / MIB:,.0f} MiB "
            f"downloads, against {elapsed_s:.0f} s for this whole run)")


def _print_takeaways(result: Any, advice: Any, options: Any, run: Any) -> None:
    """The demo's last lines: what bounds each stage, what the advisor would change, and the lab command."""
    from profiling.report.advice import takeaways

    for line in takeaways(result.profiles, advice, run):
        print(line)
    written = (result.summary.get("download") or {}).get("WriteBytes") or 0.0
    print(lab_hint(options, written, result.batch.elapsed_s))


def demo(
    images: int = typer.Option(40, min=1, max=MAX_DEMO_IMAGES, metavar="N", help="Synthetic camera images in the "
                               "training batch."),
    image_mib: float = typer.Option(25.0, min=0.01, max=MAX_IMAGE_MIB, metavar="MIB", help="Approximate size of each "
                                    "image in MiB (PNG)."),
    images_per_child: int = typer.Option(5, min=1, max=MAX_IMAGES_PER_CHILD, metavar="N", help="Images each array "
                                         "child takes."),
    workers: int = typer.Option(default_workers(), min=1, max=MAX_WORKERS, show_default=False,
                                metavar="N", help="Children running at once (default: one per core)."),
    run_dir: Path = typer.Option(Path(".iobatch/demo"), metavar="DIR", help="Where profiles, EMF, logs, the S3 data "
                                 "and the report go. An earlier run's files there are replaced; other files are left "
                                 "alone."),
    scratch: Path | None = typer.Option(None, metavar="DIR", help="Scratch root for the children (default "
                                        "RUN_DIR/scratch)."),
    s3_endpoint: str | None = typer.Option(None, metavar="URL", help="Use this S3 endpoint (e.g. LocalStack, or AWS "
                                           "with https://s3.REGION.amazonaws.com) instead of the embedded server; "
                                           "credentials from the usual AWS_* variables."),
    slow_child: int | None = typer.Option(None, min=0, max=MAX_DEMO_IMAGES, metavar="INDEX", help="Throttle this "
                                          "child's S3 traffic (4 MiB/s) to show bad-apple detection in the report."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write RUN_DIR/report.html at the end."),
    seed: int = typer.Option(0, min=0, max=2**32 - 1, metavar="N", help="Seed of the synthetic images."),
    progress: bool | None = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a TTY)."),
    contract: Path | None = typer.Option(None, metavar="FILE", help="Contract rules every child's profiler evaluates "
                                         "per stage, e.g. contracts/case-study.contract."),
    process_command: str = typer.Option(DEFAULT_PROCESS_COMMAND, metavar="COMMAND",
                                        show_default=False, help=checks.PROCESS_COMMAND_HELP),
) -> None:
    """Run the main job on this machine: an embedded S3 server (versitygw), a synthetic training batch,
    the local executor with a profiler beside every child; then print the per-stage table and where
    the outputs and the report are. The synthetic images are cached in $IOBATCH_CACHE (default
    .iobatch/cache) for the next run."""
    import os

    from pipeline.local.demo import CACHE_ENV, DemoOptions, demo_advice, run_demo
    from pipeline.local.s3server import versitygw_binary

    # Everything is checked before the server starts or anything is written.
    checks.output_dir(Path(os.environ.get(CACHE_ENV) or ".iobatch/cache"), CACHE_ENV)
    if s3_endpoint is None:
        versitygw_binary()
    options = DemoOptions(images=images, image_mib=image_mib, images_per_child=images_per_child, workers=workers,
                          run_dir=checks.output_dir(run_dir, "--run-dir"),
                          scratch_root=checks.output_dir(scratch, "--scratch") if scratch else None,
                          s3_endpoint=checks.endpoint_url(s3_endpoint), slow_child=slow_child,
                          report=report, seed=seed, contract=_checked_contract(contract),
                          process_command=checks.process_command(process_command))
    result = run_demo(options, progress=progress)
    children = counted(result.batch.children, "child", "children")
    _print_batch(result.batch, result.profiles, f"per-stage profile of {children} "
                 "(durations and rates: median per child; bytes and calls: totals)")
    print(f"outputs:  {result.output}" + (f"  (as files: {result.output_dir})" if result.output_dir else ""))
    print(f"profiles: {run_dir / 'profiles'}  EMF: {run_dir / 'emf'}  logs: {run_dir / 'logs'}")
    from pipeline.local.runjson import read_run

    run_meta = read_run(run_dir)
    advice = demo_advice(result.profiles, workers, run=run_meta) if result.profiles else None
    if report:
        path = _write_report(run_dir, advice)
        if path:
            print(f"report:   {path}")
    _print_takeaways(result, advice, options, run_meta)
    if result.batch.failed:
        raise typer.Exit(result.batch.exit_code)


def run(
    input: str = typer.Option(..., metavar="s3://BUCKET/PREFIX/", help="The prefix the images are under."),
    output: str = typer.Option(..., metavar="s3://BUCKET/PREFIX/", help="The prefix the shards go to."),
    manifest: str | None = typer.Option(None, metavar="s3://BUCKET/KEY.jsonl", help="A manifest listing the images, "
                                        "one a line (default: list INPUT)."),
    images_per_child: int = typer.Option(5, min=1, max=MAX_IMAGES_PER_CHILD, metavar="N", help="Images each array "
                                         "child takes."),
    workers: int = typer.Option(default_workers(), min=1, max=MAX_WORKERS, show_default=False,
                                metavar="N", help="Children running at once (default: one per core)."),
    s3_endpoint: str | None = typer.Option(None, metavar="URL", help="S3 endpoint URL (default: "
                                           "AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else AWS)."),
    run_dir: Path = typer.Option(Path(".iobatch/run"), metavar="DIR", help="Where profiles, EMF and logs go."),
    scratch: Path | None = typer.Option(None, metavar="DIR", help="Scratch root (default RUN_DIR/scratch)."),
    train_size: str = typer.Option("512x384", metavar="WxH", help=f"WIDTHxHEIGHT of the training images, each side "
                                   f"{MIN_TRAIN_SIDE} to {MAX_TRAIN_SIDE}."),
    force: bool = typer.Option(False, help="Redo children whose _SUCCESS marker exists."),
    skip_bad_images: bool = typer.Option(False, help="Record undecodable images in the index instead of failing."),
    progress: bool | None = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a TTY)."),
    contract: Path | None = typer.Option(None, metavar="FILE", help="Contract rules every child's profiler evaluates "
                                         "per stage."),
    process_command: str = typer.Option(DEFAULT_PROCESS_COMMAND, metavar="COMMAND",
                                        show_default=False, help=checks.PROCESS_COMMAND_HELP),
) -> None:
    """Run a batch on this machine against any S3 endpoint, with the local executor."""
    from pipeline.local.runner import LocalRun, prepared_run_dir, run_local
    from profiling import runfiles

    # Every flag is checked before S3 is touched or the run directory is emptied.
    input_uri = S3Uri.parse(input, what="--input").as_prefix()
    output_uri = S3Uri.parse(output, what="--output").as_prefix()
    manifest_uri = parse_manifest_uri(manifest, what="--manifest") if manifest else None
    check_output_outside_input(input_uri, output_uri, listed=manifest_uri is None)
    local = LocalRun(input=input_uri, output=output_uri, manifest=manifest_uri,
                     endpoint=checks.endpoint_url(s3_endpoint, client="s3"),
                     run_dir=checks.output_dir(run_dir, "--run-dir"),
                     images_per_child=images_per_child, workers=workers,
                     scratch_root=checks.output_dir(scratch, "--scratch") if scratch else None, force=force,
                     skip_bad_images=skip_bad_images, train_size=parse_train_size(train_size, what="--train-size"),
                     contract=_checked_contract(contract),
                     process_command=checks.process_command(process_command))
    with prepared_run_dir(run_dir):
        result = run_local(local, progress=progress)
    _print_batch(result, list(runfiles.read_profiles(run_dir)),
                 f"per-stage profile of {counted(result.children, 'child', 'children')}")
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
  {ENV.PROCESS_COMMAND:<26} the process stage's command line (default '{DEFAULT_PROCESS_COMMAND}')
  {ENV.S5CMD_WORKERS:<26} s5cmd --numworkers for the download (default 16)
  {ENV.S5CMD_RETRIES:<26} s5cmd --retry-count for throttling and network errors (0 to {MAX_S5CMD_RETRIES}; default 10)
  {ENV.PROFILER_SOCKET:<26} the sidecar's socket (default <child scratch>/{SOCKET_NAME}); off: none
  {ENV.PIPELINE:<26} the Pipeline dimension of the metrics (default iobatch)
  {ENV.VOLUME_TYPE:<26} reported with the metrics (st1, gp3, ...)
  {ENV.TASK_ID:<26} names this attempt's scratch directory and socket (AWS: from the task metadata)
  {ENV.TIMEOUT_S:<26} the attempt's timeout: the job stops itself before it
  {ENV.REQUIRE_PREPARED_SCRATCH} 1: the scratch volume must carry the host's prepared marker
  {ENV.INTERPOSE:<26} 1: record the calls of the job and its programs (LD_PRELOAD interposer)
  {ENV.CONTRACT:<26} read by the profiler, not the job: the contract it evaluates per stage
  {ENV.ATTEMPT:<26} the attempt number (set by AWS Batch)
  {ENV.ECS_METADATA} the task metadata endpoint (set by ECS)

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


PROCESS_HELP = f"""The built-in process command, the process stage's default ('{DEFAULT_PROCESS_COMMAND}'): decode
the images in IN, resize them to the training size, normalise them, and write OUT/shard.tar (WebDataset-style,
deterministic) and OUT/index.json.

Run by the job, it names each sample by its S3 key and checks each image's bytes against the batch's ETag, from
the file in {PROCESS_ENV.IMAGES}; by hand, on any folder, it names them by file name.

\b
Your own command takes the same two directories (see README, "Your own processing"); the job sets for it
  {PROCESS_ENV.CHILD:<26} the child's name, part-NNNNN
  {PROCESS_ENV.IMAGES:<26} a JSON Lines file: {{"file", "key", "size", "etag"}} per image
  {SUBSTAGE_SOCKET_ENV:<26} the profiler's socket, to announce sub-stages (unset: not profiled)
beside the job's own variables ({ENV.TRAIN_SIZE}, {ENV.SKIP_BAD_IMAGES}, ...).

{EXIT_CODES_HELP}"""


def process(
    input_dir: Path = typer.Argument(..., metavar="IN", help="The folder of images."),
    output_dir: Path = typer.Argument(..., metavar="OUT", help="Where the shard and its index go (created)."),
    train_size: str | None = typer.Option(None, metavar="WxH", show_default=False,
                                          help=f"WIDTHxHEIGHT of the training images (default ${ENV.TRAIN_SIZE}, "
                                          "else 512x384)."),
    skip_bad_images: bool | None = typer.Option(None, "--skip-bad-images/--no-skip-bad-images", show_default=False,
                                                help=f"Record undecodable images in the index instead of failing "
                                                f"(default ${ENV.SKIP_BAD_IMAGES})."),
) -> None:
    import errno
    import json
    import os

    from pipeline.errors import PermanentError, ScratchError
    from pipeline.imaging import process_directory
    from pipeline.process import check_md5, read_images_file
    from pipeline.settings import env_yes

    size = parse_train_size(train_size, what="--train-size") if train_size else \
        parse_train_size(os.environ.get(ENV.TRAIN_SIZE) or "512x384")
    skip = env_yes(os.environ, ENV.SKIP_BAD_IMAGES) if skip_bad_images is None else skip_bad_images
    if not input_dir.is_dir():
        raise UsageError(f"IN {input_dir} is not a folder: give the folder of images")
    checks.output_dir(output_dir, "OUT")
    checks.not_an_input(output_dir, "OUT", [input_dir])
    images_path = os.environ.get(PROCESS_ENV.IMAGES)
    try:
        images = read_images_file(Path(images_path)) if images_path else None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{PROCESS_ENV.IMAGES}={images_path}: cannot be read ({exc}): unset it to name "
                         "images by file name") from None
    if images is None and next(input_dir.iterdir(), None) is None:
        raise UsageError(f"IN {input_dir} holds no files: give the folder of images (an empty shard is no shard)")
    input_uri = os.environ.get(ENV.INPUT, "")
    bucket = S3Uri.parse(input_uri, what=ENV.INPUT).bucket if input_uri else "?"
    try:
        result = process_directory(input_dir, output_dir, images=images, size=size, skip_bad_images=skip,
                                   child=os.environ.get(PROCESS_ENV.CHILD, ""),
                                   check=lambda row, data: check_md5(str(row["key"]), data, row.get("etag"),
                                                                     bucket=bucket))
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise ScratchError(f"{output_dir} is on a full volume: free space, or give it a bigger one") from None
        if exc.filename is None or not Path(exc.filename).is_relative_to(input_dir):
            raise
        raise PermanentError(f"IN {input_dir}: image {Path(exc.filename).name} cannot be read ({exc.strerror}): "
                             "give a folder of image files") from None
    for bad in result.skipped:
        print(json.dumps({"event": "bad_image", "key": bad["key"], "error": bad["error"]}), flush=True)
    print(json.dumps({"event": "processed", "images": result.images, "bad_images": len(result.skipped),
                      "bytes": result.shard_bytes + result.index_bytes}), flush=True)
