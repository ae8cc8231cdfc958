"""StackSettings: every choice the stack makes, read from CDK context (`cdk.json` or `-c key=value`).

The context keys are camelCase and documented in the README ("Deploy to AWS"); `iobatch advise` prints
the ones it recommends. The scratch volume's keys are parsed and validated by tuning.ebs.Volume.from_context
and host tuning keys by tuning.host.HostTuning.from_context: this module keeps no copy of their rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pipeline.interface import CONTRACT_SUFFIX, process_command_problem
from tuning.ebs import CONTEXT_KEYS as VOLUME_CONTEXT_KEYS
from tuning.ebs import Volume, VolumeError
from tuning.host import CONTEXT_KEYS as HOST_CONTEXT_KEYS
from tuning.host import HostTuning, HostTuningError
from tuning.instances import (
    CHILDREN_PER_HOST_KEY,
    DEFAULT_CHILDREN_PER_HOST,
    DEFAULT_VCPUS_PER_JOB,
    INSTANCE_TYPES_KEY,
    PROFILER_MEMORY_MIB,
    VCPUS_PER_JOB_KEY,
    InstanceType,
    children_per_host,
    reserved_vcpus,
    task_memory_mib,
    types_of,
)

_NAME = re.compile(r"^[a-z][a-z0-9-]{1,30}[a-z0-9]$")
_VPC_ID = re.compile(r"^vpc-[0-9a-f]{8,17}$")
_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*[0-9][a-z0-9-]*(\.[a-z0-9]+)?$")


_PREFIX = re.compile(r"^([A-Za-z0-9!_.'()-]+/)*$")
# The contracts the image ships (containers/job/Dockerfile copies contracts/ to pipeline.interface.CONTRACTS_DIR).
SHIPPED_CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"
_IMAGE_PATH = re.compile(r"^/[A-Za-z0-9._/-]{1,250}$")
# The context key that turns the LD_PRELOAD interposer on in the job container (StackSettings.profiler_interpose).
PROFILER_INTERPOSE_KEY = "profilerInterpose"
# With vpcId: whether the stack adds an S3 gateway endpoint to the VPC's private route tables (false: it has one).
S3_GATEWAY_ENDPOINT_KEY = "s3GatewayEndpoint"
# Who hears the stack's alarms (infra/notify.py): an existing SNS topic, or an address the stack's own topic e-mails.
ALARM_TOPIC_KEY = "alarmTopicArn"
ALARM_EMAIL_KEY = "alarmEmail"
# Keys the stack's DeployContext output leaves out (StackSettings.published_context): an output is readable by anyone
# allowed cloudformation:DescribeStacks on the stack, and "CloudFormation doesn't redact or obfuscate any information
# you include in the Outputs section" (CloudFormation User Guide, "CloudFormation template Outputs syntax"). Who hears
# the alarms is the owner's business and the advisor needs neither; a `cdk deploy` whose -c pairs lack them keeps the
# values cdk.json gives ("If you specify a context variable using both the AWS CDK CLI and cdk.json file, the AWS CDK
# CLI value takes precedence": AWS CDK v2 Developer Guide, "Save and retrieve context variable values").
UNPUBLISHED_KEYS = (ALARM_TOPIC_KEY, ALARM_EMAIL_KEY)
# An SNS topic's ARN (arn:PARTITION:sns:REGION:ACCOUNT:NAME; a name is 1-256 letters, digits, - and _) and an e-mail
# address as SNS takes one for the email protocol (one @, a dot in the domain, no blanks).
_TOPIC_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$")
_EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]+\.[^@\s]+$")
# Every context key the stack reads; the README's "Deploy to AWS" table lists them with defaults.
CONTEXT_KEYS: tuple[str, ...] = (
    "pipelineName", "vpcId", S3_GATEWAY_ENDPOINT_KEY, *VOLUME_CONTEXT_KEYS,
    INSTANCE_TYPES_KEY, CHILDREN_PER_HOST_KEY, "maxvCpus", "minvCpus", VCPUS_PER_JOB_KEY, "spot", "jobTimeoutMinutes",
    "retryAttempts",
    "inputPrefix", "outputPrefix", *HOST_CONTEXT_KEYS, "profilerEbpf", PROFILER_INTERPOSE_KEY,
    "profilerContract", "processCommand", "jobImage", ALARM_TOPIC_KEY, ALARM_EMAIL_KEY,
)
# An image reference: [registry/]repository[:tag][@digest] (the Docker reference grammar, simplified).
_IMAGE = re.compile(r"^[a-z0-9][A-Za-z0-9._:/-]{0,254}(@sha256:[0-9a-f]{64})?$")
# A private ECR image the execution role is granted to pull ("Private registry authentication",
# Amazon ECR User Guide: ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPOSITORY[:TAG|@DIGEST]).
ECR_IMAGE = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
                       r"(?P<repository>[a-z0-9._/-]+?)(?::[\w.-]+|@sha256:[0-9a-f]{64})?$")


class SettingsError(ValueError):
    """A context value the stack cannot use; the message names the key and the fix."""


@dataclass(frozen=True)
class StackSettings:
    """What to deploy. Build it with `from_context(app.node.try_get_context)`-style mappings."""

    pipeline_name: str = "iobatch"
    vpc_id: str | None = None
    # With vpc_id: an S3 gateway endpoint on the route tables of its private subnets (False: the VPC has one there).
    s3_gateway_endpoint: bool = True
    volume: Volume = field(default_factory=Volume)  # the scratch volume on every host
    # Exact types by default: the ones the scratch volume is sized for (children_per_host), each with memory enough
    # per vCPU for the default job at one per core (c6i's 2 GiB per vCPU is not).
    instance_types: tuple[str, ...] = ("m6i.xlarge", "m6i.2xlarge", "r6i.xlarge", "r6i.2xlarge")
    # The most children one host's scratch volume is sized for (the advisor's plan: jobs per instance); synth
    # refuses instance types on which Batch would run more at once (each would get less than its share).
    children_per_host: int = DEFAULT_CHILDREN_PER_HOST
    max_vcpus: int = 256
    min_vcpus: int = 0
    vcpus_per_job: int = DEFAULT_VCPUS_PER_JOB
    spot: bool = False
    job_timeout_minutes: int = 120
    retry_attempts: int = 3
    # The job role may read only under input_prefix and write only under output_prefix.
    input_prefix: str = "images/"
    output_prefix: str = "shards/"
    host: HostTuning = field(default_factory=HostTuning)
    # The profiler container privileged and root, so it can load the eBPF probe (per-call latency of any
    # binary). Off by default: privileged means host-level power for the profiler (see the README).
    profiler_ebpf: bool = False
    # The job container runs with the image's LD_PRELOAD interposer (per-call latency and per-path figures of the
    # job and every dynamically linked program it starts; not of static Go binaries such as s5cmd): the job
    # derives its record directory from its scratch directory (pipeline.job.record_calls), where the profiler
    # finds it. Off by default: the job's calls then cost nothing extra.
    profiler_interpose: bool = False
    # A contract the profiler evaluates per stage: the name of one the image ships (contracts/NAME.contract)
    # or an absolute path in the image (a user image's own); None: no contract.
    profiler_contract: str | None = None
    # The process stage's command line in the job definition (pipeline.interface: {input} {output}); None
    # leaves it to the image (its IOBATCH_PROCESS_COMMAND, else the built-in resizer).
    process_command: str | None = None
    # The job's image, built FROM the project's image with the user's code (README "Your own processing");
    # None: the project's image, built from containers/job/Dockerfile by `cdk deploy`.
    job_image: str | None = None
    # Who is told when an alarm goes off (infra/notify.py): an SNS topic's ARN, or an address the stack's own topic
    # e-mails (both: the address subscribes to that topic); neither: the dashboard only.
    alarm_topic_arn: str | None = None
    alarm_email: str | None = None

    @property
    def memory_per_job_mib(self) -> int:
        """Memory for one job (tuning.instances.task_memory_mib: 3.5 GiB per vCPU)."""
        return task_memory_mib(self.vcpus_per_job)

    @property
    def profiler_memory_mib(self) -> int:
        """The sidecar's share of the job's memory."""
        return PROFILER_MEMORY_MIB

    @property
    def profiler_vcpus(self) -> int:
        """The sidecar's vCPU, taken from the job's share where it has more than one. AWS Batch documents a vCPU
        requirement for every container ("You must specify at least one vCPU", ResourceRequirement; AWS's
        EcsProperties examples give each container a VCPU and MEMORY), so the profiler is not left with MEMORY alone.
        On EC2 a vCPU is 1,024 CPU shares, a weight under contention, not a limit: the idle profiler takes nothing."""
        return 1

    @property
    def job_vcpus(self) -> int:
        """The job container's vCPUs: vcpusPerJob less the profiler's, at least one, so the job reserves
        tuning.instances.reserved_vcpus (vcpusPerJob 1 reserves 2), which the hosts' checks and the advisor count."""
        return reserved_vcpus(self.vcpus_per_job) - self.profiler_vcpus

    @classmethod
    def from_context(cls, ctx: Mapping[str, Any]) -> StackSettings:
        """Read and validate every key; unknown keys are ignored (CDK's own flags live there too)."""
        base = cls()
        try:
            volume = Volume.from_context(ctx)
            host = HostTuning.from_context(ctx)
            host.validate()
        except (VolumeError, HostTuningError) as exc:
            raise SettingsError(str(exc)) from None
        settings = cls(
            pipeline_name=_text(ctx, "pipelineName", base.pipeline_name),
            vpc_id=_optional_text(ctx, "vpcId"),
            s3_gateway_endpoint=_bool(ctx, S3_GATEWAY_ENDPOINT_KEY, base.s3_gateway_endpoint),
            volume=volume,
            instance_types=_list(ctx, INSTANCE_TYPES_KEY, base.instance_types),
            children_per_host=_int(ctx, CHILDREN_PER_HOST_KEY, base.children_per_host),
            max_vcpus=_int(ctx, "maxvCpus", base.max_vcpus),
            min_vcpus=_int(ctx, "minvCpus", base.min_vcpus),
            vcpus_per_job=_int(ctx, VCPUS_PER_JOB_KEY, base.vcpus_per_job),
            spot=_bool(ctx, "spot", base.spot),
            job_timeout_minutes=_int(ctx, "jobTimeoutMinutes", base.job_timeout_minutes),
            retry_attempts=_int(ctx, "retryAttempts", base.retry_attempts),
            input_prefix=_text(ctx, "inputPrefix", base.input_prefix),
            output_prefix=_text(ctx, "outputPrefix", base.output_prefix),
            host=host,
            profiler_ebpf=_bool(ctx, "profilerEbpf", base.profiler_ebpf),
            profiler_interpose=_bool(ctx, PROFILER_INTERPOSE_KEY, base.profiler_interpose),
            profiler_contract=_optional_text(ctx, "profilerContract"),
            process_command=_optional_text(ctx, "processCommand"),
            job_image=_optional_text(ctx, "jobImage"),
            alarm_topic_arn=_optional_text(ctx, ALARM_TOPIC_KEY),
            alarm_email=_optional_text(ctx, ALARM_EMAIL_KEY),
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise SettingsError naming the context key and the fix."""
        if not _NAME.match(self.pipeline_name):
            raise SettingsError(
                f"pipelineName {self.pipeline_name!r} is not usable in resource names: use 3-32 "
                "lowercase letters, digits and dashes, e.g. iobatch"
            )
        if self.vpc_id is not None and not _VPC_ID.match(self.vpc_id):
            raise SettingsError(f"vpcId {self.vpc_id!r} is not a VPC id like vpc-0123456789abcdef0")
        for key, prefix in (("inputPrefix", self.input_prefix), ("outputPrefix", self.output_prefix)):
            if not _PREFIX.match(prefix) or not prefix:
                raise SettingsError(
                    f"{key} {prefix!r} is not a key prefix: give folders ending in '/', e.g. images/"
                )
        if not self.instance_types:
            raise SettingsError("instanceTypes is empty: give families or types, e.g. [\"m6i\", \"c6i\"]")
        for name in self.instance_types:
            if not _INSTANCE_TYPE.match(name):
                raise SettingsError(
                    f"instanceTypes entry {name!r} is not an instance family or type like m6i or m6i.2xlarge"
                )
        if self.min_vcpus < 0 or self.max_vcpus < 1 or self.min_vcpus > self.max_vcpus:
            raise SettingsError(
                f"minvCpus {self.min_vcpus} / maxvCpus {self.max_vcpus}: need 0 <= minvCpus <= maxvCpus, "
                "maxvCpus >= 1"
            )
        if not 1 <= self.vcpus_per_job <= 64:
            raise SettingsError(f"vcpusPerJob {self.vcpus_per_job} is outside 1-64")
        if self.vcpus_per_job > self.max_vcpus:
            raise SettingsError(f"vcpusPerJob {self.vcpus_per_job} exceeds maxvCpus {self.max_vcpus}")
        if not 1 <= self.children_per_host <= 256:
            raise SettingsError(f"childrenPerHost {self.children_per_host} is outside 1-256")
        self._validate_hosts()
        if not 1 <= self.job_timeout_minutes <= 14 * 24 * 60:
            raise SettingsError(f"jobTimeoutMinutes {self.job_timeout_minutes} is outside 1-20160")
        if not 1 <= self.retry_attempts <= 10:
            raise SettingsError(f"retryAttempts {self.retry_attempts} is outside 1-10 (Batch's limits)")
        if self.process_command is not None and (problem := process_command_problem(self.process_command)):
            raise SettingsError(f"processCommand {self.process_command[:80]!r} {problem}")
        if self.profiler_contract is not None:
            shipped = sorted(p.stem for p in SHIPPED_CONTRACTS.glob(f"*{CONTRACT_SUFFIX}"))
            if not (self.profiler_contract in shipped or _IMAGE_PATH.match(self.profiler_contract)):
                raise SettingsError(f"profilerContract {self.profiler_contract[:80]!r} is neither a contract the "
                                    f"image ships ({', '.join(shipped)}) nor an absolute path in the image")
        if self.alarm_topic_arn is not None and not _TOPIC_ARN.match(self.alarm_topic_arn):
            raise SettingsError(f"{ALARM_TOPIC_KEY} {self.alarm_topic_arn[:80]!r} is not an SNS topic ARN: give e.g. "
                                "arn:aws:sns:us-east-1:123456789012:iobatch-alarms")
        if self.alarm_email is not None and not _EMAIL.match(self.alarm_email):
            raise SettingsError(f"{ALARM_EMAIL_KEY} {self.alarm_email[:80]!r} is not an e-mail address: give e.g. "
                                "ops@example.com")
        if self.job_image is not None and not _IMAGE.match(self.job_image):
            raise SettingsError(f"jobImage {self.job_image[:80]!r} is not an image reference: give e.g. "
                                "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-iobatch:1")

    def _validate_hosts(self) -> None:
        """Every instance type the table knows (tuning.instances) that instanceTypes lets Batch launch holds the
        default job at one per core (memory per vCPU), and runs at most childrenPerHost children at once, so none
        gets less than its share of the scratch volume. Types the table does not know are not checked."""
        if self.host.scratch == "instance-store":
            self._validate_stores()
            return
        for entry in self.instance_types:
            kinds = types_of(entry)
            for kind in kinds:
                per_cpu = kind.vcpus // reserved_vcpus(self.vcpus_per_job)
                children = children_per_host(kind, self.vcpus_per_job)
                if children < per_cpu:
                    self._memory_misfit(entry, kind, children)
            most = max(kinds, key=lambda k: children_per_host(k, self.vcpus_per_job), default=None)
            children = 0 if most is None else children_per_host(most, self.vcpus_per_job)
            if most is not None and children > self.children_per_host:
                launch = (most.name if entry.strip().lower() == most.name
                          else f"{entry!r} lets Batch launch {most.name}, which")
                volume, planned = self.volume, self.children_per_host
                raise SettingsError(
                    f"instanceTypes entry {launch} runs {children} children at once: each gets "
                    f"{volume.size_gib / children:,.0f} GiB and {volume.baseline_mibps / children:,.1f} MiB/s of "
                    f"{volume.label}, less than the plan's share (childrenPerHost {planned}: "
                    f"{volume.size_gib / planned:,.0f} GiB, {volume.baseline_mibps / planned:,.1f} MiB/s): give exact "
                    "types that run at most that many (e.g. m6i.2xlarge), or a larger childrenPerHost and volume")

    def _memory_misfit(self, entry: str, kind: InstanceType, children: int) -> NoReturn:
        raise SettingsError(
            f"instanceTypes entry {entry!r}: {kind.name} has {kind.memory_gib / kind.vcpus:g} GiB per vCPU and holds "
            f"{children} jobs of {self.memory_per_job_mib / 1024:g} GiB (vcpusPerJob {self.vcpus_per_job}) on "
            f"{kind.vcpus} vCPUs, leaving {kind.vcpus - children * reserved_vcpus(self.vcpus_per_job)} idle: use a "
            "family with more memory per vCPU (m6i, r6i; with an instance store m6id, r6id)")

    def _validate_stores(self) -> None:
        """Instance-store scratch: every entry is an exact type the table knows with one store device (the script
        takes one; a family's sizes differ), holding the default job at one per core, whose store gives each of
        its children at least the plan's share (volumeSizeGiB over childrenPerHost: the EBS volume is not made,
        but its size still says how much scratch a child needs)."""
        share = self.volume.size_gib / self.children_per_host
        for entry in self.instance_types:
            kinds = types_of(entry)
            if len(kinds) != 1 or "." not in entry:
                raise SettingsError(
                    f"instanceTypes entry {entry!r}: instance-store scratch needs exact types the stack knows, e.g. "
                    "m6id.2xlarge (a family's sizes have different stores; the known ones: m6id, c6id, r6id, i4i)")
            kind = kinds[0]
            if kind.store_volumes != 1:
                have = "no instance store" if not kind.store_volumes else f"{kind.store_volumes} store devices"
                raise SettingsError(
                    f"instanceTypes entry {entry!r} has {have}: instance-store scratch takes a type with exactly "
                    "one (m6id/c6id/r6id up to 8xlarge, i4i up to 4xlarge), or use -c scratch=ebs")
            children = children_per_host(kind, self.vcpus_per_job)
            if children < kind.vcpus // reserved_vcpus(self.vcpus_per_job):
                self._memory_misfit(entry, kind, children)
            each = kind.store_gb * 1e9 / 2**30 / max(children, 1)
            if each < share:
                raise SettingsError(
                    f"instanceTypes entry {entry!r}: {kind.describe()} runs {children} children of "
                    f"{self.memory_per_job_mib / 1024:g} GiB, {each:,.0f} GiB of store each, against the plan's "
                    f"{share:,.0f} GiB (volumeSizeGiB {self.volume.size_gib} over childrenPerHost "
                    f"{self.children_per_host}): "
                    "give a larger size or a family with more memory per vCPU, or a smaller volumeSizeGiB")

    def to_context(self) -> dict[str, str]:
        """The context keys that rebuild these settings (strings, as `-c` passes them)."""
        ctx = {
            "pipelineName": self.pipeline_name,
            INSTANCE_TYPES_KEY: json.dumps(list(self.instance_types)),
            "maxvCpus": str(self.max_vcpus),
            "minvCpus": str(self.min_vcpus),
            VCPUS_PER_JOB_KEY: str(self.vcpus_per_job),
            CHILDREN_PER_HOST_KEY: str(self.children_per_host),
            "spot": str(self.spot).lower(),
            "profilerEbpf": str(self.profiler_ebpf).lower(),
            PROFILER_INTERPOSE_KEY: str(self.profiler_interpose).lower(),
            "jobTimeoutMinutes": str(self.job_timeout_minutes),
            "retryAttempts": str(self.retry_attempts),
            "inputPrefix": self.input_prefix,
            "outputPrefix": self.output_prefix,
        }
        if self.vpc_id:
            ctx["vpcId"] = self.vpc_id
            ctx[S3_GATEWAY_ENDPOINT_KEY] = str(self.s3_gateway_endpoint).lower()
        if self.profiler_contract:
            ctx["profilerContract"] = self.profiler_contract
        if self.process_command:
            ctx["processCommand"] = self.process_command
        if self.job_image:
            ctx["jobImage"] = self.job_image
        if self.alarm_topic_arn:
            ctx[ALARM_TOPIC_KEY] = self.alarm_topic_arn
        if self.alarm_email:
            ctx[ALARM_EMAIL_KEY] = self.alarm_email
        return {**ctx, **self.volume.to_context(), **self.host.to_context()}

    def published_context(self) -> dict[str, str]:
        """to_context less UNPUBLISHED_KEYS: what the stack's DeployContext output says it was deployed with."""
        return {key: value for key, value in self.to_context().items() if key not in UNPUBLISHED_KEYS}


def _text(ctx: Mapping[str, Any], key: str, default: str) -> str:
    value = ctx.get(key)
    return default if value is None or str(value).strip() == "" else str(value).strip()


def _optional_text(ctx: Mapping[str, Any], key: str) -> str | None:
    value = ctx.get(key)
    if value is None or str(value).strip().lower() in ("", "none", "null"):
        return None
    return str(value).strip()


def _int(ctx: Mapping[str, Any], key: str, default: int) -> int:
    value = ctx.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    if isinstance(value, bool):
        raise SettingsError(f"context {key}={value!r} is not a whole number: e.g. -c {key}={default}")
    try:
        return int(str(value).strip())
    except ValueError:
        raise SettingsError(f"context {key}={value!r} is not a whole number: e.g. -c {key}={default}") from None


def _bool(ctx: Mapping[str, Any], key: str, default: bool) -> bool:
    value = ctx.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise SettingsError(f"context {key}={value!r} is not true or false")


def _list(ctx: Mapping[str, Any], key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """A list from cdk.json, or from `-c key=...` as JSON (["m6i","c6i"]) or comma-separated text."""
    value = ctx.get(key)
    if value is None:
        return default
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise SettingsError(f"context {key}={text!r} is not a JSON list: e.g. [\"m6i\",\"c6i\"]") from None
        else:
            value = text.split(",")
    if not isinstance(value, list | tuple):
        raise SettingsError(f"context {key}={value!r} is not a list: e.g. m6i,c6i")
    return tuple(str(v).strip() for v in value if str(v).strip())
