"""The demo against LocalStack, as a user with LocalStack would run it: the batch's data in LocalStack's S3
(`iobatch demo --s3-endpoint`), the profilers' EMF documents put into LocalStack's CloudWatch Logs as the awslogs
driver ships them, and `iobatch report --from-cloudwatch` and `--compare` with a `cw:` side reading them back with
the same figures as the local run's own report, and `iobatch advise --from-cloudwatch` with the same advice as the
run's own EMF files."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline.cli import app
from profiling import runfiles
from profiling.metrics import METRICS, STAGES, summarize
from profiling.report.cloudwatch import load_cloudwatch
from profiling.report.rundir import load_run_dir
from tests.support.cli import CliRunner, without_provenance
from tests.support.localstack import CREDENTIALS, LocalStack

GROUP = "/aws/batch/iobatch-localstack"
IMAGES, PER_CHILD = 6, 2
CHILDREN = IMAGES // PER_CHILD
runner = CliRunner()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_LOGS", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def demo_run(localstack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo whose S3 is LocalStack's."""
    base = tmp_path_factory.mktemp("demo")
    run = base / "run"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **CREDENTIALS,
           "IOBATCH_CACHE": str(base / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "demo", "--s3-endpoint", localstack.endpoint, "--images", str(IMAGES),
         "--image-mib", "0.25", "--images-per-child", str(PER_CHILD), "--workers", "2", "--run-dir", str(run),
         "--no-report", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return run


@pytest.fixture(scope="module")
def shipped(localstack: LocalStack, demo_run: Path) -> str:
    """The run's EMF files put into LocalStack's CloudWatch Logs, one stream per child, each line stamped with its
    document's own time; returns the run's range as `--compare` takes it."""
    logs = localstack.client("logs")
    logs.create_log_group(logGroupName=GROUP)
    stamps = []
    for path in runfiles.emf_files(demo_run):
        docs = path.read_text(encoding="utf-8").splitlines()
        events = [{"timestamp": json.loads(doc)["_aws"]["Timestamp"], "message": doc} for doc in docs]
        events.append({"timestamp": events[0]["timestamp"], "message": "job: downloaded"})  # not EMF: skipped
        stream = f"iobatch/profiler/{path.stem}"
        logs.create_log_stream(logGroupName=GROUP, logStreamName=stream)
        logs.put_log_events(logGroupName=GROUP, logStreamName=stream,
                            logEvents=sorted(events, key=lambda e: e["timestamp"]))
        stamps += [e["timestamp"] for e in events]
    first = datetime.fromtimestamp(math.floor(min(stamps) / 1000) - 1, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    last = datetime.fromtimestamp(math.ceil(max(stamps) / 1000) + 1, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"cw:{GROUP}@{first}..{last}"


def test_the_demos_data_is_in_localstacks_s3(localstack: LocalStack, demo_run: Path) -> None:
    s3 = localstack.client("s3")
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket="iobatch-output")
            for o in page.get("Contents", [])]
    assert sorted(k for k in keys if k.endswith("/_SUCCESS")) == [
        f"train/part-{n:05d}/_SUCCESS" for n in range(CHILDREN)]
    inputs = s3.list_objects_v2(Bucket="iobatch-input")
    assert inputs["KeyCount"] == IMAGES
    assert not (demo_run / "s3").exists()  # nothing went to the embedded server


def test_report_from_cloudwatch_has_the_local_reports_figures(
        localstack: LocalStack, demo_run: Path, shipped: str, tmp_path: Path) -> None:
    out = tmp_path / "cw.html"
    result = runner.invoke(app, ["report", "--from-cloudwatch", GROUP, "--since", "1d", "--logs-endpoint",
                                 localstack.endpoint, "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    assert f"CloudWatch Logs group {GROUP}: {CHILDREN * len(STAGES)} EMF documents from the last 1d" in page

    local = load_run_dir(demo_run)
    cloud = load_cloudwatch(localstack.client("logs"), GROUP, since_s=86400)
    assert local.stages() == cloud.stages() == list(STAGES)
    assert len(cloud.children()) == CHILDREN
    mine, theirs = summarize([e.profile for e in local.entries]), summarize([e.profile for e in cloud.entries])
    for stage in STAGES:
        for spec in METRICS:
            want = mine[stage][spec.name]
            assert theirs[stage][spec.name] == (None if want is None else pytest.approx(want, rel=1e-9)), (
                stage, spec.name)
        assert theirs[stage]["children"] == CHILDREN
        assert mine[stage]["StageDuration"] and mine[stage]["ReadBytes"]  # a real run's figures, not empty ones


def test_compare_the_local_run_with_its_documents_in_localstack(
        localstack: LocalStack, demo_run: Path, shipped: str, tmp_path: Path) -> None:
    out = tmp_path / "compare.html"
    result = runner.invoke(app, ["report", "--compare", str(demo_run), shipped, "--logs-endpoint",
                                 localstack.endpoint, "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    assert page.count(f"{CHILDREN} and {CHILDREN} children") == len(STAGES)
    ratios = [cells for _, cells in _rows(page)]
    assert ratios and all(r in ("1.00x", "same") for r in ratios), ratios


def test_advise_from_cloudwatch_gives_the_advice_of_the_demos_own_emf_files(
        localstack: LocalStack, demo_run: Path, shipped: str) -> None:
    # A real demo's documents, shipped one stream per child: the tuning loop after a batch reads them back from the
    # log group and advises as it does from the files they came from, given the same plan.
    plan = ["--instance-type", "m6i.2xlarge", "--jobs-per-day", "900", "--json"]
    cloud = runner.invoke(app, ["advise", "--from-cloudwatch", GROUP, "--since", "1d", "--logs-endpoint",
                                localstack.endpoint, *plan])
    assert cloud.exit_code == 0, cloud.output
    local = runner.invoke(app, ["advise", *map(str, runfiles.emf_files(demo_run)), *plan])
    assert local.exit_code == 0, local.output
    body = json.loads(cloud.stdout)
    assert body["workload"]["children_profiled"] == CHILDREN
    assert without_provenance(body) == without_provenance(json.loads(local.stdout))


def _rows(page: str) -> list[tuple[str, str]]:
    """(figure, B / A) of every row of the per-stage comparison tables."""
    import re

    found = []
    for table in re.findall(r"<table class=compare-table data-stage='[^']+'>(.*?)</table>", page, flags=re.S):
        for figure, cells in re.findall(r"<tr data-figure='([^']+)'>(.*?)</tr>", table, flags=re.S):
            found.append((figure, re.findall(r"<td[^>]*>(.*?)</td>", cells)[-1]))
    return found
