"""`iobatch submit --stack` and `iobatch status` against moto: Batch (simple mode), S3, CloudFormation.

The stack is a real (tiny) CloudFormation stack created on moto: its two buckets are resources and its
outputs carry the keys the deployed stack emits. Batch runs in moto's simple mode, where every child
succeeds at once (or fails at once with MOTO_SIMPLE_BATCH_FAIL_AFTER=0).

Moto differences, tested for what they are:
- moto cannot register a multi-container (ecsProperties) job definition ("containerProperties or
  eksProperties must be provided"), so the stack's job definition here is single-container and the
  submission falls back to containerOverrides, which moto echoes back in DescribeJobs.
- moto accepts ecsPropertiesOverride on SubmitJob but ignores it; the override for both containers is
  checked in the request that reached moto (a botocore event hook), not read back.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

from pipeline import submit as submission
from pipeline.cli import app
from pipeline.errors import EXIT_PERMANENT, EXIT_USAGE
from pipeline.interface import ENV
from pipeline.settings import S3Uri
from tests.support.cli import CliRunner

pytestmark = pytest.mark.untimed  # runs beside the guest's boots (tests/conftest.py)

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install 'moto[server]')")

STACK = "iobatch-test"
PARTIAL_STACK = "not-iobatch"
INPUT_BUCKET = "iobatch-input"
OUTPUT_BUCKET = "iobatch-output"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _post(url: str, body: dict[str, Any] | None = None) -> None:
    data = json.dumps(body).encode() if body is not None else b""
    urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST"), timeout=10).read()


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    url = f"http://127.0.0.1:{server._port}"
    try:
        yield url
    finally:
        server.stop()


@dataclass
class Aws:
    url: str
    queue: str
    job_definition: str

    def client(self, service: str) -> Any:
        return boto3.session.Session().client(service)


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Aws:
    """A fresh moto account: the stack, its buckets, a queue and a job definition."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": moto_url, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "MOTO_SIMPLE_BATCH_FAIL_AFTER"):
        monkeypatch.delenv(name, raising=False)
    _post(f"{moto_url}/moto-api/reset")
    _post(f"{moto_url}/moto-api/config", {"batch": {"use_docker": False}})
    session = boto3.session.Session()
    role = session.client("iam").create_role(RoleName="batch", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    batch = session.client("batch")
    env_arn = batch.create_compute_environment(computeEnvironmentName="iobatch-ce", type="UNMANAGED",
                                               state="ENABLED", serviceRole=role)["computeEnvironmentArn"]
    queue = batch.create_job_queue(jobQueueName="iobatch-queue", state="ENABLED", priority=1,
                                   computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env_arn}])
    definition = batch.register_job_definition(
        jobDefinitionName="iobatch-job", type="container",
        containerProperties={"image": "iobatch", "vcpus": 1, "memory": 512, "command": ["iobatch", "job"]})
    outputs = {"InputBucketName": {"Ref": "Input"}, "OutputBucketName": {"Ref": "Output"},
               "JobQueueArn": queue["jobQueueArn"], "JobDefinitionArn": definition["jobDefinitionArn"],
               "LogGroupName": "/aws/batch/job", "PipelineName": "iobatch", "DashboardName": "iobatch",
               "VolumeType": "st1", "InputPrefix": "images/", "OutputPrefix": "shards/"}
    template = {
        "Resources": {"Input": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": INPUT_BUCKET}},
                      "Output": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": OUTPUT_BUCKET}}},
        "Outputs": {k: {"Value": v} for k, v in outputs.items()},
    }
    cfn = session.client("cloudformation")
    cfn.create_stack(StackName=STACK, TemplateBody=json.dumps(template))
    partial = {"Resources": {"Other": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "other"}}},
               "Outputs": {"InputBucketName": {"Value": {"Ref": "Other"}}}}
    cfn.create_stack(StackName=PARTIAL_STACK, TemplateBody=json.dumps(partial))
    return Aws(moto_url, queue["jobQueueArn"], definition["jobDefinitionArn"])


class CallLog:
    """Every AWS call a session's clients make, by operation, with its parameters (botocore hooks)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.session = boto3.session.Session()
        self.session.events.register("provide-client-params", self._record)

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls.append((model.name, json.loads(json.dumps(params))))

    def count(self) -> Counter[str]:
        return Counter(name for name, _ in self.calls)

    def params(self, operation: str) -> list[dict[str, Any]]:
        return [p for name, p in self.calls if name == operation]


def _put_images(n: int, prefix: str = "images/") -> None:
    s3 = boto3.session.Session().client("s3")
    for i in range(n):
        s3.put_object(Bucket=INPUT_BUCKET, Key=f"{prefix}cam0/{i:06d}.png", Body=b"png%d" % i)


def _put_manifest(lines: list[str], key: str = "batches/2026-11-22.jsonl") -> str:
    boto3.session.Session().client("s3").put_object(Bucket=INPUT_BUCKET, Key=key,
                                                    Body=("\n".join(lines) + "\n").encode())
    return f"s3://{INPUT_BUCKET}/{key}"


def _objects(bucket: str) -> list[str]:
    listing = boto3.session.Session().client("s3").list_objects_v2(Bucket=bucket)
    return [item["Key"] for item in listing.get("Contents", [])]


def _env(job: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in job["container"]["environment"]}


def test_prefix_submits_one_array_job_with_the_batch_in_its_environment(aws: Aws) -> None:
    _put_images(25)
    log = CallLog()
    result = submission.submit_to_stack(stack=STACK, manifest=None, prefix=f"s3://{INPUT_BUCKET}/images/",
                                        images_per_child=4, session=log.session)

    assert (result.images, result.children, len(result.jobs)) == (25, 7, 1)
    assert log.count()["SubmitJob"] == 1
    assert result.request.output == S3Uri(OUTPUT_BUCKET, "shards/images-k4/")
    frozen = boto3.session.Session().client("s3").get_object(Bucket=OUTPUT_BUCKET,
                                                           Key="shards/images-k4/_batch/manifest.jsonl")
    lines = frozen["Body"].read().decode().splitlines()
    assert len(lines) == 25 and json.loads(lines[0])["key"] == "images/cam0/000000.png"

    parent = aws.client("batch").describe_jobs(jobs=[result.jobs[0].job_id])["jobs"][0]
    assert parent["arrayProperties"]["size"] == 7
    assert parent["tags"][submission.TAG_IMAGES] == "25"
    env = _env(parent)
    assert env[ENV.INPUT] == f"s3://{INPUT_BUCKET}/images/"
    assert env[ENV.OUTPUT] == f"s3://{OUTPUT_BUCKET}/shards/images-k4/"
    assert env[ENV.MANIFEST] == f"s3://{OUTPUT_BUCKET}/shards/images-k4/_batch/manifest.jsonl"
    assert (env[ENV.IMAGES_PER_CHILD], env[ENV.ARRAY_OFFSET], env[ENV.FORCE]) == ("4", "0", "0")
    # No key rides in job parameters.
    assert not log.params("SubmitJob")[0].get("parameters")

    state = submission.poll_status(aws.client("batch"), [result.jobs[0].job_id])
    assert state.summary() == {"pending": 0, "runnable": 0, "starting": 0, "running": 0,
                               "succeeded": 7, "failed": 0}
    assert (state.images_done, state.images, state.finished) == (25, 25, True)


def test_more_than_ten_thousand_children_make_one_submit_per_array_job(aws: Aws) -> None:
    manifest = _put_manifest([json.dumps({"key": f"images/{i:06d}.png"}) for i in range(20_001)])
    log = CallLog()
    result = submission.submit_to_stack(stack=STACK, manifest=manifest, prefix=None, images_per_child=2,
                                        session=log.session)

    assert result.children == 10_001
    assert log.count()["SubmitJob"] == 2  # ceil(10,001 / 10,000)
    first, second = log.params("SubmitJob")
    assert first["arrayProperties"] == {"size": 10_000}
    assert "arrayProperties" not in second  # one child left: a plain job (arrays are 2..10,000)
    offsets = [{e["name"]: e["value"] for e in p["containerOverrides"]["environment"]}[ENV.ARRAY_OFFSET]
               for p in (first, second)]
    assert offsets == ["0", "10000"]

    batch = aws.client("batch")
    listed = Counter[str]()
    original = batch.list_jobs

    def counting_list_jobs(**kwargs: Any) -> Any:
        listed[kwargs["jobStatus"]] += 1
        return original(**kwargs)

    batch.list_jobs = counting_list_jobs
    state = submission.poll_status(batch, [j.job_id for j in result.jobs])
    assert (state.children, state.count("SUCCEEDED"), state.images_done) == (10_001, 10_001, 20_001)
    # The counts come from the array parent's statusSummary: no ListJobs while no child failed or runs.
    assert listed == Counter()


def test_failed_children_are_listed_with_their_log_stream(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    _put_images(6)
    monkeypatch.setenv("MOTO_SIMPLE_BATCH_FAIL_AFTER", "0")  # moto's simple mode: every child fails at once
    result = submission.submit_to_stack(stack=STACK, manifest=None, prefix=f"s3://{INPUT_BUCKET}/images/",
                                        images_per_child=2)
    state = submission.poll_status(aws.client("batch"), [result.jobs[0].job_id])

    assert state.summary()["failed"] == 3 and state.images_done == 0 and state.finished
    assert [f.index for f in state.failed] == [0, 1, 2]
    job_id = result.jobs[0].job_id
    assert [f.log_stream for f in state.failed] == [f"iobatch-job/default/{job_id}:{i}" for i in range(3)]
    assert "failed child 1" in state.lines()[2]


def test_status_command_prints_counts_and_json(aws: Aws) -> None:
    _put_images(5)
    runner = CliRunner()
    submitted = runner.invoke(app, ["submit", "--prefix", f"s3://{INPUT_BUCKET}/images/", "-k", "2",
                                    "--stack", STACK, "--json"])
    assert submitted.exit_code == 0, submitted.output
    body = json.loads(submitted.stdout)
    assert (body["children"], body["images"], len(body["jobs"])) == (3, 5, 1)
    assert body["statusCommand"] == f"iobatch status {body['jobs'][0]['jobId']}"

    shown = runner.invoke(app, ["status", body["jobs"][0]["jobId"]])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines()[0] == ("children 3: pending 0 runnable 0 starting 0 running 0 "
                                            "succeeded 3 failed 0; images 5/5 (finished)")
    watched = runner.invoke(app, ["status", body["jobs"][0]["jobId"], "--watch", "--json", "--interval", "0.1"])
    assert watched.exit_code == 0 and json.loads(watched.stdout.splitlines()[-1])["imagesDone"] == 5

    text = runner.invoke(app, ["submit", "--prefix", f"s3://{INPUT_BUCKET}/images/", "-k", "2", "--stack", STACK])
    assert text.exit_code == 0
    assert text.stdout.splitlines()[-1].startswith("follow it with: iobatch status ")


def test_multi_container_override_reaches_both_containers(aws: Aws) -> None:
    """The ecsPropertiesOverride request for both containers (moto accepts it and ignores it)."""
    log = CallLog()
    batch = log.session.client("batch")
    request = submission.SubmitRequest.build(manifest=None, prefix=f"s3://{INPUT_BUCKET}/images/",
                                             images_per_child=3, output=None, input_bucket=INPUT_BUCKET,
                                             output_bucket=OUTPUT_BUCKET, force=True)
    target = submission.BatchTarget(aws.queue, aws.job_definition)  # the multi-container shape
    planned = submission.plan_requests(request, target, manifest=S3Uri(OUTPUT_BUCKET, "m.jsonl"),
                                       children=4, images=12)
    jobs = submission.submit_planned(batch, planned)

    assert len(jobs) == 1 and batch.describe_jobs(jobs=[jobs[0].job_id])["jobs"]
    containers = log.params("SubmitJob")[0]["ecsPropertiesOverride"]["taskProperties"][0]["containers"]
    assert [c["name"] for c in containers] == ["job", "profiler"]
    for container in containers:
        env = {e["name"]: e["value"] for e in container["environment"]}
        assert env[ENV.FORCE] == "1" and env[ENV.IMAGES_PER_CHILD] == "3" and env[ENV.ARRAY_OFFSET] == "0"


def test_submitting_the_same_manifest_twice_targets_the_same_outputs(aws: Aws) -> None:
    manifest = _put_manifest([json.dumps({"key": f"images/{i}.png", "size": 10}) for i in range(9)])
    first = submission.submit_to_stack(stack=STACK, manifest=manifest, prefix=None, images_per_child=3)
    frozen = _objects(OUTPUT_BUCKET)
    second = submission.submit_to_stack(stack=STACK, manifest=manifest, prefix=None, images_per_child=3,
                                        force=True)
    # Same output folder and frozen manifest: the job finds earlier children's _SUCCESS markers there.
    assert first.request.output == second.request.output == S3Uri(OUTPUT_BUCKET,
                                                                                        "shards/2026-11-22-k3/")
    assert _objects(OUTPUT_BUCKET) == frozen == ["shards/2026-11-22-k3/_batch/manifest.idx",
                                                 "shards/2026-11-22-k3/_batch/manifest.jsonl"]
    envs = [_env(aws.client("batch").describe_jobs(jobs=[r.jobs[0].job_id])["jobs"][0]) for r in (first, second)]
    assert [e[ENV.FORCE] for e in envs] == ["0", "1"]


def test_dry_run_validates_and_writes_nothing(aws: Aws) -> None:
    _put_images(4)
    log = CallLog()
    result = submission.submit_to_stack(stack=STACK, manifest=None, prefix=f"s3://{INPUT_BUCKET}/images/",
                                        images_per_child=3, dry_run=True, session=log.session)
    assert (result.children, result.jobs, len(result.requests)) == (2, (), 1)
    assert log.count()["SubmitJob"] == 0 and _objects(OUTPUT_BUCKET) == []


BAD_INPUTS = [
    pytest.param(["--manifest", "LINES:{\"key\": \"images/a.png\"}\n{\"key\": \"images/b.png\"}\nnot json"],
                 EXIT_PERMANENT, "line 3 is not JSON", id="manifest-line-not-json"),
    pytest.param(["--manifest", "LINES:{\"key\": \"images/a.png\"}\n{\"size\": 3}"],
                 EXIT_PERMANENT, "line 2 names no object", id="manifest-line-without-key"),
    pytest.param(["--manifest", "LINES:{\"key\": \"images/a.png\"}\n{\"key\": \"a.png\"}"],
                 EXIT_PERMANENT, "line 2: key a.png is outside the input prefix images/",
                 id="key-outside-input-prefix"),
    pytest.param(["--manifest", "LINES:{\"uri\": \"s3://elsewhere/a.png\"}"],
                 EXIT_PERMANENT, "outside the input bucket iobatch-input", id="key-outside-input-bucket"),
    pytest.param(["--prefix", "s3://elsewhere/images/"], EXIT_USAGE,
                 "outside the stack's input bucket iobatch-input", id="prefix-outside-input-bucket"),
    pytest.param(["--prefix", f"s3://{INPUT_BUCKET}/other/"], EXIT_USAGE,
                 "is outside s3://iobatch-input/images/, the only prefix the job may read", id="outside-input-prefix"),
    pytest.param(["--prefix", f"s3://{INPUT_BUCKET}/images/", "--output", f"s3://{OUTPUT_BUCKET}/mine/"],
                 EXIT_USAGE, "is outside s3://iobatch-output/shards/, the only place the job may write",
                 id="output-outside-output-prefix"),
    pytest.param(["--prefix", f"s3://{INPUT_BUCKET}/images/nothing-here/"], EXIT_PERMANENT,
                 "holds no images", id="empty-prefix"),
    pytest.param(["--prefix", f"s3://{INPUT_BUCKET}/images/", "-k", "0"], EXIT_USAGE,
                 "'--images-per-job' / '-k': 0 is not in the range 1<=x<=", id="k-below-one"),
    pytest.param(["--prefix", f"s3://{INPUT_BUCKET}/images/", "--stack", PARTIAL_STACK], EXIT_USAGE,
                 "stack not-iobatch has no output OutputBucketName, JobQueueArn, JobDefinitionArn, "
                 "LogGroupName, PipelineName, DashboardName, VolumeType", id="stack-without-outputs"),
    pytest.param(["--prefix", f"s3://{INPUT_BUCKET}/images/", "--stack", "nope"], EXIT_USAGE,
                 "stack nope does not exist", id="stack-missing"),
]


@pytest.mark.parametrize(("args", "code", "message"), BAD_INPUTS)
def test_bad_input_submits_nothing(aws: Aws, args: list[str], code: int, message: str) -> None:
    _put_images(2)
    if args[0] == "--manifest":
        args = ["--manifest", _put_manifest(args[1].removeprefix("LINES:").split("\n"))]
    if "-k" not in args:
        args += ["-k", "2"]
    if "--stack" not in args:
        args += ["--stack", STACK]
    result = CliRunner().invoke(app, ["submit", *args])

    assert result.exit_code == code, result.output
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert aws.client("batch").list_jobs(jobQueue=aws.queue)["jobSummaryList"] == []
    assert _objects(OUTPUT_BUCKET) == []


def test_missing_credentials_is_one_line(aws: Aws, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    result = CliRunner().invoke(app, ["submit", "--prefix", f"s3://{INPUT_BUCKET}/images/", "-k", "2",
                                      "--stack", STACK])
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("error: no AWS credentials found") and result.stderr.count("\n") == 1
