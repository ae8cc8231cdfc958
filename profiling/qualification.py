"""A host's qualification as its children see it: the figures the user data measured of scratch before the host took
jobs (profiling.qualifyio, run by tuning/hostqualify.py), read once by each child's profiler, so every profile and EMF
document carries them as properties (strings, as every property), and read back from them by the report and the
advisor.

The file is the host's, root's and read-only to the profiler container (infra/jobs.py binds QUALIFICATION_DIR).
Nothing here fails: a host without the file (qualification off, a local run) gives no properties.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from profiling.qualifyio import (
    EXPECTED_KEY,
    FENCED,
    MIBPS_KEY,
    QUALIFIED,
    RATIO_KEY,
    SLOW,
    SLOW_CAPPED,
    UNJUDGED,
    VERDICT_KEY,
    properties,
)

QUALIFICATION_DIR = "/var/lib/iobatch"
QUALIFICATION_FILE = f"{QUALIFICATION_DIR}/qualification.json"
VERDICTS = (QUALIFIED, SLOW, SLOW_CAPPED, FENCED, UNJUDGED)
QUALIFICATION_KEYS = (VERDICT_KEY, MIBPS_KEY, EXPECTED_KEY, RATIO_KEY)
_MAX_FILE_BYTES = 1 << 16


def host_properties(path: Path = Path(QUALIFICATION_FILE)) -> dict[str, str]:
    """The properties of the host's qualification file at `path`; {} when there is none or it is not one."""
    try:
        with path.open(encoding="utf-8") as stream:
            record = json.loads(stream.read(_MAX_FILE_BYTES))
        found = properties(record) if isinstance(record, dict) else {}
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError):
        return {}
    return found if read_qualification(found) is not None else {}


@dataclass(frozen=True)
class Qualification:
    """A host's qualification, from its children's properties."""

    verdict: str
    mibps: float  # the lower of its write and read figures
    expected_mibps: float | None
    ratio: float | None

    @property
    def slow(self) -> bool:
        return self.verdict in (SLOW, SLOW_CAPPED, FENCED)

    def describe(self) -> str:
        ratio = f"{self.ratio:.2f}x of {self.expected_mibps:.1f} MiB/s, " if self.ratio is not None and \
            self.expected_mibps else ""
        return f"qualified at {ratio}{self.mibps:.1f} MiB/s ({self.verdict})"


def read_qualification(props: Mapping[str, str]) -> Qualification | None:
    """The qualification a child's properties carry, or None (none, or not numbers)."""
    verdict = props.get(VERDICT_KEY)
    if verdict not in VERDICTS:
        return None
    try:
        mibps = float(props[MIBPS_KEY])
        expected = float(props[EXPECTED_KEY]) if EXPECTED_KEY in props else None
        ratio = float(props[RATIO_KEY]) if RATIO_KEY in props else None
    except (KeyError, ValueError):
        return None
    if not all(v is None or (math.isfinite(v) and v >= 0) for v in (mibps, expected, ratio)):
        return None
    return Qualification(str(verdict), mibps, expected, ratio)
