"""A deployed stack's plan, read back from the context it was deployed with, and the deploy that applies an advice to
it. Pure.

The stack publishes its settings as CDK context (infra.settings.StackSettings.to_context, the stack's DeployContext
output); `Deployed.from_context` reads back what the advisor needs of them through the owners of each key: the hosts'
keys (tuning.instances), the scratch volume's (tuning.ebs.Volume) and host tuning's (tuning.host.HostTuning).
`Deployed.apply` is that context with an advice's keys in place, and `make_deploy` the command line that deploys it.
The alarm keys are not in the output (UNPUBLISHED_KEYS): the command keeps what cdk.json says of them.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tuning.ebs import CONTEXT_KEYS as VOLUME_CONTEXT_KEYS
from tuning.ebs import Volume, VolumeError
from tuning.host import CONTEXT_KEYS as HOST_CONTEXT_KEYS
from tuning.host import HostTuning, HostTuningError
from tuning.instances import (
    CHILDREN_PER_HOST_KEY,
    DEFAULT_VCPUS_PER_JOB,
    INSTANCE_TYPES_KEY,
    VCPUS_PER_JOB_KEY,
    InstanceType,
    children_per_host,
    types_of,
)
from tuning.instancestore import InstanceStore
from tuning.plan import AdviseError

# The keys an advice replaces as a whole: a scratch volume and a host tuning are each one decision, so the stack's
# own value of a key the advice leaves out (its default) does not survive beside it.
_ADVISED_KEYS = (*VOLUME_CONTEXT_KEYS, *HOST_CONTEXT_KEYS)
_HOST_KEYS = (INSTANCE_TYPES_KEY, CHILDREN_PER_HOST_KEY)
# The keys the stack leaves out of its DeployContext output (infra.settings.UNPUBLISHED_KEYS, which
# tests/unit/test_deployed.py holds this to): who hears its alarms. A deploy printed from that output has no -c pair
# for them, so `cdk deploy` takes them from cdk.json (or none); the advice says so beside the command.
UNPUBLISHED_KEYS = ("alarmTopicArn", "alarmEmail")
KEPT_FROM_CDK_JSON = (f"{' and '.join(UNPUBLISHED_KEYS)} are not published by the stack, so this keeps the values "
                      "cdk.json gives them; if you deployed them with -c, add those -c pairs")


class DeployedError(AdviseError):
    """The deployed context cannot be read; the message names the stack and the fix."""


@dataclass(frozen=True)
class Deployed:
    """What a stack was deployed with, as the advisor reads it."""

    context: dict[str, str]  # every key, as published
    instance_types: tuple[str, ...]
    vcpus_per_job: int
    volume: Volume
    tuning: HostTuning

    @classmethod
    def from_output(cls, text: str, stack: str) -> Deployed:
        """From the DeployContext output's JSON object; DeployedError naming `stack` and the fix otherwise."""
        fix = "redeploy it with this version (`make deploy`) or give the plan's flags and a run's files instead"
        try:
            body = json.loads(text) if text else None
        except json.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            raise DeployedError(f"stack {stack} publishes no deployed context (its DeployContext output "
                                f"{'is missing' if not text else 'is not a JSON object'}): {fix}")
        try:
            return cls.from_context({str(k): str(v) for k, v in body.items()})
        except (VolumeError, HostTuningError, ValueError) as exc:
            raise DeployedError(f"stack {stack}'s DeployContext output: {exc}: {fix}") from None

    @classmethod
    def from_context(cls, ctx: Mapping[str, str]) -> Deployed:
        text = ctx.get(INSTANCE_TYPES_KEY, "").strip()
        types = json.loads(text) if text.startswith("[") else text.split(",")
        if not isinstance(types, list):
            raise ValueError(f"{INSTANCE_TYPES_KEY} {text[:80]!r} is not a list of instance types")
        vcpus = ctx.get(VCPUS_PER_JOB_KEY, "").strip()
        return cls(dict(ctx), tuple(str(t).strip() for t in types if str(t).strip()),
                   int(vcpus) if vcpus else DEFAULT_VCPUS_PER_JOB, Volume.from_context(ctx),
                   HostTuning.from_context(ctx))

    def known_types(self) -> list[InstanceType]:
        """Every type of the instance table that instanceTypes lets Batch launch."""
        return [kind for entry in self.instance_types for kind in types_of(entry)]

    def instance_type(self, ran_on: Iterable[str]) -> tuple[InstanceType | None, str]:
        """The plan's instance type and why: the one most of the batch's documents name (their InstanceType) among
        the stack's, else the stack's type that runs the most children at once (the one its volume is sized for)."""
        known = {kind.name: kind for kind in self.known_types()}
        counts = Counter(name for name in ran_on if name in known)
        if counts:
            name, count = counts.most_common(1)[0]
            return known[name], f"the stack's type most documents ran on ({count:,})"
        if not known:
            return None, ""
        kind = max(known.values(), key=lambda k: (children_per_host(k, self.vcpus_per_job), k.vcpus))
        return kind, "the stack's type that runs the most children at once"

    def scratch_volume(self, kind: InstanceType | None) -> Volume:
        """The hosts' scratch now: the EBS volume, or the instance store of `kind`."""
        if self.tuning.scratch == "instance-store":
            store = kind or next(iter(self.known_types()), None)
            if store is not None and store.store_volumes:
                return InstanceStore.of(store, 0.0)
        return self.volume

    def apply(self, advised: Mapping[str, str], *, keep_hosts: bool) -> dict[str, str]:
        """The deployed context with the advice's keys in place: the advice's volume and host tuning replace the
        stack's whole; its instance type and children per host only when the user chose them (`keep_hosts` False)."""
        context = {k: v for k, v in self.context.items() if k not in _ADVISED_KEYS}
        context.update({k: v for k, v in advised.items() if not (keep_hosts and k in _HOST_KEYS)})
        return context


def make_deploy(context: Mapping[str, Any]) -> str:
    """`make deploy CDK_ARGS="-c key=value ..."` for a shell: each pair quoted for the shell that runs the Makefile's
    recipe (`cdk deploy $(CDK_ARGS)`), the whole quoted for the one that runs make, `$` doubled for make itself."""
    args = " ".join(f"-c {shlex.quote(f'{key}={value}')}" for key, value in context.items())
    quoted = "".join("\\$\\$" if char == "$" else "\\" + char if char in '\\"`' else char for char in args)
    return f'make deploy CDK_ARGS="{quoted}"'
