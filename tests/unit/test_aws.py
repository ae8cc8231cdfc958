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
     "CloudWatch Logs refused the read of g (AccessDeniedException): grant the credentials logs:FilterLogEvents"),
    (client_error("InvalidParameterException", 400, "startTime is wrong\n<html>"), UsageError,
     "CloudWatch Logs answered InvalidParameterException while reading g: startTime is wrong"),
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


# ---- who answered ----------------------------------------------------------------------------------

PAGE = {"Content-Type": "text/html; charset=utf-8", "Server": "nginx/1.24"}
XML = {"Content-Type": "application/xml"}


@pytest.mark.parametrize(("status", "headers", "code", "why"), [
    (404, PAGE, "", "HTTP 404 from server 'nginx/1.24', a web page, with no AWS request id"),
    (200, PAGE, "", "HTTP 200 from server 'nginx/1.24', a web page"),  # an empty listing, or no events
    (500, PAGE, "500", "HTTP 500"),  # botocore turns a 200 page into 500 for S3 ListBuckets
    (301, {"Location": "/bkt/"}, "301", "HTTP 301, with no AWS error code or request id"),
    (405, XML, "", "HTTP 405, with no AWS error code"),
    # answers an AWS API or a look-alike gives
    (404, {**PAGE, "x-amz-request-id": "R"}, "", None),
    (404, {**XML, "X-Amzn-RequestId": "R"}, "404", None),  # moto's HEAD: the id only in the header
    (404, XML, "NoSuchKey", None),  # a look-alike that sends no request id but speaks S3
    (200, {"Content-Type": "application/x-amz-json-1.1"}, "", None),
    # a proxy in front of a service that is down or busy: left to the retry rules
    (503, PAGE, "", None), (502, PAGE, "", None), (504, PAGE, "", None), (429, PAGE, "", None),
])
def test_foreign_answers_are_told_from_aws_ones(status: int, headers: dict[str, str], code: str,
                                                why: str | None) -> None:
    found = aws.foreign_answer(status, headers, code)
    assert (found is None) == (why is None) and (why is None or why in str(found)), found


@pytest.mark.parametrize(("name", "shaped", "known"), [
    ("us-east-1", True, True), ("ap-southeast-7", True, True), ("us-gov-west-1", True, True),
    ("cn-north-1", True, True), ("eusc-de-east-1", True, True),
    ("us-nowhere-9", True, False),  # shaped like a region of the aws partition, but not one
    ("xx-nowhere-9", False, False), ("US-EAST-1", False, False), ("us-east", False, False), ("", False, False),
    ("aws-global", False, False),  # botocore lists it among the regions; it names no endpoint of its own
])
def test_regions_are_judged_by_botocores_partitions(name: str, shaped: bool, known: bool) -> None:
    assert (aws.region_shaped(name), aws.known_region(name)) == (shaped, known)


@pytest.mark.parametrize("caller", sorted(TRANSLATORS))
def test_an_endpoint_that_does_not_answer_in_an_unknown_region_is_a_wrong_region(caller: str) -> None:
    host = {"s3": "s3.us-nowhere-9.amazonaws.com", "batch": "batch.us-nowhere-9.amazonaws.com",
            "logs": "logs.us-nowhere-9.amazonaws.com"}[caller]
    error = TRANSLATORS[caller](EndpointConnectionError(endpoint_url=f"https://{host}/"))
    assert isinstance(error, UsageError) and error.exit_code == EXIT_USAGE, error
    assert error.headline.startswith("region 'us-nowhere-9' does not exist") and "--region" in error.headline


@pytest.mark.parametrize("caller", sorted(TRANSLATORS))
@pytest.mark.parametrize("url", ["https://batch.us-east-1.amazonaws.com/v1/describejobs", "http://127.0.0.1:9",
                                 "https://s3.cn-north-1.amazonaws.com.cn/"])
def test_an_endpoint_that_does_not_answer_in_a_known_region_is_transient(caller: str, url: str) -> None:
    error = TRANSLATORS[caller](EndpointConnectionError(endpoint_url=url))
    assert isinstance(error, RetryableError) and error.exit_code == EXIT_RETRYABLE, error
