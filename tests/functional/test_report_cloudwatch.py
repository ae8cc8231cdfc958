"""`iobatch report --from-cloudwatch`: EMF documents read back from CloudWatch Logs (moto server).

The documents are the sidecar's real EMF (profiling.emf through aws-embedded-metrics), mixed with
the job's ordinary log lines, as the awslogs driver ships them. moto does not extract metrics from
EMF; the report does not need it to: it reads the log lines.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from profiling import emf
from profiling.metrics import MIB, STAGES, StageProfile

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
