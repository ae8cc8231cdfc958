"""The synthesized stack as the synth tests see it; the session fixture that builds it is in tests/synth/conftest.py."""

from __future__ import annotations

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
