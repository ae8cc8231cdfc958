"""Tuning: `iobatch advise` (settings from profiles) and `iobatch lab` (an st1-like volume here) (tuning/)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from pipeline.errors import UsageError


def _need(value: Any, flag: str, example: str) -> Any:
    if value is None:
        raise UsageError(f"{flag} is missing: give it, e.g. {flag} {example}")
    return value


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

    from tuning.advice_text import render
    from tuning.advise import advise as make_advice
    from tuning.advise import load_profiles
    from tuning.ebs import VolumeError
    from tuning.host import HostTuningError
    from tuning.plan import AdviseError, Plan, parse_candidate

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
    plan = ComparePlan(tuned=tuned, memory_gib=memory_gib, rounds=rounds, workers=workers, images=images,
                       image_mib=image_mib, images_per_child=images_per_child)
    # With --json, stdout carries only the JSON: the lab's lines and the children's go to stderr.
    lines = sys.stderr if as_json else sys.stdout

    def say(message: str) -> None:
        print(message, file=lines, flush=True)

    run_batch = lab_batch(plan, run_dir, stdout=lines) if workload == "pipeline" else None
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
