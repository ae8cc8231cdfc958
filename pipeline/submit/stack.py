"""The deployed stack, read once before a submission: its CloudFormation outputs and its job definition.

`StackOutputs.from_stack` is the first AWS call of `iobatch submit --stack` (one DescribeStacks);
`resolve_target` reads the job definition's containers (one DescribeJobDefinitions). The output keys and
container names are the job's interface (pipeline/interface.py), which the stack (infra/) emits too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.aws import Backoff
from pipeline.errors import PermanentError, UsageError
from pipeline.interface import CONTAINERS, OPTIONAL_OUTPUT_KEYS, OUTPUT_KEYS
from pipeline.submit.plan import BatchTarget


@dataclass(frozen=True)
class StackOutputs:
    """What `iobatch submit --stack NAME` needs from the deployed stack."""

    input_bucket: str
    output_bucket: str
    job_queue: str
    job_definition: str
    log_group: str
    pipeline: str
    dashboard: str
    volume_type: str
    input_prefix: str = ""
    output_prefix: str = ""
    deploy_context: str = ""  # JSON: the CDK context the stack was deployed with (tuning.deployed reads it)

    @classmethod
    def from_outputs(cls, stack_name: str, outputs: Iterable[Mapping[str, Any]]) -> StackOutputs:
        """From DescribeStacks' Outputs list; names every missing key in one line."""
        found = {str(o.get("OutputKey")): str(o.get("OutputValue", "")) for o in outputs}
        missing = [key for key in OUTPUT_KEYS.values() if not found.get(key)]
        if missing:
            raise UsageError(f"stack {stack_name} has no output {', '.join(missing)}: deploy the iobatch stack "
                             "(`cdk deploy`) or name the right one with --stack")
        optional = {attr: found.get(key, "") for attr, key in OPTIONAL_OUTPUT_KEYS.items()}
        return cls(**{attr: found[key] for attr, key in OUTPUT_KEYS.items()}, **optional)

    @classmethod
    def from_stack(cls, cfn_client: Any, stack_name: str, backoff: Backoff | None = None) -> StackOutputs:
        """Read the outputs of `stack_name` with one DescribeStacks call."""
        backoff = backoff or Backoff()
        try:
            stacks = backoff.call(cfn_client.describe_stacks, doing=f"reading stack {stack_name}",
                                  StackName=stack_name)["Stacks"]
        except PermanentError as exc:
            if "does not exist" in exc.headline:
                raise UsageError(f"stack {stack_name} does not exist in this account and region: check --stack "
                                 "and AWS_REGION") from None
            raise
        return cls.from_outputs(stack_name, stacks[0].get("Outputs", []) if stacks else [])


def resolve_target(batch_client: Any, job_queue: str, job_definition: str,
                   backoff: Backoff | None = None) -> BatchTarget:
    """Read the job definition once to learn its containers, and check the job and profiler exist."""
    backoff = backoff or Backoff()
    found = backoff.call(batch_client.describe_job_definitions, doing=f"reading job definition "
                         f"{job_definition}", jobDefinitions=[job_definition])["jobDefinitions"]
    active = [d for d in found if d.get("status", "ACTIVE") == "ACTIVE"]
    if not active:
        raise UsageError(f"job definition {job_definition} does not exist or is inactive: redeploy the stack")
    definition = active[-1]
    tasks = (definition.get("ecsProperties") or {}).get("taskProperties") or []
    if not tasks:
        return BatchTarget(job_queue, job_definition, None)
    names = tuple(str(c.get("name")) for c in tasks[0].get("containers", []))
    missing = [n for n in CONTAINERS if n not in names]
    if missing:
        raise UsageError(f"job definition {job_definition} has no container {', '.join(missing)} (has "
                         f"{', '.join(names) or 'none'}): deploy the iobatch stack's job definition")
    return BatchTarget(job_queue, job_definition, names)
