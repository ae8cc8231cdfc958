"""The host's proactive reclaim (DAMON), paused while the lab runs: found, recorded in the lab's state, stopped and
turned back on (tuning.lab.restore), so the page cache keeps what an instance's would (the stack's hosts run none).

In: the sysfs switches (KDAMONDS, RECLAIM_ENABLED). Out: `reclaiming()` gives {switch file: [value to restore, value
that stops it]} for each kdamond that is on with a pageout scheme and for the DAMON_RECLAIM module; `pause` and
`resume` write them and return the problems, never raise. Why the lab needs it: docs/advisor.md (`lab --where host`)
and BENCHMARKS.md, Part 3.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path

# The sysfs interface (mm/damon/sysfs.c): kdamonds/<N>/state and kdamonds/<N>/contexts/<C>/schemes/<S>/action.
KDAMONDS = Path("/sys/kernel/mm/damon/admin/kdamonds")
# The DAMON_RECLAIM module's switch (mm/damon/reclaim.c): Y or N.
RECLAIM_ENABLED = Path("/sys/module/damon_reclaim/parameters/enabled")
# A scheme with this action pages out regions not accessed for a while whatever the free memory
# (Documentation/admin-guide/mm/damon/usage.rst, "schemes/<N>/action"; DAMON_RECLAIM does the same,
# Documentation/admin-guide/mm/damon/reclaim.rst). No kdamond runs unless configured to.
RECLAIM_ACTIONS = frozenset({"pageout"})


def reclaiming(kdamonds: Path = KDAMONDS, reclaim_enabled: Path = RECLAIM_ENABLED) -> dict[str, list[str]]:
    """What reclaims proactively now: {switch file: [value to restore, value that stops it]}."""
    found: dict[str, list[str]] = {}
    for state in sorted(kdamonds.glob("*/state")):
        actions = {_read(a) for a in state.parent.glob("contexts/*/schemes/*/action")}
        if _read(state) == "on" and actions & RECLAIM_ACTIONS:
            found[str(state)] = ["on", "off"]
    if _read(reclaim_enabled) == "Y":
        found[str(reclaim_enabled)] = ["Y", "N"]
    return found


def pause(switches: Mapping[str, Sequence[str]]) -> list[str]:
    """Stop what `reclaiming` found; returns the problems (a switch that could not be written)."""
    return _write_all(switches, stop=True)


def resume(switches: Mapping[str, Sequence[str]]) -> list[str]:
    """Turn back on what `pause` stopped; returns the problems."""
    return _write_all(switches, stop=False)


def describe(switches: Mapping[str, Sequence[str]]) -> str:
    """'' when nothing was paused, else a clause for the lab's opening line."""
    if not switches:
        return ""
    return (f"; the host's proactive reclaim (DAMON pageout, {len(switches)}) paused while the lab runs, "
            "as an instance runs none")


def _write_all(switches: Mapping[str, Sequence[str]], *, stop: bool) -> list[str]:
    problems = []
    for path, (restore, stopped) in switches.items():
        value = stopped if stop else restore
        try:
            if _read(Path(path)) != value:
                Path(path).write_text(value + "\n", encoding="ascii")
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
    return problems


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text(encoding="ascii").strip()
    return None
