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


# EC2 takes at most 16 KB of user data ("User data is limited to 16 KB, in raw form, before it is base64-encoded",
# EC2 User Guide); Batch merges its own MIME part (ECS agent settings) into the launch template's: what it adds is
# not documented, so a margin of 2 KiB stays free for it.
USER_DATA_LIMIT = 16 * 1024
BATCH_PART_ALLOWANCE = 2 * 1024
# A deployed name in place of each Ref and GetAtt: generated names run to tens of characters; this allows more.
TOKEN_STAND_IN = "x" * 128


def resolved(node: Any) -> str:
    """A CloudFormation value as text, with every Ref and GetAtt as TOKEN_STAND_IN."""
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and "Fn::Join" in node:
        sep, parts = node["Fn::Join"]
        return str(sep).join(resolved(p) for p in parts)
    if isinstance(node, dict) and ("Ref" in node or "Fn::GetAtt" in node):
        return TOKEN_STAND_IN
    raise AssertionError(f"cannot resolve {node!r}")


def user_data_size(synthesized: Synthesized) -> int:
    """The launch template's user data in bytes, as deployed names would make it (TOKEN_STAND_IN)."""
    user_data = synthesized.only("AWS::EC2::LaunchTemplate")["Properties"]["LaunchTemplateData"]["UserData"]
    return len(resolved(user_data["Fn::Base64"]).encode())


def cfn_text(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and "Fn::Join" in node:
        sep, parts = node["Fn::Join"]
        return str(sep).join(cfn_text(p) for p in parts)
    if isinstance(node, dict) and "Ref" in node:
        return f"<{node['Ref']}>"
    if isinstance(node, dict) and "Fn::GetAtt" in node:
        return "<{}.{}>".format(*node["Fn::GetAtt"])
    if isinstance(node, dict) and "Fn::Sub" in node:
        return str(node["Fn::Sub"] if isinstance(node["Fn::Sub"], str) else node["Fn::Sub"][0])
    raise AssertionError(f"cannot read {node!r}")


def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def job_role_statements(synthesized: Synthesized) -> tuple[str, list[dict[str, Any]]]:
    [role_id] = [k for k in synthesized.resources("AWS::IAM::Role") if k.startswith("JobsJobRole")]
    role = synthesized.template["Resources"][role_id]["Properties"]
    assert not role.get("ManagedPolicyArns"), "the job role carries managed policies"
    found = [s for p in role.get("Policies", []) for s in p["PolicyDocument"]["Statement"]]
    for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
        for policy in synthesized.resources(kind).values():
            roles = [cfn_text(r) for r in policy["Properties"].get("Roles", [])]
            if f"<{role_id}>" in roles:
                found.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return role_id, found


def job_containers(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The job definition's containers (EcsProperties, one task) by name."""
    (definition,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Batch::JobDefinition"]
    (task,) = definition["Properties"]["EcsProperties"]["TaskProperties"]
    return {c["Name"]: c for c in task["Containers"]}
