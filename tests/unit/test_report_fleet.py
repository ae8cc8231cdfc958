"""The report at fleet size: profiles streamed into columns, the straggler found among 20,000 children, a page
that stays light, and odd property types read or refused in one line."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from pipeline.cli import app
from profiling import outliers, runfiles
from profiling.metrics import MIB, StageProfile, TimelinePoint
from profiling.report import find_bad_apples, load_run_dir, render_html
from profiling.report.fleet import PER_CHILD_LIMIT, Fleet
from profiling.report.sources import ReportData
from profiling.sidecar import write_profile_line
from tests.support.cli import CliRunner

T0 = float(int(time.time()) - 86400)
runner = CliRunner()


def download(child: int, rate_mib_s: float, start: float, *, job: str = "job-1") -> StageProfile:
    duration = 100 / rate_mib_s
    return StageProfile(
        stage="download", outcome="ok", started_at=T0 + start, duration_s=duration, read_bytes=100 * MIB,
        write_bytes=100 * MIB, device_write_latency_ms=3.0, peak_dirty_bytes=200 * MIB,
        properties={"JobId": f"{job}:{child}", "ArrayIndex": str(child), "InstanceId": f"i-{child // 8:05x}"},
        timeline=[TimelinePoint(t=duration * (k + 1) / 4, read_bps=rate_mib_s * MIB, write_bps=rate_mib_s * MIB,
                                device_write_bps=None, device_queue_depth=None, dirty_bytes=MIB,
                                writeback_bytes=0, io_stall_some_ms=0.0) for k in range(4)],
    )


def fleet_of(count: int, slow: int, *, warm_wave: bool = False) -> ReportData:
    """`count` children in waves of 1,000, rates spread by +-15 %; child `slow` at a tenth of the rate. With
    `warm_wave`, the whole first wave runs at 0.55 (the batch's, not a child's)."""
    fleet = Fleet()
    for child in range(count):
        wave = child // 1000
        rate = 200.0 * (0.85 + 0.3 * ((child * 7919) % 101) / 100)
        rate *= 0.1 if child == slow else (0.55 if warm_wave and wave == 0 else 1.0)
        fleet.add(download(child, rate, start=wave * 10.0 + (child % 1000) * 0.001), f"part-{child:05d}")
    return ReportData(entries=[], source="test", has_timelines=False, fleet_columns=fleet.finish(), complete=False)


def test_the_straggler_is_found_among_20000_children() -> None:
    data = fleet_of(20_000, slow=13_337, warm_wave=True)
    began = time.monotonic()
    apples = find_bad_apples(data)
    assert time.monotonic() - began < 20  # one sort and a binary search, not 20,000 x 20,000 comparisons
    assert [(a.stage, a.scope, a.name) for a in apples] == [("download", "child", "child 13337")]
    page = render_html(data)
    assert "<tr class=bad data-stage='download' data-scope='child' data-name='child 13337'>" in page
    assert len(page) < 2_000_000  # the basic plotly.js and distributions, not 20,000 bars
    assert page.count("<tr class=straggler ") == 10 and "data-child='child 13337'" in page
    assert "id=fleet-time" in page and "id=plot-download-throughput" not in page


def test_a_4x_throttled_child_among_8_is_flagged() -> None:
    # A loaded machine: the others spread 2:1; z scores the throttled child -2.0 (against the others: -3.2).
    rates = [280.0, 140.0, 200.0, 300.0, 52.0, 240.0, 150.0, 260.0]
    values = {f"child {n}": r for n, r in enumerate(rates)}
    assert [o.key for o in outliers.find_outliers(values, low_only=True)] == ["child 4"]
    # and a child at 0.55 of the rest, the warm-up the demo measures, is not
    values["child 4"] = 0.55 * 220.0
    assert outliers.find_outliers(values, low_only=True) == []


def test_contemporaries_sample_keeps_a_shared_slowdown_unflagged() -> None:
    # 10,000 children all at once, half of them (a slow period) at a third: none is slow of its own.
    values = {f"c{n}": (60.0 if n % 2 else 180.0) * (1 + (n % 7) / 100) for n in range(10_000)}
    spans = {k: (0.0, 10.0) for k in values}
    assert outliers.find_slow(values, spans) == []


def write_children(run_dir: Path, count: int, slow: int) -> None:
    (run_dir / runfiles.PROFILES).mkdir(parents=True)
    for child in range(count):
        rate = 200.0 * (0.9 + 0.2 * (child % 5) / 4) * (0.1 if child == slow else 1.0)
        write_profile_line(runfiles.profile_path(run_dir, f"part-{child:05d}"),
                           download(child, rate, start=child * 0.5))


def test_a_large_run_dir_is_read_into_columns_and_drills_down(tmp_path: Path) -> None:
    write_children(tmp_path, PER_CHILD_LIMIT + 36, slow=70)
    data = load_run_dir(tmp_path)
    assert not data.complete and data.entries == [] and data.child_count() == PER_CHILD_LIMIT + 36
    assert data.fleet.summary()["download"]["children"] == PER_CHILD_LIMIT + 36
    page = render_html(data)
    assert "data-name='child 70'" in page
    assert "<h3 id='timeline-of-child 70'>child 70 <span class=flag>(bad apple)</span></h3>" in page
    small = load_run_dir(_small(tmp_path / "small"))
    assert small.complete and len(small.entries) == 5


def _small(run_dir: Path) -> Path:
    write_children(run_dir, 5, slow=-1)
    return run_dir


def _line(**properties: object) -> str:
    body = download(7, 100.0, 0.0).to_dict()
    body["properties"] = {**body["properties"], **properties}
    return json.dumps(body)


def test_a_numeric_array_index_is_read_as_its_text(tmp_path: Path) -> None:
    (tmp_path / runfiles.PROFILES).mkdir()
    runfiles.profile_path(tmp_path, "part-00007").write_text(_line(ArrayIndex=7, JobId="job-1:7") + "\n")
    data = load_run_dir(tmp_path)
    assert [x.child for x in data.entries] == ["child 7"]
    assert data.entries[0].profile.properties["ArrayIndex"] == "7"
    result = runner.invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output


def test_other_property_kinds_are_refused_in_one_line(tmp_path: Path) -> None:
    for n, (value, shown) in enumerate(((["7"], '["7"]'), ({"i": 7}, '{"i": 7}'), (True, "true"), (None, "null"))):
        run = tmp_path / str(n)
        (run / runfiles.PROFILES).mkdir(parents=True)
        file = runfiles.profile_path(run, "part-00000")
        file.write_text(_line(ArrayIndex=value) + "\n")
        result = runner.invoke(app, ["report", str(run), "--out", str(run / "r.html")])
        assert result.exit_code == 65, result.output
        assert result.output == (f"error: {file}:1: not a profile (properties.ArrayIndex is {shown}, not a string "
                                 f"or number): {runfiles.DamagedFileError.fix}\n")
        assert not (run / "r.html").exists()


def test_a_fifo_or_directory_among_a_runs_files_is_named_without_blocking(tmp_path: Path) -> None:
    # Before: a FIFO blocked the streaming reader in open(2), then (opened without blocking) was called
    # "cannot write the report".
    for kind, folder, name in (("FIFO", runfiles.PROFILES, "part-00000.jsonl"), ("directory", runfiles.EMF,
                                                                                 "part-00000.emf")):
        run = tmp_path / kind
        (run / folder).mkdir(parents=True)
        path = run / folder / name
        if kind == "FIFO":
            os.mkfifo(path)
        else:
            path.mkdir()
        started = time.monotonic()
        result = runner.invoke(app, ["report", str(run), "--out", str(tmp_path / "r.html")])
        assert time.monotonic() - started < 10
        assert result.exit_code == 64, result.output
        assert result.output.startswith(f"error: cannot read {path} ({'a ' + kind}"), result.output
        assert not (tmp_path / "r.html").exists()


def test_a_damaged_timeline_point_among_many_is_named() -> None:
    good = download(3, 100.0, 0.0).to_dict()
    for field, value, message in (("read_bps", -1.0, "read_bps is -1.0: a profile holds finite figures"),
                                  ("write_bps", True, "write_bps is true, not a number"),
                                  ("t", None, "t is null, not a number"),
                                  ("dirty_bytes", 1e308, None)):
        body = json.loads(json.dumps(good))
        body["timeline"][2][field] = value
        if field == "dirty_bytes":  # two huge finite figures: the one-pass sum overflows, the exact check passes
            body["timeline"][3][field] = 1e308
            assert runfiles.profile_from_line(json.dumps(body)).timeline[2].dirty_bytes == 1e308
            continue
        with pytest.raises(ValueError, match=f"^a timeline point: {re.escape(str(message))}"):
            runfiles.profile_from_line(json.dumps(body))
    body = json.loads(json.dumps(good))
    del body["timeline"][1]["t"]
    with pytest.raises(ValueError, match=r"^a timeline point has no 't'$"):
        runfiles.profile_from_line(json.dumps(body))
