"""What the suite checks of the machine and of each test: `make setup`'s work is there before the first test, and
no test leaves a preload or an iobatch variable in the environment for the tests after it."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path

# Built into the tree by `make setup` (the Makefile's targets), which the tests use without building.
BUILT = (".tools/bin/versitygw", "node_modules/.bin/cdk")
# What a test may not leave behind: a preload or an iobatch variable reaches every program a later test starts (an
# interposer's LD_PRELOAD once did, recording into a directory a finished test had removed).
LEAKABLE = ("LD_PRELOAD",)
LEAKABLE_PREFIX = "IOBATCH_"


def setup_missing(root: Path, euid: int) -> str | None:
    """One line naming what `make setup` makes that this machine lacks, None when nothing is: the mounts a booted
    host has (as root; profiling/probes/hoststate.py owns the list) and what setup builds into the tree `root`."""
    from profiling import hoststate

    absent = [f"{m.label} at {m.path}" for m in hoststate.missing()] if euid == 0 else []
    absent += [name for name in BUILT if not (root / name).exists()]
    if not absent:
        return None
    return f"missing: {', '.join(absent)}. Run `make setup` (as root it also mounts what a booted host has)"


def _leakable(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k in LEAKABLE or k.startswith(LEAKABLE_PREFIX)}


def environment_left(before: Mapping[str, str], environ: MutableMapping[str, str]) -> str | None:
    """What a test changed of the leakable variables since `before`, put back in `environ` (so one leak fails one
    test, not every test after it), in one line; None when nothing."""
    was, now = _leakable(before), _leakable(environ)
    changed = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
    for key in changed:
        if key in was:
            environ[key] = was[key]
        else:
            environ.pop(key, None)
    if not changed:
        return None
    return f"the test left {', '.join(changed)} changed in the environment: restore it (e.g. monkeypatch.setenv)"
