"""profilerContract: the profiler of every task evaluates a contract the image ships (or one of a user image's),
named in the job definition; none by default."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from infra.settings import SHIPPED_CONTRACTS, SettingsError, StackSettings
from pipeline.interface import CONTRACTS_DIR, ENV, PROFILER_CONTAINER
from tests.support.synth import Synthesized, synthesize

DOCKERFILE = Path(__file__).resolve().parents[2] / "containers" / "job" / "Dockerfile"


def _profiler_env(template: dict[str, Any]) -> dict[str, str]:
    (definition,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Batch::JobDefinition"]
    (task,) = definition["Properties"]["EcsProperties"]["TaskProperties"]
    (profiler,) = [c for c in task["Containers"] if c["Name"] == PROFILER_CONTAINER]
    return {e["Name"]: e["Value"] for e in profiler.get("Environment", [])}


def test_none_by_default(synthesized: Synthesized) -> None:
    assert ENV.CONTRACT not in _profiler_env(synthesized.template)


def test_a_shipped_contract_by_name() -> None:
    env = _profiler_env(synthesize(profilerContract="case-study").template)
    assert env[ENV.CONTRACT] == f"{CONTRACTS_DIR}/case-study.contract"


def test_the_image_ships_the_contracts_where_the_interface_says() -> None:
    (copied,) = re.findall(r"^COPY contracts (\S+)$", DOCKERFILE.read_text(), re.M)
    assert copied.rstrip("/") == CONTRACTS_DIR
    assert (SHIPPED_CONTRACTS / "case-study.contract").is_file()


def test_a_name_or_an_absolute_path_only() -> None:
    assert StackSettings.from_context({"profilerContract": "/opt/mine/io.contract"}).profiler_contract == \
        "/opt/mine/io.contract"
    settings = StackSettings.from_context({"profilerContract": "slow-fsync"})
    assert StackSettings.from_context(settings.to_context()) == settings
    for bad in ("case_study", "contracts/case-study.contract", "/opt/with space"):
        with pytest.raises(SettingsError, match=r"profilerContract .* is neither a contract the image ships \("
                                                 r"case-study, metadata-storm, slow-fsync, small-writes\)"):
            StackSettings.from_context({"profilerContract": bad})
