"""profilerInterpose: one switch in the job definition turns the LD_PRELOAD interposer on for the job container,
with the library the image ships; off by default."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from infra.settings import PROFILER_INTERPOSE_KEY, SettingsError, StackSettings
from pipeline.interface import ENV, JOB_CONTAINER
from profiling.probes.interpose import ENV_LIB, LIB_NAME
from tests.support.synth import Synthesized, synthesize

DOCKERFILE = Path(__file__).resolve().parents[2] / "containers" / "job" / "Dockerfile"


def _environment(template: dict[str, Any]) -> dict[str, dict[str, str]]:
    (definition,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Batch::JobDefinition"]
    (task,) = definition["Properties"]["EcsProperties"]["TaskProperties"]
    return {c["Name"]: {e["Name"]: e["Value"] for e in c.get("Environment", [])} for c in task["Containers"]}


def test_off_by_default(synthesized: Synthesized) -> None:
    for env in _environment(synthesized.template).values():
        assert ENV.INTERPOSE not in env and "LD_PRELOAD" not in env


def test_on_the_job_container_gets_the_one_switch() -> None:
    env = _environment(synthesize(**{PROFILER_INTERPOSE_KEY: "true"}).template)[JOB_CONTAINER]
    assert env[ENV.INTERPOSE] == "1"
    # No path typed into the job definition: the job derives the record directory from its scratch directory
    # and finds the library through the image's own variable.
    assert "LD_PRELOAD" not in env and "IOBATCH_INTERPOSE_DIR" not in env


def test_the_image_ships_the_library_where_its_variable_says() -> None:
    text = DOCKERFILE.read_text()
    (variable,) = re.findall(rf"{ENV_LIB}=(\S+)", text)
    (copied,) = re.findall(rf"COPY --from=\w+ \S+/{LIB_NAME} (\S+)", text)
    assert variable == copied.rstrip("/") + "/" + LIB_NAME


def test_the_key_takes_true_or_false_only() -> None:
    assert StackSettings.from_context({PROFILER_INTERPOSE_KEY: "true"}).profiler_interpose
    assert not StackSettings.from_context({}).profiler_interpose
    assert StackSettings.from_context(StackSettings(profiler_interpose=True).to_context()).profiler_interpose
    with pytest.raises(SettingsError, match=f"{PROFILER_INTERPOSE_KEY}='on' is not true or false"):
        StackSettings.from_context({PROFILER_INTERPOSE_KEY: "on"})
