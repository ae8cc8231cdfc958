"""run.json read back strictly: what a local run wrote of itself (pipeline.local.runner, the demo), each field
checked with the bounds of the flag it came from, so that a damaged or hand-edited file is one line naming the file
and the fix (65), never a plan blamed on missing flags or figures no flag would take.

profiling.runfiles reads the file (one JSON object, else DamagedRunFileError); this module owns what its fields may
hold. Fields it does not know are left to the reader (a newer run's). Every command that reads run.json reads it
here: advise (the plan a run implies), report and report --compare (the advice and the run's section), the demo,
submit --local.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipeline.endpoints import endpoint_problem, shown_endpoint
from pipeline.errors import PermanentError, UsageError
from pipeline.settings import MAX_DEMO_IMAGES, MAX_IMAGES_PER_CHILD, MAX_WORKERS
from profiling import runfiles
from tuning.instances import MAX_MEMORY_GIB, MIN_MEMORY_GIB

__all__ = ["FIELDS", "checked_run", "read_run", "run_problem"]

Check = Callable[[Any], str | None]


def _whole(low: int, high: int | None = None, flag: str = "") -> Check:
    def check(value: Any) -> str | None:
        within = isinstance(value, int) and not isinstance(value, bool) and value >= low and \
            (high is None or value <= high)
        if within:
            return None
        bounds = f"{low:,} or more" if high is None else f"{low:,} to {high:,}"
        return f"is {_shown(value)}, not a whole number {bounds}" + (f" (what {flag} takes)" if flag else "")
    return check


def _number(low: float, high: float | None = None, flag: str = "") -> Check:
    def check(value: Any) -> str | None:
        within = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and \
            value >= low and (high is None or value <= high)
        if within:
            return None
        bounds = f"{low:g} or more" if high is None else f"{low:g} to {high:g}"
        return f"is {_shown(value)}, not a number {bounds}" + (f" (what {flag} takes)" if flag else "")
    return check


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def _kind(*kinds: type) -> Check:
    names = " or ".join({str: "text", bool: "true or false", list: "a list", dict: "an object"}[k] for k in kinds)
    return lambda value: None if isinstance(value, kinds) else f"is {_shown(value)}, not {names}"


def _endpoint(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return f"is {_shown(value)}, not an endpoint URL"
    problem = endpoint_problem(value)
    return None if problem is None else f"{problem} (what --s3-endpoint takes)"


def _seconds_each(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"is {_shown(value)}, not an object"
    seconds = _number(0.0)
    for child, elapsed in value.items():
        if problem := seconds(elapsed):
            return f"of child {child[:20]!r} {problem}"
    return None


def _shown(value: Any) -> str:
    """A value for the error line; text with an '@' in it as an endpoint is shown (user info hidden), wherever it is."""
    if isinstance(value, str) and "@" in value:
        return shown_endpoint(value, 40)
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


#: What each field of run.json may hold: the flags' bounds for what came from a flag (--workers, --images-per-child,
#: --slow-child, --s3-endpoint; memory_gib is the plan's --memory-gib), counts and times otherwise.
FIELDS: dict[str, Check] = {
    "workers": _whole(1, MAX_WORKERS, "--workers"),
    "images_per_child": _whole(1, MAX_IMAGES_PER_CHILD, "--images-per-child"),
    "slow_child": _optional(_whole(0, MAX_DEMO_IMAGES, "--slow-child")),
    "endpoint": _endpoint,
    "memory_gib": _number(MIN_MEMORY_GIB, MAX_MEMORY_GIB, "advise --memory-gib"),
    "children": _whole(0), "images": _whole(0), "bytes": _whole(0), "succeeded": _whole(0), "skipped": _whole(0),
    "started": _number(0.0), "finished": _number(0.0), "elapsed_s": _number(0.0),
    "child_elapsed_s": _seconds_each,
    "job_id": _kind(str), "input": _kind(str), "output": _kind(str), "manifest": _kind(str),
    "demo": _kind(bool), "failed": _kind(list),
}


def run_problem(run: Mapping[str, Any]) -> str | None:
    """The first field of `run` (run.json's object) that holds what its flag would not take, said as 'FIELD is ...',
    or None."""
    for name, check in FIELDS.items():
        if name in run and (problem := check(run[name])):
            return f"{name} {problem}"
    return None


def checked_run(run: Mapping[str, Any] | None, run_dir: Path) -> dict[str, Any] | None:
    """`run` (read from `run_dir`'s run.json; None: there is none), checked (run_problem): a PermanentError naming
    the file and the fix when a field is wrong."""
    if run is None:
        return None
    if problem := run_problem(run):
        error = runfiles.DamagedRunFileError(f"{runfiles.run_file_path(run_dir)}: {problem}")
        raise PermanentError(f"{error}: {error.fix}")
    return dict(run)


def read_run(run_dir: Path) -> dict[str, Any]:
    """`run_dir`'s run.json, read and checked: FileNotFoundError when it is missing; a PermanentError (65) naming the
    file and the fix when it is not one JSON object or a field is not what its flag takes; a UsageError when it
    cannot be read."""
    try:
        run = runfiles.read_run(run_dir)
    except runfiles.DamagedRunFileError as exc:
        raise PermanentError(f"{exc}: {exc.fix}") from None
    except FileNotFoundError:
        raise
    except OSError as exc:  # there, yet not to read (its mode, a FIFO in its place)
        raise UsageError(f"{runfiles.run_file_path(run_dir)} cannot be read ({exc.strerror}): fix its mode, or "
                         "delete it") from None
    checked = checked_run(run, run_dir)
    assert checked is not None
    return checked
