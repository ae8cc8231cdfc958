"""The template passes cfn-lint, is created on moto's CloudFormation, and cdk-nag is really on."""

from __future__ import annotations

import copy
import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from pipeline.submit import StackOutputs
from tests.support.synth import Synthesized

# The service-linked role real accounts already have; Batch uses it when the template names none.
BATCH_SERVICE_LINKED_ROLE = "AWSServiceRoleForBatch"
# Attributes moto cannot GetAtt; CloudFormation's Ref returns the same ARN for these types.
_REF_IS_ARN = {"ComputeEnvironmentArn", "JobQueueArn"}
_ALARM = "AWS::CloudWatch::Alarm"


def cfn_lint_binary() -> str | None:
    local = Path(sys.executable).parent / "cfn-lint"
    return str(local) if local.exists() else shutil.which("cfn-lint")


def test_cfn_lint_finds_no_errors(synthesized: Synthesized) -> None:
    binary = cfn_lint_binary()
    if binary is None:
        pytest.skip("cfn-lint is not installed (make setup)")
    result = subprocess.run(
        [binary, "--non-zero-exit-code", "error", str(synthesized.template_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def for_moto(template: dict[str, Any], account_id: str) -> dict[str, Any]:
    """The template as moto can create it. Only what moto lacks is changed:

    - the CDK bootstrap version check (an SSM parameter and a rule): the bootstrap is not on moto;
    - the one multi-container job definition becomes its `job` container alone: moto registers
      containerProperties only (no ecsProperties);
    - GetAtt of a compute environment's or job queue's ARN becomes Ref, which is the same ARN;
    - the compute environment names the Batch service-linked role explicitly (moto requires one);
    - moto's CloudFormation has no CloudWatch alarms: the dashboard's alarm widget gets the alarm's ARN as text.
    """
    out = copy.deepcopy(template)
    out.pop("Rules", None)
    out.get("Parameters", {}).pop("BootstrapVersion", None)
    if not out.get("Parameters"):
        out.pop("Parameters", None)

    def swap(node: Any) -> Any:
        if isinstance(node, dict):
            get_att = node.get("Fn::GetAtt")
            if isinstance(get_att, list) and get_att[1] in _REF_IS_ARN:
                return {"Ref": get_att[0]}
            if isinstance(get_att, list) and template["Resources"].get(get_att[0], {}).get("Type") == _ALARM:
                return f"arn:aws:cloudwatch:us-east-1:{account_id}:alarm:{get_att[0]}"
            return {k: swap(v) for k, v in node.items()}
        if isinstance(node, list):
            return [swap(v) for v in node]
        return node

    out = swap(out)
    for resource in out["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::Batch::ComputeEnvironment":
            props["ServiceRole"] = (
                f"arn:aws:iam::{account_id}:role/aws-service-role/batch.amazonaws.com/{BATCH_SERVICE_LINKED_ROLE}"
            )
        if resource["Type"] == "AWS::Batch::JobDefinition":
            [task] = props.pop("EcsProperties")["TaskProperties"]
            job = next(c for c in task["Containers"] if c["Name"] == "job")
            props["ContainerProperties"] = {
                "Image": job["Image"],
                "Command": job["Command"],
                "Environment": job["Environment"],
                "ResourceRequirements": job["ResourceRequirements"],
                "JobRoleArn": task["TaskRoleArn"],
                "ExecutionRoleArn": task["ExecutionRoleArn"],
            }
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


# moto skips bucket policies with a warning (the TLS-only policies are asserted on the template).
@pytest.mark.filterwarnings("ignore:Tried to parse AWS")
def test_template_is_created_on_moto_and_submit_reads_its_outputs(
    synthesized: Synthesized, moto_endpoint: str
) -> None:
    kwargs = {"endpoint_url": moto_endpoint, "region_name": "us-east-1",
              "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    account = boto3.client("sts", **kwargs).get_caller_identity()["Account"]
    boto3.client("iam", **kwargs).create_role(
        RoleName=BATCH_SERVICE_LINKED_ROLE,
        Path="/aws-service-role/batch.amazonaws.com/",
        AssumeRolePolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": "batch.amazonaws.com"},
                           "Action": "sts:AssumeRole"}],
        }),
    )
    cfn = boto3.client("cloudformation", **kwargs)
    template = for_moto(synthesized.template, account)
    cfn.create_stack(StackName=synthesized.stack_name, TemplateBody=json.dumps(template),
                     Capabilities=["CAPABILITY_IAM"])
    stack = cfn.describe_stacks(StackName=synthesized.stack_name)["Stacks"][0]
    assert stack["StackStatus"] == "CREATE_COMPLETE", stack.get("StackStatusReason")

    outputs = StackOutputs.from_stack(cfn, synthesized.stack_name)
    assert outputs.pipeline == "iobatch"
    assert outputs.volume_type == "st1"
    assert outputs.dashboard == "iobatch-io-us-east-1"

    s3 = boto3.client("s3", **kwargs)
    s3.head_bucket(Bucket=outputs.input_bucket)
    s3.head_bucket(Bucket=outputs.output_bucket)
    batch = boto3.client("batch", **kwargs)
    [queue] = batch.describe_job_queues(jobQueues=[outputs.job_queue])["jobQueues"]
    assert queue["jobQueueArn"] == outputs.job_queue
    [environment] = batch.describe_compute_environments(
        computeEnvironments=[queue["computeEnvironmentOrder"][0]["computeEnvironment"]]
    )["computeEnvironments"]
    assert environment["computeResources"]["maxvCpus"] == 256
    [definition] = batch.describe_job_definitions(jobDefinitions=[outputs.job_definition])["jobDefinitions"]
    assert definition["retryStrategy"]["attempts"] == 3
    logs = boto3.client("logs", **kwargs)
    groups = logs.describe_log_groups(logGroupNamePrefix=outputs.log_group)["logGroups"]
    assert [g["logGroupName"] for g in groups] == [outputs.log_group]


def test_cdk_nag_fails_the_synth_on_an_unacknowledged_finding(tmp_path: Path) -> None:
    import aws_cdk as cdk
    from aws_cdk import aws_iam as iam
    from cdk_nag import AwsSolutionsChecks

    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Probe")
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"))
    role.add_to_policy(iam.PolicyStatement(actions=["s3:*"], resources=["*"]))
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    [nag] = report["pluginReports"]
    assert nag["conclusion"] == "failure"
    assert {"AwsSolutions-IAM5[Action::s3:*]", "AwsSolutions-IAM5[Resource::*]"} <= {
        v["ruleName"] for v in nag["violations"]
    }
