"""`iobatch report --from-cloudwatch` and `--compare` with a CloudWatch Logs range: EMF documents read back
from CloudWatch Logs (moto server).

The documents are the sidecar's real EMF (profiling.emf through aws-embedded-metrics), mixed with
the job's ordinary log lines, as the awslogs driver ships them. moto does not extract metrics from
EMF; the report does not need it to: it reads the log lines. The comparison ships a run's own EMF files.
"""

from __future__ import annotations

import json
import math
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest

from pipeline.cli import app
from profiling import emf, runfiles
from profiling.command import profile_command
from profiling.metrics import MIB, STAGES, StageProfile
from profiling.probes.procfs import device_of
from profiling.sidecar import write_profile_line
from tests.support.cli import CliRunner

pytestmark = pytest.mark.untimed  # runs beside the guest's boots (tests/conftest.py)

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install 'moto[server]')")

GROUP = "/aws/batch/iobatch"
SLOW = 2
runner = CliRunner()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def logs_url() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{server._port}"
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_LOGS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")


def stage(stage_name: str, child: int, rate_mib_s: float, ended: float, job: str = "job-7") -> StageProfile:
    duration = 100 / rate_mib_s
    return StageProfile(
        stage=stage_name, outcome="ok", started_at=ended - duration, duration_s=duration,
        read_bytes=100 * MIB, write_bytes=100 * MIB, device_write_latency_ms=3.0, device_queue_depth=1.2,
        peak_dirty_bytes=250 * MIB, dirty_threshold_bytes=2400 * MIB, io_stall_some_ms=20.0,
        properties={"Pipeline": "iobatch", "JobId": f"{job}:{child}", "ArrayIndex": str(child),
                    "InstanceId": f"i-{child:04x}", "InstanceType": "m5.large", "VolumeType": "st1"},
    )


@pytest.fixture(scope="module")
def log_group(logs_url: str) -> str:
    logs = boto3.client("logs", region_name="us-east-1", endpoint_url=logs_url,
                        aws_access_key_id="testing", aws_secret_access_key="testing")
    logs.create_log_group(logGroupName=GROUP)
    now = time.time()
    for child in range(5):
        lines: list[tuple[int, str]] = []
        for n, name in enumerate(STAGES):
            rate = (200.0 + 7 * child) * (0.15 if child == SLOW and name == "download" else 1)
            (doc,) = emf.serialize(stage(name, child, rate, ended=now - 600 + 10 * n))
            lines.append((json.loads(doc)["_aws"]["Timestamp"], doc))
        lines.append((int((now - 590) * 1000), "job: 5 images downloaded"))  # the job's own output
        stream = f"iobatch/profiler/{child}"
        logs.create_log_stream(logGroupName=GROUP, logStreamName=stream)
        logs.put_log_events(logGroupName=GROUP, logStreamName=stream,
                            logEvents=[{"timestamp": t, "message": m} for t, m in sorted(lines)])
    # An earlier batch, three hours ago: outside --since 1h.
    (old,) = emf.serialize(stage("download", 9, 10.0, ended=now - 3 * 3600, job="job-old"))
    logs.create_log_stream(logGroupName=GROUP, logStreamName="iobatch/profiler/old")
    logs.put_log_events(logGroupName=GROUP, logStreamName="iobatch/profiler/old",
                        logEvents=[{"timestamp": json.loads(old)["_aws"]["Timestamp"], "message": old}])
    return GROUP


def test_report_from_cloudwatch(log_group: str, logs_url: str, tmp_path: Path) -> None:
    out = tmp_path / "cw.html"
    result = runner.invoke(app, ["report", "--from-cloudwatch", log_group, "--since", "1h",
                                 "--logs-endpoint", logs_url, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"report: {out}"
    text = out.read_text(encoding="utf-8")
    assert f"CloudWatch Logs group {log_group}: 15 EMF documents from the last 1h" in text
    for name in STAGES:
        assert f"id='stage-{name}'" in text and f'id="plot-{name}-throughput"' in text
    assert "id=no-timelines" in text  # EMF carries no samples
    assert f"<tr class=bad data-stage='download' data-scope='child' data-name='child {SLOW}'>" in text
    assert text.count("<tr class=bad data-stage=") == 1
    assert "child 9" not in text and "job-old" not in text


def test_a_wider_window_takes_the_earlier_batch_in_too(log_group: str, logs_url: str, tmp_path: Path) -> None:
    out = tmp_path / "cw.html"
    result = runner.invoke(app, ["report", "--from-cloudwatch", log_group, "--since", "4h",
                                 "--logs-endpoint", logs_url, "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    assert "16 EMF documents" in text
    assert "job-old[9]" in text and "job-7[2]" in text  # two jobs: children are named by job


def test_unknown_group_and_empty_window_are_usage_errors(log_group: str, logs_url: str) -> None:
    missing = runner.invoke(app, ["report", "--from-cloudwatch", "/no/such/group", "--logs-endpoint", logs_url])
    assert missing.exit_code == 64
    assert missing.output == ("error: log group /no/such/group does not exist in this region: check "
                              "--from-cloudwatch and --region (the stack's output names the group)\n")
    empty = runner.invoke(app, ["report", "--from-cloudwatch", log_group, "--since", "1m",
                                "--logs-endpoint", logs_url])
    assert empty.exit_code == 64
    assert empty.output.startswith(f"error: log group {log_group} has no IoBatch EMF stage documents in the last 1m")


def test_unreachable_endpoint_is_retryable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    result = runner.invoke(app, ["report", "--from-cloudwatch", GROUP, "--logs-endpoint",
                                 f"http://127.0.0.1:{_free_port()}"])
    assert result.exit_code == 75
    assert result.output.startswith("error: CloudWatch Logs endpoint does not answer")
    assert result.output.count("\n") == 1


# ---- --compare with a CloudWatch Logs range -------------------------------------------------------------

COMPARE_GROUP = "/aws/batch/iobatch-compare"


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[StageProfile]]:
    """A local run directory written as the sidecar writes one: each stage of 4 children is a real command
    profiled from the kernel's counters (profiling.command), kept as a profile line and as EMF."""
    run = tmp_path_factory.mktemp("compare") / "run"
    run.mkdir()
    device, _ = device_of(run)
    profiles = []
    for child in range(4):
        name = f"part-{child:05d}"
        for stage_name, mib in (("download", 8), ("process", 2), ("upload", 1)):
            scratch = run / f"{name}-{stage_name}.bin"
            argv = ["dd", "if=/dev/zero", f"of={scratch}", "bs=1M", f"count={mib}", "conv=fsync", "status=none"]
            profile = profile_command(argv, stage=stage_name, device=device, interval_s=0.1, properties={
                "Pipeline": "iobatch", "JobId": f"job-3:{child}", "ArrayIndex": str(child)}).profile
            assert profile.outcome == "ok", profile
            write_profile_line(runfiles.profile_path(run, name), profile)
            emf.emit_profile(profile, emf.sink_for(str(runfiles.emf_path(run, name))))
            scratch.unlink()
            profiles.append(profile)
    return run, profiles


def _put(logs: Any, stream: str, lines: list[tuple[int, str]]) -> None:
    logs.create_log_stream(logGroupName=COMPARE_GROUP, logStreamName=stream)
    logs.put_log_events(logGroupName=COMPARE_GROUP, logStreamName=stream,
                        logEvents=[{"timestamp": t, "message": m} for t, m in sorted(lines)])


@pytest.fixture(scope="module")
def shipped_run(logs_url: str, profiled_run: tuple[Path, list[StageProfile]]) -> str:
    """The run's own EMF files shipped to a log group as the awslogs driver would (each line stamped when it
    was written: the document's own timestamp), beside another batch two hours before and one after it.
    Returns the range of the run, its first start to its last end, as `--compare` takes it."""
    run, profiles = profiled_run
    logs = boto3.client("logs", region_name="us-east-1", endpoint_url=logs_url,
                        aws_access_key_id="testing", aws_secret_access_key="testing")
    logs.create_log_group(logGroupName=COMPARE_GROUP)
    for path in runfiles.emf_files(run):
        docs = path.read_text(encoding="utf-8").splitlines()
        stamped = [(json.loads(doc)["_aws"]["Timestamp"], doc) for doc in docs]
        _put(logs, f"iobatch/profiler/{path.stem}", [*stamped, (stamped[0][0], "job: 8 MiB downloaded")])
    for job, shift in (("job-before", -7200.0), ("job-after", 1800.0)):
        others = [replace(p, started_at=p.started_at + shift, properties={**p.properties, "JobId": f"{job}:0"})
                  for p in profiles[:3]]
        _put(logs, f"iobatch/profiler/{job}", [(json.loads(d)["_aws"]["Timestamp"], d)
                                                for p in others for d in emf.serialize(p)])
    start = math.floor(min(p.started_at for p in profiles))
    end = math.ceil(max(p.started_at + p.duration_s for p in profiles))
    # The start without a zone (UTC), the end in another zone: both forms of the one parser.
    first = datetime.fromtimestamp(start, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    last = datetime.fromtimestamp(end, tz=timezone(timedelta(hours=2))).isoformat()
    return f"cw:{COMPARE_GROUP}@{first}..{last}"


def _figures(page: str) -> dict[tuple[str, str], list[str]]:
    """(stage, figure) -> the cells of its row in the per-stage tables: A, B and B / A."""
    rows: dict[tuple[str, str], list[str]] = {}
    for stage_name, table in re.findall(r"<table class=compare-table data-stage='([^']+)'>(.*?)</table>", page):
        for figure, cells in re.findall(r"<tr data-figure='([^']+)'>(.*?)</tr>", table):
            rows[(stage_name, figure)] = re.findall(r"<td[^>]*>(.*?)</td>", cells)[1:]
    return rows


def test_compare_a_run_with_its_own_documents_in_cloudwatch(
        profiled_run: tuple[Path, list[StageProfile]], shipped_run: str, logs_url: str, tmp_path: Path) -> None:
    run, _ = profiled_run
    pages = {}
    for name, other in (("local", str(run)), ("cloudwatch", shipped_run)):
        out = tmp_path / f"{name}.html"
        # --logs-endpoint only where a side is read from CloudWatch Logs: elsewhere it is refused, not ignored
        endpoint = ["--logs-endpoint", logs_url] if other.startswith("cw:") else []
        result = runner.invoke(app, ["report", "--compare", str(run), other, *endpoint, "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert result.output == f"comparison: {out}\n"
        pages[name] = out.read_text(encoding="utf-8")
    local, cloud = _figures(pages["local"]), _figures(pages["cloudwatch"])
    assert {s for s, _ in local} == set(STAGES)
    assert {"StageDuration", "Throughput", "PeakDirtyBytes", "DirtyThresholdBytes", "IoStallSome"} <= {
        f for _, f in local}
    # The range holds exactly this run's 12 stage documents: the same figures as the run's profiles.
    assert cloud.keys() == local.keys()
    for key, (a, b, ratio) in cloud.items():
        assert b == local[key][1] == a, key
        assert ratio in ("1.00x", "same"), key
    assert f"CloudWatch Logs group {COMPARE_GROUP}: 12 EMF documents from " in pages["cloudwatch"]
    assert "job-before" not in pages["cloudwatch"] and "job-after" not in pages["cloudwatch"]
    assert pages["cloudwatch"].count("4 and 4 children") == len(STAGES)


def test_a_duration_range_and_an_empty_range(shipped_run: str, logs_url: str, tmp_path: Path) -> None:
    # The last 3 hours hold the run and the batch before it, and not the one stamped after now.
    out = tmp_path / "c.html"
    result = runner.invoke(app, ["report", "--compare", shipped_run, f"cw:{COMPARE_GROUP}@3h",
                                 "--logs-endpoint", logs_url, "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    assert "15 EMF documents" in page and "job-before[0]" in page and "job-after" not in page
    assert "No advisor findings for " in page  # a CloudWatch range has none
    day_before = shipped_run.split("@")[0] + "@2001-01-01T00:00..2001-01-02T00:00"
    empty = runner.invoke(app, ["report", "--compare", shipped_run, day_before, "--logs-endpoint", logs_url,
                                "--out", str(out)])
    assert empty.exit_code == 64
    assert empty.output == (f"error: log group {COMPARE_GROUP} has no IoBatch EMF stage documents in 2001-01-01 "
                            f"00:00:00 to 2001-01-02 00:00:00 UTC: widen the range of {day_before}, or check the "
                            "log group and --namespace\n")
