"""AWS failures as pipeline errors, in one place: one list of throttling and credential codes, one back-off.

Three callers talk to AWS through botocore: the job's S3 calls (pipeline/s3.py), submission and status
(CloudFormation and Batch, pipeline/submit/) and the report's CloudWatch Logs reader. They share the code
lists, `is_retryable` and `Backoff`; each has a translator below that turns a failure into one of
pipeline.errors with a one-line headline naming what it was doing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
)

from pipeline.errors import (
    EndpointUnreachable,
    IobatchError,
    MissingObjectError,
    PermanentError,
    RetryableError,
    TransferError,
    UsageError,
)

#: Slow down: the same call succeeds later.
THROTTLING_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "TooManyRequestsException"})
#: Server-side and in-transit failures a retry can get past (botocore corrects clock skew on the retry).
TRANSIENT_CODES = frozenset({"RequestTimeout", "InternalError", "ServiceUnavailable", "500", "503",
                             "RequestTimeTooSkewed"})
#: The credentials are missing, expired or invalid: refreshing them is the fix.
CREDENTIAL_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException",
                              "InvalidToken", "UnrecognizedClientException", "InvalidClientTokenId",
                              "InvalidSignatureException", "RequestExpired"})
#: The credentials are valid but not allowed. S3 counts it with the credentials (a key from another account
#: is the usual cause); for Batch and CloudFormation it is a permission to grant.
DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException"})
#: The object or bucket is not there.
NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", "") or "")


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def is_throttling(exc: Exception) -> bool:
    """AWS asked us to slow down."""
    return isinstance(exc, ClientError) and (error_code(exc) in THROTTLING_CODES or _status(exc) == 429)


def is_retryable(exc: Exception) -> bool:
    """Throttling, 5xx and transient answers only: anything else would fail the same way again."""
    if not isinstance(exc, ClientError):
        return False
    return is_throttling(exc) or error_code(exc) in TRANSIENT_CODES or _status(exc) >= 500


# ---- S3 (the job) -----------------------------------------------------------------------------------


def s3_error(exc: Exception, *, what: str) -> Exception:
    """An S3 failure as one of our errors, naming `what` (a bucket, key or URI); other exceptions as given."""
    if isinstance(exc, NoCredentialsError):
        return UsageError("no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile")
    if isinstance(exc, EndpointConnectionError):
        return EndpointUnreachable(f"S3 endpoint does not answer for {what} ({exc.kwargs.get('endpoint_url')}): "
                                   "check --s3-endpoint and the network")
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code == "NoSuchBucket":
            return MissingObjectError(f"bucket of {what} does not exist: create it or fix the URI")
        if code in NOT_FOUND_CODES:
            return MissingObjectError(f"{what} does not exist: fix the manifest or upload it")
        if code in CREDENTIAL_CODES or code in DENIED_CODES:
            return UsageError(f"S3 refused the credentials for {what} ({code}): refresh or fix them")
        if is_retryable(exc):
            return RetryableError(f"S3 answered {code} for {what}: retry later")
        return PermanentError(f"S3 answered {code} for {what}: {_message(exc)}")
    if isinstance(exc, S3UploadFailedError):
        # boto3 wraps the last ClientError's text; permanent codes stay permanent.
        text = str(exc)
        for code in sorted(CREDENTIAL_CODES | DENIED_CODES):
            if f"({code})" in text:
                return UsageError(f"S3 refused the credentials for {what} ({code}): refresh or fix them")
        if "(NoSuchBucket)" in text:
            return MissingObjectError(f"bucket of {what} does not exist: create it or fix the URI")
        if "(BadDigest)" in text or "(InvalidDigest)" in text:
            return TransferError(f"S3 rejected the upload of {what} as corrupt in transit (BadDigest): retry")
        return TransferError(f"uploading {what} failed: {text[:200]}")
    if isinstance(exc, BotoCoreError):
        return RetryableError(f"S3 request for {what} failed: {exc}")
    return exc


# ---- Batch and CloudFormation (submission and status) -----------------------------------------------


def aws_error(exc: Exception, *, doing: str) -> IobatchError:
    """A botocore failure while `doing` something, as one of our errors with a one-line headline."""
    if isinstance(exc, NoCredentialsError):
        return UsageError(f"no AWS credentials found while {doing}: set AWS_PROFILE (or "
                          "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), or use --local")
    if isinstance(exc, ClientError):
        code = error_code(exc)
        message = _message(exc).splitlines()[0] if _message(exc) else ""
        if code in CREDENTIAL_CODES:
            return UsageError(f"AWS refused the credentials while {doing} ({code}): they are expired or "
                              "invalid; refresh them (e.g. `aws sso login`) and submit again")
        if is_retryable(exc):
            return RetryableError(f"AWS kept answering {code} while {doing}: wait a minute and retry")
        return PermanentError(f"AWS answered {code} while {doing}: {message}".rstrip(": "))
    if isinstance(exc, BotoCoreError):
        return RetryableError(f"AWS request failed while {doing}: {exc}")
    if isinstance(exc, IobatchError):
        return exc
    raise exc


@dataclass
class Backoff:
    """Retry a call on throttling and 5xx with capped exponential back-off and jitter."""

    attempts: int = 8
    base_s: float = 0.5
    cap_s: float = 20.0
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = random.random
    retry_server_errors: bool = True  # SubmitJob sets False: a 5xx may have created the job already
    waits: list[float] = field(default_factory=list)

    def pause(self, attempt: int) -> None:
        """Sleep before retry number `attempt` + 1: half to all of base * 2^attempt, at most cap_s."""
        wait = min(self.cap_s, self.base_s * (2 ** attempt)) * (0.5 + 0.5 * self.jitter())
        self.waits.append(wait)
        self.sleep(wait)

    def call(self, fn: Callable[..., Any], *, doing: str, **kwargs: Any) -> Any:
        for attempt in range(self.attempts):
            try:
                return fn(**kwargs)
            except ClientError as exc:
                retry = is_throttling(exc) if not self.retry_server_errors else is_retryable(exc)
                if not retry or attempt == self.attempts - 1:
                    raise aws_error(exc, doing=doing) from None
                self.pause(attempt)
            except BotoCoreError as exc:
                raise aws_error(exc, doing=doing) from None
        raise AssertionError("unreachable")


# ---- CloudWatch Logs (the report) -------------------------------------------------------------------


def logs_error(exc: Exception, *, log_group: str) -> IobatchError:
    """A failure reading `log_group` from CloudWatch Logs, as one of our errors."""
    if isinstance(exc, NoRegionError):
        return UsageError("no AWS region: pass --region or set AWS_REGION")
    if isinstance(exc, NoCredentialsError):
        return UsageError("no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
    if isinstance(exc, EndpointConnectionError):
        return EndpointUnreachable(f"CloudWatch Logs endpoint does not answer ({exc}): check --region, "
                                   "--logs-endpoint and the network")
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code == "ResourceNotFoundException":
            return UsageError(f"log group {log_group} does not exist in this region: check --from-cloudwatch "
                              "and --region (the stack's output names the group)")
        if is_retryable(exc):
            return RetryableError(f"CloudWatch Logs kept answering {code} while reading {log_group}: wait a "
                                  "minute and retry")
        error = exc.response.get("Error", {})
        return UsageError(f"CloudWatch Logs refused the read ({error.get('Code')}: {error.get('Message')}): "
                          "check the credentials' logs:FilterLogEvents permission")
    if isinstance(exc, BotoCoreError):
        return EndpointUnreachable(f"CloudWatch Logs read failed ({exc}): retry")
    if isinstance(exc, IobatchError):
        return exc
    raise exc
