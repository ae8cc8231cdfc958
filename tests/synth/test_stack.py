"""Template assertions for every construct of the stack, on the one session-wide synth."""

from __future__ import annotations

import json
import re
from typing import Any

from aws_cdk import assertions

from infra.dashboard import dashboard_metrics, slowest_download_query
from infra.settings import StackSettings
from pipeline.interface import (
    AWS_ENV,
    CONTAINER_COMMANDS,
    CONTAINERS,
    ENV,
    EXIT_PERMANENT,
    EXIT_RETRYABLE,
    EXIT_USAGE,
    HOST_CGROUP_MOUNT,
    OUTPUT_KEYS,
    PROFILER_CONTAINER,
    SCRATCH_MOUNT,
    STACK_OUTPUT_KEYS,
)
from pipeline.settings import JobSettings
from profiling.metrics import DEFAULT_NAMESPACE, STAGES
from profiling.qualification import QUALIFICATION_DIR
from tests.support.synth import Synthesized, synthesize
from tuning.host import SYSCTL_CONF_PATH, HostReport, HostTuning


def flatten(node: Any) -> str:
    """A CloudFormation value as text, with Ref/GetAtt shown as <Name> (enough to parse JSON bodies)."""
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and "Fn::Join" in node:
        sep, parts = node["Fn::Join"]
        return sep.join(flatten(p) for p in parts)
    if isinstance(node, dict) and "Ref" in node:
        return f"<{node['Ref']}>"
    if isinstance(node, dict) and "Fn::GetAtt" in node:
        return "<{}.{}>".format(*node["Fn::GetAtt"])
    raise AssertionError(f"cannot flatten {node!r}")


def host_script(synthesized: Synthesized) -> str:
    """The shell-script part of the launch template's MIME multipart user data (a text part, not base64)."""
    user_data = synthesized.only("AWS::EC2::LaunchTemplate")["Properties"]["LaunchTemplateData"]["UserData"]
    text = flatten(user_data["Fn::Base64"])
    head, _, rest = text.partition('Content-Type: text/x-shellscript; charset="utf-8"\n\n')
    assert "multipart/mixed" in head and rest and "Content-Type" not in rest
    script, _, tail = rest.rpartition("\n--")
    assert tail.endswith("--\n") or tail.endswith("--"), tail
    return script


def statements(synthesized: Synthesized, role_prefix: str) -> list[dict[str, Any]]:
    """Every policy statement attached to the role whose logical id starts with role_prefix."""
    found: list[dict[str, Any]] = []
    for policy in synthesized.resources("AWS::IAM::Policy").values():
        roles = [r["Ref"] for r in policy["Properties"]["Roles"]]
        if any(r.startswith(role_prefix) for r in roles):
            found.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return found


def test_launch_template_has_an_encrypted_st1_scratch_volume_and_requires_imdsv2(synthesized: Synthesized) -> None:
    data = synthesized.only("AWS::EC2::LaunchTemplate")["Properties"]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1  # no container reaches IMDS
    [mapping] = data["BlockDeviceMappings"]
    assert mapping["DeviceName"] == "/dev/xvdb"
    assert mapping["Ebs"] == {"DeleteOnTermination": True, "Encrypted": True, "VolumeSize": 500, "VolumeType": "st1"}


def test_instance_store_scratch_attaches_no_volume_and_takes_the_store() -> None:
    types = ["m6id.2xlarge", "r6id.2xlarge"]
    synthesized = synthesize(scratch="instance-store", instanceTypes=json.dumps(types), volumeSizeGiB="400")
    data = synthesized.only("AWS::EC2::LaunchTemplate")["Properties"]["LaunchTemplateData"]
    assert "BlockDeviceMappings" not in data  # Nitro shows the store without a mapping
    script = host_script(synthesized)
    assert "\nSCRATCH=instance-store\n" in script and "\nDEFAULT_DEVICE=''\n" in script
    resources = synthesized.only("AWS::Batch::ComputeEnvironment")["Properties"]["ComputeResources"]
    assert resources["InstanceTypes"] == types


def test_user_data_is_the_script_tuning_host_renders(synthesized: Synthesized) -> None:
    script = host_script(synthesized)
    tuning = HostTuning()
    [log_group] = [k for k in synthesized.resources("AWS::Logs::LogGroup") if k.startswith("Logs")]
    assert script == tuning.render_script(report=HostReport(f"<{log_group}>", "iobatch"))
    assert "vm.dirty_ratio = 30\n" in script and "vm.dirty_background_ratio = 20\n" in script
    assert "MOUNT_OPTIONS=noatime,nodiratime,logbufs=8,logbsize=256k,nofail\n" in script
    assert SYSCTL_CONF_PATH in script
    for removed in ("nobarrier", "osyncisdsync", "nobootwait"):
        assert removed not in script


def test_compute_environment_pins_the_launch_template_version(synthesized: Synthesized) -> None:
    env = synthesized.only("AWS::Batch::ComputeEnvironment")["Properties"]
    resources = env["ComputeResources"]
    [lt_id] = synthesized.resources("AWS::EC2::LaunchTemplate")
    assert resources["LaunchTemplate"] == {
        "LaunchTemplateId": {"Ref": lt_id},
        "Version": {"Fn::GetAtt": [lt_id, "LatestVersionNumber"]},
    }
    assert resources["Ec2Configuration"] == [{"ImageType": "ECS_AL2023"}]
    # Exact types, the ones the volume plan assumes (tests/unit/test_stack_settings.py: they fit the default job).
    assert resources["InstanceTypes"] == list(StackSettings().instance_types)
    assert resources["AllocationStrategy"] == "BEST_FIT_PROGRESSIVE"
    assert (resources["MinvCpus"], resources["MaxvCpus"]) == (0, 256)
    assert env["Type"] == "MANAGED"


def test_job_definition_runs_the_job_and_the_profiler_in_one_task(synthesized: Synthesized) -> None:
    props = synthesized.only("AWS::Batch::JobDefinition")["Properties"]
    assert props["PlatformCapabilities"] == ["EC2"]
    [task] = props["EcsProperties"]["TaskProperties"]
    assert task["PidMode"] == "task"
    # The scratch volume for both containers; the host's cgroup tree and its qualification's folder, read-only, for
    # the profiler alone.
    assert task["Volumes"] == [{"Host": {"SourcePath": "/scratch"}, "Name": "scratch"},
                               {"Host": {"SourcePath": "/sys/fs/cgroup"}, "Name": "host-cgroup"},
                               {"Host": {"SourcePath": QUALIFICATION_DIR}, "Name": "host-qualification"}]
    job, profiler = task["Containers"]
    [job_log_group] = [k for k in synthesized.resources("AWS::Logs::LogGroup") if k.startswith("Logs")]
    assert (job["Name"], job["Command"], job["Essential"]) == ("job", ["iobatch", "job"], True)
    assert (profiler["Name"], profiler["Command"], profiler["Essential"]) == ("profiler", ["iobatch", "sidecar"], False)
    assert job["Image"] == profiler["Image"]
    assert job["DependsOn"] == [{"Condition": "START", "ContainerName": PROFILER_CONTAINER}]
    scratch = {"ContainerPath": "/scratch", "ReadOnly": False, "SourceVolume": "scratch"}
    assert job["MountPoints"] == [scratch]
    assert profiler["MountPoints"] == [scratch, {"ContainerPath": HOST_CGROUP_MOUNT, "ReadOnly": True,
                                                 "SourceVolume": "host-cgroup"},
                                       {"ContainerPath": QUALIFICATION_DIR, "ReadOnly": True,
                                        "SourceVolume": "host-qualification"}]
    for container in (job, profiler):
        logs = container["LogConfiguration"]
        assert logs["LogDriver"] == "awslogs"
        assert logs["Options"]["awslogs-group"] == {"Ref": job_log_group}
        # Pinned, not the account's default: the job never blocks on CloudWatch, and the ring holds 2 x 11 documents
        # of 256 KiB (3 stages and 8 sub-stages a child).
        assert (logs["Options"]["mode"], logs["Options"]["max-buffer-size"]) == ("non-blocking", "6m")
        env = {e["Name"]: e["Value"] for e in container["Environment"]}
        assert env["AWS_EMF_NAMESPACE"] == DEFAULT_NAMESPACE
        assert env["IOBATCH_PIPELINE"] == "iobatch" and env["IOBATCH_VOLUME_TYPE"] == "st1"
    resources = {r["Type"]: r["Value"] for r in job["ResourceRequirements"]}
    profiler_resources = {r["Type"]: r["Value"] for r in profiler["ResourceRequirements"]}
    # Every container has a vCPU (AWS Batch's multi-container examples do); together the child's vcpusPerJob.
    assert (resources["VCPU"], profiler_resources["VCPU"]) == ("1", "1")
    assert int(resources["MEMORY"]) + int(profiler_resources["MEMORY"]) == 2 * 3584
    assert props["Timeout"] == {"AttemptDurationSeconds": 120 * 60}


def test_retry_strategy_retries_reclaims_start_failures_and_75_and_ends_every_other_code(
        synthesized: Synthesized) -> None:
    strategy = synthesized.only("AWS::Batch::JobDefinition")["Properties"]["RetryStrategy"]
    assert strategy["Attempts"] == 3
    assert strategy["EvaluateOnExit"] == [
        {"Action": "RETRY", "OnStatusReason": "Host EC2*"},
        {"Action": "RETRY", "OnReason": "Cannot*"},
        {"Action": "RETRY", "OnReason": "DockerTimeoutError*"},
        {"Action": "RETRY", "OnExitCode": str(EXIT_RETRYABLE)},
        {"Action": "EXIT", "OnExitCode": "*"},
    ]
    # Batch's first match decides; what matches none is retried (a failure with no exit code that no reason names).
    first = {"start": retry_action(strategy, reason="CannotStartContainerError: Error response from daemon: failed "
                                   "to initialize logging driver: failed to create Cloudwatch log stream: "
                                   "ThrottlingException: Rate exceeded"),
             "pull": retry_action(strategy, reason="CannotPullContainerError: context canceled"),
             "docker": retry_action(strategy, reason="DockerTimeoutError: Could not transition to created"),
             "reclaim": retry_action(strategy, status="Host EC2 (instance i-0abc) terminated."),
             "other start": retry_action(strategy, reason="ResourceInitializationError: unable to pull secrets"),
             **{str(code): retry_action(strategy, code=code, reason="Essential container in task exited")
                for code in (1, EXIT_USAGE, EXIT_PERMANENT, EXIT_RETRYABLE, 137)}}
    assert first == {"start": "RETRY", "pull": "RETRY", "docker": "RETRY", "reclaim": "RETRY", "other start": "RETRY",
                     "1": "EXIT", "64": "EXIT", "65": "EXIT", "75": "RETRY", "137": "EXIT"}


def retry_action(strategy: dict[str, Any], *, status: str = "", reason: str = "", code: int | None = None) -> str:
    """What Batch does with a failed attempt: the first rule whose every glob matches ("Automated job retries"),
    else RETRY. A glob is its text, or a prefix when it ends in `*`; an attempt with no exit code matches none."""
    def matches(glob: str, value: str | None) -> bool:
        if value is None:
            return False
        return value.startswith(glob[:-1]) if glob.endswith("*") else value == glob

    for rule in strategy["EvaluateOnExit"]:
        if all(matches(rule[key], value) for key, value in (("OnStatusReason", status), ("OnReason", reason),
               ("OnExitCode", None if code is None else str(code))) if key in rule):
            return str(rule["Action"])
    return "RETRY"


def test_job_role_reads_only_the_input_prefix_and_writes_only_the_output_prefix(synthesized: Synthesized) -> None:
    found = statements(synthesized, "JobsJobRole")
    [input_bucket] = [k for k in synthesized.resources("AWS::S3::Bucket") if k.startswith("StorageInput")]
    [output_bucket] = [k for k in synthesized.resources("AWS::S3::Bucket") if k.startswith("StorageOutput")]
    by_sid = {s["Sid"]: s for s in found}
    assert sorted(by_sid) == ["ListInputPrefix", "ListOutputPrefix", "ListOutputUploads", "ReadInputPrefix",
                              "WriteOutputPrefix"]
    # Listing in-progress uploads (to abort a killed child's) has no s3:prefix condition key: the output
    # bucket only, that one action, no object contents.
    assert by_sid["ListOutputUploads"]["Action"] == "s3:ListBucketMultipartUploads"
    assert flatten(by_sid["ListOutputUploads"]["Resource"]) == f"<{output_bucket}.Arn>"
    assert by_sid["ReadInputPrefix"]["Action"] == "s3:GetObject"
    assert flatten(by_sid["ReadInputPrefix"]["Resource"]) == f"<{input_bucket}.Arn>/images/*"
    assert flatten(by_sid["WriteOutputPrefix"]["Resource"]) == f"<{output_bucket}.Arn>/shards/*"
    assert "s3:DeleteObject" not in by_sid["WriteOutputPrefix"]["Action"]
    assert by_sid["ListInputPrefix"]["Condition"] == {"StringLike": {"s3:prefix": ["images/*"]}}
    assert by_sid["ListOutputPrefix"]["Condition"] == {"StringLike": {"s3:prefix": ["shards/*"]}}
    for statement in found:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert all(a.startswith("s3:") and "*" not in a for a in actions), actions


def test_execution_role_pulls_the_image_and_writes_logs_only(synthesized: Synthesized) -> None:
    actions: set[str] = set()
    for statement in statements(synthesized, "JobsExecutionRole"):
        actions.update(statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]])
    assert actions == {
        "ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage",
        "ecr:GetAuthorizationToken", "logs:CreateLogStream", "logs:PutLogEvents",
    }


def test_buckets_are_encrypted_private_tls_only_and_expire_incomplete_uploads(synthesized: Synthesized) -> None:
    buckets = synthesized.resources("AWS::S3::Bucket")
    assert len(buckets) == 3
    for bucket in buckets.values():
        props = bucket["Properties"]
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
            "SSEAlgorithm": "AES256"
        }
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True
        }
        rules = props["LifecycleConfiguration"]["Rules"]
        assert any(r.get("AbortIncompleteMultipartUpload") == {"DaysAfterInitiation": 7} for r in rules)
    for policy in synthesized.resources("AWS::S3::BucketPolicy").values():
        denies = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
        assert any(s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in denies)
    assert len(synthesized.resources("AWS::S3::BucketPolicy")) == 3


def test_network_has_private_subnets_a_flow_log_and_an_s3_gateway_endpoint(synthesized: Synthesized) -> None:
    synthesized.assertions.resource_count_is("AWS::EC2::FlowLog", 1)
    synthesized.assertions.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {"VpcEndpointType": "Gateway", "ServiceName": assertions.Match.object_like({})},
    )
    subnets = synthesized.resources("AWS::EC2::Subnet")
    private = [s for s in subnets.values() if not s["Properties"]["MapPublicIpOnLaunch"]]
    assert len(private) == 2
    env_subnets = synthesized.only("AWS::Batch::ComputeEnvironment")["Properties"]["ComputeResources"]["Subnets"]
    assert all(s["Ref"].startswith("NetworkVpcprivate") for s in env_subnets)


def dashboard_body(synthesized: Synthesized) -> dict[str, Any]:
    body = synthesized.only("AWS::CloudWatch::Dashboard")["Properties"]["DashboardBody"]
    return dict(json.loads(flatten(body)))


def test_dashboard_has_a_widget_for_every_stage_and_dashboard_metric(synthesized: Synthesized) -> None:
    widgets = dashboard_body(synthesized)["widgets"]
    graphed: set[tuple[str, str]] = set()
    for widget in widgets:
        for line in widget["properties"].get("metrics", []):
            if line[0] == DEFAULT_NAMESPACE:
                _, name, _, pipeline, _, stage = line[:6]
                assert pipeline == "iobatch"
                graphed.add((stage, name))
    wanted = {(stage, spec.name) for stage in STAGES for spec in dashboard_metrics()}
    assert graphed == wanted
    assert {"StageDuration", "Throughput", "DeviceWriteLatency", "IoStallSome", "PeakDirtyBytes"} <= {
        spec.name for spec in dashboard_metrics()
    }
    # One row per stage: each stage's widgets share a y coordinate no other stage uses.
    rows = {stage: {w["y"] for w in widgets if w["properties"].get("title", "").startswith(f"{stage}:")}
            for stage in STAGES}
    assert all(len(ys) == 1 for ys in rows.values()) and len({next(iter(ys)) for ys in rows.values()}) == 3


def test_dashboard_shows_ebs_burst_balance_queue_length_and_the_slowest_instances(synthesized: Synthesized) -> None:
    widgets = dashboard_body(synthesized)["widgets"]
    expressions = [m[0]["expression"] for w in widgets for m in w["properties"].get("metrics", [])
                   if "expression" in m[0]]
    assert any('MetricName="BurstBalance"' in e and "AWS/EBS" in e for e in expressions)
    assert any('MetricName="VolumeQueueLength"' in e for e in expressions)
    [logs] = [w for w in widgets if w["type"] == "log" and "slowest" in w["properties"]["title"]]
    query = logs["properties"]["query"]
    assert query.startswith("SOURCE '<Logs")
    for line in slowest_download_query("iobatch").splitlines():
        assert line in query


def test_outputs_are_the_keys_iobatch_submit_reads(synthesized: Synthesized) -> None:
    outputs = synthesized.template["Outputs"]
    assert set(OUTPUT_KEYS.values()) <= set(outputs)
    assert outputs["PipelineName"]["Value"] == "iobatch"
    assert outputs["VolumeType"]["Value"] == "st1"
    [definition] = synthesized.resources("AWS::Batch::JobDefinition")
    assert outputs["JobDefinitionArn"]["Value"] == {"Ref": definition}


def test_the_job_definition_and_the_job_speak_one_interface(synthesized: Synthesized) -> None:
    """Container names, commands, variable names and the scratch mount all come from pipeline.interface,
    which the job reads: a name changed on one side only fails here."""
    [task] = synthesized.only("AWS::Batch::JobDefinition")["Properties"]["EcsProperties"]["TaskProperties"]
    containers = task["Containers"]
    assert tuple(c["Name"] for c in containers) == CONTAINERS
    for container in containers:
        assert tuple(container["Command"]) == CONTAINER_COMMANDS[container["Name"]]
        env = {e["Name"]: e["Value"] for e in container["Environment"]}
        known = ENV.names() | AWS_ENV.names()
        assert set(env) <= known, f"{container['Name']} sets variables the interface does not name: " \
            f"{sorted(set(env) - known)}"
        extra = [HOST_CGROUP_MOUNT, QUALIFICATION_DIR] if container["Name"] == PROFILER_CONTAINER else []
        assert [m["ContainerPath"] for m in container["MountPoints"]] == [SCRATCH_MOUNT, *extra]
        # What the job builds from the definition's own environment: its scratch is the mounted volume.
        settings = JobSettings.from_env({**env, ENV.INPUT: "s3://in-bucket/i/", ENV.OUTPUT: "s3://out-bucket/o/",
                                         ENV.IMAGES_PER_CHILD: "1"})
        assert str(settings.scratch_root) == SCRATCH_MOUNT and settings.pipeline == env[ENV.PIPELINE]


def test_outputs_are_exactly_the_interface_keys(synthesized: Synthesized) -> None:
    assert sorted(synthesized.template["Outputs"]) == sorted(STACK_OUTPUT_KEYS.values())


def test_cdk_nag_passes_and_every_acknowledgement_gives_a_specific_reason(synthesized: Synthesized) -> None:
    report = json.loads((synthesized.outdir / "validation-report.json").read_text())
    [nag] = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert (nag["conclusion"], nag["violations"]) == ("success", [])
    metadata = json.loads((synthesized.outdir / f"{synthesized.stack_name}.metadata.json").read_text())
    reasons = {
        rule.removeprefix("AwsSolutions::"): reason
        for entries in metadata.values()
        for entry in entries
        if entry["type"] == "aws:cdk:acknowledged-rules"
        for rule, reason in entry["data"].items()
        if rule.startswith("AwsSolutions::")
    }
    suppressed = {v["ruleName"] for v in nag["suppressedViolations"]}
    assert suppressed == set(reasons)
    assert len(reasons) == 4
    assert {r for r in reasons if re.fullmatch(r"AwsSolutions-IAM5\[Resource::<Storage(Input|Output)\w+\.Arn>/"
                                                r"(images|shards)/\*\]", r)}
    for reason in reasons.values():
        assert len(reason) >= 60, reason  # a sentence with the why, not "needed"
