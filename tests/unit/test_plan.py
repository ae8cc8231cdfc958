"""tuning.plan: what the advisor is told; here the candidate volumes given as text."""

from __future__ import annotations

import pytest

from tuning.ebs import Volume
from tuning.plan import AdviseError, parse_candidate


@pytest.mark.parametrize(
    ("text", "message"),
    [("st1", "TYPE:SIZE_GIB"), ("st1:big", "not a whole number"), ("gp3:100:speed=3", "iops=N"),
     ("st1:50", "outside 125")],
)
def test_bad_candidates(text: str, message: str) -> None:
    with pytest.raises(AdviseError, match=message):
        parse_candidate(text)


def test_parse_candidate() -> None:
    assert parse_candidate("gp3:200:iops=4000:throughput=250") == Volume("gp3", 200, 4000, 250.0)
    assert parse_candidate("io1:100:iops=3000") == Volume("io1", 100, iops=3000)
