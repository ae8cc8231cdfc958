"""processCommand and jobImage: the command line in both containers' environment, the user's image in both
containers, a pull grant on its ECR repository, no image asset to build, and cdk-nag still passes."""

from __future__ import annotations

from typing import Any

from aws_cdk import assertions

from infra.app import build_app
from pipeline.interface import ENV
from tests.support.synth import job_containers

IMAGE = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/my-iobatch:1"
COMMAND = "python /opt/iobatch/examples/image_stats.py {input} {output}"


def test_process_command_and_job_image(tmp_path: Any) -> None:
    app, stack = build_app({"processCommand": COMMAND, "jobImage": IMAGE}, outdir=str(tmp_path))
    assembly = app.synth()  # cdk-nag findings would fail here
    template = assertions.Template.from_stack(stack).to_json()
    for container in job_containers(template).values():
        assert container["Image"] == IMAGE
        assert {"Name": ENV.PROCESS_COMMAND, "Value": COMMAND} in container["Environment"]
    assert not assembly.get_stack_by_name(stack.stack_name).assets  # nothing to build
    policies = [r["Properties"]["PolicyDocument"]["Statement"] for r in template["Resources"].values()
                if r["Type"] == "AWS::IAM::Policy"]
    pulls = [s for statements in policies for s in statements if "ecr:BatchGetImage" in s["Action"]]
    assert len(pulls) == 1 and "repository/team/my-iobatch" in str(pulls[0]["Resource"])
