"""The host's proactive reclaim (DAMON), paused while the lab runs: recorded in the lab's state, stopped, restored.

Some hosts run DAMON with a `pageout` scheme: memory regions not accessed for a while are paged out whatever the
free memory (Documentation/admin-guide/mm/damon/usage.rst, "schemes/<N>/action"; the DAMON_RECLAIM module does the
same, Documentation/admin-guide/mm/damon/reclaim.rst). No kdamond runs unless configured to, as on the hosts
the stack deploys. In the lab it changes what is measured: a host that pages out regions idle for 12 aggregation
intervals of 5 s (a minute) took from a child whose download lasted 85 s a share of its images before its
process stage read them, and the stage read them back from the lab volume at the baseline's random-I/O rate
(about 0.6 MiB/s: each small request a whole 1 MiB unit), blocked in folio_wait_bit_common with gigabytes of
memory free: a batch of 48 x 40 MiB had not finished its process stage after 18 minutes. The lab stops such a
kdamond (writes `off` to its state file) and turns it back `on` with the rest of its state (tuning.lab.restore),
so the page cache keeps what an instance's would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path

# The sysfs interface (mm/damon/sysfs.c): kdamonds/<N>/state and kdamonds/<N>/contexts/<C>/schemes/<S>/action.
KDAMONDS = Path("/sys/kernel/mm/damon/admin/kdamonds")
# The DAMON_RECLAIM module's switch (mm/damon/reclaim.c): Y or N.
RECLAIM_ENABLED = Path("/sys/module/damon_reclaim/parameters/enabled")
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
