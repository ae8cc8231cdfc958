"""Tuning: `iobatch advise` (settings from profiles) and `iobatch lab` (an st1-like volume here) (tuning/)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from pipeline.cli import checks
from pipeline.errors import PermanentError, UsageError
from pipeline.interface import DEFAULT_PROCESS_COMMAND
from pipeline.settings import MAX_DEMO_IMAGES, MAX_IMAGE_MIB, MAX_IMAGES_PER_CHILD, MAX_WORKERS
from tuning.instances import DEFAULT_VCPUS_PER_JOB, children_per_host, job_memory_mib

# The lab's own flags: each round runs two whole batches; a larger time scale leaves a credit bucket of less
# than a MiB; the loop file is sparse but its file system is built in full; the largest EC2 instances hold
# a few TiB (its memory is checked against this machine's too).
LAB_MAX_ROUNDS = 20
LAB_MAX_TIME_SCALE = 1e6
LAB_MAX_LOOP_MIB = 1 << 20
LAB_MAX_MEMORY_GIB = 4096.0
LAB_GUEST_TIMEOUT_S = 6 * 3600  # a lab in the guest that has not ended by then is stopped (QEMU killed)


PLAN_FLAGS = (("--jobs-per-instance", "4"), ("--memory-gib", "16"), ("--jobs-per-day", "500"))


def _implied_plan(inputs: list[Path]) -> Any:
    """The plan a local run directory among `inputs` implies (its run.json: pipeline.local.demo.local_plan), or
    None when none does."""
    from pipeline.local.demo import local_plan
    from profiling import runfiles

    for path in inputs:
        try:
            is_run = path.is_dir() and runfiles.is_run_dir(path)
        except OSError:  # a name the file system refuses (over 255 bytes): reading the profiles names it
            continue
        if is_run:
            try:  # a damaged file is named by the profile reader afterwards, with its own exit code
                run = runfiles.read_run(path)
                profiles = list(runfiles.read_profiles(path))
            except (OSError, ValueError):
                continue
            plan = local_plan(profiles, run)
            if plan is not None:
                return plan
    return None


def _plan_figures(inputs: list[Path], given: tuple[int | None, float | None, int | None]) -> tuple[Any, str, bool]:
    """(jobs per instance, memory GiB, jobs per day), what was assumed, and whether the endpoint was on the
    host: the flags given, the rest from a local run's run.json; every missing one named in one error."""
    if all(v is not None for v in given):
        return given, "", False
    implied = _implied_plan(inputs)
    if implied is None:
        missing = [flag for (flag, _), v in zip(PLAN_FLAGS, given, strict=True) if v is None]
        example = " ".join(f"{flag} {ex}" for (flag, ex), v in zip(PLAN_FLAGS, given, strict=True) if v is None)
        raise UsageError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing and no local run "
                         f"directory's run.json implies {'it' if len(missing) == 1 else 'them'}: give e.g. {example}")
    figures = (given[0] or implied.jobs_per_instance, given[1] or implied.memory_gib,
               given[2] or implied.jobs_per_day)
    return figures, implied.assumed if given == (None, None, None) else f"partly from {implied.assumed}", \
        implied.network_loopback


def _instance(name: str | None, vcpus_per_job: int) -> Any:
    """--instance-type from the table (tuning.instances), or None; a type it does not know, or one that cannot
    hold a job, is a usage error naming the flag."""
    if name is None:
        return None
    from tuning.instances import children_per_host, known_types_text, lookup, task_memory_mib

    kind = lookup(name)
    if kind is None:
        raise UsageError(f"--instance-type {name[:40]!r} is not in the instance table: use one of "
                         f"{known_types_text()} (see `iobatch advise --help`), or give --memory-gib and "
                         "--jobs-per-instance instead")
    if children_per_host(kind, vcpus_per_job) == 0:
        raise UsageError(f"--instance-type {kind.name} ({kind.vcpus} vCPUs, {kind.memory_gib} GiB) cannot hold one "
                         f"job of {vcpus_per_job} vCPUs and {task_memory_mib(vcpus_per_job) / 1024:g} GiB "
                         "(--vcpus-per-job): give a larger type")
    return kind


def advise(
    inputs: list[Path] = typer.Argument(None, metavar="RUN_DIR_OR_FILE", help="Run directories, profile .jsonl files "
                                        "or EMF files (local, or downloaded from CloudWatch Logs)."),
    jobs_per_instance: int | None = typer.Option(None, min=1, max=1024, metavar="N", help="Jobs running at once on "
                                                 "one instance (vCPUs / vcpusPerJob). Default for a local run "
                                                 "directory: its children at once (run.json)."),
    memory_gib: float | None = typer.Option(None, min=0.5, max=32768, metavar="GIB", help="The instance type's "
                                      "memory in GiB. Default for a local run directory: the memory of the "
                                      "machine it ran on."),
    jobs_per_day: int | None = typer.Option(None, min=1, max=100_000, metavar="N", help="Jobs per instance per day "
                                            "(each instance has its own scratch volume). Default for a local run "
                                            "directory: its children back to back all day."),
    instance_ebs_mibps: float | None = typer.Option(None, min=1, max=100_000, metavar="MIBPS", help="The instance "
                                                    "type's EBS bandwidth cap in MiB/s."),
    kernel: str | None = typer.Option(None, metavar="RELEASE", help="The hosts' `uname -r`, to validate mount options "
                                      "(default: a current kernel)."),
    candidate: list[str] = typer.Option([], "--candidate", "-C", metavar="VOLUME", help="A volume to compare, "
                                        "repeatable: TYPE:SIZE_GIB[:iops=N][:throughput=MIBPS], e.g. st1:500, gp3:200:"
                                        "iops=6000:throughput=500; or an instance store, nvme:INSTANCE_TYPE[:usd_per_"
                                        "hour=USD] (m6id, c6id, r6id, i4i of the plan's size; USD: what the store adds "
                                        "to the hourly price, else not priced), compared but never recommended (the "
                                        "stack deploys EBS scratch). Default: st1, sc1, gp2 and gp3 sized for the "
                                        "data, and the stores of --instance-type's size."),
    cache_budget_pct: float = typer.Option(40.0, min=1, max=90, metavar="PCT", help="Share of instance memory the "
                                           "write cache may hold."),
    io_size_kib: int | None = typer.Option(None, min=1, max=16384, metavar="KIB", help="Block I/O size to assume "
                                           "instead of the measured one."),
    random_pct: float | None = typer.Option(None, min=0, max=100, metavar="PCT", help="Share of device I/O that "
                                            "is random (st1/sc1 charge a random request under 1 MiB as "
                                            "1 MiB). Default: the profiles' DeviceRandomShare (eBPF), else "
                                            "sequential."),
    volume: str = typer.Option("st1:500", metavar="VOLUME", help="The stack's scratch volume now, which the findings "
                               "judge: TYPE:SIZE_GIB[:iops=N][:throughput=MIBPS]."),
    instance_usd_per_hour: float = typer.Option(0.384, min=0, max=1000, metavar="USD", help="The instance's price "
                                                "per hour, to price findings."),
    instance_network_mibps: float | None = typer.Option(None, min=1, max=100_000, metavar="MIBPS", help="The "
                                                        "instance's network bandwidth in MiB/s."),
    instance_type: str | None = typer.Option(None, metavar="TYPE", help="An EC2 instance type of the project's table "
                                             "(m6i, c6i, r6i, m6id, c6id, r6id, i4i; .large to .32xlarge and .metal; "
                                             "tuning/instances.py, AWS's figures): its memory, EBS baseline bandwidth "
                                             "and the children Batch runs on it (vCPUs / --vcpus-per-job, fewer when "
                                             "its memory holds fewer) are the plan's defaults."),
    vcpus_per_job: int = typer.Option(DEFAULT_VCPUS_PER_JOB, min=1, max=64, metavar="N", help="The stack's "
                                      "vcpusPerJob: children per host with --instance-type, and the job memory's "
                                      "default."),
    job_memory_gib: float | None = typer.Option(None, min=0.25, max=32768, metavar="GIB", help="Each child's memory "
                                                "limit (the job container's MEMORY): its own write cache is the dirty "
                                                "ratio of it, not of the host's memory. Default: the stack's for "
                                                "--vcpus-per-job (3.5 GiB per vCPU less the profiler's 256 MiB: 6.75 "
                                                "GiB for 2); none for a local run's own plan (its children had no "
                                                "limit) or when it exceeds --memory-gib."),
    as_json: bool = typer.Option(False, "--json", help="Print the advice as JSON."),
) -> None:
    """Recommend a scratch volume, write-cache settings and mount options from a run's profiles, and print
    the CDK context that applies them."""
    import json

    from profiling.runfiles import DamagedFileError
    from tuning.advice_text import render
    from tuning.advise import advise as make_advice
    from tuning.advise import load_profiles
    from tuning.ebs import VolumeError
    from tuning.host import HostTuningError, parse_kernel_release
    from tuning.plan import AdviseError, Plan, parse_candidate

    if kernel is not None:  # whole, before anything is read (tuning.host owns what a release is)
        try:
            parse_kernel_release(kernel, "--kernel")
        except HostTuningError as exc:
            raise UsageError(str(exc)) from None
        kernel = kernel.strip()
    kind = _instance(instance_type, vcpus_per_job)
    if kind is not None:
        jobs_per_instance = jobs_per_instance or children_per_host(kind, vcpus_per_job)
        memory_gib = memory_gib or float(kind.memory_gib)
        instance_ebs_mibps = instance_ebs_mibps or kind.ebs_baseline_mibps
    (per_instance, memory, per_day), assumed, loopback = _plan_figures(
        list(inputs or []), (jobs_per_instance, memory_gib, jobs_per_day))
    if job_memory_gib is None and memory_gib is not None:  # a local run's own plan: its children had no limit
        stack_default = job_memory_mib(vcpus_per_job) / 1024
        job_memory_gib = stack_default if stack_default <= memory else None
    try:
        plan = Plan(
            jobs_per_instance=per_instance, memory_gib=memory, jobs_per_day=per_day, assumed=assumed,
            job_memory_gib=job_memory_gib, instance_type=None if kind is None else kind.name,
            network_loopback=loopback, instance_ebs_mibps=instance_ebs_mibps, kernel_release=kernel,
            cache_budget_pct=cache_budget_pct,
            io_size_kib=io_size_kib, random_pct=random_pct, instance_usd_per_hour=instance_usd_per_hour,
            instance_network_mibps=instance_network_mibps, current_volume=parse_candidate(volume))
        volumes = [parse_candidate(text, instance_store=True) for text in candidate]
        profiles = load_profiles(list(inputs or []))
        result = make_advice(profiles, plan, volumes or None)
    except DamagedFileError as exc:  # one rule with the report: a damaged or newer-schema file is bad input, 65
        raise PermanentError(f"{exc}: {exc.fix}") from None
    except (AdviseError, VolumeError, HostTuningError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read the profiles ({exc.strerror or exc}): give readable run directories or "
                         "files") from None
    if as_json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(render(result))


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
    process_command = checks.process_command(process_command)
    # The emulated page cache lives in this machine's memory: a larger instance cannot be acted out here.
    machine_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    if memory_gib > machine_gib:
        raise UsageError(f"--memory-gib {memory_gib:g} is more than this machine's {machine_gib:.1f} GiB: give at "
                         "most that")
    try:
        tuned = HostTuning(dirty_ratio=dirty_ratio, dirty_background_ratio=dirty_background_ratio)
        tuned.validate()
        config = LabConfig(volume=parse_candidate(volume), lab_dir=lab_dir, loop_size_mib=loop_size_mib,
                           time_scale=time_scale,
                           initial_credits_mib=None if credits_gib is None else credits_gib * 1024,
                           hold_empty=after_cliff, throttle=throttle)
        config.validate()
    except (AdviseError, HostTuningError, LabError) as exc:
        raise UsageError(str(exc)) from None
    plan = ComparePlan(tuned=tuned, memory_gib=memory_gib, rounds=rounds, workers=workers, images=images,
                       image_mib=image_mib, images_per_child=images_per_child)
    # With --json, stdout carries only the JSON: the lab's lines and the children's go to stderr.
    lines = sys.stderr if as_json else sys.stdout
    if _lab_where(where) == "guest":
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
