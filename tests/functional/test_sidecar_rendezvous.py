"""The job and its sidecar meet at the attempt's socket without AWS_BATCH_JOB_ARRAY_INDEX in the sidecar's
environment; a sidecar that no job reaches says so once; the attempt's directory is left empty and gone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.interface import ENV
from pipeline.settings import JobSettings, job_identity
from profiling.emf import RecordingSink
from profiling.protocol import StageReporter
from profiling.sidecar import Sidecar, SidecarConfig


def test_a_sidecar_without_the_array_index_finds_the_job_of_its_task(tmp_path: Path) -> None:
    task = {ENV.SCRATCH: str(tmp_path), ENV.JOB_ID: "8c3e9a:12", ENV.TASK_ID: "158d1c8083dd49d6",
            ENV.INPUT: "s3://in-bucket/i/", ENV.OUTPUT: "s3://out-bucket/o/", ENV.IMAGES_PER_CHILD: "2"}
    job = JobSettings.from_env({**task, ENV.ARRAY_INDEX: "12", ENV.ARRAY_OFFSET: "100"})
    sidecar_env = {**task, ENV.ARRAY_OFFSET: "100"}  # no ARRAY_INDEX
    identity = job_identity(sidecar_env)
    assert identity.socket_path == job.socket_path == tmp_path / "task-158d1c8083dd49d6" / "profiler.sock"
    assert identity.properties["ArrayIndex"] == str(job.array_index) == "112"

    # The real sidecar command, beside an in-process job that announces one stage at that socket.
    env = {**os.environ, **sidecar_env}
    env.pop(ENV.ARRAY_INDEX, None)
    profile = tmp_path / "profile.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "sidecar", "--emf", str(tmp_path / "emf"),
                             "--profile-out", str(profile), "--no-call-probes"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        warnings: list[str] = []
        reporter = StageReporter(job.socket_path, connect_timeout_s=30, warn=warnings.append)
        assert reporter.active, warnings
        with reporter.stage("download"):
            time.sleep(0.2)
        reporter.close()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert '"ArrayIndex":"112"' in profile.read_text()
    assert not job.work_dir.exists(), "the sidecar left the attempt's empty directory behind"


def test_a_sidecar_without_the_job_id_or_index_labels_profiles_with_the_jobs_own(tmp_path: Path) -> None:
    """Batch documents AWS_BATCH_JOB_ARRAY_INDEX for the job's container only; a profiler that has neither it
    nor the job id would label every child "ArrayIndex 0, JobId local". The job names itself in stage_start."""
    task = {ENV.SCRATCH: str(tmp_path), ENV.TASK_ID: "9f0e", ENV.INPUT: "s3://in-bucket/i/",
            ENV.OUTPUT: "s3://out-bucket/o/", ENV.IMAGES_PER_CHILD: "2"}
    job = JobSettings.from_env({**task, ENV.JOB_ID: "7d2b:5", ENV.ARRAY_INDEX: "5"})
    assert job_identity(task).properties["ArrayIndex"] == "0"  # what the profiler alone would say
    config = SidecarConfig(socket_path=job.socket_path, emf_sink=RecordingSink(),
                           properties=dict(job_identity(task).properties))
    sidecar = Sidecar(config, probes=[])
    sidecar.bind()
    server = threading.Thread(target=sidecar.serve, kwargs={"poll_s": 0.05})
    server.start()
    reporter = StageReporter(job.socket_path, identity={"JobId": job.job_id, "ArrayIndex": str(job.array_index)})
    with reporter.stage("download"):
        pass
    reporter.close()
    server.join(timeout=30)
    (line,) = config.emf_sink.lines  # type: ignore[attr-defined]
    assert '"ArrayIndex": "5"' in line and '"JobId": "7d2b:5"' in line


def test_the_jobs_identity_in_a_message_is_checked() -> None:
    from profiling.protocol import ProtocolError, decode, encode

    start = {"type": "stage_start", "stage": "download", "pid": 1}
    assert decode(encode({**start, "job": {"ArrayIndex": "5"}}).strip())["job"] == {"ArrayIndex": "5"}
    for bad in ({"InstanceId": "i-1"}, {"ArrayIndex": 5}, {"JobId": ""}, ["JobId"], {"JobId": "x" * 257}):
        with pytest.raises(ProtocolError, match="identity"):
            decode(encode({**start, "job": bad}).strip())


def test_a_sidecar_no_job_reaches_warns_once_and_keeps_waiting(tmp_path: Path) -> None:
    warned: list[str] = []
    config = SidecarConfig(socket_path=tmp_path / "task-x" / "profiler.sock", emf_sink=RecordingSink(),
                           grace_s=0.2, remove_empty_dir=True)
    sidecar = Sidecar(config, warn=warned.append, probes=[])
    sidecar.bind()
    server = threading.Thread(target=sidecar.serve, kwargs={"poll_s": 0.05})
    server.start()
    time.sleep(0.8)
    assert server.is_alive()
    sidecar.stop()
    server.join(timeout=5)
    assert warned == [f"no job connected to {config.socket_path} within 0.2 s: the job may have derived another "
                      "task id (its stages are then not profiled), or it had nothing to do"]
    assert not (tmp_path / "task-x").exists()
