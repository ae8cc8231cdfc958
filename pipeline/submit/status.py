"""Following a submitted batch: counts of its children by status, images done, the failed children by exit
code and the slowest running ones.

`poll_status` reads the counts from the array parents' statusSummary (one DescribeJobs per 100 parents),
then lists at most a bounded number of failed and running children: a poll of a 20,000-child batch makes
the same few calls as one of 8, and holds as little. Without a statusSummary it counts with ListJobs per
status, paginated. Never one DescribeJobs per child; every call goes through `pipeline.aws.Backoff`, which
retries only throttling and 5xx answers.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.aws import Backoff
from pipeline.errors import IobatchError, UsageError
from pipeline.interface import EXIT_RETRYABLE, JOB_CONTAINER, batch_exit_code
from pipeline.submit.hosts import HostLine, host_lines, hosts_text, log_group_of
from pipeline.submit.plan import TAG_IMAGES, TAG_OFFSET, TAG_PER_CHILD

STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
FINISHED = ("SUCCEEDED", "FAILED")
RUNNING_LISTED = 1000  # running children listed per parent and poll (one ListJobs page), for the slowest
SLOWEST_SHOWN = 5
FAILED_LINES = 10  # failed children shown one a line; the rest are counted by exit code
# Children RUNNABLE this long after submission with none started: Batch cannot place them. AWS Batch's
# troubleshooting guide ("Jobs stuck in a RUNNABLE status") names the causes: no instance type fits the job's
# vCPUs and memory, the compute environment at its max vCPUs, or hosts that cannot join the cluster (here: a host
# that fails its scratch setup shuts down, counted by the stack's host-setup alarm).
RUNNABLE_WARN_MS = 15 * 60 * 1000


@dataclass(frozen=True)
class RunningChild:
    """A running child: its global index and when it started (ms since the epoch)."""

    job_id: str
    index: int
    started_ms: int


@dataclass(frozen=True)
class FailedChild:
    """A failed child: its global index, why it failed, and where its log is."""

    job_id: str
    index: int
    reason: str
    exit_code: int | None
    log_stream: str | None


@dataclass(frozen=True)
class JobProgress:
    """Counts of one submitted (array or plain) job."""

    job_id: str
    name: str
    status: str
    size: int
    offset: int
    images: int
    images_per_child: int
    counts: Mapping[str, int]
    created_ms: int | None = None  # when it was submitted (DescribeJobs createdAt)

    @property
    def images_done(self) -> int:
        return min(self.counts.get("SUCCEEDED", 0) * self.images_per_child, self.images)


@dataclass(frozen=True)
class BatchStatus:
    """Progress of a batch made of one or more submitted jobs."""

    jobs: tuple[JobProgress, ...]
    failed: tuple[FailedChild, ...]
    slowest: tuple[RunningChild, ...] = ()  # the longest-running among those listed, longest first
    now_ms: int = 0  # when the status was read, for how long the slowest have run
    hosts: tuple[HostLine, ...] = ()  # the hosts by their scratch's qualification, slow first (submit/hosts.py)

    def count(self, *statuses: str) -> int:
        return sum(job.counts.get(s, 0) for job in self.jobs for s in statuses)

    @property
    def children(self) -> int:
        return sum(job.size for job in self.jobs)

    @property
    def images(self) -> int:
        return sum(job.images for job in self.jobs)

    @property
    def images_done(self) -> int:
        return sum(job.images_done for job in self.jobs)

    @property
    def finished(self) -> bool:
        return self.count(*FINISHED) >= self.children

    @property
    def exit_code(self) -> int:
        """`status --watch`'s exit code, by the batch rule (interface.batch_exit_code) over the failed children
        described (`follow` describes every one at the end); a child with no exit code, as after Batch's hard
        timeout, counts as 75: a rerun can complete it."""
        return batch_exit_code(EXIT_RETRYABLE if f.exit_code is None else f.exit_code for f in self.failed)

    def summary(self) -> dict[str, int]:
        """The six user-facing counts (SUBMITTED counts as pending)."""
        return {
            "pending": self.count("SUBMITTED", "PENDING"),
            "runnable": self.count("RUNNABLE"),
            "starting": self.count("STARTING"),
            "running": self.count("RUNNING"),
            "succeeded": self.count("SUCCEEDED"),
            "failed": self.count("FAILED"),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": [{"jobId": j.job_id, "name": j.name, "status": j.status, "size": j.size,
                      "offset": j.offset, "images": j.images, "imagesDone": j.images_done,
                      "counts": dict(j.counts)} for j in self.jobs],
            "children": self.children,
            **self.summary(),
            "images": self.images,
            "imagesDone": self.images_done,
            "finished": self.finished,
            "failedChildren": [{"jobId": f.job_id, "index": f.index, "reason": f.reason,
                                "exitCode": f.exit_code, "logStream": f.log_stream} for f in self.failed],
            "failedByExit": [{"exitCode": code, "reason": reason, "children": n}
                             for (code, reason), n in self.failed_by_exit()],
            "slowestRunning": [{"jobId": r.job_id, "index": r.index, "startedAt": r.started_ms}
                               for r in self.slowest],
            "stuckRunnable": self.stuck_runnable(),
            "hosts": [h.to_json() for h in self.hosts],
        }

    def stuck_runnable(self) -> str | None:
        """One line when children have waited RUNNABLE past RUNNABLE_WARN_MS with none ever started, else None."""
        created = [j.created_ms for j in self.jobs if j.created_ms]
        started = self.count("STARTING", "RUNNING", "SUCCEEDED", "FAILED")
        if not created or started or not self.count("RUNNABLE") or not self.now_ms:
            return None
        waited = self.now_ms - min(created)
        if waited < RUNNABLE_WARN_MS:
            return None
        return (f"{self.count('RUNNABLE')} children RUNNABLE for {waited / 60000:.0f} min and none started: Batch "
                "cannot place them. Check the stack's host-setup alarm (hosts failing their scratch setup), the "
                "compute environment's status and max vCPUs, and that an instance type fits the job's vCPUs and "
                "memory")

    def failed_by_exit(self) -> list[tuple[tuple[int | None, str], int]]:
        """The failed children described, counted by (exit code, reason), most first."""
        counts = Counter((f.exit_code, f.reason) for f in self.failed)
        return sorted(counts.items(), key=lambda item: (-item[1], str(item[0])))

    def lines(self) -> list[str]:
        """Plain-text rendering for logs and non-TTY output (pure): a summary whatever the batch's size, never
        a line per child: at most FAILED_LINES failed children, the rest counted by exit code and reason."""
        counts = " ".join(f"{k} {v}" for k, v in self.summary().items())
        out = [f"children {self.children}: {counts}; images {self.images_done}/{self.images}"
               + (" (finished)" if self.finished else "")]
        for f in self.failed[:FAILED_LINES]:
            code = "-" if f.exit_code is None else str(f.exit_code)
            out.append(f"failed child {f.index} ({f.job_id}): exit {code}: {f.reason or 'no reason given'}; "
                       f"log stream {f.log_stream or '-'}")
        hidden = self.count("FAILED") - min(len(self.failed), FAILED_LINES)
        if hidden > 0:
            out.append(f"... and {hidden} more failed children (see --json or the Batch console)")
        if len(self.failed) > FAILED_LINES:
            shown = ", ".join(f"exit {'-' if code is None else code} ({reason or 'no reason given'}): {n}"
                              for (code, reason), n in self.failed_by_exit()[:5])
            out.append(f"failed by exit code, of {len(self.failed)} described: {shown}")
        if (stuck := self.stuck_runnable()) is not None:
            out.append("warning: " + stuck)
        if self.slowest:
            out.append("slowest running: " + ", ".join(
                f"child {r.index} for {max(0, self.now_ms - r.started_ms) / 60000:.1f} min" for r in self.slowest))
        if (hosts := hosts_text(list(self.hosts))) is not None:
            out.append(hosts)
        return out


def _int_tag(tags: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(tags.get(key, default))
    except (TypeError, ValueError):
        return default


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def job_container(job: Mapping[str, Any]) -> Mapping[str, Any]:
    """The job container's details (name, exitCode, reason, logStreamName) from DescribeJobs, for this job's
    shape.

    A multi-container job leaves the job-level `container` empty and reports each container under
    ecsProperties.taskProperties[].containers[] (JobDetail, AWS Batch API Reference: "ecsProperties ...
    taskProperties ... containers: a list of containers ... exitCode, name, reason, logStreamName"); its
    attempts carry the same under attempts[].taskProperties[].containers[] (AttemptEcsTaskDetails). A
    single-container job has them in `container`. Empty when the job never started a container.
    """
    def ours(tasks: Any) -> Mapping[str, Any] | None:
        for task in tasks or []:
            for container in task.get("containers") or []:
                if container.get("name") == JOB_CONTAINER:
                    return dict(container)
        return None

    found = ours((job.get("ecsProperties") or {}).get("taskProperties"))
    if found is None:
        attempts = job.get("attempts") or []
        found = ours(attempts[-1].get("taskProperties")) if attempts else None
    if found is None:
        found = job.get("container") or (attempts[-1].get("container") if attempts else None) or {}
    return found


def _child_index(job_id: str, offset: int) -> int:
    _, _, index = job_id.rpartition(":")
    return offset + int(index) if index.isdigit() else offset


def poll_status(batch_client: Any, job_ids: Sequence[str], *, backoff: Backoff | None = None,
                max_failed: int | None = 100, logs_client: Any = None) -> BatchStatus:
    """The progress of the given jobs.

    One DescribeJobs for the parents (sizes and tags), then ListJobs(arrayJobId, jobStatus) per status,
    paginated (1,000 a page), and one DescribeJobs per 100 failed children (at most `max_failed`, None for
    all) for their exit codes and log streams.
    """
    if not job_ids:
        raise UsageError("give the job id(s) `iobatch submit` printed")
    backoff = backoff or Backoff()
    parents: dict[str, Mapping[str, Any]] = {}
    for chunk in _chunks(list(job_ids), 100):
        for job in backoff.call(batch_client.describe_jobs, doing="describing jobs", jobs=list(chunk))["jobs"]:
            parents[str(job["jobId"])] = job
    unknown = [j for j in job_ids if j not in parents]
    if unknown:
        raise UsageError(f"no Batch job {', '.join(unknown)} in this account and region: check the id "
                         "`iobatch submit` printed and AWS_REGION")
    progress: list[JobProgress] = []
    failed_summaries: list[tuple[Mapping[str, Any], int]] = []
    running: list[RunningChild] = []
    for job_id in job_ids:
        parent = parents[job_id]
        tags = parent.get("tags") or {}
        offset = _int_tag(tags, TAG_OFFSET, 0)
        per_child = _int_tag(tags, TAG_PER_CHILD, 1)
        array = parent.get("arrayProperties") or {}
        size = int(array.get("size") or 0)
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        # DescribeJobs gives an array parent "statusSummary: a summary of the number of array job children in
        # each available job status" (AWS Batch API Reference, ArrayPropertiesDetail): the counts in one call.
        summary = array.get("statusSummary")
        room = None if max_failed is None else max(0, max_failed - len(failed_summaries))
        if size == 0:  # a plain job: its own status is its one child's
            size = 1
            counts[str(parent.get("status"))] = 1
            if parent.get("status") == "FAILED":
                failed_summaries.append((parent, offset))
        elif isinstance(summary, Mapping) and summary and all(isinstance(v, int) for v in summary.values()):
            counts.update({str(k): int(v) for k, v in summary.items() if k in counts})
            if counts["FAILED"] and room != 0:
                failed_summaries += [(s, offset) for s in _list_children(batch_client, backoff, job_id, "FAILED",
                                                                         limit=room)]
            if counts["RUNNING"]:
                running += _running(_list_children(batch_client, backoff, job_id, "RUNNING", limit=RUNNING_LISTED),
                                    offset)
        else:
            for status in STATUSES:
                for child in _list_children(batch_client, backoff, job_id, status):
                    counts[status] += 1
                    if status == "FAILED":
                        failed_summaries.append((child, offset))
                    elif status == "RUNNING" and counts[status] <= RUNNING_LISTED:
                        running += _running([child], offset)
        images = _int_tag(tags, TAG_IMAGES, size * per_child)
        created = parent.get("createdAt")
        progress.append(JobProgress(job_id, str(parent.get("jobName", "")), str(parent.get("status", "")),
                                    size, offset, images, per_child, counts,
                                    created if isinstance(created, int) and not isinstance(created, bool) else None))
    slowest = tuple(sorted(running, key=lambda r: (r.started_ms, r.index))[:SLOWEST_SHOWN])
    now_ms = int(time.time() * 1000)
    return BatchStatus(tuple(progress), _failed_children(batch_client, backoff, failed_summaries[:max_failed]),
                       slowest, now_ms, _hosts(logs_client, parents.values(), progress, now_ms, backoff))


def _hosts(logs_client: Any, parents: Iterable[Mapping[str, Any]], progress: Sequence[JobProgress], now_ms: int,
           backoff: Backoff) -> tuple[HostLine, ...]:
    """The hosts' qualifications since the batch was submitted (none without a Logs client or a log group, or when
    Logs cannot be read: the counts are what status is for)."""
    group = log_group_of(parents) if logs_client is not None else None
    if group is None:
        return ()
    since = min((j.created_ms for j in progress if j.created_ms), default=now_ms - 86_400_000)
    try:
        return tuple(host_lines(logs_client, group, since, backoff))
    except IobatchError:
        return ()


def _running(summaries: Iterable[Mapping[str, Any]], offset: int) -> list[RunningChild]:
    """The listed running children that say when they started (ListJobs' JobSummary.startedAt, ms)."""
    return [RunningChild(str(s["jobId"]), _child_index(str(s["jobId"]), offset), int(s["startedAt"]))
            for s in summaries if isinstance(s.get("startedAt"), int)]


def _list_children(batch_client: Any, backoff: Backoff, job_id: str, status: str,
                   limit: int | None = None) -> Iterable[Mapping[str, Any]]:
    """The children of `job_id` in `status`, page by page (ListJobs: at most 1,000 a page); at most `limit`."""
    token: str | None = None
    given = 0
    while True:
        kwargs: dict[str, Any] = {"arrayJobId": job_id, "jobStatus": status,
                                  "maxResults": 1000 if limit is None else max(1, min(1000, limit - given))}
        if token:
            kwargs["nextToken"] = token
        page = backoff.call(batch_client.list_jobs, doing=f"listing {status} children of {job_id}", **kwargs)
        for child in page.get("jobSummaryList", []):
            if limit is not None and given >= limit:
                return
            given += 1
            yield child
        token = page.get("nextToken")
        if not token or (limit is not None and given >= limit):
            return


def _failed_children(batch_client: Any, backoff: Backoff,
                     summaries: Sequence[tuple[Mapping[str, Any], int]]) -> tuple[FailedChild, ...]:
    if not summaries:
        return ()
    containers: dict[str, Mapping[str, Any]] = {}
    ids = [str(s["jobId"]) for s, _ in summaries]
    for chunk in _chunks(ids, 100):
        for job in backoff.call(batch_client.describe_jobs, doing="describing failed children",
                                jobs=list(chunk))["jobs"]:
            containers[str(job["jobId"])] = job_container(job)
    out = []
    for summary, offset in summaries:
        job_id = str(summary["jobId"])
        # ListJobs' summary has a container only for single-container jobs: the described job is the truth.
        container = containers.get(job_id) or summary.get("container") or {}
        reason = str(summary.get("statusReason") or container.get("reason") or "")
        exit_code = container.get("exitCode")
        stream = container.get("logStreamName")
        out.append(FailedChild(job_id, _child_index(job_id, offset), reason,
                               int(exit_code) if exit_code is not None else None, str(stream) if stream else None))
    return tuple(sorted(out, key=lambda f: f.index))


def follow(batch_client: Any, job_ids: Sequence[str], *, interval_s: float, show: Callable[[BatchStatus], None],
           sleep: Callable[[float], None] = time.sleep, backoff: Backoff | None = None,
           logs_client: Any = None) -> BatchStatus:
    """Poll until every child has finished, calling `show` after each poll; return the last status."""
    backoff = backoff or Backoff(sleep=sleep)
    while True:
        status = poll_status(batch_client, job_ids, backoff=backoff, logs_client=logs_client)
        show(status)
        if status.finished:
            if status.count("FAILED") > len(status.failed):  # every failed child's exit code, for the batch's
                status = poll_status(batch_client, job_ids, backoff=backoff, max_failed=None, logs_client=logs_client)
            return status
        sleep(interval_s)


def progress_view(total: int) -> tuple[Any, Callable[[BatchStatus], None]]:
    """A rich progress bar (children finished of total) and the callback that updates it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]children"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), transient=False)
    task = bar.add_task("", total=total)

    def update(status: BatchStatus) -> None:
        s = status.summary()
        bar.update(task, total=status.children, completed=s["succeeded"] + s["failed"],
                   description=f"running {s['running']} runnable {s['runnable']} pending {s['pending']} "
                               f"failed {s['failed']} | images {status.images_done}/{status.images}")

    return bar, update
