"""`iobatch status` ranks the batch's hosts by their scratch's qualification (pipeline/submit/hosts.py): the events
the hosts posted to the job definition's log group, read with FilterLogEvents (fakes in the shape of botocore's
models of Batch and CloudWatch Logs)."""

from __future__ import annotations

import json
from typing import Any

import botocore.session

from pipeline import submit as sub
from pipeline.aws import Backoff
from pipeline.submit.hosts import log_group_of
from tests.support.aws import client_error, no_sleep
from tuning.hostqualify import EVENT_PREFIX

GROUP = "/aws/batch/iobatch-jobs"
PARENT = {"jobId": "job-1", "jobName": "iobatch-job-1", "status": "RUNNING", "createdAt": 1_700_000_000_000,
          "arrayProperties": {"size": 3, "statusSummary": {"RUNNING": 3}},
          "ecsProperties": {"taskProperties": [{"containers": [
              {"name": "profiler", "logConfiguration": {"logDriver": "awslogs", "options": {"awslogs-group": "x"}}},
              {"name": "job", "logConfiguration": {"logDriver": "awslogs", "options": {"awslogs-group": GROUP}}}]}]}}


def event(instance: str, verdict: str, ratio: float, mibps: float) -> dict[str, Any]:
    body = {"Pipeline": "iobatch", "InstanceId": instance, "InstanceType": "m6i.2xlarge", "HostQualification": verdict,
            "QualifiedMiBps": f"{mibps:.1f}", "QualifiedExpectedMiBps": "122.1", "QualifiedRatio": f"{ratio:.3f}"}
    return {"logStreamName": EVENT_PREFIX + instance, "timestamp": 1_700_000_100_000, "message": json.dumps(body)}


class FakeBatch:
    def describe_jobs(self, jobs: list[str]) -> Any:
        body = {"jobs": [PARENT]}
        check("batch", "DescribeJobs", body)
        return body

    def list_jobs(self, **kwargs: Any) -> Any:
        return {"jobSummaryList": []}


class FakeLogs:
    def __init__(self, pages: list[list[dict[str, Any]]], fail: bool = False) -> None:
        self.pages, self.fail, self.calls = pages, fail, []  # type: ignore[var-annotated]

    def filter_log_events(self, **kwargs: Any) -> Any:
        model = botocore.session.get_session().get_service_model("logs").operation_model("FilterLogEvents")
        assert set(kwargs) <= set(model.input_shape.members), kwargs
        self.calls.append(kwargs)
        if self.fail:
            raise client_error("AccessDeniedException", 400)
        n = int(kwargs.get("nextToken") or 0)
        body: dict[str, Any] = {"events": self.pages[n]}
        if n + 1 < len(self.pages):
            body["nextToken"] = str(n + 1)
        check("logs", "FilterLogEvents", body)
        return body


def check(service: str, operation: str, body: dict[str, Any]) -> None:
    """`body` uses only names botocore's model of the service answers at each place."""
    def walk(shape: Any, value: Any, where: str) -> None:
        if shape.type_name == "structure":
            assert not set(value) - set(shape.members), f"{where}: {sorted(set(value) - set(shape.members))}"
            for key, item in value.items():
                walk(shape.members[key], item, f"{where}.{key}")
        elif shape.type_name == "list":
            for item in value:
                walk(shape.member, item, f"{where}[]")

    walk(botocore.session.get_session().get_service_model(service).operation_model(operation).output_shape, body,
         operation)


def test_status_names_the_slow_host_first_from_the_job_definitions_log_group() -> None:
    logs = FakeLogs([[event("i-00000000000000001", "qualified", 1.01, 123.0),
                      event("i-00000000000000002", "slow", 0.034, 4.1)],
                     [event("i-00000000000000003", "qualified", 0.97, 118.0),
                      {"logStreamName": EVENT_PREFIX + "x", "timestamp": 1, "message": "not json"}]])
    status = sub.poll_status(FakeBatch(), ["job-1"], backoff=Backoff(sleep=no_sleep), logs_client=logs)
    assert [h.instance_id for h in status.hosts] == ["i-00000000000000002", "i-00000000000000003",
                                                     "i-00000000000000001"]
    assert logs.calls[0] == {"logGroupName": GROUP, "logStreamNamePrefix": EVENT_PREFIX,
                             "startTime": PARENT["createdAt"]}
    assert status.lines()[-1] == ("hosts by qualification (3, 1 slow): i-00000000000000002 0.03x slow (4.1 of 122.1 "
                                  "MiB/s), i-00000000000000003 0.97x qualified (118.0 of 122.1 MiB/s), "
                                  "i-00000000000000001 1.01x qualified (123.0 of 122.1 MiB/s)")
    assert status.to_json()["hosts"][0]["verdict"] == "slow"


def test_status_without_logs_or_with_logs_refused_still_counts() -> None:
    assert sub.poll_status(FakeBatch(), ["job-1"], backoff=Backoff(sleep=no_sleep)).hosts == ()
    refused = sub.poll_status(FakeBatch(), ["job-1"], backoff=Backoff(sleep=no_sleep),
                              logs_client=FakeLogs([[]], fail=True))
    assert refused.hosts == () and refused.summary()["running"] == 3
    assert log_group_of([{"jobId": "j"}]) is None
