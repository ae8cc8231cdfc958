"""`iobatch advise`: a scratch volume, write-cache settings and mount options from a run's profiles (tuning/): from
local run directories and files, or from a batch in AWS (pipeline.cli.advise_aws), its plan from the deployed stack."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from pipeline.cli import checks
from pipeline.errors import PermanentError, UsageError
from tuning.instances import DEFAULT_VCPUS_PER_JOB, MAX_MEMORY_GIB, MIN_MEMORY_GIB, children_per_host, job_memory_mib

PLAN_FLAGS = (("--jobs-per-instance", "4"), ("--memory-gib", "16"), ("--jobs-per-day", "500"))


def _implied_plan(inputs: list[Path]) -> Any:
    """The plan a local run directory among `inputs` implies (its run.json: pipeline.local.demo.local_plan), or
    None when none does."""
    from pipeline.local.demo import local_plan
    from pipeline.local.runjson import read_run
    from profiling import runfiles

    for path in inputs:
        try:
            is_run = path.is_dir() and runfiles.is_run_dir(path)
        except OSError:  # a name the file system refuses (over 255 bytes): reading the profiles names it
            continue
        if is_run:
            run = read_run(path)  # strictly: a damaged run.json is 65 naming it, never "missing flags"
            try:  # a damaged profile is named by the profile reader afterwards, with its own exit code
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
        raise UsageError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing and neither a local "
                         f"run directory's run.json nor --stack implies {'it' if len(missing) == 1 else 'them'}: give "
                         f"e.g. {example}")
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


@dataclass
class _StackPlan:
    """The plan's defaults a deployed stack gives (`advise --stack`: tuning.deployed), and where each came from; with
    no stack, the advisor's own defaults and nothing to say."""

    deployed: Any  # tuning.deployed.Deployed | None
    stack: str | None
    profiles: list[Any]
    instance_type: str | None
    vcpus_per_job: int
    notes: list[str] = field(default_factory=list)  # the hosts' settings taken from the stack
    day: str = ""  # how the jobs per day were derived from the batch

    @classmethod
    def of(cls, cloud: Any, instance_type: str | None, vcpus_per_job: int | None) -> _StackPlan:
        deployed = None if cloud is None else cloud.deployed
        if deployed is None:
            return cls(None, None, [], instance_type, vcpus_per_job or DEFAULT_VCPUS_PER_JOB)
        plan = cls(deployed, cloud.stack, cloud.profiles, instance_type, vcpus_per_job or deployed.vcpus_per_job)
        if vcpus_per_job is None:
            plan.notes.append(f"vcpusPerJob {deployed.vcpus_per_job}")
        if instance_type is None:
            kind, why = deployed.instance_type(str(p.properties.get("InstanceType", "")) for p in cloud.profiles)
            if kind is not None:
                plan.instance_type = kind.name
                plan.notes.append(f"{kind.name}, {why}")
        return plan

    @property
    def tuning(self) -> Any:
        """The hosts' tuning now: the stack's, else the stack's defaults (tuning.host.HostTuning)."""
        from tuning.host import HostTuning

        return HostTuning() if self.deployed is None else self.deployed.tuning

    def scratch(self, kind: Any) -> Any:
        """The scratch volume now: the stack's (its instance store on `kind` with -c scratch=instance-store), else
        the stack's default volume."""
        from tuning.ebs import Volume

        return Volume() if self.deployed is None else self.deployed.scratch_volume(kind)

    def jobs_per_day(self, jobs_per_instance: int) -> int | None:
        """With a stack, the batch's children back to back all day (tuning.plan.back_to_back); else None."""
        from tuning.plan import back_to_back

        if self.deployed is None:
            return None
        per_day, child_s = back_to_back(self.profiles, jobs_per_instance)
        self.day = f"jobs per day: the batch's children back to back all day at {child_s:,.1f} s each"
        return per_day

    def assumed(self, scratch: Any, given: list[str]) -> str:
        """Where the plan came from, in words ('' with no stack): what the stack gave, and the flags that overrode
        it."""
        if self.deployed is None:
            return ""
        stack_notes = [*self.notes, *([] if "--volume" in given else [f"scratch {scratch.label}"]),
                       "its host tuning", *([self.day] if self.day else [])]
        flags = f"; given over the stack's: {', '.join(given)}" if given else ""
        return f"stack {self.stack}: " + ", ".join(stack_notes) + flags

    def deploy(self, advised: dict[str, str], *, keep_hosts: bool) -> tuple[dict[str, str], str] | None:
        """The stack's deployed context with the advice in place, and the command that deploys it (None: no stack).
        The stack's instance types stay unless the plan's came from a flag."""
        from tuning.deployed import make_deploy

        if self.deployed is None:
            return None
        context = self.deployed.apply(advised, keep_hosts=keep_hosts)
        return context, make_deploy(context)


def advise(
    inputs: list[Path] = typer.Argument(None, metavar="RUN_DIR_OR_FILE", help="Run directories, profile .jsonl files "
                                        "or EMF files (local, or downloaded from CloudWatch Logs)."),
    stack: str | None = typer.Option(None, "--stack", metavar="NAME", help="A deployed stack: read the batch's EMF "
                                     "documents from its log group and the plan from what it was deployed with "
                                     "(instance types, vcpusPerJob, scratch, host tuning: its DeployContext output); "
                                     "print the `make deploy` that applies the advice. A plan flag given overrides "
                                     "the stack's value."),
    from_cloudwatch: str | None = typer.Option(None, "--from-cloudwatch", metavar="LOG_GROUP", help="Read the EMF "
                                               "documents of a batch in AWS from this CloudWatch Logs group (the "
                                               "plan from the flags)."),
    job_id: list[str] = typer.Option([], "--job-id", metavar="JOB_ID", help="With --stack or --from-cloudwatch: only "
                                     "this batch's children (an array job's id, repeatable for a batch of several), "
                                     "read over the time AWS Batch says it ran unless --since is given."),
    since: str | None = typer.Option(None, metavar="DURATION", help="With --stack or --from-cloudwatch: how far back "
                                     "to read (90s, 30m, 1h, 2d; default 1h, or the run of --job-id)."),
    namespace: str = typer.Option("IoBatch", metavar="NAME", help="The EMF namespace to keep, of EMF files or "
                                  "CloudWatch Logs: the one the sidecar wrote (its --namespace, else "
                                  "AWS_EMF_NAMESPACE)."),
    region: str | None = typer.Option(None, metavar="REGION", help="With --stack or --from-cloudwatch: the AWS region "
                                      "(default: AWS_REGION, then AWS_DEFAULT_REGION)."),
    logs_endpoint: str | None = typer.Option(None, metavar="URL", help="With CloudWatch Logs: a CloudWatch Logs "
                                             "endpoint other than AWS's (e.g. a local emulator)."),
    jobs_per_instance: int | None = typer.Option(None, min=1, max=1024, metavar="N", help="Jobs running at once on "
                                                 "one instance (vCPUs / vcpusPerJob). Default for a local run "
                                                 "directory: its children at once (run.json)."),
    memory_gib: float | None = typer.Option(None, min=MIN_MEMORY_GIB, max=MAX_MEMORY_GIB, metavar="GIB",
                                            help="The instance type's memory in GiB. Default for a local run "
                                            "directory: the memory of the machine it ran on."),
    jobs_per_day: int | None = typer.Option(None, min=1, max=100_000, metavar="N", help="Jobs per instance per day "
                                            "(each instance has its own scratch volume). Default for a local run "
                                            "directory or --stack: its children back to back all day."),
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
    volume: str | None = typer.Option(None, metavar="VOLUME", help="The stack's scratch volume now, which the "
                                      "findings judge: TYPE:SIZE_GIB[:iops=N][:throughput=MIBPS]. Default: the "
                                      "stack's with --stack, else st1:500."),
    instance_usd_per_hour: float = typer.Option(0.384, min=0, max=1000, metavar="USD", help="The instance's price "
                                                "per hour, to price findings."),
    instance_network_mibps: float | None = typer.Option(None, min=1, max=100_000, metavar="MIBPS", help="The "
                                                        "instance's network bandwidth in MiB/s."),
    instance_type: str | None = typer.Option(None, metavar="TYPE", help="An EC2 instance type of the project's table "
                                             "(m6i, c6i, r6i, m6id, c6id, r6id, i4i; .large to .32xlarge and .metal; "
                                             "tuning/instances.py, AWS's figures): its memory, EBS baseline bandwidth "
                                             "and the children Batch runs on it (vCPUs / --vcpus-per-job, fewer when "
                                             "its memory holds fewer) are the plan's defaults. Default with --stack: "
                                             "the stack's type most of the batch ran on."),
    vcpus_per_job: int | None = typer.Option(None, min=1, max=64, metavar="N", help="The stack's vcpusPerJob: "
                                             "children per host with --instance-type, and the job memory's default "
                                             f"(default: the stack's with --stack, else {DEFAULT_VCPUS_PER_JOB})."),
    job_memory_gib: float | None = typer.Option(None, min=0.25, max=32768, metavar="GIB", help="Each child's memory "
                                                "limit (the job container's MEMORY): its own write cache is the dirty "
                                                "ratio of it, not of the host's memory. Default: the stack's for "
                                                "--vcpus-per-job (3.5 GiB per vCPU less the profiler's 256 MiB: 6.75 "
                                                "GiB for 2); none for a local run's own plan (its children had no "
                                                "limit) or when it exceeds --memory-gib."),
    as_json: bool = typer.Option(False, "--json", help="Print the advice as JSON."),
) -> None:
    """Recommend a scratch volume, write-cache settings and mount options from a run's profiles, and print
    the CDK context that applies them (with --stack, the whole `make deploy` command)."""
    import json

    from profiling.runfiles import DamagedFileError
    from tuning.advice_text import render
    from tuning.advise import advise as make_advice
    from tuning.advise import load_profiles
    from tuning.ebs import VolumeError
    from tuning.host import HostTuningError, parse_kernel_release
    from tuning.plan import AdviseError, Plan, parse_candidate

    sources = [bool(inputs), stack is not None, from_cloudwatch is not None]
    if sum(sources) != 1:
        raise UsageError("give run directories or files, --stack NAME or --from-cloudwatch LOG_GROUP: exactly one of "
                         "them" + (" (got more than one)" if sum(sources) > 1 else ""))
    if job_id and not (stack or from_cloudwatch):
        raise UsageError("--job-id selects a batch in CloudWatch Logs: give it with --stack NAME or --from-cloudwatch")
    if inputs:  # read from files: the CloudWatch Logs flags would be silently ignored
        checks.unused_flags({"since": "--since", "region": "--region", "logs_endpoint": "--logs-endpoint"},
                            "with --stack or --from-cloudwatch")
        if all(path.suffix == ".jsonl" and not path.is_dir() for path in inputs):  # a profile carries no namespace
            checks.unused_flags({"namespace": "--namespace"}, "with EMF files, run directories or CloudWatch Logs")
    logs_endpoint = checks.endpoint_url(logs_endpoint, "--logs-endpoint")  # given, it is checked, used or not
    checks.emf_namespace(namespace)
    job_ids = checks.job_ids(job_id)
    if kernel is not None:  # whole, before anything is read (tuning.host owns what a release is)
        try:
            parse_kernel_release(kernel, "--kernel")
        except HostTuningError as exc:
            raise UsageError(str(exc)) from None
        kernel = kernel.strip()
    try:
        current = None if volume is None else parse_candidate(volume, what="--volume")
        volumes = [parse_candidate(text, instance_store=True) for text in candidate]
    except (AdviseError, VolumeError) as exc:
        raise UsageError(str(exc)) from None
    given = [flag for flag, value in (("--instance-type", instance_type), ("--vcpus-per-job", vcpus_per_job),
                                      ("--jobs-per-instance", jobs_per_instance), ("--memory-gib", memory_gib),
                                      ("--jobs-per-day", jobs_per_day), ("--job-memory-gib", job_memory_gib),
                                      ("--instance-ebs-mibps", instance_ebs_mibps), ("--volume", volume))
             if value is not None]
    cloud = None
    if stack is not None or from_cloudwatch is not None:
        from pipeline.cli.advise_aws import read_batch

        cloud = read_batch(stack=stack, from_cloudwatch=from_cloudwatch, job_ids=job_ids, since=since,
                           namespace=namespace, region=region, logs_endpoint=logs_endpoint)
    stacked = _StackPlan.of(cloud, instance_type, vcpus_per_job)
    vcpus = stacked.vcpus_per_job
    kind = _instance(stacked.instance_type, vcpus)
    if kind is not None:
        jobs_per_instance = jobs_per_instance or children_per_host(kind, vcpus)
        memory_gib = memory_gib or float(kind.memory_gib)
        instance_ebs_mibps = instance_ebs_mibps or kind.ebs_baseline_mibps
    if jobs_per_day is None and jobs_per_instance is not None:
        jobs_per_day = stacked.jobs_per_day(jobs_per_instance)
    (per_instance, memory, per_day), assumed, loopback = _plan_figures(
        list(inputs or []), (jobs_per_instance, memory_gib, jobs_per_day))
    if job_memory_gib is None and memory_gib is not None:  # a local run's own plan: its children had no limit
        stack_default = job_memory_mib(vcpus) / 1024
        job_memory_gib = stack_default if stack_default <= memory else None
    scratch = current or stacked.scratch(kind)
    try:
        plan = Plan(
            jobs_per_instance=per_instance, memory_gib=memory, jobs_per_day=per_day,
            assumed=stacked.assumed(scratch, given) or assumed,
            job_memory_gib=job_memory_gib, instance_type=None if kind is None else kind.name, vcpus_per_job=vcpus,
            network_loopback=loopback, instance_ebs_mibps=instance_ebs_mibps, kernel_release=kernel,
            cache_budget_pct=cache_budget_pct,
            io_size_kib=io_size_kib, random_pct=random_pct, instance_usd_per_hour=instance_usd_per_hour,
            instance_network_mibps=instance_network_mibps, current_volume=scratch, current_tuning=stacked.tuning)
        profiles = cloud.profiles if cloud is not None else load_profiles(list(inputs or []), namespace=namespace)
        result = make_advice(profiles, plan, volumes or None)
    except DamagedFileError as exc:  # one rule with the report: a damaged or newer-schema file is bad input, 65
        raise PermanentError(f"{exc}: {exc.fix}") from None
    except (AdviseError, VolumeError, HostTuningError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read the profiles ({exc.strerror or exc}): give readable run directories or "
                         "files") from None
    deploy = stacked.deploy(result.context, keep_hosts=not {"--instance-type", "--jobs-per-instance"} & set(given))
    if as_json:
        body = result.to_json()
        if cloud is not None:
            body["source"] = cloud.source
        if deploy is not None:
            body["deploy_context"], body["make_deploy"] = deploy
        print(json.dumps(body, indent=1))
    else:
        print(render(result, deploy=None if deploy is None else deploy[1]))
