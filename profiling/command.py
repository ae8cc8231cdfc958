"""`iobatch profile -- CMD`: run one command as one profiled stage.

The command's figures are exact for any binary (Python, C, static Go such as s5cmd): they come from
the kernel's /proc counters (profiling/sampler.py), not from hooking the program. Per-call figures
and contract results are added by the same `finish_stage` the sidecar uses.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

from profiling.files import program_problem
from profiling.finish import Evaluator, finish_stage
from profiling.metrics import StageProfile
from profiling.probes import CallProbe, command_environment
from profiling.probes.procfs import BlockDevice, ProcIo
from profiling.proctree import ProcessTree, foreground, forwarding_signals
from profiling.sampler import DEFAULT_INTERVAL_S, Sources, StageSampler


class CommandNotFound(ValueError):
    """The command to profile does not exist or is not executable."""


@dataclass
class CommandResult:
    """The command's exit code and its finished profile."""

    returncode: int
    profile: StageProfile


#: How soon a signal that landed on another thread has its handler run while the command runs.
HANDLER_LATENCY_S = 0.1


def _wait_unreaped(pid: int) -> None:
    """Wait for `pid` to exit without reaping it: its /proc/<pid>/io stays readable (as a zombie) and
    still holds everything it and its reaped descendants did. Reaping would fold it into our own.

    Never one blocking wait: a signal sent to this process may land on the sampler's thread, and then only
    the main thread's next bytecode runs its Python handler (Python's signal module documentation: "Python signal
    handlers are always executed in the main Python thread"); a wait the signal did not interrupt would hold a forwarded
    Ctrl-C or SIGTERM until the command ended on its own. So the wait wakes every HANDLER_LATENCY_S."""
    try:
        watch = os.pidfd_open(pid)
    except OSError:  # gone already, or before Linux 5.3
        watch = None
    try:
        while True:
            if watch is not None:
                select.select([watch], [], [], HANDLER_LATENCY_S)
            try:
                if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                    return
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if watch is None:
                time.sleep(HANDLER_LATENCY_S)
    finally:
        if watch is not None:
            os.close(watch)


#: After a forwarded SIGTERM the command has this long to end before SIGKILL: AWS Batch (ECS) sends SIGKILL
#: 30 s after SIGTERM by default (ECS_CONTAINER_STOP_TIMEOUT, "Amazon ECS container agent configuration"),
#: so the profile and table are still written within that.
FORWARD_GRACE_S = 10.0


def _sample(argv: Sequence[str], *, interval_s: float, device: BlockDevice | None, stage: str,
            properties: Mapping[str, str] | None, stdout: TextIO | None,
            env: Mapping[str, str]) -> tuple[int, StageProfile]:
    """Run `argv` under a StageSampler: (exit code, the profile of its kernel counters)."""
    if not argv:
        raise CommandNotFound("no command given: write it after --, e.g. iobatch profile -- dd ...")
    found = shutil.which(argv[0]) if os.sep not in argv[0] else argv[0]
    if found is not None and os.path.isdir(found):
        raise CommandNotFound(f"command {argv[0]!r} is a directory: give the program to run")
    if found is not None and (problem := program_problem(found)) and os.access(found, os.X_OK):
        raise CommandNotFound(f"command {argv[0]!r} {problem}")
    with forwarding_signals(FORWARD_GRACE_S) as forwarded:
        try:
            # A process group of its own: a stopping signal reaches the whole tree (profiling.proctree).
            child = subprocess.Popen(list(argv), stdout=stdout, env={**os.environ, **env} if env else None,
                                     process_group=0)
        except FileNotFoundError:
            raise CommandNotFound(f"command {argv[0]!r} not found: check the name and PATH") from None
        except PermissionError:
            raise CommandNotFound(f"command {argv[0]!r} is not executable: check its permissions") from None
        except OSError as exc:  # ENOEXEC: what the check above did not foresee (a damaged ELF)
            raise CommandNotFound(f"command {argv[0]!r} cannot be run ({exc.strerror}): give a program for this "
                                  "machine, or a script with its #! line") from None
        # A new process starts with all io counters at zero: that is the exact baseline, even if the
        # command has already done I/O by the time the first snapshot is read.
        sampler = StageSampler(stage=stage, pid=child.pid, device=device, interval_s=interval_s, base_io=ProcIo(),
                               sources=Sources())
        sampler.start()
        tree = ProcessTree(child.pid)
        outcome = "interrupted"
        try:
            with foreground(tree):
                forwarded.attach(tree)
                _wait_unreaped(child.pid)
            outcome = "interrupted" if forwarded.signals else "ok"
        finally:
            final = sampler.snapshot()
            returncode = child.wait()
            tree.reaped = True
            forwarded.finish()
            if outcome == "ok" and returncode != 0:
                outcome = "failed"
            profile = sampler.finish(outcome=outcome, final=final, properties=properties)
    return returncode, profile


def profile_command(
    argv: Sequence[str],
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    device: BlockDevice | None = None,
    stage: str = "command",
    properties: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    call_probe: CallProbe | None = None,
    rules: Evaluator | None = None,
) -> CommandResult:
    """Run `argv` as one profiled stage.

    `call_probe`, when given, is already watching the processes this one starts
    (profiling.probes.start_command_probe): it is stopped when the command ends, however it ends, and
    its figures join the profile. `rules` evaluates a contract on the finished profile
    (profiling.finish.load_rules). Raises CommandNotFound when the command cannot be started.
    """
    calls = None
    try:
        returncode, profile = _sample(argv, interval_s=interval_s, device=device, stage=stage,
                                      properties=properties, stdout=stdout, env=command_environment(call_probe))
    finally:
        if call_probe is not None:
            calls = call_probe.stop()
    results = [(call_probe.name, calls)] if call_probe is not None else []
    return CommandResult(returncode, finish_stage(profile, results, rules))
