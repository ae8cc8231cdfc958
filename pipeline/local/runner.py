"""A batch on this machine: `run_local` freezes a batch (prefix or manifest) beside its outputs and runs its
children with the local executor against any S3 endpoint, recording the run in the run directory.

`iobatch run`, `iobatch submit --local` and the demo (pipeline/local/demo.py) all run their batches here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import s3 as s3io
from pipeline.errors import UsageError
from pipeline.interface import DEFAULT_PROCESS_COMMAND
from pipeline.local.executor import BatchResult, LocalBatch, run_batch
from pipeline.settings import DEFAULT_TRAIN_SIZE, JobSettings, S3Uri, counted, default_workers
from profiling import runfiles


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
    process_command: str = DEFAULT_PROCESS_COMMAND  # the process stage (pipeline/process.py)
    # What the profiles say scratch is (VolumeType): this machine's disk, or the volume the lab emulates there.
    volume_type: str = "local"


#: The demo's embedded S3 server's data (the dataset and the outputs) in a run directory.
S3_DATA = "s3"
#: What a local run writes in its run directory: runfiles' own files, plus the demo's S3 data and server
#: log, the default scratch root and the dataset's upload list. A rerun removes these and nothing else.
RUN_ENTRIES = (runfiles.RUN_FILE, runfiles.PROFILES, runfiles.EMF, runfiles.LOGS, runfiles.REPORT, S3_DATA,
               "s3server.log", "scratch", "upload-dataset.cmds")


# A run holds a lock on its run directory itself (flock(2) on the directory's descriptor: no file of its own
# left there) for as long as its process lives; the kernel releases it however the process ends, SIGKILL
# included, so a stale lock cannot outlive its run.
_held: dict[Path, int] = {}  # run directories this process has locked: their descriptors


def lock_run_dir(run_dir: Path) -> None:
    """Hold `run_dir`'s lock for the rest of this process: a second run into the same directory (another
    `demo` at the same time) is told it is busy before it removes or writes anything there."""
    key = run_dir.resolve()
    if key in _held:
        return
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"run directory {run_dir} is busy: another run is writing there now; wait for it to end "
                         "or give another --run-dir") from None
    _held[key] = fd


def _release_run_dir(run_dir: Path) -> None:
    fd = _held.pop(run_dir.resolve(), None)
    if fd is not None:
        os.close(fd)


def _holds_files(run_dir: Path) -> bool:
    return any(run_dir.iterdir())


def prepare_run_dir(run_dir: Path) -> None:
    """Make `run_dir` ready for a run: a new or empty directory, or an earlier run's, whose own files
    (RUN_ENTRIES) are removed. Files the user put there are left alone; a non-empty directory that holds
    no run file is refused, since its files cannot be told from a run's. The directory is locked first
    (`lock_run_dir`), so a run never empties a directory another run is writing."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} is a file: give a directory with --run-dir")
    if run_dir.exists() and _holds_files(run_dir) and not runfiles.is_run_dir(run_dir):
        raise UsageError(f"run directory {run_dir} is not empty and holds no {runfiles.RUN_FILE}: "
                         "give an empty or new directory with --run-dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"run directory {run_dir} cannot be created ({exc.strerror}): give another "
                         "--run-dir") from None
    lock_run_dir(run_dir)
    if _holds_files(run_dir):
        for name in RUN_ENTRIES:
            entry = run_dir / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            elif entry.exists() or entry.is_symlink():
                entry.unlink()


@contextlib.contextmanager
def prepared_run_dir(run_dir: Path) -> Iterator[Path]:
    """prepare_run_dir for a run; if the run fails before it wrote anything (S3 unreachable, a bad
    manifest), the run directory is removed again when this call created it (the directory itself; parents
    it needed are left)."""
    created = not run_dir.exists()
    prepare_run_dir(run_dir)
    try:
        yield run_dir
    except BaseException:
        if created and run_dir.is_dir() and not _holds_files(run_dir):
            _release_run_dir(run_dir)
            run_dir.rmdir()
        raise


def machine_memory_gib() -> float:
    """This machine's memory in GiB (one decimal): what run.json records for the advisor's plan."""
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)


def run_local(run: LocalRun, *, progress: bool | None = None, say: Callable[[str], None] = print) -> BatchResult:
    """Freeze the batch beside its outputs, then run its children with the local executor."""
    s3 = s3io.client(run.endpoint, run.env)
    frozen = s3io.freeze_batch(s3, input=run.input, manifest=run.manifest, output=run.output,
                               per_child=run.images_per_child)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    scratch = run.scratch_root or (run.run_dir / "scratch")
    scratch.mkdir(parents=True, exist_ok=True)
    job_id = run.job_id or f"local-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    template = JobSettings(input=run.input, output=run.output, manifest=frozen.manifest, scratch_root=scratch,
                           images_per_child=run.images_per_child, array_index=0, job_id=job_id,
                           s3_endpoint=run.endpoint, train_size=run.train_size, skip_bad_images=run.skip_bad_images,
                           force=run.force, volume_type=run.volume_type, process_command=run.process_command)
    batch = LocalBatch(template=template, children=frozen.children, workers=run.workers, run_dir=run.run_dir,
                       env=run.env, sidecar=run.sidecar, slow_child=run.slow_child,
                       slow_child_bps=run.slow_child_bps, contract=run.contract)
    meta: dict[str, Any] = {"job_id": job_id, "input": str(run.input), "output": str(run.output),
                            "manifest": str(frozen.manifest), "children": frozen.children, "images": frozen.images,
                            "bytes": frozen.bytes, "workers": run.workers, "images_per_child": run.images_per_child,
                            "started": time.time(), "slow_child": run.slow_child, "endpoint": run.endpoint,
                            "memory_gib": machine_memory_gib()}
    runfiles.write_run(run.run_dir, meta)
    say(f"batch {job_id}: {counted(frozen.images, 'image', 'images')} ({frozen.bytes / 2**20:,.1f} MiB) in "
        f"{counted(frozen.children, 'child', 'children')}, "
        f"{run.workers} at a time")
    result = run_batch(batch, progress=progress, images_total=frozen.images)
    meta.update(finished=time.time(), elapsed_s=round(result.elapsed_s, 3),
                failed=[{"child": i, "exit_code": c, "error": h} for i, c, h in result.failed],
                succeeded=result.succeeded, skipped=result.skipped,
                # Each child's whole time as the executor saw it: the report shows the part in no stage.
                child_elapsed_s={str(o.index): round(o.elapsed_s, 3) for o in result.outcomes if not o.skipped})
    runfiles.write_run(run.run_dir, meta)
    return result
