"""The synthesized stack as the tests see it: built once per test session (`synthesize`), for the synth
tests (the session fixture in tests/synth/conftest.py) and the task rehearsal (tests/e2e) alike."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Only a type here: importing aws_cdk is slow and must follow the fixture's environment settings.
    from aws_cdk import assertions


@dataclass(frozen=True)
class Synthesized:
    """The stack's template as a dict, as an assertions.Template, and where it was written."""

    template: dict[str, Any]
    assertions: assertions.Template
    template_path: Path
    outdir: Path
    stack_name: str

    def resources(self, cfn_type: str) -> dict[str, dict[str, Any]]:
        """Every resource of this CloudFormation type, by logical id."""
        return {k: v for k, v in self.template["Resources"].items() if v["Type"] == cfn_type}

    def only(self, cfn_type: str) -> dict[str, Any]:
        """The one resource of this type (the test fails if there are none or several)."""
        found = self.resources(cfn_type)
        assert len(found) == 1, f"expected one {cfn_type}, found {sorted(found)}"
        return next(iter(found.values()))


@functools.cache
def synthesize(**context: str) -> Synthesized:
    """The stack synthesized as `cdk deploy -c KEY=VALUE ...` synthesizes it (aws-cdk-lib's template validation
    on, cdk-nag), once per process and context, into a temporary directory."""
    # What deploy runs: a CDK_VALIDATION=false left in the environment would test a synth deploy never does.
    os.environ.pop("CDK_VALIDATION", None)
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")
    from aws_cdk import assertions as cdk_assertions

    from infra.app import build_app

    outdir = Path(tempfile.mkdtemp(prefix="iobatch-cdk.out-"))
    atexit.register(shutil.rmtree, outdir, True)
    app, stack = build_app(context, outdir=str(outdir))
    artifact = app.synth().get_stack_by_name(stack.stack_name)
    template_path = outdir / artifact.template_file
    template = json.loads(template_path.read_text())
    return Synthesized(template=template, assertions=cdk_assertions.Template.from_json(template),
                       template_path=template_path, outdir=outdir, stack_name=stack.stack_name)
