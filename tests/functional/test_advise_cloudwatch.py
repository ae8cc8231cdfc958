"""`iobatch advise --stack` and `--from-cloudwatch`, and `report --stack`, against moto (CloudFormation, Logs, Batch).

The stack is a CloudFormation stack on moto whose outputs are the ones the deployed stack emits, its DeployContext
written by the one owner (infra.settings.StackSettings.published_context). The documents are the sidecar's own EMF
(profiling.emf through aws-embedded-metrics), shipped one log stream per child as the awslogs driver writes them; the
same documents are written as a local run's EMF files, and the advice from either is the same.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest

import profiling.report
from infra.settings import StackSettings
from pipeline.cli import app
from pipeline.interface import STACK_OUTPUT_KEYS
from profiling import emf
from profiling.metrics import StageProfile
from tests.support.cli import CliRunner, without_provenance
from tests.support.profiles import PROPS, child
from tuning.deployed import make_deploy
from tuning.plan import back_to_back

pytestmark = pytest.mark.untimed  # runs beside the guest's boots (tests/conftest.py)

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install 'moto[server]')")

STACK = "iobatch-advise"
OLD_STACK = "iobatch-old"
GROUP = "/aws/batch/iobatch-advise"
CHILDREN = 8
JOB = "0a1b2c3d-0000-4000-8000-00000000000a"
OTHER_JOB = "0a1b2c3d-0000-4000-8000-00000000000b"
# What the stack was deployed with: not its defaults, so the plan is seen to come from it.
CONTEXT = {"instanceTypes": '["m6i.2xlarge","r6i.2xlarge"]', "volumeType": "gp3", "volumeSizeGiB": "300",
           "dirtyRatio": "10", "dirtyBackgroundRatio": "5", "pipelineName": "iobatch-advise"}
runner = CliRunner()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{server._port}"
    finally:
        server.stop()


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh moto account, every client of this process pointed at it (the variables restored after)."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": moto_url, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_LOGS"):
        monkeypatch.delenv(name, raising=False)
    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", data=b"", method="POST"),
                           timeout=10).read()
    return moto_url


def deploy_stack(name: str, settings: StackSettings | None, log_group: str = GROUP) -> None:
    """A stack on moto with the deployed stack's outputs (DeployContext from `settings`; none when None)."""
    values = {"InputBucketName": "in", "OutputBucketName": "out", "JobQueueArn": "arn:queue",
              "JobDefinitionArn": "arn:definition", "LogGroupName": log_group, "PipelineName": name,
              "DashboardName": name, "VolumeType": "st1", "InputPrefix": "images/", "OutputPrefix": "shards/"}
    if settings is not None:
        values["DeployContext"] = json.dumps(settings.published_context(), separators=(",", ":"))
    assert set(values) <= set(STACK_OUTPUT_KEYS.values())
    template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                "Outputs": {key: {"Value": value} for key, value in values.items()}}
    boto3.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


def batch_profiles(job: str, children: int, started: float, first: int = 0) -> list[list[StageProfile]]:
    """Each child's download, process and upload from `started` on, as the sidecar profiles them."""
    out = []
    for i in range(first, first + children):
        props = {**PROPS, "Pipeline": "iobatch-advise", "JobId": f"{job}:{i}", "ArrayIndex": str(i),
                 "InstanceId": f"i-{i // 4:04x}", "InstanceType": "m6i.2xlarge", "VolumeType": "gp3"}
        start = started + 20 * (i - first)
        out.append([replace(p, started_at=start + p.started_at, properties=props)
                    for p in child(i, download_s=1.5 + 0.1 * i)])
    return out


def documents(profiles: list[StageProfile]) -> list[str]:
    return [doc for p in profiles for doc in emf.serialize(p)]


def ship(log_group: str, children: list[list[StageProfile]], create: bool = True) -> None:
    """Each child's documents to a log stream of its own, as the awslogs driver ships them."""
    logs = boto3.client("logs")
    if create:
        logs.create_log_group(logGroupName=log_group)
    for stages in children:
        stream = f"iobatch/profiler/{stages[0].properties['JobId'].replace(':', '-')}"
        logs.create_log_stream(logGroupName=log_group, logStreamName=stream)
        events = sorted((json.loads(doc)["_aws"]["Timestamp"], doc) for doc in documents(stages))
        logs.put_log_events(logGroupName=log_group, logStreamName=stream,
                            logEvents=[{"timestamp": t, "message": m} for t, m in events])


def run_dir(tmp_path: Path, children: list[list[StageProfile]]) -> Path:
    """The same documents as a local run keeps them: one EMF file per child."""
    folder = tmp_path / "run"
    (folder / "emf").mkdir(parents=True)
    for n, stages in enumerate(children):
        (folder / "emf" / f"child-{n:05d}.emf").write_text("\n".join(documents(stages)) + "\n", encoding="utf-8")
    return folder


def advise_json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["advise", *args, "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def test_advise_stack_reads_the_plan_it_was_deployed_with_and_equals_the_run_dirs(aws: str, tmp_path: Path) -> None:
    children = batch_profiles(JOB, CHILDREN, time.time() - 600)
    deploy_stack(STACK, StackSettings.from_context(CONTEXT))
    ship(GROUP, children)
    body = advise_json("--stack", STACK)
    # The plan: the stack's type the documents ran on, four 2-vCPU children on it, its gp3 300 GiB and its ratios
    # judged, its children back to back all day.
    per_day, child_s = back_to_back([p for c in children for p in c], 4)
    plan = body["plan"]
    assert (plan["instance_type"], plan["jobs_per_instance"], plan["memory_gib"], plan["job_memory_gib"],
            plan["jobs_per_day"]) == ("m6i.2xlarge", 4, 32.0, 6.75, per_day)
    assert plan["assumed"] == (f"stack {STACK}: vcpusPerJob 2, m6i.2xlarge, the stack's type most documents ran on "
                               f"({CHILDREN * 3}), scratch gp3 300 GiB 3000 IOPS 125 MiB/s, its host tuning, jobs per "
                               f"day: the batch's children back to back all day at {child_s:,.1f} s each")
    assert body["source"].startswith(f"log group {GROUP}: {CHILDREN * 3} stage documents from the last 1h")
    findings = {f["code"] for f in body["findings"]}
    # The same documents as a run directory's files, given the same plan by flags: the same advice.
    local = advise_json(str(run_dir(tmp_path, children)), "--instance-type", "m6i.2xlarge", "--jobs-per-day",
                        str(per_day), "--volume", "gp3:300")
    assert local["plan"]["assumed"] == ""
    # The local run cannot say the hosts' ratios: only the findings that judge them may differ.
    assert {k: v for k, v in without_provenance(body).items() if k != "findings"} == \
        {k: v for k, v in without_provenance(local).items() if k != "findings"}
    assert findings >= {f["code"] for f in local["findings"]} - {"dirty-ratio-greedy"}
    # The deploy that applies it: every key the stack was deployed with, the advice's in place.
    context = body["deploy_context"]
    assert context["pipelineName"] == "iobatch-advise"
    assert json.loads(context["instanceTypes"]) == json.loads(CONTEXT["instanceTypes"])  # the stack's types stay
    assert {k: context[k] for k in body["cdk_context"] if k not in ("instanceTypes", "childrenPerHost")} == \
        {k: v for k, v in body["cdk_context"].items() if k not in ("instanceTypes", "childrenPerHost")}
    assert "dirtyRatio" in context and context["dirtyRatio"] == "none"  # the advice's bytes form, not the stack's 10
    assert body["make_deploy"] == make_deploy(context)
    deployed = StackSettings.from_context(context)  # a context the stack takes, the advised volume in it
    assert (deployed.volume.kind, deployed.volume.size_gib) == next(
        (c["type"], c["size_gib"]) for c in body["candidates"] if c["volume"] == body["recommended"])
    text = runner.invoke(app, ["advise", "--stack", STACK]).stdout
    assert f"(stack {STACK}: vcpusPerJob 2, m6i.2xlarge" in text
    assert text.rstrip().endswith(body["make_deploy"])


def test_a_flag_overrides_the_stacks_value_and_the_advice_says_so(aws: str) -> None:
    children = batch_profiles(JOB, CHILDREN, time.time() - 600)
    deploy_stack(STACK, StackSettings.from_context(CONTEXT))
    ship(GROUP, children)
    body = advise_json("--stack", STACK, "--instance-type", "r6i.2xlarge", "--volume", "st1:500",
                       "--jobs-per-day", "100")
    plan = body["plan"]
    assert (plan["instance_type"], plan["memory_gib"], plan["jobs_per_day"]) == ("r6i.2xlarge", 64.0, 100)
    assert plan["assumed"] == (f"stack {STACK}: vcpusPerJob 2, its host tuning; given over the stack's: "
                               "--instance-type, --jobs-per-day, --volume")
    # The type came from a flag: the deploy narrows the stack's types to it.
    assert body["deploy_context"]["instanceTypes"] == "r6i.2xlarge"


def test_job_id_reads_only_that_batch_over_the_time_batch_says_it_ran(aws: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{aws}/moto-api/config", data=json.dumps(
        {"batch": {"use_docker": False}}).encode(), method="POST"), timeout=10).read()
    batch = boto3.client("batch")
    role = boto3.client("iam").create_role(RoleName="batch", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    env = batch.create_compute_environment(computeEnvironmentName="iobatch-ce", type="UNMANAGED", state="ENABLED",
                                           serviceRole=role)["computeEnvironmentArn"]
    queue = batch.create_job_queue(jobQueueName="iobatch-queue", state="ENABLED", priority=1,
                                   computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env}])["jobQueueArn"]
    definition = batch.register_job_definition(jobDefinitionName="iobatch-job", type="container", containerProperties={
        "image": "iobatch", "vcpus": 1, "memory": 512, "command": ["true"]})["jobDefinitionArn"]
    job = batch.submit_job(jobName="batch", jobQueue=queue, jobDefinition=definition)["jobId"]
    # Its children ran as Batch ran it (within the margin its window is read with); another batch a quarter of an
    # hour earlier.
    deploy_stack(STACK, StackSettings.from_context(CONTEXT))
    ship(GROUP, batch_profiles(job, 3, time.time() - 100))
    ship(GROUP, batch_profiles(OTHER_JOB, 5, time.time() - 900, first=3), create=False)
    assert advise_json("--stack", STACK, "--jobs-per-day", "100")["workload"]["children_profiled"] == 8
    body = advise_json("--stack", STACK, "--job-id", job, "--jobs-per-day", "100")
    assert body["workload"]["children_profiled"] == 3
    assert body["source"].startswith(f"log group {GROUP}: 9 stage documents from the run of job {job} (")
    unknown = runner.invoke(app, ["advise", "--stack", STACK, "--job-id", OTHER_JOB])
    assert unknown.exit_code == 64
    assert unknown.output.startswith(f"error: --job-id {OTHER_JOB} is not a job AWS Batch knows")


def test_from_cloudwatch_gives_the_advice_of_the_files_the_documents_came_from(aws: str, tmp_path: Path) -> None:
    children = batch_profiles(JOB, CHILDREN, time.time() - 600)
    ship(GROUP, children)
    plan = ["--instance-type", "m6i.2xlarge", "--jobs-per-day", "900"]
    cloud = advise_json("--from-cloudwatch", GROUP, "--logs-endpoint", aws, *plan)
    emf_files = sorted(str(p) for p in (run_dir(tmp_path, children) / "emf").glob("*.emf"))
    assert without_provenance(cloud) == without_provenance(advise_json(*emf_files, *plan))
    text = runner.invoke(app, ["advise", "--from-cloudwatch", GROUP, *plan]).stdout
    assert "CDK context:\n  cdk deploy -c " in text  # no stack: the advice's keys alone


def test_report_stack_finds_its_log_group(aws: str, tmp_path: Path) -> None:
    deploy_stack(STACK, StackSettings.from_context(CONTEXT))
    ship(GROUP, batch_profiles(JOB, 3, time.time() - 600))
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", "--stack", STACK, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"CloudWatch Logs group {GROUP}: 9 EMF documents from the last 1h" in out.read_text(encoding="utf-8")


def test_a_stack_that_publishes_no_plan_and_one_that_does_not_exist_are_one_line_each(aws: str) -> None:
    deploy_stack(OLD_STACK, None)
    old = runner.invoke(app, ["advise", "--stack", OLD_STACK])
    assert old.exit_code == 64
    assert old.output == (f"error: stack {OLD_STACK} publishes no deployed context (its DeployContext output is "
                          "missing): redeploy it with this version (`make deploy`) or give the plan's flags and a "
                          "run's files instead\n")
    for command in (["advise", "--stack", "nope"], ["report", "--stack", "nope"]):
        missing = runner.invoke(app, command)
        assert missing.exit_code == 64
        assert missing.output.startswith("error: stack nope does not exist in this account and region")


FLEET = 20_000
STREAMS = 40  # children per stream: FLEET / STREAMS, as many hosts' profilers would
UPLOADS = 10  # every tenth child's upload stage is shipped too, so each stage's documents are counted apart


def test_20000_childrens_documents_are_read_in_pages_and_slices_at_once_each_once(
        aws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = boto3.client("logs")
    logs.create_log_group(logGroupName=GROUP)
    now = time.time()
    per_stream = FLEET // STREAMS
    shipped: Counter[tuple[str, str]] = Counter()
    for stream in range(STREAMS):
        events = []
        for i in range(stream * per_stream, (stream + 1) * per_stream):
            download, _, upload = child(i, download_s=1.5 + (i * 7919 % 101) / 100)
            # The batch over 23 minutes of the last hour: more than a page (10,000 events) in one slice of it.
            ended = now - 1700 + i * 0.07
            props = {**PROPS, "JobId": f"{JOB}:{i}", "ArrayIndex": str(i), "InstanceType": "m6i.2xlarge"}
            stages = [replace(download, started_at=ended - download.duration_s, properties=props)]
            if i % UPLOADS == 0:
                stages.append(replace(upload, started_at=ended + 30, properties=props))
            for stage in stages:
                (doc,) = emf.serialize(stage)
                events.append({"timestamp": json.loads(doc)["_aws"]["Timestamp"], "message": doc})
                shipped[(props["JobId"], stage.stage)] += 1
        events.sort(key=lambda e: e["timestamp"])
        name = f"iobatch/profiler/{stream}"
        logs.create_log_stream(logGroupName=GROUP, logStreamName=name)
        for start in range(0, len(events), 250):  # PutLogEvents: at most 1 MiB a call
            logs.put_log_events(logGroupName=GROUP, logStreamName=name, logEvents=events[start:start + 250])
    documents = FLEET + FLEET // UPLOADS
    assert sum(shipped.values()) == documents and set(shipped.values()) == {1}
    lock = threading.Lock()
    flight = {"now": 0, "most": 0, "calls": 0}
    returned: Counter[str] = Counter()  # every event FilterLogEvents gave back, by its eventId

    def sent(**_: Any) -> None:
        with lock:
            flight["now"] += 1
            flight["calls"] += 1
            flight["most"] = max(flight["most"], flight["now"])

    def answered(parsed: dict[str, Any], **_: Any) -> None:
        with lock:
            flight["now"] -= 1
            returned.update(str(event["eventId"]) for event in parsed.get("events", []))

    real = __import__("pipeline.cli.report", fromlist=["_logs_client"])._logs_client

    def counted(region: str | None, endpoint: str | None) -> Any:
        client = real(region, endpoint)
        client.meta.events.register("before-send.cloudwatch-logs.FilterLogEvents", sent)
        client.meta.events.register("after-call.cloudwatch-logs.FilterLogEvents", answered)
        return client

    # What reached the advisor: each stage profile the reader gave out, by child and stage.
    read: Counter[tuple[str, str]] = Counter()
    real_profiles = profiling.report.cloudwatch_profiles

    def recorded(*args: Any, **kwargs: Any) -> Iterator[StageProfile]:
        for profile in real_profiles(*args, **kwargs):
            read[(str(profile.properties.get("JobId")), profile.stage)] += 1
            yield profile

    monkeypatch.setattr("pipeline.cli.report._logs_client", counted)
    monkeypatch.setattr("profiling.report.cloudwatch_profiles", recorded)
    began = time.monotonic()
    body = advise_json("--from-cloudwatch", GROUP, "--instance-type", "m6i.2xlarge", "--jobs-per-day", "500")
    took = time.monotonic() - began
    assert flight["calls"] > 4 and flight["most"] > 1  # paged, and the slices read at once
    # Every event came back once, from one slice's page only: none lost at a slice's edge or read by two slices.
    assert sum(returned.values()) == documents and set(returned.values()) == {1}
    # Every child's documents reached the advisor exactly once per stage: none dropped, doubled or merged away.
    assert read == shipped
    assert body["workload"]["children_profiled"] == FLEET
    assert {s["stage"] for s in body["workload"]["stages"]} == {"download", "upload"}
    assert body["source"] == f"log group {GROUP}: {documents:,} stage documents from the last 1h"
    print(f"advise read {FLEET:,} children's documents in {took:.1f} s ({flight['calls']} FilterLogEvents calls)")
