"""The synthesized stack, built once per test session (synth takes seconds and a lot of memory).

aws-cdk-lib runs a bundled template validator on every synth; it is switched off here (before aws_cdk
is imported) and cfn-lint runs once on the template instead. cdk-nag still runs: it is a plugin.
"""

from __future__ import annotations

import os

os.environ.setdefault("CDK_VALIDATION", "false")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")

import json
import shutil

import pytest

if shutil.which("node") is None:
    pytest.skip("node is not installed: CDK synthesis needs it (make setup)", allow_module_level=True)

from aws_cdk import assertions

from infra.app import build_app
from tests.support.synth import Synthesized


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    outdir = tmp_path_factory.mktemp("cdk.out")
    app, stack = build_app(outdir=str(outdir))
    assembly = app.synth()
    artifact = assembly.get_stack_by_name(stack.stack_name)
    template_path = outdir / artifact.template_file
    template = json.loads(template_path.read_text())
    return Synthesized(
        template=template,
        assertions=assertions.Template.from_json(template),
        template_path=template_path,
        outdir=outdir,
        stack_name=stack.stack_name,
    )
