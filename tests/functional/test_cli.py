"""The commands as a person meets them: help, one-line errors with documented exit codes, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.local.s3server import EmbeddedS3, free_port
from pipeline.settings import ENV

CLI = [sys.executable, "-m", "pipeline.cli"]


def iobatch(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in errors[0]


def test_job_help_names_every_variable() -> None:
    result = iobatch("job", "--help", env={"COLUMNS": "200"})
    assert result.returncode == 0
    names = [v for k, v in vars(ENV).items() if k.isupper()]
    missing = [name for name in names if name not in result.stdout and name != ENV.QUEUE]
    assert missing == []
    for command in ("demo", "run", "sidecar", "profile"):
        assert iobatch(command, "--help").returncode == 0


def test_job_without_settings_is_a_usage_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOBATCH_")}
    result = subprocess.run([*CLI, "job"], capture_output=True, text=True, env=env, timeout=60)
    assert_one_line_error(result, 64, "IOBATCH_INPUT is not set")


def test_bad_uri_is_a_usage_error(tmp_path: Path) -> None:
    result = iobatch("run", "--input", "my-bucket/images", "--output", "s3://out/x/", "--run-dir", str(tmp_path))
    assert_one_line_error(result, 64, "--input 'my-bucket/images' is not an S3 URI")


# A run that fails before it starts leaves no run directory behind (it creates a new one only to run in).
def test_missing_bucket_is_permanent(s3_server: EmbeddedS3, tmp_path: Path) -> None:
    result = iobatch("run", "--input", "s3://no-such-bucket-y/images/", "--output", "s3://no-such-bucket-y/o/",
                     "--s3-endpoint", s3_server.endpoint, "--run-dir", str(tmp_path / "run"), env=s3_server.env())
    assert_one_line_error(result, 65, "no-such-bucket-y", "does not exist")
    assert not (tmp_path / "run").exists()


def test_empty_prefix_is_permanent(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> None:
    result = iobatch("run", "--input", f"s3://{bucket}/nothing/", "--output", f"s3://{bucket}/o/",
                     "--s3-endpoint", s3_server.endpoint, "--run-dir", str(tmp_path / "run"), env=s3_server.env())
    assert_one_line_error(result, 65, f"s3://{bucket}/nothing/ holds no images")
    assert not (tmp_path / "run").exists()


def test_unreachable_endpoint_is_retryable(s3_server: EmbeddedS3, tmp_path: Path) -> None:
    result = iobatch("run", "--input", "s3://bkt/images/", "--output", "s3://bkt/o/", "--s3-endpoint",
                     f"http://127.0.0.1:{free_port()}", "--run-dir", str(tmp_path / "run"), env=s3_server.env())
    assert_one_line_error(result, 75, "S3 endpoint does not answer")
    assert not (tmp_path / "run").exists()
    # An existing (empty) directory the user named is left in place.
    (tmp_path / "mine").mkdir()
    again = iobatch("run", "--input", "s3://bkt/images/", "--output", "s3://bkt/o/", "--s3-endpoint",
                    f"http://127.0.0.1:{free_port()}", "--run-dir", str(tmp_path / "mine"), env=s3_server.env())
    assert_one_line_error(again, 75, "S3 endpoint does not answer")
    assert (tmp_path / "mine").is_dir()


def test_unwritable_scratch_names_the_directory(s3_server: EmbeddedS3, s3: Any, bucket: str, tmp_path: Path) -> None:
    s3.put_object(Bucket=bucket, Key="images/a.png", Body=b"x")
    env = {**s3_server.env(), ENV.INPUT: f"s3://{bucket}/images/", ENV.OUTPUT: f"s3://{bucket}/o/",
           ENV.IMAGES_PER_CHILD: "1", ENV.SCRATCH: str(tmp_path / "absent"), ENV.S3_ENDPOINT: s3_server.endpoint}
    result = iobatch("job", env=env)
    assert_one_line_error(result, 65, f"scratch directory {tmp_path / 'absent'} does not exist")
    # Said at once: no profiler can listen under a root that is not there, so the job does not wait for one.
    assert "no profiler at" not in result.stderr, result.stderr


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline[:120]}")
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_demo_stops_everything(tmp_path: Path, sig: int) -> None:
    run_dir = tmp_path / "demo"
    # As a terminal's foreground command: Ctrl-C's SIGINT at its default even when the suite itself runs
    # where it is ignored (a shell starts background commands with SIGINT ignored, and Python keeps that).
    proc = subprocess.Popen([*CLI, "demo", "--images", "8", "--image-mib", "2", "--images-per-child", "1",
                             "--run-dir", str(run_dir), "--no-report", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "IOBATCH_CACHE": str(tmp_path / "cache")},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("batch "):
            break
    time.sleep(1.0)  # children are running now
    assert _processes_mentioning(str(run_dir)), "expected the server and children to be running"
    proc.send_signal(sig)
    rest = proc.stdout.read()
    proc.wait(timeout=60)
    assert proc.returncode == 75, rest
    assert "error: interrupted" in rest
    deadline = time.monotonic() + 10
    while _processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_mentioning(str(run_dir)) == []


@pytest.mark.parametrize("index", ["3", "9999"], ids=["just-past", "far-past"])
def test_job_past_the_frozen_batch_writes_nothing(s3_server: EmbeddedS3, s3: Any, bucket: str, tmp_path: Path,
                                                  index: str) -> None:
    from pipeline import s3 as s3io
    from pipeline.settings import S3Uri

    for i in range(5):
        s3.put_object(Bucket=bucket, Key=f"images/{i}.png", Body=b"x")
    frozen = s3io.freeze_batch(s3, input=S3Uri(bucket, "images/"), manifest=None, output=S3Uri(bucket, "o/"),
                               per_child=2)
    before = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="o/")["Contents"])
    env = {**s3_server.env(), ENV.INPUT: f"s3://{bucket}/images/", ENV.OUTPUT: f"s3://{bucket}/o/",
           ENV.MANIFEST: str(frozen.manifest), ENV.IMAGES_PER_CHILD: "2", ENV.ARRAY_INDEX: index,
           ENV.SCRATCH: str(tmp_path), ENV.S3_ENDPOINT: s3_server.endpoint, ENV.PROFILER_SOCKET: "off"}
    result = iobatch("job", env=env)
    assert_one_line_error(result, 65, f"array index {index} is beyond the batch", "has 3 children")
    assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="o/")["Contents"]) == before
    assert list(tmp_path.iterdir()) == []


def test_sidecar_removes_only_a_stale_socket_of_its_own(tmp_path: Path) -> None:
    import socket

    from profiling.sidecar import remove_stale_socket

    stale = tmp_path / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(stale))
    dead.close()  # bound, never listening: what a killed profiler leaves
    remove_stale_socket(stale)
    assert not stale.exists()
    live_path = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(live_path))
        live.listen(1)
        with pytest.raises(ValueError, match="already serving"):
            remove_stale_socket(live_path)
    assert live_path.exists()
