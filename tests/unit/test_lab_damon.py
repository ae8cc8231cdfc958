"""The host's proactive reclaim as the lab finds, pauses and resumes it (tuning.lab.damon), on a sysfs tree laid out
as the kernel's (mm/damon/sysfs.c: kdamonds/<N>/state, kdamonds/<N>/contexts/<C>/schemes/<S>/action)."""

from __future__ import annotations

from pathlib import Path

from tuning.lab import damon


def kdamond(root: Path, n: int, state: str, action: str) -> Path:
    scheme = root / str(n) / "contexts" / "0" / "schemes" / "0"
    scheme.mkdir(parents=True)
    (scheme / "action").write_text(action + "\n")
    (root / str(n) / "state").write_text(state + "\n")
    return root / str(n) / "state"


def test_a_running_pageout_kdamond_is_paused_and_resumed(tmp_path: Path) -> None:
    root = tmp_path / "kdamonds"
    reclaim = kdamond(root, 0, "on", "pageout")
    kdamond(root, 1, "off", "pageout")  # not running: left alone
    kdamond(root, 2, "on", "stat")  # monitors only: left alone
    module = tmp_path / "enabled"
    module.write_text("Y\n")
    found = damon.reclaiming(root, module)
    assert found == {str(reclaim): ["on", "off"], str(module): ["Y", "N"]}
    assert damon.pause(found) == []
    assert reclaim.read_text().strip() == "off" and module.read_text().strip() == "N"
    assert (root / "2" / "state").read_text().strip() == "on"
    assert damon.reclaiming(root, module) == {}  # paused: a second lab finds nothing to pause
    assert damon.resume(found) == []
    assert reclaim.read_text().strip() == "on" and module.read_text().strip() == "Y"
    assert "proactive reclaim (DAMON pageout, 2) paused" in damon.describe(found)


def test_nothing_to_pause_where_damon_is_absent(tmp_path: Path) -> None:
    assert damon.reclaiming(tmp_path / "none", tmp_path / "none-either") == {}
    assert damon.describe({}) == "" and damon.pause({}) == [] and damon.resume({}) == []


def test_a_switch_that_cannot_be_written_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    problems = damon.resume({str(tmp_path / "gone" / "state"): ["on", "off"]})
    assert len(problems) == 1 and "gone/state" in problems[0]
