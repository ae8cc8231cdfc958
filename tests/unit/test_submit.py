"""pipeline.submit: validation, planning, request building, back-off and status (pure, fake clients)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError, NoCredentialsError
from hypothesis import given
from hypothesis import strategies as st

from pipeline import submit as sub
from pipeline.errors import EXIT_PERMANENT, EXIT_RETRYABLE, EXIT_USAGE, RetryableError, UsageError
from pipeline.settings import ENV, JobSettings, S3Uri

pytestmark = pytest.mark.unit

JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def client_error(code: str, status: int = 400, message: str = "m") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


def no_sleep() -> sub.Backoff:
    return sub.Backoff(sleep=lambda _s: None, jitter=lambda: 1.0)


# ---- naming and validation -------------------------------------------------------------------------


@pytest.mark.parametrize(("uri", "k", "name"), [
    ("s3://bkt/batches/2026-11-22.jsonl", 5, "2026-11-22-k5"),
    ("s3://bkt/images/cam0/", 10, "images-cam0-k10"),
    ("s3://bkt/", 1, "bkt-k1"),
    ("s3://bkt/weird name+x.json", 2, "weird-name-x-k2"),
])
def test_batch_name_is_stable_and_includes_k(uri: str, k: int, name: str) -> None:
    assert sub.batch_name(S3Uri.parse(uri, what="t"), k) == name


def test_request_defaults_output_to_the_stack_output_bucket() -> None:
    request = sub.SubmitRequest.build(manifest=None, prefix="s3://inb/images", images_per_child=4, output=None,
                                      input_bucket="inb", output_bucket="outb")
    assert request.input == S3Uri("inb", "images/")
    assert request.output == S3Uri("outb", "images-k4/")
    assert request.manifest is None and request.source == request.input


def test_request_with_a_manifest_reads_keys_from_the_input_bucket() -> None:
    request = sub.SubmitRequest.build(manifest="s3://anywhere/bb/x.jsonl", prefix=None, images_per_child=2,
                                      output="s3://outb/p", input_bucket="inb", output_bucket="outb")
    assert request.input == S3Uri("inb", "") and request.output == S3Uri("outb", "p/")
    assert request.manifest == S3Uri("anywhere", "bb/x.jsonl")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"prefix": "s3://inb/i/", "images_per_child": 0}, "--images-per-job is 0: give 1 or more"),
    ({"prefix": "s3://inb/i/", "manifest": "s3://inb/m.jsonl"}, "give exactly one of --manifest"),
    ({}, "give exactly one of --manifest"),
    ({"prefix": "s3://other/i/"}, "--prefix s3://other/i/ is outside the stack's input bucket inb"),
    ({"manifest": "s3://inb/folder/"}, "names a folder"),
    ({"prefix": "s3://inb/", "output": "s3://inb/out/", "input_bucket": None, "output_bucket": None},
     "is inside the input prefix"),
    ({"prefix": "not-a-uri"}, "is not an S3 URI"),
])
def test_request_rejects_bad_flags(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"manifest": None, "prefix": None, "images_per_child": 3, "output": None,
                            "input_bucket": "inb", "output_bucket": "outb", **kwargs}
    with pytest.raises(UsageError) as caught:
        sub.SubmitRequest.build(**args)
    assert message in caught.value.headline and caught.value.exit_code == EXIT_USAGE


def test_request_keeps_to_the_prefixes_the_job_role_may_use() -> None:
    stack: dict[str, Any] = {"input_bucket": "inb", "output_bucket": "outb", "input_prefix": "images/",
                             "output_prefix": "shards/"}
    request = sub.SubmitRequest.build(manifest=None, prefix="s3://inb/images/cam0/", images_per_child=2,
                                      output=None, **stack)
    assert request.output == S3Uri("outb", "shards/images-cam0-k2/")
    with pytest.raises(UsageError, match=r"outside s3://inb/images/, the only prefix the job may read"):
        sub.SubmitRequest.build(manifest=None, prefix="s3://inb/raw/", images_per_child=2, output=None, **stack)
    with pytest.raises(UsageError, match=r"outside s3://outb/shards/, the only place the job may write"):
        sub.SubmitRequest.build(manifest=None, prefix="s3://inb/images/", images_per_child=2,
                                output="s3://outb/elsewhere/", **stack)


def test_stack_outputs_read_the_optional_prefixes() -> None:
    extra = [{"OutputKey": "InputPrefix", "OutputValue": "images/"}, {"OutputKey": "OutputPrefix",
                                                                      "OutputValue": "shards/"}]
    outputs = sub.StackOutputs.from_outputs("s", FULL_OUTPUTS + extra)
    assert (outputs.input_prefix, outputs.output_prefix) == ("images/", "shards/")
    assert sub.StackOutputs.from_outputs("s", FULL_OUTPUTS).output_prefix == ""


def test_local_default_output_inside_a_whole_bucket_input_asks_for_output() -> None:
    with pytest.raises(UsageError, match="give --output elsewhere"):
        sub.SubmitRequest.build(manifest=None, prefix="s3://inb/", images_per_child=1, output=None)


# ---- stack outputs ---------------------------------------------------------------------------------

FULL_OUTPUTS = [{"OutputKey": key, "OutputValue": f"v-{key}"} for key in sub.OUTPUT_KEYS.values()]


def test_stack_outputs_map_every_key() -> None:
    outputs = sub.StackOutputs.from_outputs("s", FULL_OUTPUTS)
    assert outputs.input_bucket == "v-InputBucketName" and outputs.job_definition == "v-JobDefinitionArn"


def test_stack_outputs_name_every_missing_key_in_one_line() -> None:
    partial = [o for o in FULL_OUTPUTS if o["OutputKey"] not in ("JobQueueArn", "VolumeType")]
    with pytest.raises(UsageError) as caught:
        sub.StackOutputs.from_outputs("mine", partial)
    assert caught.value.headline.startswith("stack mine has no output JobQueueArn, VolumeType: deploy")
    assert "\n" not in caught.value.headline


class FakeCfn:
    def __init__(self, answer: Callable[[], Any]) -> None:
        self.answer = answer
        self.calls = 0

    def describe_stacks(self, StackName: str) -> Any:
        self.calls += 1
        return self.answer()


def _raise(exc: Exception) -> Callable[[], Any]:
    def answer() -> Any:
        raise exc
    return answer


@pytest.mark.parametrize(("exc", "code", "message"), [
    (client_error("ValidationError", 400, "Stack with id x does not exist"), EXIT_USAGE, "stack x does not exist"),
    (client_error("ExpiredToken", 403, "The security token included in the request is expired"), EXIT_USAGE,
     "AWS refused the credentials while reading stack x (ExpiredToken): they are expired"),
    (NoCredentialsError(), EXIT_USAGE, "no AWS credentials found while reading stack x"),
    (client_error("AccessDenied", 403, "no"), EXIT_PERMANENT, "AWS answered AccessDenied while reading stack x"),
])
def test_stack_errors_are_one_line(exc: Exception, code: int, message: str) -> None:
    cfn = FakeCfn(_raise(exc))
    with pytest.raises(sub.IobatchError) as caught:
        sub.StackOutputs.from_stack(cfn, "x", no_sleep())
    assert caught.value.exit_code == code and message in caught.value.headline
    assert "\n" not in caught.value.headline and cfn.calls == 1


# ---- job definition --------------------------------------------------------------------------------


class FakeBatchDefs:
    def __init__(self, definitions: list[dict[str, Any]]) -> None:
        self.definitions = definitions

    def describe_job_definitions(self, jobDefinitions: list[str]) -> Any:
        return {"jobDefinitions": self.definitions}


def _ecs(*names: str) -> dict[str, Any]:
    return {"status": "ACTIVE", "ecsProperties": {"taskProperties": [{"containers": [{"name": n} for n in names]}]}}


def test_target_reads_the_containers_of_a_multi_container_definition() -> None:
    target = sub.BatchTarget.resolve(FakeBatchDefs([_ecs("job", "profiler", "log-router")]), "q", "d")
    assert target.containers == ("job", "profiler", "log-router")
    single = sub.BatchTarget.resolve(FakeBatchDefs([{"status": "ACTIVE", "containerProperties": {}}]), "q", "d")
    assert single.containers is None


@pytest.mark.parametrize(("definitions", "message"), [
    ([_ecs("job")], "has no container profiler (has job)"),
    ([], "does not exist or is inactive"),
    ([{**_ecs("job", "profiler"), "status": "INACTIVE"}], "does not exist or is inactive"),
])
def test_target_rejects_a_foreign_definition(definitions: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        sub.BatchTarget.resolve(FakeBatchDefs(definitions), "q", "d")


# ---- planning --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("children", "sizes"), [
    (1, [1]), (2, [2]), (10_000, [10_000]), (10_001, [10_000, 1]), (25_000, [10_000, 10_000, 5_000]),
])
def test_plan_shards_into_arrays_of_at_most_ten_thousand(children: int, sizes: list[int]) -> None:
    plans = sub.plan_array_jobs("b", children=children, images=children * 3, images_per_child=3)
    assert [p.size for p in plans] == sizes
    assert [p.offset for p in plans] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert all(JOB_NAME.match(p.name) for p in plans) and len({p.name for p in plans}) == len(plans)


@given(children=st.integers(1, 60_000), per_child=st.integers(1, 50), short=st.integers(0, 49))
def test_plan_covers_every_child_and_image_once(children: int, per_child: int, short: int) -> None:
    images = max(children * per_child - min(short, per_child - 1), (children - 1) * per_child + 1)
    plans = sub.plan_array_jobs("b", children=children, images=images, images_per_child=per_child)
    assert len(plans) == math.ceil(children / 10_000)
    assert sum(p.size for p in plans) == children and sum(p.images for p in plans) == images
    assert all(1 <= p.size <= 10_000 for p in plans)


def test_plan_of_nothing_is_an_error() -> None:
    with pytest.raises(sub.PermanentError, match="no children"):
        sub.plan_array_jobs("b", children=0, images=0, images_per_child=1)


def _request(force: bool = False) -> sub.SubmitRequest:
    return sub.SubmitRequest.build(manifest=None, prefix="s3://inb/img/", images_per_child=5, output=None,
                                   input_bucket="inb", output_bucket="outb", force=force)


def test_requests_override_both_containers_and_read_back_as_job_settings() -> None:
    target = sub.BatchTarget("queue", "def", ("job", "profiler", "log-router"))
    planned = sub.plan_requests(_request(force=True), target, manifest=S3Uri("outb", "img-k5/_batch/manifest.jsonl"),
                                children=10_003, images=50_012)
    (first_plan, first), (second_plan, second) = planned
    assert first["arrayProperties"] == {"size": 10_000} and second["arrayProperties"] == {"size": 3}
    assert "parameters" not in first and "containerOverrides" not in first
    containers = first["ecsPropertiesOverride"]["taskProperties"][0]["containers"]
    assert [c["name"] for c in containers] == ["job", "profiler"]  # the log router reads no IOBATCH_*
    env = {e["name"]: e["value"] for e in second["ecsPropertiesOverride"]["taskProperties"][0]["containers"][1][
        "environment"]}
    assert env[ENV.ARRAY_OFFSET] == "10000" and env[ENV.FORCE] == "1"
    # What a child of the second array job (index 2) reads back: global child 10,002.
    settings = JobSettings.from_env({**env, ENV.ARRAY_INDEX: "2"})
    assert settings.array_index == 10_002 and settings.force and settings.images_per_child == 5
    assert settings.manifest == S3Uri("outb", "img-k5/_batch/manifest.jsonl")
    assert second["tags"][sub.TAG_IMAGES] == "12" and first_plan.images == 50_000 and second_plan.images == 12


def test_a_single_child_is_a_plain_job_with_container_overrides() -> None:
    (_, only), = sub.plan_requests(_request(), sub.BatchTarget("q", "d", None), manifest=S3Uri("obk", "m"),
                                   children=1, images=4)
    assert "arrayProperties" not in only
    assert {e["name"] for e in only["containerOverrides"]["environment"]} == {
        ENV.INPUT, ENV.OUTPUT, ENV.MANIFEST, ENV.IMAGES_PER_CHILD, ENV.ARRAY_OFFSET, ENV.FORCE}


# ---- back-off --------------------------------------------------------------------------------------


class Flaky:
    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return {"ok": kwargs}


def test_backoff_retries_throttling_and_5xx_with_growing_capped_waits() -> None:
    backoff = no_sleep()
    backoff.cap_s = 1.5
    call = Flaky(client_error("TooManyRequestsException", 429), client_error("ServerException", 500),
                 client_error("TooManyRequestsException", 429), client_error("InternalError", 503))
    assert backoff.call(call, doing="x", a=1) == {"ok": {"a": 1}}
    assert call.calls == 5 and backoff.waits == [0.5, 1.0, 1.5, 1.5]


@pytest.mark.parametrize("code", ["ClientException", "AccessDeniedException", "ValidationException"])
def test_backoff_does_not_retry_other_errors(code: str) -> None:
    call = Flaky(client_error(code, 400))
    with pytest.raises(sub.PermanentError, match=code):
        no_sleep().call(call, doing="x")
    assert call.calls == 1


def test_backoff_gives_up_with_a_retryable_error() -> None:
    call = Flaky(*[client_error("TooManyRequestsException", 429)] * 3)
    backoff = sub.Backoff(attempts=3, sleep=lambda _s: None)
    with pytest.raises(RetryableError) as caught:
        backoff.call(call, doing="listing")
    assert caught.value.exit_code == EXIT_RETRYABLE and call.calls == 3 and len(backoff.waits) == 2


def test_submit_never_retries_a_5xx_which_may_have_created_the_job() -> None:
    class Batch:
        def __init__(self) -> None:
            self.submit_job = Flaky(client_error("TooManyRequestsException", 429), client_error("Server", 500))

    batch = Batch()
    planned = sub.plan_requests(_request(), sub.BatchTarget("q", "d"), manifest=S3Uri("obk", "m"), children=3,
                                images=15)
    with pytest.raises(RetryableError):
        sub.submit_planned(batch, planned, sub.Backoff(retry_server_errors=False, sleep=lambda _s: None))
    assert batch.submit_job.calls == 2  # the throttle was retried, the 500 was not


# ---- status ----------------------------------------------------------------------------------------


class FakeBatch:
    """Children of array jobs with given statuses, served the way Batch pages them."""

    def __init__(self, parents: dict[str, dict[str, Any]], children: dict[str, list[str]], page: int = 2,
                 throttle_every: int = 0) -> None:
        self.parents = parents
        self.children = children
        self.page = page
        self.throttle_every = throttle_every
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def describe_jobs(self, jobs: list[str]) -> Any:
        self.calls.append(("describe_jobs", {"jobs": jobs}))
        assert len(jobs) <= 100
        out = []
        for job_id in jobs:
            if job_id in self.parents:
                out.append(self.parents[job_id])
            elif ":" in job_id:
                out.append({"jobId": job_id, "ecsProperties": {"taskProperties": [{"containers": [
                    {"name": "profiler", "logStreamName": "p/" + job_id},
                    {"name": "job", "logStreamName": "j/" + job_id}]}]}})
        return {"jobs": out}

    def list_jobs(self, arrayJobId: str, jobStatus: str, maxResults: int, nextToken: str | None = None) -> Any:
        self.calls.append(("list_jobs", {"status": jobStatus, "token": nextToken}))
        if self.throttle_every and len(self.calls) % self.throttle_every == 0:
            raise client_error("TooManyRequestsException", 429)
        matching = [(i, s) for i, s in enumerate(self.children[arrayJobId]) if s == jobStatus]
        start = int(nextToken or 0)
        page = matching[start:start + self.page]
        body: dict[str, Any] = {"jobSummaryList": [
            {"jobId": f"{arrayJobId}:{i}", "status": s, "statusReason": "Essential container in task exited",
             "container": {"exitCode": 65}} for i, s in page]}
        if start + self.page < len(matching):
            body["nextToken"] = str(start + self.page)
        return body


def _parent(job_id: str, size: int, offset: int, per_child: int, images: int) -> dict[str, Any]:
    return {"jobId": job_id, "jobName": f"iobatch-{job_id}", "status": "RUNNING", "arrayProperties": {"size": size},
            "tags": {sub.TAG_OFFSET: str(offset), sub.TAG_PER_CHILD: str(per_child), sub.TAG_IMAGES: str(images)}}


def test_status_counts_children_with_list_jobs_per_status_and_pages() -> None:
    statuses = ["SUCCEEDED"] * 5 + ["FAILED"] * 2 + ["RUNNING", "RUNNABLE", "SUBMITTED", "PENDING", "STARTING"]
    batch = FakeBatch({"a": _parent("a", 12, 10_000, 4, 46)}, {"a": statuses}, page=2, throttle_every=4)
    backoff = no_sleep()
    state = sub.poll_status(batch, ["a"], backoff=backoff)

    assert state.summary() == {"pending": 2, "runnable": 1, "starting": 1, "running": 1, "succeeded": 5,
                               "failed": 2}
    assert (state.images_done, state.images, state.finished) == (20, 46, False)
    assert [(f.index, f.exit_code, f.log_stream) for f in state.failed] == [
        (10_005, 65, "j/a:5"), (10_006, 65, "j/a:6")]
    assert backoff.waits  # throttled calls were retried, not fatal
    describes = [c for c in batch.calls if c[0] == "describe_jobs"]
    assert len(describes) == 2  # the parent, then the failed children together: never one per child
    assert state.lines()[1] == ("failed child 10005 (a:5): exit 65: Essential container in task exited; "
                                "log stream j/a:5")


def test_images_done_is_capped_at_the_batch_total() -> None:
    batch = FakeBatch({"a": _parent("a", 3, 0, 4, 10)}, {"a": ["SUCCEEDED"] * 3})
    state = sub.poll_status(batch, ["a"], backoff=no_sleep())
    assert (state.images_done, state.finished) == (10, True)
    assert state.to_json()["imagesDone"] == 10


def test_a_plain_job_counts_as_one_child() -> None:
    plain = {"jobId": "p", "jobName": "iobatch-p", "status": "FAILED", "statusReason": "Timeout",
             "tags": {sub.TAG_OFFSET: "20000", sub.TAG_PER_CHILD: "2", sub.TAG_IMAGES: "1"},
             "container": {"exitCode": 75, "logStreamName": "j/p"}}
    batch = FakeBatch({"p": plain}, {})
    state = sub.poll_status(batch, ["p"], backoff=no_sleep())
    assert state.children == 1 and state.summary()["failed"] == 1
    assert state.failed == (sub.FailedChild("p", 20_000, "Timeout", 75, "j/p"),)
    assert not [c for c in batch.calls if c[0] == "list_jobs"]


def test_unknown_job_id_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no Batch job nope"):
        sub.poll_status(FakeBatch({}, {}), ["nope"], backoff=no_sleep())


def test_follow_polls_until_finished() -> None:
    statuses = ["RUNNING", "SUCCEEDED"]
    batch = FakeBatch({"a": _parent("a", 2, 0, 1, 2)}, {"a": statuses})
    seen: list[int] = []
    sleeps: list[float] = []

    def emit(state: sub.BatchStatus) -> None:
        seen.append(state.count("SUCCEEDED"))
        statuses[0] = "SUCCEEDED"

    final = sub.follow(batch, ["a"], interval_s=7, emit=emit, sleep=sleeps.append, backoff=no_sleep())
    assert final.finished and seen == [1, 2] and sleeps == [7]


def test_check_flags_needs_no_client() -> None:
    with pytest.raises(UsageError, match="give 1 or more"):
        sub.check_flags(manifest=None, prefix="s3://bkt/p/", images_per_child=-1)


def test_progress_view_tracks_finished_children() -> None:
    batch = FakeBatch({"a": _parent("a", 4, 0, 2, 7)}, {"a": ["SUCCEEDED", "FAILED", "RUNNING", "RUNNABLE"]})
    state = sub.poll_status(batch, ["a"], backoff=no_sleep())
    bar, update = sub.progress_view(0)
    update(state)
    task = bar.tasks[0]
    assert (task.total, task.completed) == (4, 2)
    assert "running 1 runnable 1 pending 0 failed 1 | images 2/7" in task.description
