"""pipeline.submit.status: counting children with ListJobs per status, failed children, following (fakes)."""

from __future__ import annotations

from typing import Any

import botocore.session
import pytest

from pipeline import submit as sub
from pipeline.errors import UsageError
from pipeline.submit.status import job_container
from tests.support.aws import client_error, no_sleep


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
                # A multi-container child as DescribeJobs answers: no job-level container.
                out.append({"jobId": job_id, "status": "FAILED", "ecsProperties": {"taskProperties": [{"containers": [
                    {"name": "profiler", "exitCode": 0, "logStreamName": "p/" + job_id},
                    {"name": "job", "exitCode": 65, "logStreamName": "j/" + job_id}]}]}})
        body = {"jobs": out}
        assert_shape("DescribeJobs", body)
        return body

    def list_jobs(self, arrayJobId: str, jobStatus: str, maxResults: int, nextToken: str | None = None) -> Any:
        self.calls.append(("list_jobs", {"status": jobStatus, "token": nextToken}))
        if self.throttle_every and len(self.calls) % self.throttle_every == 0:
            raise client_error("TooManyRequestsException", 429)
        matching = [(i, s) for i, s in enumerate(self.children[arrayJobId]) if s == jobStatus]
        start = int(nextToken or 0)
        page = matching[start:start + self.page]
        # ListJobs' summaries of multi-container children carry no container (and so no exit code).
        body: dict[str, Any] = {"jobSummaryList": [
            {"jobId": f"{arrayJobId}:{i}", "status": s, "statusReason": "Essential container in task exited"}
            for i, s in page]}
        if start + self.page < len(matching):
            body["nextToken"] = str(start + self.page)
        assert_shape("ListJobs", body)
        return body


def _check(shape: Any, value: Any, where: str) -> None:
    """`value` uses only names botocore's model of the Batch API has at this place."""
    if shape.type_name == "structure":
        assert isinstance(value, dict), where
        unknown = set(value) - set(shape.members)
        assert not unknown, f"{where} has {sorted(unknown)}, which Batch does not answer"
        for key, item in value.items():
            _check(shape.members[key], item, f"{where}.{key}")
    elif shape.type_name == "list":
        for item in value:
            _check(shape.member, item, f"{where}[]")


def assert_shape(operation: str, body: dict[str, Any]) -> None:
    """The fake answers in the shape of the real service's answer (botocore's model of AWS Batch)."""
    model = botocore.session.get_session().get_service_model("batch")
    _check(model.operation_model(operation).output_shape, body, operation)


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


def test_watch_exit_code_follows_the_batch_rule() -> None:
    def status(*codes: int | None) -> sub.BatchStatus:
        failed = tuple(sub.FailedChild(f"j:{i}", i, "Essential container in task exited", code, None)
                       for i, code in enumerate(codes))
        job = sub.JobProgress("j", "iobatch-x", "FAILED", 10, 0, 10, 1, {"FAILED": len(codes),
                                                                         "SUCCEEDED": 10 - len(codes)})
        return sub.BatchStatus((job,), failed)

    assert status(75, 65, None).exit_code == 65  # bad input: a rerun cannot complete the batch
    assert status(75, 64).exit_code == 65  # a bad variable: the stack's settings, the same on every rerun
    assert status(75, None).exit_code == 75  # retries ran out, or Batch's hard timeout (no exit code)
    assert status(137, 1).exit_code == 75  # killed, or a bug: no marker, a rerun redoes it
    assert status().exit_code == 0


def test_follow_describes_every_failed_child_at_the_end() -> None:
    """The batch's exit code needs every failed child's, not the first 100 a poll describes."""
    codes = [75] * 120 + [65]
    batch = FakeBatch({"a": _parent("a", len(codes), 0, 1, len(codes))}, {"a": ["FAILED"] * len(codes)}, page=1000)
    real_describe = batch.describe_jobs

    def describe_jobs(jobs: list[str]) -> Any:  # child i's job container exited codes[i]
        answer = real_describe(jobs)
        for job in answer["jobs"]:
            for container in job.get("ecsProperties", {}).get("taskProperties", [{}])[0].get("containers", []):
                if container["name"] == "job":
                    container["exitCode"] = codes[int(job["jobId"].split(":")[1])]
        return answer

    batch.describe_jobs = describe_jobs  # type: ignore[method-assign]
    shown: list[sub.BatchStatus] = []
    final = sub.follow(batch, ["a"], interval_s=0, show=shown.append, sleep=lambda _: None, backoff=no_sleep())
    assert len(shown[-1].failed) == 100 and len(final.failed) == 121
    assert final.exit_code == 65


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

    final = sub.follow(batch, ["a"], interval_s=7, show=emit, sleep=sleeps.append, backoff=no_sleep())
    assert final.finished and seen == [1, 2] and sleeps == [7]


def test_progress_view_tracks_finished_children() -> None:
    batch = FakeBatch({"a": _parent("a", 4, 0, 2, 7)}, {"a": ["SUCCEEDED", "FAILED", "RUNNING", "RUNNABLE"]})
    state = sub.poll_status(batch, ["a"], backoff=no_sleep())
    bar, update = sub.progress_view(0)
    update(state)
    task = bar.tasks[0]
    assert (task.total, task.completed) == (4, 2)
    assert "running 1 runnable 1 pending 0 failed 1 | images 2/7" in task.description


def test_a_failed_multi_container_child_shows_the_job_containers_exit_code_reason_and_log() -> None:
    """ListJobs gives a multi-container child no container; the described job's job container is read
    (from the job, else from its last attempt), never the profiler's."""
    described = {"jobId": "a:0", "status": "FAILED", "statusReason": "Essential container in task exited",
                 "ecsProperties": {"taskProperties": [{"containers": [
                     {"name": "profiler", "exitCode": 0, "reason": "", "logStreamName": "profiler/x"},
                     {"name": "job", "exitCode": 75, "reason": "", "logStreamName": "job/x"}]}]}}
    from_attempt = {"jobId": "a:1", "status": "FAILED", "attempts": [{"taskProperties": [{"containers": [
        {"name": "job", "exitCode": 65, "reason": "OutOfMemoryError: killed", "logStreamName": "job/y"}]}]}]}
    assert_shape("DescribeJobs", {"jobs": [described, from_attempt]})
    assert job_container(described)["exitCode"] == 75
    assert job_container(from_attempt)["logStreamName"] == "job/y"

    class Described(FakeBatch):
        def describe_jobs(self, jobs: list[str]) -> Any:
            if jobs == ["a"]:
                return super().describe_jobs(jobs)
            return {"jobs": [described, from_attempt]}

    batch = Described({"a": _parent("a", 2, 0, 1, 2)}, {"a": ["FAILED", "FAILED"]})
    state = sub.poll_status(batch, ["a"], backoff=no_sleep())
    assert [(f.index, f.exit_code, f.log_stream) for f in state.failed] == [(0, 75, "job/x"), (1, 65, "job/y")]
    assert state.lines()[1] == ("failed child 0 (a:0): exit 75: Essential container in task exited; "
                                "log stream job/x")


class SummarizingBatch(FakeBatch):
    """Batch as it answers for a large array: the parent's statusSummary, running children's start times."""

    def describe_jobs(self, jobs: list[str]) -> Any:
        answer = super().describe_jobs(jobs)
        for job in answer["jobs"]:
            if job["jobId"] in self.children:
                job["arrayProperties"]["statusSummary"] = {
                    s: self.children[job["jobId"]].count(s) for s in sub.STATUSES}
        assert_shape("DescribeJobs", answer)
        return answer

    def list_jobs(self, arrayJobId: str, jobStatus: str, maxResults: int, nextToken: str | None = None) -> Any:
        page = super().list_jobs(arrayJobId, jobStatus, maxResults, nextToken)
        page["jobSummaryList"] = page["jobSummaryList"][:maxResults]
        if jobStatus == "RUNNING":
            for summary in page["jobSummaryList"]:
                summary["startedAt"] = 1_000_000 + int(summary["jobId"].split(":")[1])
        assert_shape("ListJobs", page)
        return page


def test_a_20000_child_poll_makes_a_few_calls_and_prints_a_summary() -> None:
    statuses = (["SUCCEEDED"] * 12_000 + ["RUNNING"] * 3_000 + ["RUNNABLE"] * 4_000 + ["FAILED"] * 1_000)
    statuses[15_000:15_010] = ["RUNNING"] * 10
    children = {"a": statuses[:10_000], "b": statuses[10_000:]}
    parents = {"a": _parent("a", 10_000, 0, 50, 500_000), "b": _parent("b", 10_000, 10_000, 50, 500_000)}
    batch = SummarizingBatch(parents, children, page=1000)
    state = sub.poll_status(batch, ["a", "b"], backoff=no_sleep())
    assert state.summary() == {"pending": 0, "runnable": 3_990, "starting": 0, "running": 3_010,
                               "succeeded": 12_000, "failed": 1_000}
    # the parents, one page of running children each, 100 failed children listed and described
    assert len(batch.calls) <= 6, batch.calls
    assert len(state.failed) == 100
    lines = state.lines()
    assert len(lines) <= 14
    assert lines[-2] == ("failed by exit code, of 100 described: exit 65 (Essential container in task exited): "
                         "100")
    # b (offset 10,000) runs its children 2,000-5,009; the fake starts them in index order
    assert lines[-1].startswith("slowest running: child 12000 for ")
    assert [r.index for r in state.slowest] == [12_000, 12_001, 12_002, 12_003, 12_004]


def test_children_runnable_too_long_with_none_started_are_named_once() -> None:
    minute = 60_000

    def status(waited_min: int, **counts: int) -> sub.BatchStatus:
        job = sub.JobProgress("j", "iobatch-x", "PENDING", 20_000, 0, 20_000, 1, counts, created_ms=1_000_000)
        return sub.BatchStatus((job,), (), (), 1_000_000 + waited_min * minute)

    stuck = status(20, RUNNABLE=20_000)
    warnings = [line for line in stuck.lines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "20000 children RUNNABLE for 20 min" in warnings[0], stuck.lines()
    assert "host-setup alarm" in warnings[0] and stuck.to_json()["stuckRunnable"] == warnings[0][9:]
    assert status(10, RUNNABLE=20_000).stuck_runnable() is None  # not yet past the 15 minutes
    assert status(60, RUNNABLE=19_999, RUNNING=1).stuck_runnable() is None  # a host is working
    assert status(60, RUNNABLE=19_000, SUCCEEDED=1_000).stuck_runnable() is None
