"""The profiler: `iobatch sidecar` (beside the job) and `iobatch profile -- CMD` (any command) (profiling/)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import typer

from pipeline.cli import checks
from pipeline.errors import IobatchError, UsageError
from pipeline.interface import ENV, EXIT_OK, exit_code_of
from profiling.protocol import SOCKET_NAME


def _warn(text: str) -> None:
    """A notice on stderr (stdout may carry EMF or the table)."""
    print(f"note: {text}", file=sys.stderr, flush=True)


def _device(path: str | None, fallback: Any = None) -> Any:
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


def _interval(interval: float) -> float:
    from profiling.sampler import check_interval

    try:
        return check_interval(interval)
    except ValueError as exc:
        raise UsageError(f"--interval: {exc}") from None


def sidecar(
    socket_path: Path | None = typer.Option(None, "--socket", metavar="PATH", help="Unix socket to serve (default: "
                                               f"$IOBATCH_PROFILER_SOCKET or <scratch>/task-<task id>/{SOCKET_NAME})."),
    emf: str = typer.Option("-", "--emf", metavar="FILE", help="EMF output file, or - for stdout (what CloudWatch "
                            "reads)."),
    profile_out: Path | None = typer.Option(None, "--profile-out", metavar="FILE", help="Append profile JSON lines "
                                            "here."),
    interval: float = typer.Option(1.0, "--interval", metavar="SECONDS", help="Seconds between samples (0.1 to 60)."),
    device: str | None = typer.Option(None, "--device", metavar="DEVICE", help="Block device (or a path on it) to "
                                      "sample."),
    scratch_dir: Path | None = typer.Option(None, "--scratch-dir", metavar="DIR", help="The job's working directory; "
                                               "its block device is sampled (default: the child's work dir)."),
    namespace: str = typer.Option("", "--namespace", metavar="NAME", help="EMF namespace (default $AWS_EMF_NAMESPACE "
                                  "or IoBatch)."),
    contract: Path | None = typer.Option(None, "--contract", metavar="FILE", envvar=ENV.CONTRACT,
                                         help="Contract rules evaluated per stage."),
    call_probes: bool = typer.Option(True, "--call-probes/--no-call-probes", help="Per-call latency probes "
                                     "(eBPF when root, LD_PRELOAD records) beside the kernel counters."),
) -> None:
    """Profile the job beside it: one StageProfile and one EMF document per stage (container entrypoint).

    Exits after the job's job_end with the code the job says it exits with, so that its container ends as the job's
    does whichever of the two Batch reads (infra/jobs.py, retry_conditions); 0 when the job closes the socket without
    one, on SIGTERM (the running stage is flushed as interrupted), and when the profiler cannot start (one warning:
    the job runs unprofiled). It never makes the job fail; only a bad flag exits 64.
    """
    # A SIGTERM before the server's own handler (ECS stops the profiler when the job ended first) exits 0, not 75.
    signal.signal(signal.SIGTERM, _stopped_early)
    try:
        server = _start_sidecar(socket_path, emf, profile_out, interval, device, scratch_dir, namespace, contract,
                                call_probes)
    except _StoppedEarly:
        raise typer.Exit(EXIT_OK) from None
    if server is not None:
        server.serve()
    raise typer.Exit(EXIT_OK if server is None or server.job_exit_code is None else server.job_exit_code)


class _StoppedEarly(BaseException):
    """SIGTERM while the profiler was still starting."""


def _stopped_early(signum: int, frame: FrameType | None) -> None:
    raise _StoppedEarly


def _start_sidecar(socket_path: Path | None, emf: str, profile_out: Path | None, interval: float, device: str | None,
                   scratch_dir: Path | None, namespace: str, contract: Path | None, call_probes: bool) -> Any:
    """The sidecar with its socket bound and SIGTERM handled, or None (and one warning) when it cannot start.

    A bad flag is the caller's (UsageError, 64); what the environment or the machine stands in the way of (the
    pipeline's variables, the scratch directory, the socket) is the profiler's own start-up failure, which never
    fails the child: the job runs unprofiled, and the profiler's container exits 0."""
    import os

    from pipeline.interface import AWS_ENV, HOST_CGROUP_MOUNT
    from pipeline.settings import job_identity
    from profiling.emf import dimension_value_problem, sink_for
    from profiling.metrics import DEFAULT_NAMESPACE
    from profiling.protocol import MAX_SOCKET_PATH
    from profiling.sidecar import Sidecar, SidecarConfig

    checks.output_or_stdout(emf, "--emf")
    if profile_out is not None:
        checks.output_file(profile_out, "--profile-out")
    if namespace:
        checks.emf_namespace(namespace, "--namespace")
    if socket_path is not None and len(str(socket_path)) > MAX_SOCKET_PATH:
        raise UsageError(f"--socket {str(socket_path)[:40]}...: the path is over {MAX_SOCKET_PATH} bytes; use a "
                         "shorter path")
    if scratch_dir is not None and device is None and not scratch_dir.exists():
        checks.output_dir(scratch_dir, "--scratch-dir")
    step, flagged_device = _interval(interval), _device(device) if device else None
    server = target = None
    try:
        chosen = namespace or os.environ.get(AWS_ENV.EMF_NAMESPACE) or DEFAULT_NAMESPACE
        checks.emf_namespace(chosen, AWS_ENV.EMF_NAMESPACE)
        identity = job_identity(dict(os.environ))
        if problem := dimension_value_problem(identity.pipeline):
            raise UsageError(f"{ENV.PIPELINE}={identity.pipeline[:40]!r} {problem}: set it to the stack's pipeline "
                             "name")
        target = socket_path or identity.socket_path
        if target is None:
            raise UsageError(f"no socket: give --socket PATH or set {ENV.PROFILER_SOCKET}")
        scratch = scratch_dir or identity.work_dir
        if device is None and not scratch.exists():
            scratch.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:  # a root profiler (profilerEbpf) beside a job of another user: like /scratch
                scratch.chmod(0o1777)
        server = Sidecar(SidecarConfig(
            socket_path=target, emf_sink=sink_for(emf), profile_out=profile_out, interval_s=step,
            device=flagged_device or _device(None, scratch), scratch_dir=scratch, namespace=chosen,
            properties=identity.properties, contract_path=contract, call_probes=call_probes,
            remove_empty_dir=target.parent == identity.work_dir, host_cgroup_mount=Path(HOST_CGROUP_MOUNT)))
        server.install_sigterm()
        server.bind()
        if os.geteuid() == 0:  # the job may be another user (profilerEbpf runs the profiler as root)
            target.chmod(0o666)
    except (IobatchError, OSError, ValueError) as exc:
        why = exc.headline if isinstance(exc, IobatchError) else str(exc)
        where = f" the profiler socket {target}:" if target is not None and server is not None else ""
        print(f"warning: profiler: cannot serve{where} {why}; the job runs unprofiled", file=sys.stderr, flush=True)
        return None
    return server


def profile(
    command: list[str] = typer.Argument(..., metavar="COMMAND", help="The command to profile, after --."),
    interval: float = typer.Option(1.0, "--interval", metavar="SECONDS", help="Seconds between samples (0.1 to 60)."),
    json_out: str | None = typer.Option(None, "--json", metavar="FILE", help="Write the profile JSON (schema 1) "
                                        "here (- for stdout)."),
    emf: str | None = typer.Option(None, "--emf", metavar="FILE", help="Write the EMF document here (- for stdout)."),
    device: str | None = typer.Option(None, "--device", metavar="DEVICE", help="Block device (or a path on it) to "
                                      "sample "
                                         "(default: the current directory's)."),
    contract: Path | None = typer.Option(None, "--contract", metavar="FILE", help="Contract rules to evaluate."),
) -> None:
    """Run a command as one profiled stage and print its I/O table; exits with the command's code.

    Exact bytes and call counts for any binary (Python, C, static Go such as s5cmd): they come from the
    kernel's /proc counters, not from hooking the program.
    """
    import json
    import os

    from rich.console import Console

    from pipeline.settings import job_identity
    from profiling.command import CommandNotFound, profile_command
    from profiling.contract import format_results
    from profiling.finish import load_rules
    from profiling.probes import start_command_probe
    from profiling.table import profile_row, render_stage_table

    # Every output path is checked before the command runs: its table and exit code are never lost to a
    # --json that cannot be written afterwards. '-' is stdout for either (checks.STDOUT), not for both.
    if json_out is not None:
        checks.output_or_stdout(json_out, "--json")
    if emf is not None:
        checks.output_or_stdout(emf, "--emf")
    if json_out == emf == checks.STDOUT:
        raise UsageError("--json - and --emf - would both write to stdout: give one of them a file")
    properties = job_identity(dict(os.environ)).properties
    dev = _device(device, Path.cwd())
    step = _interval(interval)
    try:
        rules = load_rules(contract)
    except ValueError as exc:
        raise UsageError(f"--contract: {exc}") from None
    # Per-call figures (latency) whenever a probe can run: eBPF on the command's process tree (root), else the
    # interposer for a dynamically linked command; otherwise one notice says they are off.
    call_probe = start_command_probe(_warn, command, device=dev)
    try:
        result = profile_command(command, interval_s=step, device=dev, properties=properties,
                                 call_probe=call_probe, rules=rules)
    except CommandNotFound as exc:
        raise UsageError(str(exc)) from None
    prof = result.profile
    if json_out == checks.STDOUT:
        print(json.dumps(prof.to_dict(), indent=1), flush=True)
    elif json_out is not None:
        from profiling.runfiles import write_text_atomic  # imported for these outputs only (start-up: issue 43)

        write_text_atomic(Path(json_out), json.dumps(prof.to_dict(), indent=1) + "\n")
    if emf is not None:
        from profiling.emf import emit_profile, sink_for

        emit_profile(prof, sink_for(emf))
    code = exit_code_of(result.returncode)
    title = f"{' '.join(command)[:60]} ({prof.outcome}, exit {code}; device {prof.device or '-'})"
    # The terminal's width (COLUMNS, else 80 when not a terminal); on stderr when stdout carries EMF or JSON.
    console = Console(stderr=checks.STDOUT in (emf, json_out))
    console.print(render_stage_table({prof.stage: profile_row(prof)}, title, console.width))
    if rules is not None:
        console.print(f"contract {contract}: values at or above each rule's threshold, per time frame",
                      highlight=False)
        for line in format_results(prof.contract):
            console.print(f"  {line}", highlight=False, markup=False)
    raise typer.Exit(code)
