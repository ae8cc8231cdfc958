"""The task rehearsal: the synthesized job definition run as Batch runs it, as far as this machine can.

Each child is a pod of the job and profiler containers from the real image, made from the template's task
(tests/support/rehearsal.py). One "host" has a scratch volume prepared by the rendered user-data script on
an XFS loop device; another has a bare root-owned /scratch, as a host whose setup failed. On the prepared
host two batches run at once with the same child indices; one child's job is killed with SIGKILL in its
download, one child is stopped with SIGTERM (as ECS stops a task) in its download; both are then retried
as Batch retries them. Needs root, podman, runc and a loop device; skips with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import s3 as s3io
from pipeline.errors import EXIT_RETRYABLE
from pipeline.imaging import INDEX_NAME, SHARD_NAME, write_shard
from pipeline.interface import JOB_CONTAINER, PROFILER_CONTAINER
from pipeline.local.proxy import ThrottledProxy
from pipeline.local.s3server import EmbeddedS3
from pipeline.scratch import UNCLAIMED_AGE_S, sweep
from pipeline.settings import DEFAULT_TRAIN_SIZE, S3Uri, child_name
from pipeline.submit.plan import SubmitRequest, batch_environment
from profiling.qualification import QUALIFICATION_FILE
from tests.support import images
from tests.support.bpfhost import kernel_programs, slots
from tests.support.data import upload_dir
from tests.support.rehearsal import (
    Host,
    MetadataEndpoint,
    TaskSpec,
    emf_documents,
    qualification_dir,
    rehearsal_podman,
)
from tests.support.synth import synthesize
from tuning.host import SCRATCH_READY_MARKER, HostTuning

pytestmark = [pytest.mark.root, pytest.mark.container]

if os.geteuid() != 0:
    pytest.skip("needs root: podman pods, a loop device and a mount", allow_module_level=True)
if missing := [t for t in ("podman", "runc", "debootstrap", "losetup", "mkfs.xfs", "node") if shutil.which(t) is None]:
    pytest.skip(f"needs {', '.join(missing)} (make setup installs them)", allow_module_level=True)

PER_CHILD = 4  # two children per batch over the session's 8 small images
DOWNLOAD_BPS = 256 * 1024  # the slowed children download for ~8 s, long enough to be hit in the stage


@pytest.fixture
def prepared_scratch(tmp_path: Path) -> Iterator[Path]:
    """A host's scratch volume as the user data prepares it: the rendered script on an XFS loop device (its
    sysctls left out, so this machine's page cache is not changed), with the ready marker."""
    image, mount_point = tmp_path / "scratch.img", tmp_path / "host-a"
    with image.open("wb") as stream:
        stream.truncate(320 << 20)  # XFS wants at least 300 MiB; sparse
    found = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True, check=False)
    if found.returncode != 0:
        pytest.skip(f"no loop device available: {found.stderr.strip()}")
    device = found.stdout.strip()
    try:
        script = HostTuning(dirty_ratio=None, dirty_background_ratio=None,
                            mount_point=str(mount_point)).render_script(device=device)
        env = {**os.environ, "IOBATCH_FSTAB": "", "IOBATCH_SYSCTL_CONF": str(tmp_path / "90-iobatch.conf"),
               "IOBATCH_IMDS": "",
               "IOBATCH_QUALIFICATION_FILE": str(qualification_dir(mount_point) / Path(QUALIFICATION_FILE).name)}
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 0, done.stderr
        assert (mount_point / SCRATCH_READY_MARKER).is_file()
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, check=False)
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False)


def expected_outputs(source: Path, keys: list[str], child: int, work: Path) -> dict[str, bytes]:
    """What a child run alone writes (shards are deterministic): built in-process from the same bytes."""
    ordered = sorted(keys)[child * PER_CHILD:(child + 1) * PER_CHILD]
    out = work / f"solo-{child}"
    write_shard([(k, source / k.split("/", 1)[1]) for k in ordered], out, size=DEFAULT_TRAIN_SIZE,
                child=child_name(child))
    return {SHARD_NAME: (out / SHARD_NAME).read_bytes(), INDEX_NAME: (out / INDEX_NAME).read_bytes()}


def test_the_task_rehearsal(s3_server: EmbeddedS3, s3: Any, bucket: str, small_dataset: tuple[Any, Path],
                            prepared_scratch: Path, tmp_path: Path) -> None:
    _, source = small_dataset
    keys = upload_dir(s3, bucket, "images/", source)
    spec = TaskSpec.from_template(synthesize().template)
    image = images.job_image()
    batches = {}
    for name in ("a", "b"):
        request = SubmitRequest(input=S3Uri(bucket, "images/"), manifest=None, output=S3Uri(bucket, f"{name}/"),
                                images_per_child=PER_CHILD, name=name)
        frozen = s3io.freeze_batch(s3, input=request.input, manifest=None, output=request.output,
                                   per_child=PER_CHILD)
        assert frozen.children == 2
        batches[name] = batch_environment(request, frozen.manifest, 0)
    unprepared = tmp_path / "host-b"
    unprepared.mkdir(mode=0o755)  # the root disk's mount point: root's, not the volume

    metadata = MetadataEndpoint()
    try:
        with rehearsal_podman(tmp_path) as conf, ThrottledProxy(s3_server.port, DOWNLOAD_BPS) as slow:
            host_a = Host(spec, image, prepared_scratch, metadata, conf, s3_server.env())
            host_b = Host(spec, image, unprepared, metadata, conf, s3_server.env())

            def start(host: Host, batch: str, index: int, attempt: int = 1, endpoint: str | None = None) -> Any:
                return host.start(array_job=f"job-{batch}", index=index, attempt=attempt, override=batches[batch],
                                  s3_endpoint=endpoint or s3_server.endpoint)

            # Two batches at once on one host, indices 0 and 1 in both; batch b's children download slowly.
            tasks = {("a", 0): start(host_a, "a", 0), ("a", 1): start(host_a, "a", 1),
                     ("b", 0): start(host_a, "b", 0, endpoint=slow.endpoint),
                     ("b", 1): start(host_a, "b", 1, endpoint=slow.endpoint)}
            for index in (0, 1):
                assert tasks[("b", index)].wait_for_log(JOB_CONTAINER, '"stage": "download"'), \
                    tasks[("b", index)].log(JOB_CONTAINER)
            tasks[("b", 0)].signal(JOB_CONTAINER, "KILL")  # killed in its download
            for container in (JOB_CONTAINER, PROFILER_CONTAINER):  # ECS stops a task: SIGTERM to each container
                tasks[("b", 1)].signal(container, "TERM")
            codes = {key: task.finish(spec) for key, task in tasks.items()}
            # Batch retries both (137 by the host-reclaim rule's kin, 75 by the exit-code rule): new attempts.
            retries = {("b", i): start(host_a, "b", i, attempt=2) for i in (0, 1)}
            retry_codes = {key: task.finish(spec) for key, task in retries.items()}
            # A host that did not prepare its scratch: the child exits 75 to be run elsewhere.
            bad_host = start(host_b, "a", 0, attempt=2)
            bad_codes = bad_host.finish(spec)
    finally:
        metadata.close()

    logs = {key: task.logs for key, task in tasks.items()}
    assert codes[("a", 0)][JOB_CONTAINER] == 0 and codes[("a", 1)][JOB_CONTAINER] == 0, logs
    assert codes[("b", 0)][JOB_CONTAINER] == 137, logs[("b", 0)]
    assert codes[("b", 1)][JOB_CONTAINER] == EXIT_RETRYABLE, logs[("b", 1)]
    assert "error: the child was stopped by SIGTERM" in tasks[("b", 1)].logs[JOB_CONTAINER]
    assert [c[JOB_CONTAINER] for c in retry_codes.values()] == [0, 0], [t.logs for t in retries.values()]
    assert bad_codes[JOB_CONTAINER] == EXIT_RETRYABLE, bad_host.logs
    assert "this host did not prepare its scratch volume" in bad_host.logs[JOB_CONTAINER]
    # Every child's outputs, byte for byte those of the child run alone.
    for batch in ("a", "b"):
        for child in (0, 1):
            prefix = f"{batch}/{child_name(child)}/"
            for name, data in expected_outputs(source, keys, child, tmp_path).items():
                assert s3.get_object(Bucket=bucket, Key=prefix + name)["Body"].read() == data, prefix + name
            assert s3io.exists(s3, S3Uri(bucket, prefix + s3io.SUCCESS_MARKER))
    # Profiles for every child, from a sidecar that had no array index: the index came with the task.
    finished = {**{k: t for k, t in tasks.items() if k[0] == "a"}, **retries}
    for (_, child), task in finished.items():
        docs = emf_documents(task.logs[PROFILER_CONTAINER])
        assert [(d["Stage"], d["ArrayIndex"]) for d in docs] == [(s, str(child)) for s in
                                                                 ("download", "process", "upload")], task.logs
    stopped = emf_documents(tasks[("b", 1)].logs[PROFILER_CONTAINER])
    assert [(d["Stage"], d["Outcome"]) for d in stopped] == [("download", "interrupted")], tasks[("b", 1)].logs
    # Nothing left on the shared volume but the host's marker: the killed child's directory was swept.
    killed_dir = f"task-{tasks[('b', 0)].task_id}"
    assert killed_dir in "".join(t.logs[JOB_CONTAINER] for t in retries.values() if '"event": "swept"' in
                                 t.logs[JOB_CONTAINER]), "no retry swept the killed child's directory"
    # A profiler stopped past its stop timeout (SIGKILL, as ECS does) may leave the directory its socket was in; the
    # next claim on the host sweeps it by its dead lock, or by age when no job ever locked it (pipeline/scratch.py).
    owners = {f"task-{t.task_id}": f"batch {k[0]} child {k[1]}" + (" (retry)" if t in retries.values() else "")
              for k, t in [*tasks.items(), *retries.items()]}
    left = {p.name: (owners.get(p.name, "?"), sorted(q.name for q in p.iterdir()) if p.is_dir() else "a file")
            for p in prepared_scratch.iterdir() if p.name != SCRATCH_READY_MARKER}
    sweep(prepared_scratch, now=lambda: time.time() + UNCLAIMED_AGE_S + 1)
    assert sorted(p.name for p in prepared_scratch.iterdir()) == [SCRATCH_READY_MARKER], left
    assert list(unprepared.iterdir()) == []


def _run_one_child(spec: TaskSpec, name: str, s3_server: EmbeddedS3, s3: Any, bucket: str, scratch: Path,
                   tmp_path: Path) -> Any:
    """One child of 8 images, alone on `scratch`, in a task of `spec`; the finished Task."""
    tmp_path.mkdir(exist_ok=True)
    request = SubmitRequest(input=S3Uri(bucket, "images/"), manifest=None, output=S3Uri(bucket, f"{name}/"),
                            images_per_child=8, name=name)
    frozen = s3io.freeze_batch(s3, input=request.input, manifest=None, output=request.output, per_child=8)
    metadata = MetadataEndpoint()
    try:
        with rehearsal_podman(tmp_path) as conf:
            host = Host(spec, images.job_image(), scratch, metadata, conf, s3_server.env())
            task = host.start(array_job=f"job-{name}", index=0, attempt=1, s3_endpoint=s3_server.endpoint,
                              override=batch_environment(request, frozen.manifest, 0))
            codes = task.finish(spec)
    finally:
        metadata.close()
    assert codes[JOB_CONTAINER] == 0, task.logs
    return task


def test_a_user_image_built_from_ours(s3_server: EmbeddedS3, s3: Any, bucket: str,
                                      small_dataset: tuple[Any, Path], prepared_scratch: Path,
                                      tmp_path: Path) -> None:
    """README "Your own processing": examples/Dockerfile FROM the project's image, deployed with -c jobImage=...;
    its processing command (the image's IOBATCH_PROCESS_COMMAND) runs in the process stage of a real task."""
    _, source = small_dataset
    upload_dir(s3, bucket, "images/", source)
    image = images.user_image()
    spec = TaskSpec.from_template(synthesize(jobImage=image).template)
    assert {c.name: c.image for c in spec.containers} == {JOB_CONTAINER: image, PROFILER_CONTAINER: image}
    task = _run_one_child(spec, "user", s3_server, s3, bucket, prepared_scratch, tmp_path)
    prefix = f"user/{child_name(0)}/"
    marker = json.loads(s3.get_object(Bucket=bucket, Key=prefix + s3io.SUCCESS_MARKER)["Body"].read())
    stats = s3.head_object(Bucket=bucket, Key=prefix + "stats.npy")
    assert [(o["key"], o["size"]) for o in marker["objects"]] == [("stats.npy", stats["ContentLength"])]
    # The command's own sub-stages are stages of the profile, between the pipeline's.
    stages = [d["Stage"] for d in emf_documents(task.logs[PROFILER_CONTAINER])]
    assert stages == ["download", "process/stats", "process/write", "process", "upload"], task.logs
    assert sorted(p.name for p in prepared_scratch.iterdir()) == [SCRATCH_READY_MARKER]


def test_per_call_figures_inside_a_task(s3_server: EmbeddedS3, s3: Any, bucket: str,
                                        small_dataset: tuple[Any, Path], prepared_scratch: Path,
                                        tmp_path: Path) -> None:
    """-c profilerEbpf=true -c profilerContract=case-study: the profiler container (privileged, root) loads the
    eBPF probe for the job's container, whose processes live in the task's own pid namespace, and the case
    study's contract (shipped in the image) answers mean write latency, write count and bytes for s5cmd's
    download. Then -c profilerInterpose=true alone: the interposer's figures reach the unprivileged profiler."""
    _, source = small_dataset
    upload_dir(s3, bucket, "images/", source)
    spec = TaskSpec.from_template(synthesize(profilerEbpf="true", profilerContract="case-study").template)
    [profiler] = [c for c in spec.containers if c.name == PROFILER_CONTAINER]
    assert profiler.privileged and profiler.user == "0"
    task = _run_one_child(spec, "calls", s3_server, s3, bucket, prepared_scratch, tmp_path)
    docs = {d["Stage"]: d for d in emf_documents(task.logs[PROFILER_CONTAINER])}
    download, upload = docs["download"], docs["upload"]
    rows = {r["label"]: r for r in download["Contract"]}
    assert {rows[k]["source"] for k in ("mean_lat_write", "num_write", "total_write")} == {"ebpf"}, rows
    # The probe's counts are the kernel's own per-process counters (wchar, syscw), read independently.
    assert (rows["total_write"]["value"], rows["num_write"]["value"]) == \
        (download["WriteBytes"], download["WriteCalls"]), download
    assert rows["mean_lat_write"]["value"] > 0
    # The job's own socket bytes (its cgroup), against what moved: the images in, the outputs out.
    image_bytes = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    assert image_bytes <= download["NetworkReceivedBytes"] <= image_bytes * 1.02, download
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"calls/{child_name(0)}/")["Contents"]
    uploaded = sum(o["Size"] for o in listed)
    assert uploaded <= upload["NetworkSentBytes"] <= uploaded * 1.02, upload

    spec = TaskSpec.from_template(synthesize(profilerInterpose="true", profilerContract="case-study").template)
    [profiler] = [c for c in spec.containers if c.name == PROFILER_CONTAINER]
    assert not profiler.privileged
    task = _run_one_child(spec, "interposed", s3_server, s3, bucket, prepared_scratch, tmp_path / "i")
    docs = {d["Stage"]: d for d in emf_documents(task.logs[PROFILER_CONTAINER])}
    # The resizer's writes (Python, dynamically linked) through the interposer, at the stage's exact edges.
    rows = {r["label"]: r for r in docs["process"]["Contract"]}
    assert rows["mean_lat_write"]["source"] == "interpose" and rows["mean_lat_write"]["value"] > 0, rows
    assert docs["process"]["WriteCallLatency"] > 0
    assert not [n for d in docs.values() for n in d.get("Notices", []) if "approximate" in n], docs
    # s5cmd is a static binary the interposer cannot enter: the download's latency is absent, not the job's
    # few writes passed off as the stage's, and its counts and bytes are the kernel's.
    download = docs["download"]
    rows = {r["label"]: r for r in download["Contract"]}
    assert rows["mean_lat_write"]["value"] is None and "WriteCallLatency" not in download, download
    assert (rows["total_write"]["value"], rows["total_write"]["source"]) == (download["WriteBytes"], "procfs")
    assert any("static binaries such as s5cmd" in n for n in download["Notices"]), download
    assert sorted(p.name for p in prepared_scratch.iterdir()) == [SCRATCH_READY_MARKER]


PACKED = 8  # children of one host at once, one image each (a packed host runs one per core)
HOLD_BPS, RELEASE_BPS = 16 * 1024, 64 << 20  # in all: 8 x 0.5 MiB takes minutes, then well under a second


def test_eight_children_of_a_packed_host_share_one_set_of_programs(
        s3_server: EmbeddedS3, s3: Any, bucket: str, small_dataset: tuple[Any, Path], prepared_scratch: Path,
        tmp_path: Path) -> None:
    """Eight tasks of one batch on one host, each with its eBPF profiler container (-c profilerEbpf=true): while
    all eight are in their download the kernel holds one set of our programs (each profiler added its child's slot,
    not programs), each child's write counts and bytes are exactly its own processes' (the kernel's per-process
    counters, read independently), and nothing of ours stays loaded after the last task ends."""
    if kernel_programs("iob_"):
        pytest.skip("another profiler runs on this host: the test counts what the kernel holds")
    _, source = small_dataset
    upload_dir(s3, bucket, "images/", source)
    spec = TaskSpec.from_template(synthesize(profilerEbpf="true", profilerContract="case-study").template)
    request = SubmitRequest(input=S3Uri(bucket, "images/"), manifest=None, output=S3Uri(bucket, "packed/"),
                            images_per_child=1, name="packed")
    frozen = s3io.freeze_batch(s3, input=request.input, manifest=None, output=request.output, per_child=1)
    assert frozen.children == PACKED
    metadata = MetadataEndpoint()
    seen: list[tuple[int, int]] = []  # (our programs in the kernel, slots taken) while the children download
    try:
        with rehearsal_podman(tmp_path) as conf, ThrottledProxy(s3_server.port, HOLD_BPS) as slow:
            host = Host(spec, images.job_image(), prepared_scratch, metadata, conf, s3_server.env())
            tasks = [host.start(array_job="job-packed", index=i, attempt=1, s3_endpoint=slow.endpoint,
                                override=batch_environment(request, frozen.manifest, 0)) for i in range(PACKED)]
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and (not seen or seen[-1][1] < PACKED):
                seen.append((len(kernel_programs("iob_")), len(slots())))
                time.sleep(0.5)
            slow.set_rate(RELEASE_BPS)
            codes = [task.finish(spec) for task in tasks]
    finally:
        metadata.close()
    assert [c[JOB_CONTAINER] for c in codes] == [0] * PACKED, [t.logs for t in tasks]
    # From the first slot taken to all eight at once, the kernel held the same number of our programs.
    assert seen[-1][1] == PACKED and len({n for n, slots in seen if slots}) == 1 and seen[-1][0] > 0, seen
    for task in tasks:
        download = {d["Stage"]: d for d in emf_documents(task.logs[PROFILER_CONTAINER])}["download"]
        rows = {r["label"]: r for r in download["Contract"]}
        assert {rows[k]["source"] for k in ("num_write", "total_write")} == {"ebpf"}, rows
        assert (rows["total_write"]["value"], rows["num_write"]["value"]) == \
            (download["WriteBytes"], download["WriteCalls"]), download
    deadline = time.monotonic() + 30
    while kernel_programs("iob_") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not kernel_programs("iob_") and not slots(), "our programs stayed loaded after the last task"

