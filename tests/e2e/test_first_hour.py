"""The first hour of a user, through the real producer: `iobatch demo` on this machine (scratch on the local
disk, VolumeType `local`) in a 100-column terminal, then `iobatch advise RUN_DIR` and `iobatch report RUN_DIR`
with no other flags. The console table fits; the last lines say what bounds each stage, never price a volume
the run did not run on as a cost now, and name an absolute lab command for this batch; advise and report of
the run directory give the demo's recommendation; the page opens with its summary."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from profiling import runfiles
from profiling.report import load_run_dir
from profiling.report.advice import takeaways

REPO = Path(__file__).resolve().parents[2]
# Two children of two ~25 MiB images: each process stage takes seconds (long enough to judge), a download
# well under one on loopback (too short to judge).
SHAPE = ("--images", "4", "--image-mib", "25", "--images-per-child", "2", "--workers", "2")
BOUNDS = ("CPU-bound", "I/O-bound", "network-bound", "write cache-bound", "too short to judge", "not measured")


def iobatch(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("first-hour")
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100", "IOBATCH_CACHE": str(root / "cache")}
    run_dir = root / "demo"
    done = iobatch("demo", *SHAPE, "--run-dir", str(run_dir), "--no-progress", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return {"root": root, "env": env, "run_dir": run_dir, "out": done.stdout}


def test_the_console_table_fits_100_columns_and_shows_its_scope_tags(demo: dict[str, Any]) -> None:
    table = [line for line in demo["out"].splitlines() if line[:1] in "┏┃┡│└"]
    assert table, demo["out"]
    assert max(len(line) for line in table) <= 100, "\n".join(table)
    text = "\n".join(table)
    assert "[device]" in text and "[host]" in text  # shown, not read as rich markup
    assert "…" not in text  # headings wrap, numbers are never cut
    assert "net received MiB" in text


def test_the_last_lines_say_what_bounds_each_stage_first(demo: dict[str, Any]) -> None:
    lines = demo["out"].splitlines()
    stages = next(line for line in lines if line.startswith("stages (median child):"))
    for stage in ("download", "process", "upload"):
        shown = re.search(rf"{stage} [0-9.,]+ s ([^,]+)", stages)
        assert shown and shown.group(1) in BOUNDS, stages
    assert "s in no stage" in stages
    slowest = next(line for line in lines if line.startswith("slowest stage:"))
    assert slowest.startswith("slowest stage: process") and any(b in slowest for b in BOUNDS), slowest
    # Nothing on this machine is priced as a cost now unless a finding of this run says so.
    change = next(line for line in lines if line.startswith("the advisor would change"))
    for code in ("HDD_RANDOM_IO", "BURST_CREDITS", "SCRATCH_TOO_SMALL"):
        assert code not in change, change
    # No change without a reason: a write cache is proposed only by a finding that asks for it.
    assert "vm.dirty_bytes" not in change or "DIRTY_PAUSE" in change, change


def test_the_lab_hint_is_an_absolute_command_for_this_batch(demo: dict[str, Any]) -> None:
    hint = next(line for line in demo["out"].splitlines() if "lab --after-cliff" in line)
    command = hint.split("sudo ", 1)[1].split()
    assert Path(command[0]).is_absolute() and Path(command[0]).exists(), hint
    assert " ".join(SHAPE) in hint and "as root" in hint and "(root)" not in hint


def test_a_volume_the_run_did_not_run_on_is_a_what_if_never_a_cost_now(demo: dict[str, Any]) -> None:
    # A small st1 with most device I/O random in 64 KiB requests: HDD findings that cost seconds per child on that
    # volume. The request size is given, not measured: whether the demo's few MiB reach the device during the
    # stage at all depends on the page cache of the machine running it.
    done = iobatch("advise", str(demo["run_dir"]), "--volume", "st1:125", "--random-pct", "80", "--io-size-kib",
                   "64", "--json", env=demo["env"])
    assert done.returncode == 0, done.stderr
    advice = json.loads(done.stdout)
    hdd = [f for f in advice["findings"] if f["code"] == "HDD_RANDOM_IO"]
    assert hdd, advice["findings"]
    for f in hdd:
        assert f["what_if"] == "st1 125 GiB" and f["title"].startswith("if this ran on st1 125 GiB")
        assert f["stage"] == "process"  # the download is too short to judge
    lines = takeaways(list(runfiles.read_profiles(demo["run_dir"])), advice)
    change = next(line for line in lines if line.startswith("the advisor would change"))
    assert "HDD_RANDOM_IO" not in change and " now" not in change.replace("nothing on this machine", "")
    what_if = next(line for line in lines if line.startswith("what-if"))
    assert "HDD_RANDOM_IO" in what_if and "not measured here" in what_if
    assert any(line.startswith("prices assume:") and "this machine's run" in line for line in lines)


def test_advise_of_the_run_directory_needs_no_plan_flags(demo: dict[str, Any]) -> None:
    done = iobatch("advise", str(demo["run_dir"]), "--json", env=demo["env"])
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["plan"]
    run = runfiles.read_run(demo["run_dir"])
    assert plan["jobs_per_instance"] == run["workers"] == 2 and plan["memory_gib"] == run["memory_gib"]
    assert "this machine's run" in plan["assumed"] and plan["summary"].startswith("2 jobs per instance")
    # A profile file alone says nothing of the plan: every missing flag in one line.
    alone = iobatch("advise", str(runfiles.profile_files(demo["run_dir"])[0]), env=demo["env"])
    assert alone.returncode == 64
    error = alone.stderr.strip().splitlines()
    assert len(error) == 1 and all(f in error[0] for f in ("--jobs-per-instance", "--memory-gib", "--jobs-per-day"))


def test_report_of_the_run_directory_keeps_the_demos_recommendation(demo: dict[str, Any]) -> None:
    again = demo["root"] / "again.html"
    done = iobatch("report", str(demo["run_dir"]), "--out", str(again), env=demo["env"])
    assert done.returncode == 0, done.stderr
    first = runfiles.report_path(demo["run_dir"]).read_text(encoding="utf-8")
    second = again.read_text(encoding="utf-8")
    assert "No recommendation was given" not in second and "id=candidates-table" in second
    plan = second[second.index("<p id=advice-plan>"):]
    assert "this machine" in plan[:plan.index("</p>")] and "jobs per instance per day" in plan[:plan.index("</p>")]
    recommended = re.compile(r"<p><b>Volume: ([^<]+)</b>")
    assert recommended.findall(first) == recommended.findall(second) != []


def test_the_page_opens_with_its_summary(demo: dict[str, Any]) -> None:
    page = runfiles.report_path(demo["run_dir"]).read_text(encoding="utf-8")
    sections = re.findall(r"<section[^>]* id=['\"]?([\w-]+)", page)
    assert sections[0] == "summary", sections[:3]
    summary = page[page.index("<section id=summary>"):page.index("</section>")]
    for stage in ("download", "process", "upload", "(no stage)"):
        assert f"data-stage='{stage}'" in summary
    assert "id=summary-finding" in summary and "id=summary-apples" in summary
    # The per-file table comes from the eBPF probe (root); without it, one note says so.
    from profiling.probes import ebpf

    if ebpf.available() is None:
        assert summary.count("class=file-row") == 10 and "input/00000-" in summary
        # The downloads write each image front to back: Darshan's pattern, from eBPF's per-file records.
        assert re.search(r"writes: [0-9,]+ consecutive, [0-9,]+ sequential of [0-9,]+; sizes", summary)
    else:
        assert "id=no-file-records" in summary


def test_the_page_of_a_small_run_weighs_at_most_3_mb(demo: dict[str, Any]) -> None:
    assert runfiles.report_path(demo["run_dir"]).stat().st_size <= 3 * 2**20


def test_compare_of_runs_that_did_different_work_says_so(demo: dict[str, Any]) -> None:
    # The same images (cached), one a child instead of two: half the work per child.
    half = demo["root"] / "half"
    done = iobatch("demo", "--images", "2", "--image-mib", "25", "--images-per-child", "1", "--workers", "2",
                   "--run-dir", str(half), "--no-progress", "--no-report", env=demo["env"])
    assert done.returncode == 0, done.stderr[-2000:]
    out = demo["root"] / "compare.html"
    done = iobatch("report", "--compare", str(demo["run_dir"]), str(half), "--out", str(out), env=demo["env"])
    assert done.returncode == 0, done.stderr
    page = out.read_text(encoding="utf-8")
    workloads = page[page.index("<table id=compare-workloads>"):]
    workloads = workloads[:workloads.index("</table>")]
    assert ">2</td>" in workloads and ">1</td>" in workloads  # images per child, both shown
    assert "id=compare-work-differs" in page and "ratio per GiB moved" in page and "ratio per image" in page
    # Half the work in a shorter time is not shown as faster: the raw duration ratio carries no colour.
    summary = page[page.index("<table id=compare-summary>"):]
    row = summary[summary.index("#compare-process"):]
    row = row[:row.index("</tr>")]
    assert row.count("class=''") >= 1


def test_the_plots_keep_a_scale_a_reader_can_trust(demo: dict[str, Any]) -> None:
    from profiling.metrics import median
    from profiling.report import load_run_dir, stage_figures
    from profiling.report.figures import OFF_SCALE_SHARE, STALL_AXIS_SHARE

    data = load_run_dir(demo["run_dir"])
    for stage in data.stages():
        entries = data.of_stage(stage)
        figures = dict(stage_figures(entries, set()))
        peaks = [x.profile.peak_dirty_bytes or 0 for x in entries]
        limits = [x.profile.dirty_threshold_bytes for x in entries if x.profile.dirty_threshold_bytes]
        texts = [a.text for a in figures["dirty"].layout.annotations]
        if limits and max(peaks) < OFF_SCALE_SHARE * max(limits):  # a 4 GiB limit over 100 MiB bars
            assert any("off this scale" in t for t in texts) and len(figures["dirty"].data) == 1, texts
        else:
            assert len(figures["dirty"].data) == 2
        stalls = [x.profile.io_stall_some_ms for x in entries if x.profile.io_stall_some_ms is not None]
        floor = STALL_AXIS_SHARE * median([x.profile.duration_s for x in entries]) * 1000
        if stalls and max(stalls) < floor:
            assert figures["io-stall"].layout.yaxis.range[1] >= floor * 0.99
        latency = figures["write-latency"]
        if all(x.profile.device_write_latency_ms is None for x in entries):
            assert any(x.profile.device_write_ops == 0 for x in entries)
            assert latency.layout.annotations[0].text.startswith("nothing to show: the scratch device completed no")


def test_the_timelines_share_the_runs_time_axis(demo: dict[str, Any]) -> None:
    page = runfiles.report_path(demo["run_dir"]).read_text(encoding="utf-8")
    data = load_run_dir(demo["run_dir"])
    start = min(x.profile.started_at for x in data.entries)
    end = max(x.profile.started_at + x.profile.duration_s for x in data.entries)
    ranges = re.findall(r'"xaxis3":\{"anchor":"y3".*?"range":\[0,([0-9.]+)\]', page)
    assert len(ranges) == len(data.children()) == 2 and {float(r) for r in ranges} == {round(end - start, 3)}
    assert "seconds since the run's first stage" in page
