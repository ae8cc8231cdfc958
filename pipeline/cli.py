"""`iobatch`: the commands a person types, and the container entrypoints.

Each command is a thin layer: it parses flags, calls the module that does the work, and turns known
errors (pipeline.errors) into one line on stderr and a documented exit code.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import typer

from pipeline.errors import EXIT_PERMANENT, EXIT_RETRYABLE, EXIT_USAGE, IobatchError, UsageError
from pipeline.settings import ENV, JobSettings, S3Uri, default_workers, parse_train_size

EXIT_CODES_HELP = (
    f"Exit codes: 0 ok; {EXIT_USAGE} bad flag or variable; {EXIT_PERMANENT} bad input (permanent, not "
    f"retried); {EXIT_RETRYABLE} transient fault (throttling, network, interrupted: retried); 1 a bug."
)

app = typer.Typer(
    name="iobatch",
    help="Run data-heavy ML preprocessing on AWS Batch (or this machine) and see its I/O, stage by stage.\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

F = TypeVar("F", bound=Callable[..., Any])


def fail(headline: str, code: int) -> None:
    """Print one error line and exit with `code`."""
    print(f"error: {headline}", file=sys.stderr, flush=True)
    raise typer.Exit(code)


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def handles_errors(func: F) -> F:
    """Known errors become one line and their exit code; anything else keeps its traceback.

    SIGTERM is treated as Ctrl-C, so every `with` block (the S3 server, the children) cleans up.
    """

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        try:
            return func(*args, **kwargs)
        except IobatchError as exc:
            fail(exc.headline, exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_RETRYABLE)

    return wrapper  # type: ignore[return-value]


# ---- the pipeline: demo, run, job (pipeline/local, pipeline/job.py) --------------------------------


def _exit_code_of(failed: list[tuple[int, int, str]]) -> int:
    """A failed batch exits 65 if any child failed permanently, else 75 (a rerun can complete it)."""
    codes = {code for _, code, _ in failed}
    return EXIT_PERMANENT if EXIT_PERMANENT in codes else EXIT_RETRYABLE


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


def _demo_advice(profiles: list[Any], workers: int) -> Any | None:
    """The advisor on the demo's own profiles, taking this machine as one instance that runs `workers`
    children at once, back to back all day (the heaviest use of its volume's burst credits)."""
    from profiling.metrics import median
    from tuning.advise import AdviseError, Plan, advise

    per_child: dict[str, float] = {}
    for profile in profiles:
        key = profile.properties.get("ArrayIndex", "")
        per_child[key] = per_child.get(key, 0.0) + profile.duration_s
    if not per_child:
        return None
    child_s = max(1.0, median(list(per_child.values())))
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    plan = Plan(jobs_per_instance=workers, memory_gib=round(memory_gib, 1),
                jobs_per_day=max(1, int(workers * 86400 / child_s)))
    try:
        return advise(profiles, plan)
    except (AdviseError, ValueError) as exc:
        print(f"advice:   not given ({exc})")
        return None


def _write_report(run_dir: Path, advice: Any | None = None) -> Path | None:
    from profiling.report import ReportInputError, write_report

    try:
        return write_report(run_dir, advice=advice)
    except ReportInputError as exc:
        print(f"report:   not written ({exc})")
        return None


@app.command()
@handles_errors
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
    from pipeline.local.demo import DemoOptions, run_demo

    options = DemoOptions(images=images, image_mib=image_mib, images_per_child=images_per_child, workers=workers,
                          run_dir=run_dir, scratch_root=scratch, s3_endpoint=s3_endpoint, slow_child=slow_child,
                          report=report, seed=seed, contract=_checked_contract(contract))
    result = run_demo(options, progress=progress)
    _print_batch(result.batch, result.profiles, f"per-stage profile of {result.batch.children} children "
                 "(durations and rates: median per child; bytes and calls: totals)")
    print(f"outputs:  {result.output}" + (f"  (as files: {result.output_dir})" if result.output_dir else ""))
    print(f"profiles: {run_dir / 'profiles'}  EMF: {run_dir / 'emf'}  logs: {run_dir / 'logs'}")
    if report:
        path = _write_report(run_dir, _demo_advice(result.profiles, workers))
        if path:
            print(f"report:   {path}")
    if result.batch.failed:
        raise typer.Exit(_exit_code_of(result.batch.failed))


@app.command()
@handles_errors
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
    from pipeline.local.demo import LocalRun, prepare_run_dir, run_local
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
        raise typer.Exit(_exit_code_of(result.failed))


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
  {ENV.PROFILER_SOCKET:<26} the sidecar's socket (default <child scratch>/profiler.sock); off: none
  {ENV.PIPELINE:<26} the Pipeline dimension of the metrics (default iobatch)
  {ENV.VOLUME_TYPE:<26} reported with the metrics (st1, gp3, ...)

{EXIT_CODES_HELP}"""


@app.command(help=JOB_HELP)
def job() -> None:
    from pipeline.job import main as job_main

    try:
        settings = JobSettings.from_env()
    except IobatchError as exc:
        fail(exc.headline, exc.exit_code)
    raise typer.Exit(job_main(settings))


# ---- profiling: profile, sidecar (profiling/) -------------------------------------------------------


def _profiling_device(path: str | None, fallback: Any = None) -> Any:
    """The BlockDevice behind `path` (or `fallback`), printing a notice when none backs it."""
    from profiling.probes.procfs import DeviceError, device_of

    target = path or fallback
    if target is None:
        return None
    try:
        device, notice = device_of(Path(target))
    except DeviceError as exc:
        raise UsageError(f"--device: {exc}") from None
    if notice:
        print(f"notice: {notice}", file=sys.stderr, flush=True)
    return device


def _profiling_interval(interval: float) -> float:
    from profiling.sidecar import check_interval

    try:
        return check_interval(interval)
    except ValueError as exc:
        raise UsageError(f"--interval: {exc}") from None


def _job_identity(environ: dict[str, str]) -> tuple[dict[str, str], Path | None, Path]:
    """(EMF properties, default socket, default scratch dir) from the job's environment.

    The sidecar does not need the job's S3 settings, so it falls back to the raw variables when the
    full JobSettings cannot be built.
    """
    from pipeline.settings import DEFAULT_SCRATCH, ENV, JobSettings, child_name
    from profiling.sidecar import instance_identity

    try:
        settings = JobSettings.from_env(environ)
        index, job_id, pipeline, volume = (settings.array_index, settings.job_id, settings.pipeline,
                                           settings.volume_type)
        socket_path: Path | None = settings.socket_path
        work_dir = settings.work_dir
    except UsageError:
        raw_index = environ.get(ENV.ARRAY_INDEX, "0") or "0"
        raw_offset = environ.get(ENV.ARRAY_OFFSET, "0") or "0"
        index = int(raw_index) + int(raw_offset) if (raw_index + raw_offset).isdigit() else 0
        job_id = environ.get(ENV.JOB_ID) or "local"
        pipeline = environ.get(ENV.PIPELINE) or "iobatch"
        volume = environ.get(ENV.VOLUME_TYPE) or "unknown"
        work_dir = Path(environ.get(ENV.SCRATCH) or DEFAULT_SCRATCH) / child_name(index)
        raw_socket = environ.get(ENV.PROFILER_SOCKET, "").strip()
        socket_path = Path(raw_socket) if raw_socket else work_dir / "profiler.sock"
    instance_id, instance_type = instance_identity(environ)
    properties = {"Pipeline": pipeline, "JobId": job_id, "ArrayIndex": str(index), "InstanceId": instance_id,
                  "InstanceType": instance_type, "VolumeType": volume}
    return properties, socket_path, work_dir


@app.command()
@handles_errors
def sidecar(
    socket_path: Path | None = typer.Option(None, "--socket", help="Unix socket to serve (default: "
                                               "$IOBATCH_PROFILER_SOCKET or <scratch>/<child>/profiler.sock)."),
    emf: str = typer.Option("-", "--emf", help="EMF output file, or - for stdout (what CloudWatch reads)."),
    profile_out: Path | None = typer.Option(None, "--profile-out", help="Append profile JSON lines here."),
    interval: float = typer.Option(1.0, "--interval", help="Seconds between samples (0.1 to 60)."),
    device: str | None = typer.Option(None, "--device", help="Block device (or a path on it) to sample."),
    scratch_dir: Path | None = typer.Option(None, "--scratch-dir", help="The job's working directory; "
                                               "its block device is sampled (default: the child's work dir)."),
    namespace: str = typer.Option("", "--namespace", help="EMF namespace (default $AWS_EMF_NAMESPACE or IoBatch)."),
    contract: Path | None = typer.Option(None, "--contract", help="Contract rules evaluated per stage."),
    call_probes: bool = typer.Option(True, "--call-probes/--no-call-probes", help="Per-call latency probes "
                                     "(eBPF when root, LD_PRELOAD records) beside the kernel counters."),
) -> None:
    """Profile the job beside it: one StageProfile and one EMF document per stage (container entrypoint).

    Exits 0 after the job's job_end, when the job closes the socket, or on SIGTERM (the running stage is
    flushed as interrupted). It never makes the job fail.
    """
    import os

    from profiling.emf import sink_for
    from profiling.metrics import DEFAULT_NAMESPACE
    from profiling.sidecar import Sidecar, SidecarConfig

    properties, default_socket, work_dir = _job_identity(dict(os.environ))
    target = socket_path or default_socket
    if target is None:
        raise UsageError("no socket: give --socket PATH or set IOBATCH_PROFILER_SOCKET")
    scratch = scratch_dir or work_dir
    if device is None and not scratch.exists():
        scratch.mkdir(parents=True, exist_ok=True)
    config = SidecarConfig(
        socket_path=target,
        emf_sink=sink_for(emf),
        profile_out=profile_out,
        interval_s=_profiling_interval(interval),
        device=_profiling_device(device, scratch),
        scratch_dir=scratch,
        namespace=namespace or os.environ.get("AWS_EMF_NAMESPACE") or DEFAULT_NAMESPACE,
        properties=properties,
        contract_path=contract,
        call_probes=call_probes,
    )
    server = Sidecar(config)
    server.install_sigterm()
    try:
        server.bind()
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot serve the profiler socket {target}: {exc}") from None
    server.serve()


@app.command(context_settings={"allow_interspersed_args": False})
@handles_errors
def profile(
    command: list[str] = typer.Argument(..., help="The command to profile, after --."),
    interval: float = typer.Option(1.0, "--interval", help="Seconds between samples (0.1 to 60)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the profile JSON (schema 1) here."),
    emf: str | None = typer.Option(None, "--emf", help="Write the EMF document here (- for stdout)."),
    device: str | None = typer.Option(None, "--device", help="Block device (or a path on it) to sample "
                                         "(default: the current directory's)."),
    contract: Path | None = typer.Option(None, "--contract", help="Contract rules to evaluate."),
) -> None:
    """Run a command as one profiled stage and print its I/O table; exits with the command's code.

    Exact bytes and call counts for any binary (Python, C, static Go such as s5cmd): they come from the
    kernel's /proc counters, not from hooking the program.
    """
    import dataclasses
    import json
    import os

    from rich.console import Console

    from profiling.contract import format_results
    from profiling.emf import emit_profile, sink_for
    from profiling.probes.callstats import with_calls
    from profiling.probes.ebpf import start_command_probe
    from profiling.sidecar import CommandNotFound, load_contract_hook, profile_command
    from profiling.table import profile_row, render_stage_table

    properties, _, _ = _job_identity(dict(os.environ))
    dev = _profiling_device(device, Path.cwd())
    step = _profiling_interval(interval)
    try:
        loaded, evaluate = load_contract_hook(contract)
    except ValueError as exc:
        raise UsageError(f"--contract: {exc}") from None
    # With a contract, per-call figures (latency) come from eBPF on the command's process tree when root.
    call_probe = start_command_probe(_profile_notice) if evaluate is not None else None
    try:
        result = profile_command(command, interval_s=step, device=dev, properties=properties)
    except CommandNotFound as exc:
        raise UsageError(str(exc)) from None
    finally:
        calls = call_probe.stop() if call_probe is not None else None
    prof = with_calls(result.profile, "ebpf", calls)
    if evaluate is not None:
        prof = dataclasses.replace(prof, contract=list(evaluate(loaded, prof)))
    if json_out is not None:
        json_out.write_text(json.dumps(prof.to_dict(), indent=1) + "\n", encoding="utf-8")
    if emf is not None:
        emit_profile(prof, sink_for(emf))
    title = f"{' '.join(command)[:60]} ({prof.outcome}, exit {result.returncode}; device {prof.device or '-'})"
    console = Console(stderr=emf == "-", width=None if sys.stdout.isatty() else 160)
    console.print(render_stage_table({prof.stage: profile_row(prof)}, title))
    if evaluate is not None:
        console.print(f"contract {contract}: values at or above each rule's threshold, per time frame",
                      highlight=False)
        for line in format_results(prof.contract):
            console.print(f"  {line}", highlight=False, markup=False)
    raise typer.Exit(result.returncode)


def _profile_notice(text: str) -> None:
    print(f"note: {text}", file=sys.stderr, flush=True)


# ---- submission: submit, status (pipeline/submit.py) ------------------------------------------------


def _print_json(body: Any) -> None:
    import json

    print(json.dumps(body, separators=(",", ":")), flush=True)


@app.command()
@handles_errors
def submit(
    manifest: str | None = typer.Option(None, "--manifest", help="s3://bucket/key.jsonl: one image a line; "
                                        "keys are in the stack's input bucket (--local: the manifest's bucket)."),
    prefix: str | None = typer.Option(None, "--prefix", help="s3://bucket/images/: every image under it."),
    images_per_job: int | None = typer.Option(None, "--images-per-job", "-k", help="Images per array child."),
    stack: str | None = typer.Option(None, "--stack", help="Deployed stack: queue, job definition, buckets."),
    local: bool = typer.Option(False, "--local", help="Run on this machine with the local executor."),
    output: str | None = typer.Option(None, "--output", help="s3://bucket/prefix/ for the shards "
                                      "(default: the stack's output bucket /<batch name>/)."),
    force: bool = typer.Option(False, "--force", help="Redo children whose _SUCCESS marker exists."),
    s3_endpoint: str | None = typer.Option(None, "--s3-endpoint", help="Another S3 (default: AWS, or the "
                                           "embedded server with --local)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and plan; write and submit nothing."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="--local: run directory "
                                        "(default .iobatch/local/<batch name>)."),
    workers: int | None = typer.Option(None, "--workers", help="--local: children at once (default: cores)."),
) -> None:
    """Submit a batch: freeze its manifest once, then one array job per 10,000 children.

    Every input is checked before anything is submitted. Children whose outputs are complete are
    skipped unless --force, so submitting the same manifest twice processes nothing twice.
    """
    from pipeline import submit as submission

    if images_per_job is None:
        raise UsageError("--images-per-job is missing: give K, the images each array child processes")
    if (stack is None) == (not local):
        raise UsageError("give exactly one of --stack NAME (AWS Batch) or --local (this machine)")
    common: dict[str, Any] = dict(manifest=manifest, prefix=prefix, images_per_child=images_per_job,
                                  output=output, force=force, s3_endpoint=s3_endpoint, dry_run=dry_run)
    if stack is not None:
        result = submission.submit_to_stack(stack=stack, **common)
        if as_json:
            _print_json(result.to_json())
        else:
            print("\n".join(result.lines()), flush=True)
        return
    result, outcome = submission.submit_local(run_dir=run_dir, workers=workers,
                                              progress=None if not as_json else False, **common)
    body = result.to_json()
    if outcome is not None:
        body["local"] = {"runDir": str(outcome.run_dir), "succeeded": outcome.succeeded,
                         "skipped": outcome.skipped, "elapsedS": round(outcome.elapsed_s, 3),
                         "failed": [{"index": i, "exitCode": c, "headline": h} for i, c, h in outcome.failed]}
    if as_json:
        _print_json(body)
    else:
        lines = result.lines()[:2]
        if outcome is not None:
            lines.append(f"ran locally in {outcome.elapsed_s:.1f} s: {outcome.succeeded} succeeded, "
                         f"{outcome.skipped} skipped (already complete), {len(outcome.failed)} failed; "
                         f"run directory {outcome.run_dir}")
            lines += [f"failed child {i}: exit {c}: {h}" for i, c, h in outcome.failed]
        else:
            lines += result.lines()[2:]
        print("\n".join(lines), flush=True)
    if outcome is not None and outcome.failed:
        codes = {c for _, c, _ in outcome.failed}
        raise typer.Exit(EXIT_RETRYABLE if EXIT_RETRYABLE in codes else EXIT_PERMANENT)


@app.command()
@handles_errors
def status(
    job_ids: list[str] = typer.Argument(..., help="The job id(s) `iobatch submit` printed."),
    watch: bool = typer.Option(False, "--watch", help="Follow until every child has finished."),
    as_json: bool = typer.Option(False, "--json", help="JSON on stdout (one line per poll with --watch)."),
    interval: float = typer.Option(10.0, "--interval", help="Seconds between polls with --watch."),
) -> None:
    """Children pending, runnable, starting, running, succeeded and failed; images done; failed children.

    Exit 0 when the status was read; with --watch, 65 if the batch finished with failed children.
    """
    import boto3

    from pipeline import submit as submission

    if interval <= 0:
        raise UsageError(f"--interval is {interval}: give a number of seconds above 0")
    session = boto3.session.Session()
    submission.require_credentials(session)
    _, batch = submission.aws_clients(session)

    def show(state: submission.BatchStatus) -> None:
        if as_json:
            _print_json(state.to_json())
        else:
            print("\n".join(state.lines()), flush=True)

    if not watch:
        show(submission.poll_status(batch, job_ids))
        return
    if sys.stdout.isatty() and not as_json:
        bar, update = submission.progress_view(0)
        with bar:
            final = submission.follow(batch, job_ids, interval_s=interval, emit=update)
        print("\n".join(final.lines()), flush=True)
    else:
        final = submission.follow(batch, job_ids, interval_s=interval, emit=show)
    if final.count("FAILED"):
        raise typer.Exit(EXIT_PERMANENT)

# ---- report (profiling/report.py) -------------------------------------------------------------------


def _read_advice(path: Path | None) -> Any:
    import json

    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--advice {path}: cannot read it ({exc.strerror}): give a JSON file") from None
    except ValueError as exc:
        raise UsageError(f"--advice {path} is not JSON ({exc}): give the JSON the advisor wrote") from None


def _cloudwatch_report(log_group: str, out: Path, since: str, namespace: str, region: str | None,
                       logs_endpoint: str | None, advice: Any) -> Path:
    import os

    import boto3
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
    )

    from pipeline.errors import EndpointUnreachable
    from profiling.report import parse_since, write_report_from_cloudwatch

    since_s = parse_since(since)
    try:
        # AWS_REGION is what Batch and most tools set; boto3 itself reads only AWS_DEFAULT_REGION.
        region = region or os.environ.get("AWS_REGION") or None
        client = boto3.client("logs", region_name=region, endpoint_url=logs_endpoint)
        return write_report_from_cloudwatch(client, log_group, out, since_s=since_s, namespace=namespace,
                                            advice=advice)
    except NoRegionError:
        raise UsageError("no AWS region: pass --region or set AWS_REGION") from None
    except NoCredentialsError:
        raise UsageError("no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY") from None
    except EndpointConnectionError as exc:
        raise EndpointUnreachable(f"CloudWatch Logs endpoint does not answer ({exc}): check --region, "
                                  "--logs-endpoint and the network") from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "ResourceNotFoundException":
            raise UsageError(f"log group {log_group} does not exist in this region: check --from-cloudwatch "
                             "and --region (the stack's output names the group)") from None
        raise UsageError(f"CloudWatch Logs refused the read ({error.get('Code')}: {error.get('Message')}): "
                         "check the credentials' logs:FilterLogEvents permission") from None
    except BotoCoreError as exc:
        raise EndpointUnreachable(f"CloudWatch Logs read failed ({exc}): retry") from None


@app.command()
@handles_errors
def report(
    run_dir: Path | None = typer.Argument(None, help="A local run directory (default .iobatch/demo)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="The HTML file (default RUN_DIR/report.html, "
                                    "or ./report.html with --from-cloudwatch)."),
    from_cloudwatch: str | None = typer.Option(None, "--from-cloudwatch", metavar="LOG_GROUP",
                                               help="Read the EMF documents of a batch in AWS from this "
                                               "CloudWatch Logs group instead of a run directory."),
    since: str = typer.Option("1h", help="With --from-cloudwatch: how far back to read (90s, 30m, 1h, 2d)."),
    namespace: str = typer.Option("IoBatch", help="With --from-cloudwatch: the EMF namespace to keep."),
    region: str | None = typer.Option(None, help="With --from-cloudwatch: the AWS region (default: AWS_REGION, "
                                      "then AWS_DEFAULT_REGION)."),
    logs_endpoint: str | None = typer.Option(None, help="With --from-cloudwatch: a CloudWatch Logs endpoint "
                                             "other than AWS's (e.g. a local emulator)."),
    advice: Path | None = typer.Option(None, help="A JSON recommendation (from the advisor) to show in the report."),
) -> None:
    """Write the HTML report of a run: per-stage plots, a timeline per child, bad apples, contract rule
    results and the advisor's recommendation. The file opens offline (plotly.js is embedded)."""
    from pipeline.errors import PermanentError
    from profiling.report import DamagedInputError, ReportInputError, write_report

    given = _read_advice(advice)
    try:
        if from_cloudwatch is not None:
            if run_dir is not None:
                raise UsageError("give a run directory or --from-cloudwatch LOG_GROUP, not both")
            path = _cloudwatch_report(from_cloudwatch, out or Path("report.html"), since, namespace, region,
                                      logs_endpoint, given)
        else:
            path = write_report(run_dir or Path(".iobatch/demo"), out, advice=given)
    except DamagedInputError as exc:
        raise PermanentError(str(exc)) from None
    except ReportInputError as exc:
        raise UsageError(str(exc)) from None
    print(f"report: {path}")


# ---- tuning: advise, lab (tuning/) ------------------------------------------------------------------


def _need(value: Any, flag: str, example: str) -> Any:
    if value is None:
        raise UsageError(f"{flag} is missing: give it, e.g. {flag} {example}")
    return value


@app.command()
@handles_errors
def advise(
    inputs: list[Path] = typer.Argument(None, help="Run directories, profile .jsonl files or EMF files "
                                        "(local, or downloaded from CloudWatch Logs)."),
    jobs_per_instance: int | None = typer.Option(None, help="Jobs running at once on one instance "
                                                 "(vCPUs / vcpusPerJob)."),
    memory_gib: float | None = typer.Option(None, help="The instance type's memory in GiB."),
    jobs_per_day: int | None = typer.Option(None, help="Jobs per instance per day (each instance has its own "
                                            "scratch volume)."),
    instance_ebs_mibps: float | None = typer.Option(None, help="The instance type's EBS bandwidth cap in MiB/s."),
    kernel: str | None = typer.Option(None, help="The hosts' `uname -r`, to validate mount options "
                                      "(default: a current kernel)."),
    candidate: list[str] = typer.Option([], "--candidate", "-C", help="A volume to compare, repeatable: "
                                        "TYPE:SIZE_GIB[:iops=N][:throughput=MIBPS], e.g. st1:500, gp3:200:"
                                        "throughput=250. Default: st1, sc1, gp2 and gp3 sized for the data."),
    cache_budget_pct: float = typer.Option(40.0, help="Share of instance memory the write cache may hold."),
    io_size_kib: int | None = typer.Option(None, help="Block I/O size to assume instead of the measured one."),
    as_json: bool = typer.Option(False, "--json", help="Print the advice as JSON."),
) -> None:
    """Recommend a scratch volume, write-cache settings and mount options from a run's profiles, and print
    the CDK context that applies them."""
    import json

    from tuning.advise import AdviseError, Plan, load_profiles, parse_candidate, render
    from tuning.advise import advise as make_advice
    from tuning.ebs import VolumeError
    from tuning.host import HostTuningError

    try:
        plan = Plan(
            jobs_per_instance=_need(jobs_per_instance, "--jobs-per-instance", "4"),
            memory_gib=_need(memory_gib, "--memory-gib", "16"),
            jobs_per_day=_need(jobs_per_day, "--jobs-per-day", "500"),
            instance_ebs_mibps=instance_ebs_mibps, kernel_release=kernel, cache_budget_pct=cache_budget_pct,
            io_size_kib=io_size_kib)
        volumes = [parse_candidate(text) for text in candidate]
        profiles = load_profiles(list(inputs or []))
        result = make_advice(profiles, plan, volumes or None)
    except (AdviseError, VolumeError, HostTuningError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read the profiles ({exc}): give readable run directories or files") from None
    if as_json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(render(result))


@app.command()
@handles_errors
def lab(
    volume: str = typer.Option("st1:500", help="The volume to emulate: TYPE:SIZE_GIB[:iops=N][:throughput=M]."),
    memory_gib: float = typer.Option(4.0, help="Act like an instance with this much memory: the dirty limits "
                                     "are set in bytes from it (dirty_bytes)."),
    workload: str = typer.Option("pipeline", help="pipeline (the demo batch on the lab volume) or writer "
                                 "(plain files, the same burst)."),
    workers: int = typer.Option(2, min=1, help="Children at once (like one task per core)."),
    images: int = typer.Option(40, min=1, help="Images in the batch."),
    image_mib: float = typer.Option(25.0, min=0.01, help="Approximate size of each image in MiB."),
    images_per_child: int = typer.Option(10, min=1, help="Images each child takes."),
    rounds: int = typer.Option(1, min=1, help="Default/tuned pairs to run, alternating."),
    dirty_ratio: int = typer.Option(30, help="Tuned vm.dirty_ratio (of the emulated memory)."),
    dirty_background_ratio: int = typer.Option(20, help="Tuned vm.dirty_background_ratio."),
    time_scale: float = typer.Option(1.0, min=1.0, help="Shrink the credit bucket by this factor, so hours "
                                     "of credits last minutes."),
    credits_gib: float | None = typer.Option(None, help="Credits at the start, at the real volume's scale "
                                             "(default: a full bucket)."),
    after_cliff: bool = typer.Option(False, "--after-cliff", help="Hold the credit bucket empty: the volume "
                                     "runs at baseline, as after the credit cliff under sustained load."),
    loop_size_mib: int = typer.Option(4096, help="Size of the lab file system (sparse)."),
    lab_dir: Path = typer.Option(Path("/var/tmp/iobatch-lab"), help="Backing file and mount point."),
    run_dir: Path = typer.Option(Path(".iobatch/lab"), help="Run directories (S3 data, profiles) per run; "
                                 "not on the lab volume."),
    recover_only: bool = typer.Option(False, "--recover", help="Only clean up after a lab that crashed."),
    as_json: bool = typer.Option(False, "--json", help="Print the runs as JSON."),
) -> None:
    """Emulate an st1 volume here (loop device + XFS + root blkio throttle following the credit bucket) and
    run a batch on it under the kernel's default and the tuned write cache. Root only; every setting it
    changes is restored on exit, Ctrl-C, SIGTERM, or by the next run after a crash."""
    import contextlib
    import dataclasses
    import json
    import time

    from tuning.advise import AdviseError, parse_candidate
    from tuning.ebs import GIB
    from tuning.host import KERNEL_DEFAULTS, HostTuning, HostTuningError
    from tuning.lab import Lab, LabConfig, LabError, LabInterrupted, LabRun, recover, render_comparison, write_files

    if recover_only:
        try:
            found = recover()
        except LabError as exc:
            raise UsageError(str(exc)) from None
        print("lab: cleaned up" if found else "lab: nothing to clean up")
        return
    if workload not in ("pipeline", "writer"):
        raise UsageError(f"--workload {workload!r} is not pipeline or writer")
    try:
        tuned = HostTuning(dirty_ratio=dirty_ratio, dirty_background_ratio=dirty_background_ratio)
        tuned.validate()
        config = LabConfig(volume=parse_candidate(volume), lab_dir=lab_dir, loop_size_mib=loop_size_mib,
                           time_scale=time_scale,
                           initial_credits_mib=None if credits_gib is None else credits_gib * 1024,
                           hold_empty=after_cliff)
        config.validate()
    except (AdviseError, HostTuningError, LabError) as exc:
        raise UsageError(str(exc)) from None
    def say(message: str) -> None:
        # With --json, stdout carries only the JSON.
        print(message, file=sys.stderr if as_json else sys.stdout, flush=True)

    memory = int(memory_gib * GIB)
    children = -(-images // images_per_child)
    burst_files = min(workers, children) * images_per_child
    runs: list[LabRun] = []
    try:
        with Lab(config, say=say) as the_lab:
            say(f"lab: emulating {memory_gib:g} GiB of memory; {workers} children at once, {images} images of "
                  f"~{image_mib:g} MiB, {images_per_child} per child ({children} children)")
            settings = [("default", KERNEL_DEFAULTS), ("tuned", tuned)] * rounds
            for number, (name, tuning) in enumerate(settings, 1):
                the_lab.drain()
                sysctls = the_lab.apply_cache(tuning, memory)
                before = the_lab.credits_gib
                start = time.monotonic()
                stages: dict[str, dict[str, float | None]] = {}
                writer = None
                if workload == "pipeline":
                    from pipeline.local.demo import DemoOptions, run_demo

                    scratch = the_lab.mount / f"run-{number}"
                    scratch.mkdir()
                    options = DemoOptions(images=images, image_mib=image_mib, images_per_child=images_per_child,
                                          workers=workers, run_dir=run_dir / f"run-{number}-{name}",
                                          scratch_root=scratch, report=False)
                    # With --json, progress lines go to stderr so stdout is only the JSON.
                    with contextlib.redirect_stdout(sys.stderr if as_json else sys.stdout):
                        result = run_demo(options, progress=False, say=lambda _: None)
                    stages = result.summary
                    if result.batch.failed:
                        raise UsageError(f"lab run {number} ({name}): {len(result.batch.failed)} children failed: "
                                         f"{result.batch.failed[0][2]}")
                writer = write_files(the_lab, files=burst_files, file_mib=image_mib, threads=min(workers, 8),
                                     subdir=f"writer-{number}")
                the_lab.check()
                runs.append(LabRun(name, sysctls, stages, time.monotonic() - start, before, the_lab.credits_gib,
                                   the_lab.limit_mibps, writer))
                say(f"lab: run {number} ({name}, {', '.join(f'{k}={v}' for k, v in sysctls.items())}) done in "
                      f"{time.monotonic() - start:.1f} s; credits {before:,.1f} -> {the_lab.credits_gib:,.1f} GiB")
    except LabError as exc:
        raise UsageError(str(exc)) from None
    except LabInterrupted:
        raise KeyboardInterrupt from None
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in runs], indent=1, default=str))
    else:
        print(render_comparison(runs))


def main() -> None:
    app(prog_name="iobatch")


if __name__ == "__main__":
    main()
