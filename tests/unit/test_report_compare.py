"""`iobatch report --compare`: the one parser of a side (a run directory or a CloudWatch Logs range), and its
usage errors. Times are fixed: nothing here depends on today's date or this machine's zone."""

from __future__ import annotations

import calendar
from pathlib import Path

import pytest

from pipeline.cli import app
from profiling import runfiles
from profiling.metrics import STAGES
from profiling.report import CloudWatchRange, ReportInputError, parse_run_side
from profiling.sidecar import write_profile_line
from tests.support.cli import CliRunner
from tests.support.profiles import PROPS, full_profile

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
runner = CliRunner()


def utc(*fields: int) -> float:
    """Seconds since the epoch of a UTC time (year, month, day, hour, minute, second)."""
    return float(calendar.timegm((*fields, 0, 0, 0)))


@pytest.mark.parametrize(("side", "group", "start", "end"), [
    ("cw:/aws/batch/iobatch@2026-11-20T10:00..2026-11-20T11:30", "/aws/batch/iobatch",
     utc(2026, 11, 20, 10, 0, 0), utc(2026, 11, 20, 11, 30, 0)),
    # A zone moves the instant; Z is UTC; a date alone is its midnight (UTC).
    ("cw:g@2026-11-20T10:00+01:00..2026-11-20T10:00:30Z", "g", utc(2026, 11, 20, 9, 0, 0),
     utc(2026, 11, 20, 10, 0, 30)),
    ("cw:a.b-c_d#e@2026-11-20..2026-11-21", "a.b-c_d#e", utc(2026, 11, 20, 0, 0, 0), utc(2026, 11, 21, 0, 0, 0)),
    ("cw:g@2026-11-20T10:00:00.250..", "g", utc(2026, 11, 20, 10, 0, 0) + 0.25, NOW),  # no end: until now
    ("cw:g@90m", "g", NOW - 5400, NOW),  # the last DURATION
    ("cw:g@2d", "g", NOW - 2 * 86400, NOW),
])
def test_cloudwatch_ranges(side: str, group: str, start: float, end: float) -> None:
    assert parse_run_side(side, now=NOW) == CloudWatchRange(group, start, end, side)


def test_anything_else_is_a_run_directory() -> None:
    assert parse_run_side("runs/before", now=NOW) == Path("runs/before")
    assert parse_run_side("./cw:old", now=NOW) == Path("cw:old")  # a directory named cw:...


def test_the_window_is_shown_in_utc() -> None:
    one_day = parse_run_side("cw:g@2026-11-20T10:00+01:00..2026-11-20T11:30", now=NOW)
    assert isinstance(one_day, CloudWatchRange)
    assert one_day.window() == "2026-11-20 09:00:00 to 11:30:00 UTC"
    two_days = parse_run_side("cw:g@2026-11-20T23:00..2026-11-21T01:00", now=NOW)
    assert isinstance(two_days, CloudWatchRange)
    assert two_days.window() == "2026-11-20 23:00:00 to 2026-11-21 01:00:00 UTC"


@pytest.mark.parametrize(("side", "says"), [
    ("", "a side is empty"),
    ("cw:", "is not a log group name"),
    ("cw:my group@1h", "'my group' is not a log group name"),
    ("cw:g@x@1h", "'x@1h' is neither"),
    ("cw:" + "g" * 513 + "@1h", "is not a log group name"),
    ("cw:g", "has no time range"),
    ("cw:g@", "has no time range"),
    ("cw:g@soon", "'soon' is neither START..END nor a duration"),
    ("cw:g@-1h", "is neither START..END nor a duration"),
    ("cw:g@0s", "is neither START..END nor a duration"),
    ("cw:g@2026-11-20T25:00..2026-11-21", "'2026-11-20T25:00' is not a time after 1970"),
    ("cw:g@yesterday..2026-11-21", "'yesterday' is not a time after 1970"),
    ("cw:g@..2026-11-21", "'' is not a time after 1970"),
    ("cw:g@1969-12-31T23:00..2026-11-21", "'1969-12-31T23:00' is not a time after 1970"),
    ("cw:g@1970-01-01T00:30+01:00..2026-11-21", "is not a time after 1970"),
    ("cw:g@2026-11-21T10:00..2026-11-21T10:00", "the range ends before it starts"),
    ("cw:g@2026-11-21T10:00..2026-11-21T10:30+01:00", "the range ends before it starts"),
])
def test_bad_sides_name_themselves_and_the_forms(side: str, says: str) -> None:
    with pytest.raises(ReportInputError) as caught:
        parse_run_side(side, now=NOW)
    message = str(caught.value)
    assert says in message and "\n" not in message
    assert message.startswith("--compare")
    assert message.endswith(("cw:LOG_GROUP@1h", "with START first"))


def test_a_malformed_side_is_a_usage_error_before_anything_is_read(tmp_path: Path) -> None:
    # The run directory does not exist either: the range is judged first, and nothing is written.
    out = tmp_path / "c.html"
    result = runner.invoke(app, ["report", "--compare", str(tmp_path / "absent"), "cw:g@2026-11-20T10:00..soon",
                                 "--out", str(out)])
    assert result.exit_code == 64
    assert result.output.startswith("error: --compare 'cw:g@2026-11-20T10:00..soon': 'soon' is not a time")
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert not out.exists()


def test_compare_goes_alone(tmp_path: Path) -> None:
    for extra in (["--advice", str(tmp_path / "a.json")], ["--from-cloudwatch", "g"], [str(tmp_path)]):
        result = runner.invoke(app, ["report", "--compare", "a", "b", *extra])
        assert result.exit_code == 64, extra
        assert result.output.startswith("error: give --compare RUN_A RUN_B alone")


def write_run(run_dir: Path, download_s: float) -> None:
    """Three children, each stage written as the sidecar writes its profile lines (4 MB a stage: the
    advisor, which the comparison runs on each run, simulates every byte)."""
    size = 4_000_000
    for child in range(3):
        name = f"part-{child:05d}"
        for stage in STAGES:
            write_profile_line(runfiles.profile_path(run_dir, name), full_profile(
                stage=stage, duration_s=download_s if stage == "download" else 0.1, read_bytes=size,
                write_bytes=size, storage_write_bytes=size, device_write_bytes=size, device_write_ops=30,
                io_stall_some_ms=20.0, io_stall_full_ms=10.0,
                properties={**PROPS, "JobId": f"job-1:{child}", "ArrayIndex": str(child)}))


def test_two_run_directories_need_no_aws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    write_run(tmp_path / "before", download_s=0.4)
    write_run(tmp_path / "after", download_s=0.2)
    out = tmp_path / "c.html"
    result = runner.invoke(app, ["report", "--compare", str(tmp_path / "before"), str(tmp_path / "after"),
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    assert ("<tr data-figure='StageDuration'><td class=l>Wall time of the stage</td><td>0.400 s</td><td>0.200 s</td>"
            "<td class='better'>0.50x</td></tr>") in page
