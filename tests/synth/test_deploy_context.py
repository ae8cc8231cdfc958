"""The stack publishes what it was deployed with (its DeployContext output), so `iobatch advise --stack` reads the
plan from the stack itself: the output is the context StackSettings.to_context writes, and it rebuilds the settings."""

from __future__ import annotations

import json

from infra.settings import StackSettings
from pipeline.interface import OPTIONAL_OUTPUT_KEYS
from tests.support.synth import Synthesized, synthesize
from tuning.deployed import Deployed
from tuning.ebs import Volume
from tuning.host import HostTuning


def test_the_deploy_context_output_rebuilds_the_stacks_settings(synthesized: Synthesized) -> None:
    value = synthesized.template["Outputs"][OPTIONAL_OUTPUT_KEYS["deploy_context"]]["Value"]
    assert isinstance(value, str)  # a literal: no token, so DescribeStacks gives it back as written
    assert StackSettings.from_context(json.loads(value)) == StackSettings()
    deployed = Deployed.from_output(value, synthesized.stack_name)
    assert (deployed.instance_types, deployed.vcpus_per_job) == (StackSettings().instance_types, 2)
    assert (deployed.volume, deployed.tuning) == (Volume(), HostTuning())


def test_the_output_leaves_out_who_hears_the_alarms() -> None:
    # An output is readable by anyone allowed DescribeStacks: the address and the topic are in no output, and the
    # published context still rebuilds every other setting.
    email, topic = "ops@example.com", "arn:aws:sns:us-east-1:123456789012:iobatch-alarms"
    synthesized = synthesize(alarmEmail=email, alarmTopicArn=topic)
    outputs = json.dumps(synthesized.template["Outputs"])
    assert email not in outputs and topic not in outputs
    value = synthesized.template["Outputs"][OPTIONAL_OUTPUT_KEYS["deploy_context"]]["Value"]
    assert not {"alarmEmail", "alarmTopicArn"} & set(json.loads(value))
    assert StackSettings.from_context(json.loads(value)) == StackSettings()
