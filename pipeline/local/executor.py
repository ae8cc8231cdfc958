"""The local array executor: AWS Batch's environment contract on one machine.

Each child is two processes, as in the Batch task: `iobatch sidecar` (the profiler) and `iobatch job`,
with the variables Batch sets (AWS_BATCH_JOB_ARRAY_INDEX, AWS_BATCH_JOB_ID, AWS_BATCH_JQ_NAME) and its
own scratch subdirectory. At most `workers` children run at once (default: one per core). A failed
child is reported with its headline and exit code; the others go on.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.endpoints import endpoint_address
from pipeline.errors import EXIT_RETRYABLE
from pipeline.interface import batch_exit_code, exit_code_of
from pipeline.local.proxy import ThrottledProxy
from pipeline.settings import ENV, PROFILER_OFF, JobSettings, child_name, env_yes, new_task_id
from profiling import runfiles

NO_SIDECAR_ENV = "IOBATCH_NO_SIDECAR"  # 1: run children without the profiler (overhead benchmarks)
INTERPOSE_ENV = ENV.INTERPOSE  # 1: preload the per-call interposer into the job (profiling/interpose)
SIDECAR_EXIT_WAIT_S = 10.0
# After the job exits, how long its sidecar may take to leave by itself before it is stopped as ECS stops a task's
# other containers (SIGTERM, then SIDECAR_EXIT_WAIT_S). One whose job ended its stages leaves in milliseconds; one
# the job never spoke to (a skipped child, a command refused before its first stage) would wait for it: it waited
# the whole SIDECAR_EXIT_WAIT_S, 10 s per such child. Profiles still building are written on SIGTERM too.
SIDECAR_GRACE_S = 1.0


@dataclass(frozen=True)
class LocalBatch:
    """What to run: `children` copies of `template` (its array_index is replaced per child)."""

    template: JobSettings
    children: int
    workers: int
    run_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)  # credentials and the like, added to every child
    sidecar: bool = True
    slow_child: int | None = None  # this child's S3 traffic goes through a throttling proxy
    slow_child_bps: float = 4 * 2**20
    queue: str = "local"
    contract: Path | None = None  # contract rules every sidecar evaluates per stage


@dataclass(frozen=True)
class ChildOutcome:
    index: int
    exit_code: int
    headline: str | None
    elapsed_s: float
    skipped: bool = False
    images: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class BatchResult:
    run_dir: Path
    children: int
    outcomes: list[ChildOutcome] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def failed(self) -> list[tuple[int, int, str]]:
        return [(o.index, o.exit_code, o.headline or "") for o in self.outcomes if not o.ok]

    @property
    def succeeded(self) -> int:
        return sum(1 for o in self.outcomes if o.ok and not o.skipped)

    @property
    def skipped(self) -> int:
        return sum(1 for o in self.outcomes if o.skipped)

    @property
    def exit_code(self) -> int:
        """The batch's exit code by the one rule (pipeline.interface.batch_exit_code): 0, or 65 over 75."""
        return batch_exit_code(o.exit_code for o in self.outcomes if not o.ok)


class _Progress:
    """Bars on a terminal; one plain line per finished child otherwise."""

    def __init__(self, children: int, images: int | None, enabled: bool) -> None:
        self._lock = threading.Lock()
        self._bars: Progress | None = None
        self.bytes_moved = 0
        if enabled:
            self._bars = Progress(TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[extra]}"), TimeElapsedColumn(), transient=False)
            self._children = self._bars.add_task("children", total=children, extra="")
            self._images = self._bars.add_task("images", total=images, extra="")
            self._bytes = self._bars.add_task("bytes moved", total=None, extra="")

    def __enter__(self) -> _Progress:
        if self._bars:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bars:
            self._bars.stop()

    def event(self, body: Mapping[str, Any]) -> None:
        with self._lock:
            if body.get("event") == "stage_end" and body.get("stage") in ("download", "upload"):
                self.bytes_moved += int(body.get("bytes") or 0)
                if self._bars:
                    self._bars.update(self._bytes, extra=f"{self.bytes_moved / 2**20:,.0f} MiB")
            if body.get("event") == "stage_end" and body.get("stage") == "process" and self._bars:
                self._bars.advance(self._images, int(body.get("images") or 0))

    def child_done(self, outcome: ChildOutcome) -> None:
        with self._lock:
            if self._bars:
                self._bars.advance(self._children)
                if not outcome.ok:
                    self._bars.console.print(f"[red]{child_name(outcome.index)} failed (exit {outcome.exit_code}): "
                                             f"{outcome.headline}")
                return
            state = "skipped (already complete)" if outcome.skipped else (
                "ok" if outcome.ok else f"FAILED exit {outcome.exit_code}: {outcome.headline}")
            print(f"{child_name(outcome.index)} {state} in {outcome.elapsed_s:.1f} s", flush=True)


def child_settings(batch: LocalBatch, index: int, proxy_endpoint: str | None) -> JobSettings:
    """Child `index`'s settings; `proxy_endpoint` (the slow child's throttling proxy) replaces the S3 endpoint."""
    # A fresh task id per attempt, as ECS gives each task: runs sharing a scratch root never share a directory.
    return replace(batch.template, array_index=index, job_id=f"{batch.template.job_id}:{index}",
                   s3_endpoint=proxy_endpoint or batch.template.s3_endpoint, task_id=new_task_id(index))


def child_environment(batch: LocalBatch, settings: JobSettings) -> dict[str, str]:
    env = {**os.environ, **batch.env, **settings.to_env()}
    env.pop(ENV.ARRAY_OFFSET, None)  # the index is already global
    env[ENV.QUEUE] = batch.queue
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, wait_s: float = SIDECAR_EXIT_WAIT_S) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Runner:
    def __init__(self, batch: LocalBatch, progress: _Progress) -> None:
        self.batch = batch
        self.progress = progress
        self.stopping = threading.Event()
        self._live: set[subprocess.Popen[Any]] = set()
        self._lock = threading.Lock()

    def _spawn(self, args: list[str], env: Mapping[str, str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(args, env=dict(env), start_new_session=True, **kwargs)
        with self._lock:
            self._live.add(proc)
        return proc

    def _forget(self, proc: subprocess.Popen[Any]) -> None:
        with self._lock:
            self._live.discard(proc)

    def terminate_all(self) -> None:
        self.stopping.set()
        with self._lock:
            live = list(self._live)
        for proc in live:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def supervise_child(self, index: int, proxy_endpoint: str | None) -> ChildOutcome:
        """Start child `index` (its job and sidecar processes), log and follow it until both have exited."""
        started = time.monotonic()
        if self.stopping.is_set():
            return ChildOutcome(index, EXIT_RETRYABLE, "not started: the run was interrupted", 0.0)
        batch = self.batch
        settings = child_settings(batch, index, proxy_endpoint)
        env = child_environment(batch, settings)
        name = settings.child
        settings.work_dir.mkdir(parents=True, exist_ok=True)
        python = [sys.executable, "-m", "pipeline.cli"]
        sidecar = None
        use_sidecar = batch.sidecar and os.environ.get(NO_SIDECAR_ENV, "") not in ("1", "true")
        with runfiles.log_path(batch.run_dir, name).open("w", encoding="utf-8") as log:
            if use_sidecar:
                sidecar = self._spawn(
                    [*python, "sidecar", "--socket", str(settings.socket_path),
                     "--emf", str(runfiles.emf_path(batch.run_dir, name)),
                     "--profile-out", str(runfiles.profile_path(batch.run_dir, name)),
                     "--scratch-dir", str(settings.work_dir),
                     *(["--contract", str(batch.contract)] if batch.contract else [])],
                    env, stdout=log, stderr=subprocess.STDOUT)
            else:
                env[ENV.PROFILER_SOCKET] = PROFILER_OFF
            job_env = dict(env)
            if use_sidecar and env_yes(env, INTERPOSE_ENV):
                from profiling.probes.interpose import preload_env

                job_env.update(preload_env(settings.work_dir))
            job = self._spawn([*python, "job"], job_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            headline, skipped, images = None, False, 0
            assert job.stdout is not None
            for line in job.stdout:
                log.write(line)
                if line.startswith("{"):
                    try:
                        body = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    self.progress.event(body)
                    skipped = skipped or body.get("event") == "skipped"
                    images = int(body.get("images") or images) if body.get("event") == "done" else images
                elif line.startswith("error: "):
                    headline = line[len("error: "):].strip()
            code = job.wait()
            self._forget(job)
            if sidecar is not None:
                try:
                    sidecar.wait(timeout=SIDECAR_GRACE_S)
                except subprocess.TimeoutExpired:
                    _stop(sidecar)
                self._forget(sidecar)
        if code < 0 and self.stopping.is_set():
            # Stopped by this run's own Ctrl-C or SIGTERM before its handler ran: interrupted, as the README says.
            code, headline = EXIT_RETRYABLE, "interrupted: rerun the batch to finish it"
        elif code < 0:
            # The shell's convention (128 + signal), so the batch's code and a person read it alike.
            headline = f"killed by signal {-code}"
            code = exit_code_of(code)
        elif code and not headline:
            headline = f"exited with code {code} (see {runfiles.log_path(batch.run_dir, name)})"
        outcome = ChildOutcome(index, code, headline, time.monotonic() - started, skipped, images)
        self.progress.child_done(outcome)
        return outcome


class _StopSignals:
    """Ctrl-C (SIGINT) and SIGTERM while the children run are noted here, and run_batch's loop raises
    KeyboardInterrupt itself between its waits. Raised where the signal lands, the exception can fall inside a
    lock's `with` (a future's condition while the loop waits for a child) and leave the lock held; the pool's
    shutdown then waits forever for the worker blocked on it (seen: a demo stopped with SIGTERM at that moment
    never exited). Only in the main thread, where Python runs signal handlers; a signal ignored when the batch
    starts (a shell's background job ignores SIGINT) stays ignored. The handlers before are restored on exit."""

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run_batch(batch: LocalBatch, *, progress: bool | None = None, images_total: int | None = None,
              on_start: Callable[[LocalBatch], None] | None = None) -> BatchResult:
    """Run every child; return when all have finished. Ctrl-C stops the children (SIGTERM) and re-raises."""
    for sub in (runfiles.PROFILES, runfiles.EMF, runfiles.LOGS):
        (batch.run_dir / sub).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result = BatchResult(batch.run_dir, batch.children)
    show_bars = sys.stdout.isatty() if progress is None else progress
    with contextlib.ExitStack() as stack:
        proxy: ThrottledProxy | None = None
        if batch.slow_child is not None and batch.template.s3_endpoint:
            # Where the endpoint connects: its host, and its port or the scheme's (pipeline.endpoints owns the URL).
            host, port = endpoint_address(batch.template.s3_endpoint)
            proxy = stack.enter_context(ThrottledProxy(port, batch.slow_child_bps, upstream_host=host))
        if on_start:
            on_start(batch)
        bars = stack.enter_context(_Progress(batch.children, images_total, show_bars))
        runner = _Runner(batch, bars)
        stop = stack.enter_context(_StopSignals())
        pool = ThreadPoolExecutor(max_workers=max(1, batch.workers), thread_name_prefix="child")
        try:
            futures = [pool.submit(runner.supervise_child, i,
                                   proxy.endpoint if proxy and i == batch.slow_child else None)
                       for i in range(batch.children)]
            while not all(future.done() for future in futures):
                if stop.signum:
                    raise KeyboardInterrupt  # here, holding no lock
                time.sleep(0.1)
            result.outcomes.extend(future.result() for future in futures)
        except BaseException:
            runner.terminate_all()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=True)
    result.elapsed_s = time.monotonic() - started
    return result
