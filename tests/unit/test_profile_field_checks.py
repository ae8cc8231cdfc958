"""A profile line's fields checked all numbers at once (runfiles._check_fields) accept and refuse exactly what the
check field by field does, with the same message."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiling import runfiles
from profiling.metrics import StageProfile, TimelinePoint
from tests.support.profiles import full_profile

pytestmark = pytest.mark.timeout(300, method="thread")

BODY = {k: v for k, v in full_profile(calls={"calls": {}}, notices=["n"]).to_dict().items() if k != "timeline"}
NAMES = [spec.name for spec in dataclasses.fields(StageProfile)]
ODD = [None, -1, -0.5, 0, 7, 2.5, math.nan, math.inf, -math.inf, True, False, "7", [], {}, 10**30, 1e308]


def one_by_one(body: Any, cls: type) -> str | None:
    """The check field by field, as it was: its message, or None."""
    try:
        if not isinstance(body, dict):
            raise ValueError(f"the line is a JSON {type(body).__name__}, not an object")
        runfiles._check_each(body, runfiles._field_checks(cls), "the line")
    except ValueError as exc:
        return str(exc)
    return None


def checked(body: Any, cls: type) -> str | None:
    try:
        runfiles._check_fields(body, cls, "the line")
    except ValueError as exc:
        return str(exc)
    return None


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(NAMES), st.sampled_from(ODD), max_size=6),
       st.lists(st.sampled_from(NAMES), max_size=3))
def test_all_at_once_is_field_by_field(changes: dict[str, Any], removed: list[str]) -> None:
    body = {**BODY, **changes}
    for name in removed:
        body.pop(name, None)
    assert checked(body, StageProfile) == one_by_one(body, StageProfile)


@given(st.dictionaries(st.sampled_from([f.name for f in dataclasses.fields(TimelinePoint)]), st.sampled_from(ODD)))
def test_a_timeline_point_too(point: dict[str, Any]) -> None:
    assert checked(point, TimelinePoint) == one_by_one(point, TimelinePoint)


def test_a_good_line_takes_the_quick_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = runfiles._check_each
    monkeypatch.setattr(runfiles, "_check_each", lambda body, checks, what: calls.append(len(checks)) or real(
        body, checks, what))
    assert checked(dict(BODY), StageProfile) is None
    assert calls == [len(runfiles._field_groups(StageProfile)[2])] and calls[0] < len(NAMES) // 3
