"""The HTML report: what it reads, what it finds, what it holds (rendering in a browser is functional)."""

from __future__ import annotations

import html
import json
import re
import time
from dataclasses import replace
from pathlib import Path

import plotly
import plotly.graph_objects as go
import pytest

from pipeline.cli import app
from profiling import emf, runfiles
from profiling.contract import evaluate_stage, load_contract
from profiling.emf import profile_from_emf
from profiling.metrics import METRICS, METRICS_BY_NAME, MIB, STAGES, StageProfile, TimelinePoint
from profiling.report import (
    PLOTTERS,
    STAGE_PLOTS,
    DamagedInputError,
    Entry,
    ReportData,
    ReportInputError,
    downsample,
    find_bad_apples,
    load_run_dir,
    parse_since,
    profiles_from_emf_lines,
    render_html,
    stage_figures,
    timeline_figure,
    write_report,
)
from profiling.report.page import BASIC_BUNDLE, figure_html, plotly_js
from tests.support.cli import CliRunner
from tuning.advise import advise
from tuning.plan import Plan

# MiB/s per stage for the normal children: rates a st1-backed child sees.
RATES = {"download": [240.0, 232.0, 251.0, 228.0, 245.0, 238.0], "process": [44.0, 46.0, 43.0, 45.0, 47.0, 44.5],
         "upload": [91.0, 88.0, 95.0, 90.0, 86.0, 93.0]}
MIB_MOVED = {"download": 125, "process": 125, "upload": 20}
T0 = float(int(time.time()) - 3600)  # EMF refuses timestamps older than 14 days
CASE_STUDY = Path(__file__).resolve().parents[2] / "contracts" / "case-study.contract"


def profile(stage: str, child: int, rate_mib_s: float, *, instance: str = "i-0a", outcome: str = "ok",
            device: bool = True, contract: list[dict[str, object]] | None = None) -> StageProfile:
    duration = MIB_MOVED[stage] / rate_mib_s
    steps = 5
    return StageProfile(
        stage=stage, outcome=outcome, started_at=T0 + child * 10 + STAGES.index(stage) * 3,
        duration_s=duration, read_bytes=MIB_MOVED[stage] * MIB, write_bytes=MIB_MOVED[stage] * MIB // 2,
        read_calls=1000, write_calls=800, items=5,
        device="xvdb" if device else None,
        device_write_latency_ms=4.0 if device else None, device_queue_depth=1.5 if device else None,
        peak_dirty_bytes=300 * MIB, dirty_threshold_bytes=2400 * MIB, io_stall_some_ms=40.0,
        properties={"JobId": f"job-1:{child}", "ArrayIndex": str(child), "InstanceId": instance, "Pipeline": "p"},
        contract=contract or [],
        timeline=[TimelinePoint(t=(i + 1) * duration / steps, read_bps=rate_mib_s * MIB, write_bps=0.0,
                                device_write_bps=None, device_queue_depth=None, dirty_bytes=i * MIB,
                                writeback_bytes=0, io_stall_some_ms=float(i)) for i in range(steps)],
    )


def write_run(run_dir: Path, slow: int | None = None, **kwargs: object) -> list[StageProfile]:
    """Six children; child `slow` downloads at a fifth of the rate."""
    (run_dir / runfiles.PROFILES).mkdir(parents=True)
    written = []
    for child in range(6):
        lines = []
        for stage in STAGES:
            rate = RATES[stage][child] * (0.2 if child == slow and stage == "download" else 1)
            p = profile(stage, child, rate, **kwargs)  # type: ignore[arg-type]
            written.append(p)
            lines.append(json.dumps(p.to_dict()))
        runfiles.profile_path(run_dir, f"part-{child:05d}").write_text("\n".join(lines) + "\n")
    return written


def test_slow_child_is_the_only_bad_apple(tmp_path: Path) -> None:
    write_run(tmp_path, slow=4)
    apples = find_bad_apples(load_run_dir(tmp_path))
    assert [(a.stage, a.scope, a.name) for a in apples] == [("download", "child", "child 4")]
    # the median of 49, 228, 232, 238, 240, 251 MiB/s is 235
    assert apples[0].outlier.ratio == pytest.approx(0.2 * 245 / 235)


def test_no_bad_apple_in_an_even_run(tmp_path: Path) -> None:
    write_run(tmp_path)
    assert find_bad_apples(load_run_dir(tmp_path)) == []


def timed(child: int, rate: float, start: float) -> Entry:
    """A download entry of `child` at `rate` MiB/s that starts at T0 + `start`."""
    return Entry(f"child {child}", replace(profile("download", child, rate), started_at=T0 + start), None)


def test_a_warm_up_wave_is_no_bad_apple() -> None:
    # Two at a time; the first wave ran at 0.58 and 0.62 of the rest while everything warmed up.
    rates = [140.0, 150.0, 240.0, 241.0, 239.0, 242.0, 240.5, 239.5]
    entries = [timed(n, r, start=(n // 2) * 10.0 + (n % 2) * 0.2) for n, r in enumerate(rates)]
    assert find_bad_apples(ReportData(entries=entries, source="test", has_timelines=True)) == []


def test_a_slow_child_that_lost_under_half_a_second_holds_no_batch_back() -> None:
    """A demo's 2 MiB downloads: the others at 20 MiB/s (0.1 s), one at a fifth of it, 0.4 s lost: flagged by the
    outlier rules, not by the report; the same child downloading 20 MiB loses 4 s and is."""
    def short(child: int, rate: float, mib: float) -> Entry:
        full = profile("download", child, rate)
        return Entry(f"child {child}", replace(full, read_bytes=int(mib * MIB), write_bytes=int(mib * MIB) // 2,
                                               duration_s=mib / rate), None)

    for mib, flagged in ((2.0, []), (20.0, ["child 3"])):
        entries = [short(n, 4.0 if n == 3 else 20.0 + n, mib) for n in range(8)]
        apples = find_bad_apples(ReportData(entries=entries, source="test", has_timelines=True))
        assert [a.name for a in apples] == flagged, (mib, apples)


def test_a_child_beside_a_slow_one_is_judged_by_its_contemporaries() -> None:
    # child 3 crawls for 30 s; child 4 ran beside it at 0.43 of the median (shared cores), the rest alone.
    entries = [timed(n, 240.0 + n, start=n * 10.0) for n in range(3)]
    entries += [timed(3, 5.0, start=30.0), timed(4, 103.0, start=31.0)]
    entries += [timed(n, 240.0 + n, start=70.0 + n * 10.0) for n in range(5, 8)]
    apples = find_bad_apples(ReportData(entries=entries, source="test", has_timelines=True))
    assert [(a.name, a.stage) for a in apples] == [("child 3", "download")]


def test_a_slow_instance_is_found_across_its_children() -> None:
    entries = []
    for n in range(8):
        instance = f"i-{n // 2}"  # two children per instance
        rate = 240.0 + n if instance != "i-3" else 30.0 + n
        entries.append(Entry(f"child {n}", profile("download", n, rate, instance=instance), instance))
    apples = find_bad_apples(ReportData(entries=entries, source="test", has_timelines=True))
    assert ("instance", "i-3") in [(a.scope, a.name) for a in apples]
    assert {a.name for a in apples if a.scope == "child"} == {"child 6", "child 7"}


def test_a_failed_stage_does_not_count_as_slow() -> None:
    entries = [Entry(f"child {n}", profile("upload", n, 90.0 + n), None) for n in range(5)]
    entries.append(Entry("child 5", profile("upload", 5, 1.0, outcome="failed"), None))
    assert find_bad_apples(ReportData(entries=entries, source="test", has_timelines=True)) == []


def test_html_is_self_contained_with_one_plotly_copy(tmp_path: Path) -> None:
    write_run(tmp_path, slow=1)
    out = write_report(tmp_path)
    assert out == tmp_path / runfiles.REPORT
    text = out.read_text(encoding="utf-8")
    # The report draws bars and scatters only: plotly.js's basic bundle (1.2 MB), once, not the full one.
    banner = BASIC_BUNDLE.read_text(encoding="utf-8")[:200]
    assert "plotly.js (basic - minified) v" in banner
    assert banner.split(" v", 1)[1].split()[0] == plotly.offline.get_plotlyjs().split(" v", 1)[1].split()[0]
    assert text.count(banner) == 1
    assert plotly.offline.get_plotlyjs()[:200] not in text
    assert set(re.findall(r"data-traces='([a-z ]*)'", text)) <= {"bar", "scatter", "bar scatter"}
    assert re.search(r"<script[^>]+src=", text) is None
    assert "<link" not in text
    assert len(text) < 2_000_000  # one basic plotly.js (~1.2 MB) and the figures


def test_a_page_with_other_trace_types_gets_the_full_bundle() -> None:
    fig = go.Figure(go.Box(x=[1.0, 2.0, 3.0]))
    body = figure_html(fig, "box")
    assert plotly_js(body) == plotly.offline.get_plotlyjs()
    assert plotly_js(figure_html(go.Figure(go.Bar(x=[1], y=[2])), "bar")) == BASIC_BUNDLE.read_text(encoding="utf-8")


def test_html_has_every_stage_section_plot_and_timeline(tmp_path: Path) -> None:
    write_run(tmp_path, slow=1)
    text = write_report(tmp_path, tmp_path / "elsewhere" / "r.html").read_text(encoding="utf-8")
    for stage in STAGES:
        assert f"id='stage-{stage}'" in text
        for plot_id, _, _ in STAGE_PLOTS:
            assert f'id="plot-{stage}-{plot_id}"' in text
    assert len(re.findall(r'id="timeline-\d+"', text)) == 6
    assert "data-name='child 1'" in text  # the bad-apple row
    assert text.index("'>child 1 <span class=flag>(bad apple)</span></h3>") < text.index("'>child 0</h3>")


def test_plots_take_labels_and_scales_from_metrics() -> None:
    tput = METRICS_BY_NAME["Throughput"]
    entries = [Entry(f"child {n}", profile("download", n, r), None) for n, r in enumerate(RATES["download"])]
    figures = dict(stage_figures(entries, {"child 2"}))
    fig = figures["throughput"]
    assert fig.layout.yaxis.title.text == tput.label
    assert tput.display_unit in fig.layout.title.text
    assert list(fig.data[0].y) == pytest.approx(RATES["download"])  # bytes/s shown in MiB/s
    assert fig.data[0].marker.color[2] == "#d62728" and fig.data[0].marker.color[0] != "#d62728"
    dirty = figures["dirty"]
    assert [t.name for t in dirty.data] == [METRICS_BY_NAME["PeakDirtyBytes"].label,
                                            METRICS_BY_NAME["DirtyThresholdBytes"].label]
    assert list(dirty.data[1].y) == [2400.0] * 6


def test_a_metric_the_run_did_not_measure_gets_a_no_data_plot() -> None:
    entries = [Entry(f"child {n}", profile("upload", n, 90.0, device=False), None) for n in range(3)]
    figures = dict(stage_figures(entries, set()))
    assert len(figures) == len(STAGE_PLOTS)
    assert len(figures["write-latency"].data) == 0
    assert figures["write-latency"].layout.annotations[0].text.startswith("no data")
    assert len(figures["throughput"].data) == 1


def test_emf_round_trip_keeps_every_metric() -> None:
    original = profile("download", 3, 200.0)
    (line,) = emf.serialize(original)
    back = profile_from_emf(json.loads(line))
    assert back is not None
    for spec in METRICS:
        assert back.value(spec) == pytest.approx(original.value(spec)), spec.name
    assert back.properties["ArrayIndex"] == "3" and back.stage == "download" and back.device == "xvdb"
    assert back.started_at == pytest.approx(original.started_at, abs=0.002)  # EMF timestamps are in ms
    assert back.timeline == []


def test_emf_lines_skip_other_output_and_name_a_broken_line() -> None:
    line = emf.serialize(profile("upload", 0, 90.0))[0]
    other_namespace = line.replace('"IoBatch"', '"Other"')
    lines = ["starting job", line, '{"not": "emf"}', other_namespace]
    assert [p.stage for p in profiles_from_emf_lines(lines, where="x")] == ["upload"]
    with pytest.raises(DamagedInputError, match=r"^part\.emf:2: not an EMF document"):
        profiles_from_emf_lines([line, '{"broken'], where="part.emf")


def test_emf_only_run_says_there_are_no_timelines(tmp_path: Path) -> None:
    (tmp_path / runfiles.EMF).mkdir()
    for child in range(4):
        lines = [emf.serialize(profile(stage, child, RATES[stage][child]))[0] for stage in STAGES]
        runfiles.emf_path(tmp_path, f"part-{child:05d}").write_text("\n".join(lines) + "\n")
    data = load_run_dir(tmp_path)
    assert not data.has_timelines and len(data.entries) == 12
    text = render_html(data)
    assert "id=no-timelines" in text and 'id="timeline-' not in text
    assert 'id="plot-upload-io-stall"' in text


def evaluated(entry: Entry, contract: Path = CASE_STUDY) -> Entry:
    """The entry with the rows the real contract evaluator writes for its profile."""
    rows = evaluate_stage(load_contract(contract), entry.profile)
    return replace(entry, profile=replace(entry.profile, contract=rows))


def test_contract_rows_are_the_evaluators_with_values_and_units() -> None:
    entries = [evaluated(Entry(f"child {n}", profile("download", n, RATES["download"][n]), None)) for n in range(3)]
    rows = entries[1].profile.contract
    assert [r["label"] for r in rows] == ["mean_lat_write", "num_write", "total_write"]  # what the evaluator wrote
    text = render_html(ReportData(entries=entries, source="test", has_timelines=True))
    section = text[text.index("<section id=contract>"):text.index("<section id=advice>")]
    assert section.count("<tr class=contract-row>") == 9
    # 800 write calls, 62.5 MiB (65,536,000 B), and no latency without a per-call probe (the evaluator's note)
    assert "<td>800 calls</td>" in section and "<td>65,536,000 B (62.5 MiB)</td>" in section
    assert "latency unavailable (static binary, no eBPF)" in section
    assert "0-3.13 s (frame 0)" not in section and "0-0.521 s (frame 0)" in section  # 125 MiB at 240 MiB/s
    assert "procfs" in section and "passed" not in section and "None" not in section


def test_no_contract_says_so() -> None:
    entries = [Entry(f"child {n}", profile("download", n, 240.0), None) for n in range(3)]
    assert "No contract rules were evaluated" in render_html(ReportData(entries, "test", True))


def real_advice(profiles: list[StageProfile]) -> dict[str, object]:
    """What the advisor really produces for these profiles (Advice.to_dict())."""
    plan = Plan(jobs_per_instance=2, memory_gib=16, jobs_per_day=500)
    return advise(profiles, plan).to_dict()


def test_the_recommendation_reads_for_a_person(tmp_path: Path) -> None:
    written = write_run(tmp_path)
    advice = real_advice(written)
    text = render_html(load_run_dir(tmp_path), advice=advice)
    section = text[text.index("<section id=advice>"):]
    assert "None" not in section and "{" not in section
    assert f"cdk deploy {html.escape(str(advice['cdk_args']), quote=True)}" in section
    assert f"<b>Volume: {advice['recommended']}</b>" in section
    assert section.count("<tr class=pick>") == 1 and "USD per month" in section
    assert re.search(r"vm.dirty_bytes = [\d.,]+ [KMG]iB", section)
    prose = re.sub(r"<(pre|code)[^>]*>.*?</\1>", " ", section)  # the commands to copy carry exact bytes
    assert not re.search(r"\d{7,}", re.sub(r"<[^>]+>", " ", prose)), "a raw byte count without a unit"
    findings = advice.get("findings")
    if findings:
        assert section.count("<tr class=finding") == len(findings)  # type: ignore[arg-type]


def test_findings_render_with_codes_costs_and_fix() -> None:
    advice = {"findings": [
        {"code": "LOW_ONE", "severity": "low", "title": "t1", "evidence": "e1", "fix": "f1",
         "cost_s_per_child": None, "cost_usd_per_month": None, "context": {}},
        {"code": "DIRTY_PAUSE", "severity": "high", "title": "Writers paused", "evidence": "paused 3.2 s",
         "fix": "raise the dirty limit", "cost_s_per_child": 3.2, "cost_usd_per_month": 41.5,
         "context": {"dirtyBytes": "1073741824"}},
    ]}
    text = render_html(ReportData([Entry("child 0", profile("upload", 0, 90.0), None)], "t", True), advice=advice)
    section = text[text.index("<section id=advice>"):]
    codes = re.findall(r"data-code='([A-Z_]+)'", section)
    assert codes == ["DIRTY_PAUSE", "LOW_ONE"]  # most severe first
    assert "<td>3.2 s</td><td>$41.5</td>" in section and "not measured" in section
    assert "-c dirtyBytes=1073741824" in section


def test_advice_without_findings_or_with_unknown_fields_still_renders() -> None:
    data = ReportData([Entry("child 0", profile("upload", 0, 90.0), None)], "t", True)
    text = render_html(data, advice={"volume": "gp3", "peak_bytes": 3 * MIB, "why": None})
    section = text[text.index("<section id=advice>"):]
    assert "carries no findings" in section and "3 MiB" in section and "None" not in section
    assert "found nothing to fix" in render_html(data, advice={"findings": []})
    assert "No recommendation was given" in render_html(data)


def test_downsample_keeps_peaks() -> None:
    points = [TimelinePoint(t=float(i), read_bps=float(i % 4), write_bps=0.0, device_write_bps=None,
                            device_queue_depth=None, dirty_bytes=100 if i == 5 else 0, writeback_bytes=0,
                            io_stall_some_ms=None) for i in range(10)]
    small = downsample(points, 3)  # buckets of 4: [0-3] [4-7] [8-9]
    assert [p.t for p in small] == [3.0, 7.0, 9.0]
    assert [p.dirty_bytes for p in small] == [0, 100, 0]
    assert [p.read_bps for p in small] == [3.0, 3.0, 1.0]
    assert small[0].device_write_bps is None
    assert downsample(points, 50) == points


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("1h", 3600), ("2d", 172800),
                                               ("45", 45), (" 1.5H ", 5400)])
def test_parse_since(text: str, seconds: float) -> None:
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "0", "-1h", "1w", "nan"])
def test_parse_since_rejects(text: str) -> None:
    with pytest.raises(ReportInputError, match="is not a duration"):
        parse_since(text)


def test_a_missing_or_empty_run_dir_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ReportInputError, match="does not exist"):
        load_run_dir(tmp_path / "nope")
    with pytest.raises(ReportInputError, match="holds no profiles/"):
        load_run_dir(tmp_path)


# ---- the command -------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_writes_the_report(tmp_path: Path) -> None:
    from tuning.advise import advise
    from tuning.plan import Plan

    profiles = write_run(tmp_path / "run", slow=0)
    advice = tmp_path / "advice.json"  # what `advise --json` writes, with a field the page does not know
    body = advise(profiles, Plan(jobs_per_instance=4, memory_gib=16, jobs_per_day=500)).to_json()
    advice.write_text(json.dumps({**body, "why": "st1 credits ran out"}))
    result = runner.invoke(app, ["report", str(tmp_path / "run"), "--out", str(tmp_path / "r.html"),
                                 "--advice", str(advice)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"report: {tmp_path / 'r.html'}"
    assert "st1 credits ran out" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_cli_bad_input_is_one_line_and_an_exit_code(tmp_path: Path) -> None:
    missing = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert missing.exit_code == 64
    assert missing.output.count("\n") == 1 and missing.output.startswith("error: run directory")

    both = runner.invoke(app, ["report", str(tmp_path), "--from-cloudwatch", "g"])
    assert both.exit_code == 64 and "not both" in both.output

    since = runner.invoke(app, ["report", "--from-cloudwatch", "g", "--since", "soon", "--region", "us-east-1"])
    assert since.exit_code == 64 and "--since 'soon' is not a duration" in since.output

    written = write_run(tmp_path / "run")
    damaged = runfiles.profile_path(tmp_path / "run", "part-00002")
    damaged.write_text(json.dumps(replace(written[0], stage="download").to_dict()) + "\n{oops\n")
    broken = runner.invoke(app, ["report", str(tmp_path / "run")])
    assert broken.exit_code == 65
    assert broken.output.startswith(f"error: {damaged}:2: not a profile")
    assert "Traceback" not in broken.output


def test_timeline_puts_a_childs_stages_on_one_axis() -> None:
    entries = [Entry("child 0", profile(stage, 0, RATES[stage][0]), None) for stage in STAGES]
    fig = timeline_figure("child 0", entries)
    bands = [(round(s.x0, 3), round(s.x1, 3)) for s in fig.layout.shapes]
    starts = [e.profile.started_at - entries[0].profile.started_at for e in entries]
    assert bands == [(round(b, 3), round(b + e.profile.duration_s, 3)) for b, e in zip(starts, entries, strict=True)]
    assert [a.text for a in fig.layout.annotations][-3:] == list(STAGES)
    read = [t for t in fig.data if t.name == "read"]
    assert len(read) == 3 and read[1].x[0] == pytest.approx(starts[1] + entries[1].profile.timeline[0].t, abs=1e-3)
    assert read[0].y[0] == pytest.approx(RATES["download"][0], rel=1e-4)  # MiB/s, from the Throughput spec
    assert [t.showlegend for t in read] == [True, False, False]


def test_every_stage_plot_has_a_plot_function() -> None:
    assert set(PLOTTERS) == {plot_id for plot_id, _, _ in STAGE_PLOTS}
