"""The hosts of a batch ranked by their scratch's qualification at boot, for `iobatch status`: the one event each host
posted to the pipeline's log group (stream tuning.hostqualify.EVENT_PREFIX<instance id>), read back with
FilterLogEvents from the batch's submission on, at most MAX_PAGES pages a poll.

The log group is the job definition's: the job container's awslogs group, which DescribeJobs gives for the array
parents `poll_status` describes anyway (ecsProperties.taskProperties[].containers[].logConfiguration).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.aws import Backoff
from pipeline.interface import JOB_CONTAINER
from profiling.qualification import Qualification, read_qualification
from tuning.hostqualify import EVENT_PREFIX

MAX_PAGES = 5  # 10,000 events a page: more hosts than any batch has
HOSTS_SHOWN = 5


@dataclass(frozen=True)
class HostLine:
    """One host's qualification as it posted it."""

    instance_id: str
    instance_type: str
    qualification: Qualification

    def to_json(self) -> dict[str, Any]:
        q = self.qualification
        return {"instanceId": self.instance_id, "instanceType": self.instance_type, "verdict": q.verdict,
                "ratio": q.ratio, "mibps": q.mibps, "expectedMibps": q.expected_mibps}

    def text(self) -> str:
        q = self.qualification
        ratio = "-" if q.ratio is None else f"{q.ratio:.2f}x"
        expected = f" of {q.expected_mibps:.1f}" if q.expected_mibps else ""
        return f"{self.instance_id} {ratio} {q.verdict} ({q.mibps:.1f}{expected} MiB/s)"


def log_group_of(parents: Iterable[Mapping[str, Any]]) -> str | None:
    """The job container's awslogs group of the first parent that names one."""
    for parent in parents:
        for task in (parent.get("ecsProperties") or {}).get("taskProperties") or []:
            for container in task.get("containers") or []:
                options = (container.get("logConfiguration") or {}).get("options") or {}
                if container.get("name") == JOB_CONTAINER and options.get("awslogs-group"):
                    return str(options["awslogs-group"])
    return None


def ranked(lines: Iterable[HostLine]) -> list[HostLine]:
    """Slow hosts first, lowest ratio first; hosts without a ratio last."""
    return sorted(lines, key=lambda h: (not h.qualification.slow, h.qualification.ratio is None,
                                        h.qualification.ratio or 0.0, h.instance_id))


def host_lines(logs_client: Any, log_group: str, since_ms: int, backoff: Backoff | None = None) -> list[HostLine]:
    """The hosts that posted their qualification since `since_ms`, the latest event of each, ranked."""
    backoff = backoff or Backoff()
    found: dict[str, HostLine] = {}
    kwargs: dict[str, Any] = {"logGroupName": log_group, "logStreamNamePrefix": EVENT_PREFIX, "startTime": since_ms}
    for _ in range(MAX_PAGES):
        page = backoff.call(logs_client.filter_log_events, doing="reading the hosts' qualifications", **kwargs)
        for event in page.get("events") or []:
            try:
                body = json.loads(event.get("message") or "")
            except ValueError:
                continue
            quality = read_qualification(body) if isinstance(body, dict) else None
            if quality is not None and isinstance(body.get("InstanceId"), str):
                found[body["InstanceId"]] = HostLine(body["InstanceId"], str(body.get("InstanceType") or "-"),
                                                     quality)
        token = page.get("nextToken")
        if not token:
            break
        kwargs["nextToken"] = token
    return ranked(found.values())


def hosts_text(lines: list[HostLine]) -> str | None:
    """One line for `status`: how many hosts qualified, how many slow, the first HOSTS_SHOWN ranked."""
    if not lines:
        return None
    slow = sum(h.qualification.slow for h in lines)
    shown = ", ".join(h.text() for h in lines[:HOSTS_SHOWN])
    more = f", and {len(lines) - HOSTS_SHOWN} more" if len(lines) > HOSTS_SHOWN else ""
    return f"hosts by qualification ({len(lines)}, {slow} slow): {shown}{more}"
