"""The stack publishes what it was deployed with (its DeployContext output), so `iobatch advise --stack` reads the
plan from the stack itself: the output is the context StackSettings.to_context writes, and it rebuilds the settings."""

from __future__ import annotations

import json

from infra.settings import StackSettings
from pipeline.interface import OPTIONAL_OUTPUT_KEYS
from tests.support.synth import Synthesized
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
