"""The demo: a synthetic training batch served by the embedded S3 server (or any S3), run end to end on this
machine by the local runner (pipeline/local/runner.py), with the per-stage summary, the advisor's view of the
run, and the lab's batch (the same synthetic batch on the lab volume).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline import s3 as s3io
from pipeline.errors import UsageError
from pipeline.interface import DEFAULT_PROCESS_COMMAND
from pipeline.local.dataset import DatasetSpec, generate
from pipeline.local.executor import BatchResult
from pipeline.local.runner import S3_DATA, LocalRun, machine_memory_gib, prepare_run_dir, run_local
from pipeline.local.s3server import EmbeddedS3
from pipeline.s5cmd import Copy, run_copies
from pipeline.settings import DEFAULT_TRAIN_SIZE, S3Uri, default_workers
from profiling import runfiles
from profiling.metrics import StageProfile, summarize

if TYPE_CHECKING:
    from tuning.advise import Advice
    from tuning.lab import ComparePlan, RunBatch
    from tuning.plan import Plan

INPUT_BUCKET = "iobatch-input"
OUTPUT_BUCKET = "iobatch-output"
CACHE_ENV = "IOBATCH_CACHE"


@dataclass(frozen=True)
class DemoOptions:
    """The demo's flags: the synthetic batch, the children at once, where the run goes."""

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
    process_command: str = DEFAULT_PROCESS_COMMAND  # the process stage (pipeline/process.py)
    # Write the staged dataset to disk (sync) before the children start. The lab sets it: a real S3 source
    # leaves no dirty pages on the instance, while the embedded server's copy of the dataset would share the
    # kernel's dirty limit with the download being measured (measured: BENCHMARKS.md, the advisor in the lab).
    settle_inputs: bool = False
    volume_type: str = "local"  # the profiles' VolumeType: the lab sets the type of the volume it emulates


@dataclass
class DemoResult:
    """A finished demo: the executor's outcome, where the outputs are, and the profiles and their summary."""

    run_dir: Path
    batch: BatchResult
    output: S3Uri
    output_dir: Path | None  # where the outputs are as files (embedded server only)
    summary: dict[str, dict[str, float | None]]
    profiles: list[StageProfile]
    report: Path | None = None


def dataset_cache(spec: DatasetSpec) -> Path:
    """Where the synthetic images of `spec` are kept between runs ($IOBATCH_CACHE, default .iobatch/cache)."""
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
    """Upload the synthetic images under `prefix` with s5cmd."""
    copies = [Copy(str(source / spec.key(i)), str(prefix.join(spec.key(i)))) for i in range(spec.images)]
    command_file = work / "upload-dataset.cmds"
    run_copies(copies, command_file=command_file, endpoint=endpoint, workers=16, env={**os.environ, **env})
    command_file.unlink()


def _ensure_bucket(s3: Any, name: str, endpoint: str | None) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    from pipeline.aws import s3_error

    try:
        existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
        if name not in existing:
            s3.create_bucket(Bucket=name)
    except (BotoCoreError, ClientError) as exc:
        raise s3_error(exc, what=f"bucket {name} at {endpoint or 'AWS'}") from None


def run_demo(options: DemoOptions, *, progress: bool | None = None, say: Callable[[str], None] = print) -> DemoResult:
    """Generate a training batch, serve it from the embedded S3 server, and run it end to end."""
    if options.images < 1 or options.image_mib <= 0 or options.images_per_child < 1 or options.workers < 1:
        raise UsageError("--images, --image-mib, --images-per-child and --workers must all be positive")
    if options.slow_child is not None and not 0 <= options.slow_child < -(-options.images // options.images_per_child):
        raise UsageError(f"--slow-child {options.slow_child} is not a child of this batch: give 0 to "
                         f"{-(-options.images // options.images_per_child) - 1}")
    if options.slow_child is not None and (options.s3_endpoint or "").strip().lower().startswith("https:"):
        raise UsageError("--slow-child throttles its child through a TCP proxy on 127.0.0.1, which an https "
                         "endpoint's certificate does not name: give an http:// --s3-endpoint, or leave out "
                         "--slow-child")
    run_dir = options.run_dir
    prepare_run_dir(run_dir)
    runfiles.write_run(run_dir, {"demo": True, "started": time.time()})
    spec = DatasetSpec(options.images, options.image_mib, options.seed)
    cache = dataset_cache(spec)
    width, height = spec.dimensions()
    say(f"dataset: {spec.images} synthetic camera images of {width}x{height} (~{spec.image_mib:g} MiB each) "
        f"in {cache}")
    _generate_with_progress(spec, cache, progress, say)

    def with_server(endpoint: str | None, env: Mapping[str, str], output_dir: Path | None) -> DemoResult:
        s3 = s3io.client(endpoint, env)
        for bucket in (INPUT_BUCKET, OUTPUT_BUCKET):
            _ensure_bucket(s3, bucket, endpoint)
        images = S3Uri(INPUT_BUCKET, "images/")
        output = S3Uri(OUTPUT_BUCKET, "train/")
        upload_dataset(spec, cache, images, endpoint, run_dir, env)
        if options.settle_inputs:
            os.sync()
        say(f"uploaded to {images}; outputs go to {output}")
        run = LocalRun(input=images, output=output, endpoint=endpoint, run_dir=run_dir,
                       images_per_child=options.images_per_child, workers=options.workers,
                       scratch_root=options.scratch_root, env=env, slow_child=options.slow_child,
                       sidecar=options.sidecar, train_size=options.train_size, force=True, contract=options.contract,
                       process_command=options.process_command, volume_type=options.volume_type,
                       job_id=f"demo-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
        batch = run_local(run, progress=progress, say=say)
        profiles = list(runfiles.read_profiles(run_dir))  # none when the sidecar was off
        return DemoResult(run_dir, batch, output, output_dir, summarize(profiles), profiles)

    if options.s3_endpoint:
        result = with_server(options.s3_endpoint, {}, None)
    else:
        data_dir = run_dir / S3_DATA
        with EmbeddedS3(data_dir, log_file=run_dir / "s3server.log") as server:
            result = with_server(server.endpoint, server.env(), data_dir / OUTPUT_BUCKET / "train")
    return result


def is_loopback(endpoint: str | None) -> bool:
    """Whether an S3 endpoint URL is on this host (the embedded server's, or LocalStack's): no network."""
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(endpoint or "").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_plan(profiles: list[StageProfile], run: Mapping[str, Any]) -> Plan | None:
    """The plan a local run implies, from its run.json: its children at once per instance, the memory of the
    machine it ran on, and that many children back to back all day (the heaviest use of a volume's burst
    credits); the S3 endpoint on this host means no network. None when run.json lacks the children at once.
    """
    from tuning.plan import Plan, back_to_back

    workers = run.get("workers")
    if not isinstance(workers, int) or workers < 1:
        return None
    jobs_per_day, child_s = back_to_back(profiles, workers)
    memory = run.get("memory_gib")
    memory_gib = float(memory) if isinstance(memory, int | float) and memory > 0 else machine_memory_gib()
    # No endpoint recorded: the demo's embedded server. A recorded None is AWS's own endpoint.
    endpoint = run.get("endpoint", "http://127.0.0.1")
    loopback = is_loopback(endpoint if isinstance(endpoint, str) else None)
    return Plan(jobs_per_instance=workers, memory_gib=memory_gib,
                jobs_per_day=jobs_per_day, network_loopback=loopback,
                assumed=f"this machine's run: {workers} children at once, back to back all day at "
                        f"{child_s:.1f} s each")


def demo_advice(profiles: list[StageProfile], workers: int, *, say: Callable[[str], None] = print,
                run: Mapping[str, Any] | None = None) -> Advice | None:
    """The advisor on a local run's own profiles under local_plan (run.json `run`, else `workers` children at
    once with the embedded server's loopback endpoint).

    None when there are no profiles, or (said in one line) when the advisor cannot answer for this run.
    """
    from tuning.advise import advise
    from tuning.plan import AdviseError

    if not profiles:
        return None
    plan = local_plan(profiles, {**(run or {}), "workers": workers})
    if plan is None:
        return None
    try:
        return advise(profiles, plan)
    except (AdviseError, ValueError) as exc:
        say(f"advice:   not given ({exc})")
        return None


def run_advice(profiles: list[StageProfile], run: Mapping[str, Any] | None) -> Advice | None:
    """The advice the demo gives, for any local run directory's profiles and run.json (None when run.json does
    not say how many children ran at once, or the advisor cannot answer): `report` and `advise` of a run
    directory compute it the same way as the demo did."""
    workers = (run or {}).get("workers")
    if not isinstance(workers, int) or workers < 1:
        return None
    return demo_advice(profiles, workers, say=lambda _: None, run=run)


def lab_run_dir(run_dir: Path, number: int, setting: str) -> Path:
    """Where lab_batch keeps run `number` under `setting`: run-<number>-<setting>, a '/' in the setting's name
    (as in 30/20) read as '-'."""
    return run_dir / f"run-{number}-{setting.replace('/', '-')}"


def lab_dataset(plan: ComparePlan, *, say: Callable[[str], None] = print) -> Path:
    """Generate the lab batch's images here, before a guest boots, and return the cache root ($IOBATCH_CACHE) the
    guest reads them from through its root: generating them under emulation would take minutes."""
    spec = DatasetSpec(plan.images, plan.image_mib, DemoOptions.seed)
    _generate_with_progress(spec, dataset_cache(spec), None, say)
    return dataset_cache(spec).parent.resolve()


def lab_batch(plan: ComparePlan, run_dir: Path, *, stdout: TextIO | None = None, volume_type: str = "local",
              process_command: str = DEFAULT_PROCESS_COMMAND) -> RunBatch:
    """The lab's batch (tuning.lab.RunBatch): the demo's synthetic batch of `plan`'s shape on the lab volume.

    Run `number` under `setting` keeps its run directory (profiles, logs, EMF) in `run_dir`, off the lab volume;
    its profiles say they ran on `volume_type` (the emulated volume's, so the advisor judges that volume as
    measured, not as a what-if); the embedded server's data (the dataset and the outputs, twice the batch's
    bytes) is deleted once the run succeeded, so a loop of many runs does not fill the disk (a failed run keeps
    it). Each child's process stage runs `process_command`. The children's lines go to `stdout` (default:
    this process's). A run with failed children is a UsageError, so the comparison stops
    rather than compare broken runs.
    """

    def run_batch(number: int, setting: str, scratch: Path) -> dict[str, dict[str, float | None]]:
        options = DemoOptions(images=plan.images, image_mib=plan.image_mib, images_per_child=plan.images_per_child,
                              workers=plan.workers, run_dir=lab_run_dir(run_dir, number, setting),
                              scratch_root=scratch, report=False, settle_inputs=True, volume_type=volume_type,
                              process_command=process_command)
        with contextlib.redirect_stdout(stdout or sys.stdout):
            result = run_demo(options, progress=False, say=lambda _: None)
        if result.batch.failed:
            raise UsageError(f"lab run {number} ({setting}): {len(result.batch.failed)} children failed: "
                             f"{result.batch.failed[0][2]}")
        shutil.rmtree(options.run_dir / S3_DATA, ignore_errors=True)
        return result.summary

    return run_batch
