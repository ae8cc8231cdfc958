"""Tuning: `iobatch advise` (settings from profiles: pipeline.cli.advise) and `iobatch lab` (an st1-like volume here)
(tuning/)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from pipeline.cli import checks
from pipeline.cli.advise import advise
from pipeline.errors import UsageError
from pipeline.interface import DEFAULT_PROCESS_COMMAND
from pipeline.settings import MAX_DEMO_IMAGES, MAX_IMAGE_MIB, MAX_IMAGES_PER_CHILD, MAX_WORKERS

# The lab's own flags: each round runs two whole batches; a larger time scale leaves a credit bucket of less
# than a MiB; the loop file is sparse but its file system is built in full; the largest EC2 instances hold
# a few TiB (its memory is checked against this machine's too).
LAB_MAX_ROUNDS = 20
LAB_MAX_TIME_SCALE = 1e6
LAB_MAX_LOOP_MIB = 1 << 20
LAB_MAX_MEMORY_GIB = 4096.0
LAB_GUEST_TIMEOUT_S = 6 * 3600  # a lab in the guest that has not ended by then is stopped (QEMU killed)

__all__ = ["advise", "lab"]


def lab(
    volume: str = typer.Option("st1:500", metavar="VOLUME", help="The volume to emulate: "
                               "TYPE:SIZE_GIB[:iops=N][:throughput=M]."),
    memory_gib: float = typer.Option(4.0, min=0.5, max=LAB_MAX_MEMORY_GIB, metavar="GIB", help="Act like an instance "
                                     "with this much memory, at most this machine's: the dirty limits are set in "
                                     "bytes from it (dirty_bytes)."),
    workload: str = typer.Option("pipeline", metavar="WORKLOAD", help="pipeline (the demo batch on the lab volume) or "
                                 "writer (plain files, the same burst)."),
    workers: int = typer.Option(2, min=1, max=MAX_WORKERS, metavar="N", help="Children at once (like one task per "
                                "core)."),
    images: int = typer.Option(40, min=1, max=MAX_DEMO_IMAGES, metavar="N", help="Images in the batch."),
    image_mib: float = typer.Option(25.0, min=0.01, max=MAX_IMAGE_MIB, metavar="MIB", help="Approximate size of each "
                                    "image in MiB."),
    images_per_child: int = typer.Option(10, min=1, max=MAX_IMAGES_PER_CHILD, metavar="N", help="Images each child "
                                         "takes."),
    rounds: int = typer.Option(1, min=1, max=LAB_MAX_ROUNDS, metavar="N", help="Default/tuned pairs to run, "
                               "alternating; with --advise, runs of each setting (measured: their median and "
                               "range)."),
    dirty_ratio: int = typer.Option(30, min=0, max=100, metavar="PCT", help="Tuned vm.dirty_ratio (of the "
                                    "emulated memory)."),
    dirty_background_ratio: int = typer.Option(20, min=0, max=100, metavar="PCT", help="Tuned "
                                               "vm.dirty_background_ratio."),
    time_scale: float = typer.Option(1.0, min=1.0, max=LAB_MAX_TIME_SCALE, metavar="FACTOR", help="Shrink the credit "
                                     "bucket by this factor, so hours of credits last minutes."),
    credits_gib: float | None = typer.Option(None, min=0.0, metavar="GIB", help="Credits at the start, at the real "
                                             "volume's scale, at most its bucket's size (default: a full bucket)."),
    after_cliff: bool = typer.Option(False, "--after-cliff", help="Hold the credit bucket empty: the volume "
                                     "runs at baseline, as after the credit cliff under sustained load."),
    loop_size_mib: int = typer.Option(4096, max=LAB_MAX_LOOP_MIB, metavar="MIB", help="Size of the lab file system "
                                      "(sparse; at least 300 for XFS)."),
    throttle: str = typer.Option("fuse", metavar="METHOD", help="With --where host: fuse (a fixed-rate FUSE device "
                                 "under the loop device: any kernel, cgroup v1 or v2, AWS's HDD accounting), blkio "
                                 "(root blkio cgroup, v1 only) or hypervisor (inside the guest: its throttled disk)."),
    where: str = typer.Option("auto", metavar="WHERE", help="guest (the cgroup v2 guest under QEMU: no root, nothing "
                              "on this machine changes), host (this machine, as root: its sysctls, a loop device "
                              "and a throttle, restored on exit) or auto (guest where make setup prepared it, else "
                              "host)."),
    lab_dir: Path = typer.Option(Path("/var/tmp/iobatch-lab"), metavar="DIR", help="Backing file and mount point."),
    run_dir: Path = typer.Option(Path(".iobatch/lab"), metavar="DIR", help="Run directories (S3 data, profiles) per "
                                 "run; not on the lab volume."),
    recover_only: bool = typer.Option(False, "--recover", help="Only clean up after a lab that crashed."),
    as_json: bool = typer.Option(False, "--json", help="Print the runs as JSON."),
    advise_loop: bool = typer.Option(False, "--advise", help="The closed loop: run the batch under the kernel's "
                                     "defaults, advise from its profiles, run it under the advised cache, and "
                                     "print the predicted and measured download stage of each run."),
    process_command: str = typer.Option(DEFAULT_PROCESS_COMMAND, metavar="COMMAND", show_default=False,
                                        help=checks.PROCESS_COMMAND_HELP + " The lab measures the download; a "
                                        "lighter command makes each run shorter."),
) -> None:
    """Emulate an st1 volume and run a batch on it under the kernel's default and the tuned write cache.

    By default in the cgroup v2 guest (a QEMU machine whose disk the hypervisor throttles like the volume): no
    root, and nothing on this machine changes. With --where host, on this machine as root (loop device + XFS
    over a fixed-rate FUSE device with a credit bucket); every setting it changes is restored on exit, Ctrl-C,
    SIGTERM, or by the next run after a crash."""
    import dataclasses
    import json

    from pipeline.local.demo import lab_batch
    from tuning.host import HostTuning, HostTuningError
    from tuning.lab import ComparePlan, LabConfig, LabError, LabInterrupted, recover, render_comparison, run_comparison
    from tuning.plan import AdviseError, parse_candidate

    if recover_only:
        try:
            found = recover()
        except LabError as exc:
            raise UsageError(str(exc)) from None
        print("lab: cleaned up" if found else "lab: nothing to clean up")
        return
    if workload not in ("pipeline", "writer"):
        raise UsageError(f"--workload {workload!r} is not pipeline or writer")
    if advise_loop and workload != "pipeline":  # before anything starts: here, or in a guest booted minutes later
        raise UsageError("--advise runs the pipeline: leave out --workload writer")
    if after_cliff and credits_gib is not None:  # the bucket held empty: credits at the start would be ignored
        raise UsageError("--after-cliff holds the credit bucket empty: leave out --credits-gib, or --after-cliff")
    process_command = checks.process_command(process_command)
    # The emulated page cache lives in this machine's memory: a larger instance cannot be acted out here.
    machine_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    if memory_gib > machine_gib:
        raise UsageError(f"--memory-gib {memory_gib:g} is more than this machine's {machine_gib:.1f} GiB: give at "
                         "most that")
    try:
        tuned = HostTuning(dirty_ratio=dirty_ratio, dirty_background_ratio=dirty_background_ratio)
        tuned.validate()
        config = LabConfig(volume=parse_candidate(volume, what="--volume"), lab_dir=lab_dir,
                           loop_size_mib=loop_size_mib, time_scale=time_scale,
                           initial_credits_mib=None if credits_gib is None else credits_gib * 1024,
                           hold_empty=after_cliff, throttle=throttle)
        config.validate()
    except (AdviseError, HostTuningError, LabError) as exc:
        raise UsageError(str(exc)) from None
    plan = ComparePlan(tuned=tuned, memory_gib=memory_gib, rounds=rounds, workers=workers, images=images,
                       image_mib=image_mib, images_per_child=images_per_child)
    # With --json, stdout carries only the JSON: the lab's lines and the children's go to stderr.
    lines = sys.stderr if as_json else sys.stdout
    if _lab_where(where) == "guest":  # its disk throttled by QEMU, its lab directory its own
        checks.unused_flags({"throttle": "--throttle", "lab_dir": "--lab-dir"}, "with --where host")
        raise typer.Exit(_lab_in_guest(config, plan, run_dir, pipeline_batch=workload == "pipeline", lines=lines))

    def say(message: str) -> None:
        print(message, file=lines, flush=True)

    if advise_loop:
        _advise_loop(config, plan, run_dir, lines, as_json, process_command)
        return
    run_batch = lab_batch(plan, run_dir, stdout=lines, volume_type=config.volume.kind,
                          process_command=process_command) if workload == "pipeline" else None
    try:
        runs = run_comparison(config, plan, run_batch=run_batch, say=say)
    except LabError as exc:
        raise UsageError(str(exc)) from None
    except LabInterrupted:
        raise KeyboardInterrupt from None
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in runs], indent=1, default=str))
    else:
        print(render_comparison(runs))
    if run_batch is not None:
        _write_lab_comparison(run_dir, [r.setting for r in runs], lines)


def _lab_where(where: str) -> str:
    """guest or host: auto is the guest where it can boot."""
    from tuning.guest.machine import unavailable

    if where not in ("auto", "guest", "host"):
        raise UsageError(f"--where {where!r} is not guest, host or auto")
    if where == "host":
        return where
    reason = unavailable()
    if reason is None:
        return "guest"
    if where == "guest":
        raise UsageError(f"--where guest: {reason}")
    print(f"lab: on this machine (--where host), since the guest cannot boot: {reason}", file=sys.stderr)
    return "host"


def _lab_in_guest(config: Any, plan: Any, run_dir: Path, *, pipeline_batch: bool, lines: Any) -> int:
    """`iobatch lab` again inside the guest (tuning.lab.inguest), with the images generated here first; this
    side's lines go to `lines` (stderr with --json, where stdout is the lab's JSON from inside)."""
    from pipeline.local.demo import CACHE_ENV, lab_dataset
    from tuning.lab import LabError
    from tuning.lab.inguest import run_in_guest

    def say(message: str) -> None:
        print(message, file=lines, flush=True)

    env = {CACHE_ENV: str(lab_dataset(plan, say=say))} if pipeline_batch else {}
    argv = sys.argv[sys.argv.index("lab") + 1:] if "lab" in sys.argv else []
    try:
        return run_in_guest(argv, config, memory_gib=plan.memory_gib, vcpus=min(os.cpu_count() or 1, plan.workers + 1),
                            run_dir=run_dir, iobatch=str(Path(sys.executable).with_name("iobatch")), env=env,
                            timeout=LAB_GUEST_TIMEOUT_S, say=say)
    except LabError as exc:
        raise UsageError(str(exc)) from None


def _write_lab_comparison(run_dir: Path, settings: list[str], lines: Any) -> None:
    """The first default and tuned runs side by side as HTML (profiling.report.write_comparison); the
    run directories are lab_batch's (lab_run_dir), numbered from 1."""
    from pipeline.local.demo import lab_run_dir
    from profiling.report import ReportInputError, write_comparison

    dirs = {s: lab_run_dir(run_dir, n, s) for n, s in reversed(list(enumerate(settings, 1)))}
    if "default" in dirs and "tuned" in dirs:
        try:
            path = write_comparison(dirs["default"], dirs["tuned"], run_dir / "compare.html",
                                    names=("kernel defaults", "tuned"))
            print(f"comparison: {path}", file=lines)
        except (ReportInputError, OSError) as exc:
            print(f"comparison: not written ({exc})", file=lines)


def _advise_loop(config: Any, plan: Any, run_dir: Path, lines: Any, as_json: bool, process_command: str) -> None:
    """`iobatch lab --advise`: tuning.lab.loop with the demo's batch; each run's profiles are read back from
    lab_batch's run directory (lab_run_dir)."""
    import json

    from pipeline.local.demo import lab_batch, lab_run_dir
    from profiling import runfiles
    from tuning.lab import LabError, LabInterrupted
    from tuning.lab.loop import render_loop, run_advise_loop
    from tuning.plan import AdviseError

    run_batch = lab_batch(plan, run_dir, stdout=lines, volume_type=config.volume.kind,
                          process_command=process_command)

    def run_profiles(number: int, setting: str, scratch: Path) -> list[Any]:
        run_batch(number, setting, scratch)
        return list(runfiles.read_profiles(lab_run_dir(run_dir, number, setting)))

    try:
        result = run_advise_loop(config, plan, run_profiles, say=lambda m: print(m, file=lines, flush=True))
    except (LabError, AdviseError) as exc:
        raise UsageError(str(exc)) from None
    except LabInterrupted:
        raise KeyboardInterrupt from None
    if as_json:
        print(json.dumps({"advice": result.advice.to_dict(), "runs": [
            {"setting": r.setting, "sysctls": r.sysctls, "other_dirty_bytes": r.other_dirty_bytes,
             "predicted_download_s": round(r.predicted_s, 2),
             "predicted_low_download_s": None if r.predicted_low_s is None else round(r.predicted_low_s, 2),
             "predicted_high_download_s": None if r.predicted_high_s is None else round(r.predicted_high_s, 2),
             "measured_download_s": None if r.measured_s is None else round(r.measured_s, 2),
             "measured_each_s": [round(m, 2) for m in r.measured_each],
             "error": None if r.error is None else round(r.error, 3)} for r in result.runs]}, indent=1))
    else:
        print(render_loop(result))
