"""pipeline.aws: the one list of throttling and credential codes, the translators that share it, the back-off."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import EndpointConnectionError, NoCredentialsError, NoRegionError

from pipeline import aws
from pipeline.aws import Backoff
from pipeline.errors import (
    EXIT_PERMANENT,
    EXIT_RETRYABLE,
    EXIT_USAGE,
    EndpointUnreachable,
    MissingObjectError,
    PermanentError,
    RetryableError,
    TransferError,
    UsageError,
)
from tests.support.aws import Flaky, client_error, no_sleep

# Each caller's translator, as a function of the failure alone.
TRANSLATORS: dict[str, Callable[[Exception], Exception]] = {
    "s3": lambda exc: aws.s3_error(exc, what="s3://b/k"),
    "batch": lambda exc: aws.aws_error(exc, doing="x"),
    "logs": lambda exc: aws.logs_error(exc, log_group="g"),
}


# ---- one list of codes for every caller ------------------------------------------------------------


@pytest.mark.parametrize("caller", sorted(TRANSLATORS))
@pytest.mark.parametrize("code", sorted(aws.THROTTLING_CODES | aws.TRANSIENT_CODES))
def test_every_caller_takes_throttling_and_transient_answers_as_retryable(caller: str, code: str) -> None:
    error = TRANSLATORS[caller](client_error(code, 400))
    assert isinstance(error, RetryableError) and error.exit_code == EXIT_RETRYABLE, error


@pytest.mark.parametrize("caller", sorted(TRANSLATORS))
@pytest.mark.parametrize("code", sorted(aws.CREDENTIAL_CODES))
def test_every_caller_takes_refused_credentials_as_a_usage_error(caller: str, code: str) -> None:
    error = TRANSLATORS[caller](client_error(code, 403))
    assert isinstance(error, UsageError) and error.exit_code == EXIT_USAGE, error


@pytest.mark.parametrize("caller", sorted(TRANSLATORS))
def test_every_caller_takes_a_5xx_or_429_as_retryable(caller: str) -> None:
    assert isinstance(TRANSLATORS[caller](client_error("SomethingNew", 502)), RetryableError)
    assert isinstance(TRANSLATORS[caller](client_error("SomethingElse", 429)), RetryableError)


@pytest.mark.parametrize("caller", sorted(TRANSLATORS))
def test_every_caller_names_missing_credentials(caller: str) -> None:
    error = TRANSLATORS[caller](NoCredentialsError())
    assert isinstance(error, UsageError) and "no AWS credentials" in error.headline


# ---- each caller's headlines -----------------------------------------------------------------------


@pytest.mark.parametrize(("exc", "kind", "headline"), [
    (client_error("NoSuchBucket", 404), MissingObjectError, "bucket of s3://b/k does not exist: create it"),
    (client_error("NoSuchKey", 404), MissingObjectError, "s3://b/k does not exist: fix the manifest"),
    (client_error("404", 404), MissingObjectError, "s3://b/k does not exist"),
    (client_error("AccessDenied", 403), UsageError, "S3 refused the credentials for s3://b/k (AccessDenied)"),
    (client_error("SlowDown", 503), RetryableError, "S3 answered SlowDown for s3://b/k: retry later"),
    (client_error("InvalidRange", 416, "bad range"), PermanentError,
     "S3 answered InvalidRange for s3://b/k: bad range"),
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), EndpointUnreachable,
     "S3 endpoint does not answer for s3://b/k (http://127.0.0.1:9)"),
    (S3UploadFailedError("An error occurred (BadDigest) when calling the PutObject operation"), TransferError,
     "as corrupt in transit (BadDigest)"),
    (S3UploadFailedError("An error occurred (AccessDenied) when calling the PutObject operation"), UsageError,
     "S3 refused the credentials for s3://b/k (AccessDenied)"),
    (S3UploadFailedError("An error occurred (NoSuchBucket) when calling the PutObject operation"),
     MissingObjectError, "bucket of s3://b/k does not exist"),
])
def test_s3_errors_name_the_object(exc: Exception, kind: type[Exception], headline: str) -> None:
    error = aws.s3_error(exc, what="s3://b/k")
    assert type(error) is kind and headline in str(error)


def test_s3_error_leaves_other_exceptions_alone() -> None:
    exc = ValueError("x")
    assert aws.s3_error(exc, what="s3://b/k") is exc


def test_batch_takes_access_denied_as_permanent_not_as_credentials() -> None:
    error = aws.aws_error(client_error("AccessDeniedException", 403, "not allowed\nsecond line"), doing="submitting")
    assert isinstance(error, PermanentError) and error.exit_code == EXIT_PERMANENT
    assert error.headline == "AWS answered AccessDeniedException while submitting: not allowed"


@pytest.mark.parametrize(("exc", "kind", "headline"), [
    (NoRegionError(), UsageError, "no AWS region: pass --region or set AWS_REGION"),
    (client_error("ResourceNotFoundException", 400), UsageError, "log group g does not exist in this region"),
    (client_error("AccessDeniedException", 400, "no"), UsageError,
     "CloudWatch Logs refused the read (AccessDeniedException: no): check the credentials' logs:FilterLogEvents"),
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), EndpointUnreachable,
     "CloudWatch Logs endpoint does not answer"),
    (client_error("ThrottlingException", 400), RetryableError, "CloudWatch Logs kept answering ThrottlingException"),
])
def test_logs_errors_name_the_log_group_and_the_fix(exc: Exception, kind: type[Exception], headline: str) -> None:
    error = aws.logs_error(exc, log_group="g")
    assert type(error) is kind and headline in error.headline


# ---- back-off --------------------------------------------------------------------------------------


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
    with pytest.raises(PermanentError, match=code):
        no_sleep().call(call, doing="x")
    assert call.calls == 1


def test_backoff_gives_up_with_a_retryable_error() -> None:
    call = Flaky(*[client_error("TooManyRequestsException", 429)] * 3)
    backoff = Backoff(attempts=3, sleep=lambda _s: None)
    with pytest.raises(RetryableError) as caught:
        backoff.call(call, doing="listing")
    assert caught.value.exit_code == EXIT_RETRYABLE and call.calls == 3 and len(backoff.waits) == 2


def test_backoff_pauses_grow_capped_with_jitter() -> None:
    slept: list[float] = []
    backoff = Backoff(base_s=0.1, cap_s=0.3, sleep=slept.append, jitter=lambda: 0.0)
    for attempt in range(4):
        backoff.pause(attempt)
    assert slept == backoff.waits == [0.05, 0.1, 0.15, 0.15]
