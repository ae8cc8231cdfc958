"""The profiler's container ends as the job's does, on every way the job ends, and never fails the child itself.

Which container's exit code Batch's retry rules read in a multi-container job is not documented (infra/jobs.py,
retry_conditions), so the real `iobatch sidecar` exits with the code the job's job_end says; when it cannot start
(its socket cannot be bound, SIGTERM while it starts) it says so once and exits 0. The other two ways out, the job
closing the socket without a job_end and SIGTERM while serving, exit 0 too (tests/functional/test_sidecar.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipeline.interface import ENV, EXIT_PERMANENT, EXIT_RETRYABLE, EXIT_USAGE
from pipeline.settings import JobSettings
from profiling import protocol
from profiling.protocol import StageReporter
from tests.support.sidecar import REPO, sidecar_env, start_sidecar


@pytest.mark.parametrize("code", [0, EXIT_PERMANENT, EXIT_RETRYABLE])
def test_the_profiler_exits_with_the_code_the_jobs_job_end_says(tmp_path: Path, code: int) -> None:
    sidecar, sock = start_sidecar(tmp_path)
    try:
        reporter = StageReporter(sock)
        assert reporter.active
        with reporter.stage("download"):
            pass
        reporter.close("ok" if code == 0 else "failed", code)
        _, err = sidecar.communicate(timeout=15)
    finally:
        sidecar.kill()
    assert sidecar.returncode == code, err


def test_a_job_that_ends_before_its_first_stage_tells_the_profiler_its_code(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A command the job cannot find is a usage error before anything ran (64): the job still says so at its
    socket, and the profiler's container ends with 64 too, not 0 (nor waits for ECS's SIGTERM)."""
    from pipeline import job

    short = tempfile.TemporaryDirectory(prefix="iob", dir="/tmp")  # the socket's path must fit in 107 bytes
    request.addfinalizer(short.cleanup)
    task = {ENV.SCRATCH: short.name, ENV.JOB_ID: "8c3e9a:3", ENV.TASK_ID: "0f1e2d3c4b5a6978",
            ENV.INPUT: "s3://in-bucket/i/", ENV.OUTPUT: "s3://out-bucket/o/", ENV.IMAGES_PER_CHILD: "2",
            ENV.PIPELINE: "exit-test"}
    missing = "iobatch-no-such-command {input} {output}"
    settings = JobSettings.from_env({**task, ENV.ARRAY_INDEX: "3", ENV.PROCESS_COMMAND: missing})
    env = {**sidecar_env(tmp_path), **task, ENV.ARRAY_INDEX: "3"}
    sidecar = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "sidecar", "--emf", str(tmp_path / "emf"),
                                "--no-call-probes"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert job.main(settings) == EXIT_USAGE
        _, err = sidecar.communicate(timeout=15)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        sidecar.kill()
    assert sidecar.returncode == EXIT_USAGE, err


def test_a_profiler_that_cannot_bind_its_socket_warns_once_and_exits_0(tmp_path: Path) -> None:
    taken = tmp_path / "p.sock"
    taken.write_text("not a socket")
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "sidecar", "--socket", str(taken), "--emf",
                           str(tmp_path / "emf"), "--scratch-dir", str(tmp_path), "--no-call-probes"],
                          cwd=REPO, env=sidecar_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("warning: profiler: cannot serve") and "runs unprofiled" in line, line
    assert taken.read_text() == "not a socket"


# SIGTERM while the profiler is still starting: sent from inside, as the sidecar object is made.
EARLY_SIGTERM = """
import os, signal, sys
from profiling import sidecar
made = sidecar.Sidecar.__init__
def term_first(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    made(self, *args, **kwargs)
sidecar.Sidecar.__init__ = term_first
from pipeline.cli import main
main(sys.argv[1:])
"""


def test_sigterm_while_the_profiler_starts_exits_0_not_75(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", EARLY_SIGTERM, "sidecar", "--socket", str(tmp_path / "p.sock"),
                           "--emf", str(tmp_path / "emf"), "--scratch-dir", str(tmp_path), "--no-call-probes"],
                          cwd=REPO, env=sidecar_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("code", [-1, 256, True, "75", 7.5])
def test_a_job_end_whose_exit_code_is_no_exit_code_is_refused(code: object) -> None:
    with pytest.raises(protocol.ProtocolError, match="exit_code"):
        protocol.decode(protocol.encode({"type": "job_end", "outcome": "ok", "exit_code": code}))
