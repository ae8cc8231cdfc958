"""The suite's own checks: a machine without setup's work is named in one line before any test runs, and a test that
leaves a preload or an iobatch variable behind is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiling import hoststate
from tests.support.hostsetup import BUILT, environment_left, setup_missing


def test_a_tree_without_setups_tools_is_named_with_the_step(tmp_path: Path) -> None:
    line = setup_missing(tmp_path, euid=1000)
    assert line is not None and "\n" not in line
    assert all(name in line for name in BUILT) and "`make setup`" in line
    for name in BUILT:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    assert setup_missing(tmp_path, euid=1000) is None


def test_an_unmounted_bpffs_is_named_for_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in BUILT:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    monkeypatch.setattr(hoststate, "missing", lambda: [hoststate.BPFFS])
    assert setup_missing(tmp_path, euid=0) == ("missing: bpffs at /sys/fs/bpf. Run `make setup` (as root it also "
                                               "mounts what a booted host has)")
    assert setup_missing(tmp_path, euid=1000) is None  # only root's setup mounts it


def test_a_preload_or_an_iobatch_variable_left_behind_is_caught_and_put_back() -> None:
    before = {"PATH": "/bin", "IOBATCH_CACHE": "/c"}
    environ = {"PATH": "/usr/bin", "LD_PRELOAD": "/x.so", "IOBATCH_CACHE": "/d", "IOBATCH_NEW": "1"}
    line = environment_left(before, environ)
    assert line is not None and "IOBATCH_CACHE, IOBATCH_NEW, LD_PRELOAD" in line
    assert environ == {"PATH": "/usr/bin", "IOBATCH_CACHE": "/c"}  # PATH is not its business
    assert environment_left(before, dict(before)) is None


def test_a_probe_on_a_command_never_preloads_this_process() -> None:
    """The interposer's variables go to the command only (profiling.probes.command_environment): set here, they
    reached every program later tests started."""
    import os
    import sys

    from profiling.probes import _CommandInterposeProbe, command_environment
    from profiling.probes.interpose import ENV_LIB

    before = dict(os.environ)
    probe = _CommandInterposeProbe(Path("/nonexistent-scratch"))
    env = command_environment(probe)
    assert env.get("LD_PRELOAD") and any(k.startswith("IOBATCH_") for k in env), env
    assert ENV_LIB in env or "LD_PRELOAD" in env
    assert dict(os.environ) == before and command_environment(None) == {}
    assert sys.modules["profiling.probes"]


def test_a_working_directory_or_signal_handler_left_behind_is_caught_and_put_back(tmp_path: Path) -> None:
    import os
    import signal

    from tests.support.hostsetup import ProcessState, state_left

    before = ProcessState.now()
    assert state_left(before) is None
    old = signal.getsignal(signal.SIGTERM)
    os.chdir(tmp_path)
    signal.signal(signal.SIGTERM, lambda *_: None)
    line = state_left(before)
    assert line is not None and "working directory" in line and "SIGTERM handler" in line
    assert os.getcwd() == before.cwd and signal.getsignal(signal.SIGTERM) == old
