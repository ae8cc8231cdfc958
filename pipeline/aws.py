"""AWS failures as pipeline errors, in one place: one list of throttling and credential codes, one back-off.

Three callers talk to AWS through botocore: the job's S3 calls (pipeline/s3.py), submission and status
(CloudFormation and Batch, pipeline/submit/) and the report's CloudWatch Logs reader. They share the code
lists, `is_retryable` and `Backoff`; each has a translator below that turns a failure into one of
pipeline.errors with a one-line headline naming what it was doing.

Two failures look like others unless they are told apart here: a server that is not the AWS service at all
(a web server's 404 page would read as "the key does not exist", its 200 page as an empty listing), which
`refuse_foreign_answers` catches on every answer, and a region that does not exist (its endpoint never
answers, which would read as a network fault to retry), which the translators tell from an outage with
botocore's list of regions.
"""

from __future__ import annotations

import functools
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import botocore
import botocore.loaders
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    SSLError,
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
from pipeline.interface import ENV

#: Slow down: the same call succeeds later.
THROTTLING_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "TooManyRequestsException"})
#: Server-side and in-transit failures a retry can get past (botocore corrects clock skew on the retry).
TRANSIENT_CODES = frozenset({"RequestTimeout", "InternalError", "ServiceUnavailable", "500", "503",
                             "RequestTimeTooSkewed"})
#: The credentials are missing, expired or invalid: refreshing them is the fix.
CREDENTIAL_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException",
                              "InvalidToken", "UnrecognizedClientException", "InvalidClientTokenId",
                              "InvalidSignatureException", "RequestExpired"})
#: Of those, the ones that say the credentials ran out: inside a Batch child a new attempt gets fresh task-role
#: credentials, so the job counts these as transient (pipeline/s5cmd.py); a person is told to refresh them.
EXPIRED_CODES = frozenset({"ExpiredToken", "ExpiredTokenException", "RequestExpired"})
#: The credentials are valid but not allowed. S3 counts it with the credentials (a key from another account
#: is the usual cause); for Batch and CloudFormation it is a permission to grant.
DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException"})
#: The object or bucket is not there.
NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def refused(code: str, what: str) -> UsageError:
    """S3 refused the credentials (CREDENTIAL_CODES or DENIED_CODES): the same line for boto3 and s5cmd."""
    return UsageError(f"S3 refused the credentials for {what} ({code}): refresh or fix them")


def refused_code(text: str) -> str | None:
    """The credential or permission code an error's text names (s5cmd's output, boto3's upload errors), if any."""
    longest_first = sorted(CREDENTIAL_CODES | DENIED_CODES, key=lambda c: (-len(c), c))  # "...Exception" first
    return next((code for code in longest_first if code in text), None)


def error_code(exc: ClientError) -> str:
    """The AWS error code; the HTTP status when the answer carried none (an error without a body: HEAD)."""
    return str(exc.response.get("Error", {}).get("Code", "") or _status(exc) or "")


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


# ---- who answered: the AWS service, or some other HTTP server -----------------------------------------

#: Every answer of an AWS API carries its request id in a header: S3 in x-amz-request-id and x-amz-id-2
#: ("Common Response Headers", Amazon S3 API Reference), Batch, CloudFormation and CloudWatch Logs in
#: x-amzn-RequestId (botocore's JSON parsers take ResponseMetadata.RequestId from it). The S3 servers people
#: run instead send them too (versitygw, MinIO, LocalStack; moto the second).
REQUEST_ID_HEADERS = frozenset({"x-amz-request-id", "x-amz-id-2", "x-amzn-requestid"})
#: What a proxy or load balancer answers for a service behind it that is down, slow or busy: 502 Bad Gateway,
#: 503 Service Unavailable, 504 Gateway Timeout (RFC 9110, section 15.6) and 429 Too Many Requests (RFC 6585).
GATEWAY_STATUSES = frozenset({429, 502, 503, 504})
#: The service models' protocols whose answers are JSON (botocore's metadata "protocol"), and XML's media types.
JSON_PROTOCOLS = frozenset({"json", "rest-json"})
XML_TYPES = frozenset({"application/xml", "text/xml"})


def foreign_answer(status: int, headers: Mapping[str, str], code: str, protocol: str = "") -> str | None:
    """What shows that an HTTP answer came from some other server than an AWS API, or None when it may not.

    An API of a JSON protocol (`protocol`, the service model's: CloudWatch Logs, Batch) never answers in XML: an
    XML answer is another service's, an S3 server's most likely, request id or not. Without a request id, a web
    page or an error without an AWS error code is some other server's. A gateway's status without one is left
    to the retry rules: a proxy or load balancer in front of a service that is down or busy answers so, and a
    later attempt can get past it.
    """
    fields = {name.lower(): value for name, value in headers.items()}
    server = fields.get("server", "")[:40]
    said = f" from server {server!r}" if server else ""
    kind = fields.get("content-type", "").split(";")[0].strip().lower()
    if protocol in JSON_PROTOCOLS and kind in XML_TYPES:
        return f"HTTP {status}{said}, an XML answer where this API answers JSON (an S3 server?)"
    if REQUEST_ID_HEADERS & fields.keys() or status in GATEWAY_STATUSES:
        return None
    if fields.get("content-type", "").lower().startswith("text/html"):
        return f"HTTP {status}{said}, a web page, with no AWS request id"
    if status >= 300 and not code.strip("0123456789"):
        return f"HTTP {status}{said}, with no AWS error code or request id"
    return None


def refuse_foreign_answers(events: Any, *, service: str, fix: str) -> None:
    """Make every call of a client (its `meta.events`) or of a session's clients (`events`) fail with one
    line (UsageError) when the server answering is not `service`; `fix` names the flag to correct.

    botocore emits needs-retry.SERVICE.OPERATION for every answer, errors included, right after parsing it
    (botocore/endpoint.py, Endpoint._send_request); handlers of a longer event name run before shorter ones
    (botocore/hooks.py, prefix_search), so the check runs before the retry rules and before S3's redirect
    handler (needs-retry.s3), which a web server's redirects would send round in circles.
    """

    def check(response: tuple[Any, Mapping[str, Any]] | None, operation: Any, **_: Any) -> None:
        if response is None:  # no answer at all: the translators judge the connection error
            return
        http_response, parsed = response
        error = parsed.get("Error") or {}
        why = foreign_answer(int(http_response.status_code), http_response.headers, str(error.get("Code") or ""),
                             str(operation.metadata.get("protocol") or ""))
        if why:
            raise UsageError(f"{origin(str(http_response.url))} is not {service}: it answered {operation.name} "
                             f"with {why}: {fix}")

    events.register_first("needs-retry.*.*", check)


def origin(url: str) -> str:
    """scheme://HOST[:PORT] of a URL, without its user info, path or query: how an error line names a server."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _said(said: object) -> str:
    """An exception's (or a URL's) text for an error line, any URL's user info hidden: botocore names the URLs
    it tried, and AWS_ENDPOINT_URL is not checked here."""
    return re.sub(r"(?<=://)[^/\s@]*@", "***@", str(said))


# ---- TLS to a plain-HTTP server: a wrong scheme, not an outage ----------------------------------------------

#: What a TLS client meets when the server answers in plain HTTP: OpenSSL's alert (1.1 and 3.0 "wrong version
#: number", 3.2 and later "record layer failure", as botocore's SSLError carries it) and Go's (s5cmd's lines).
PLAIN_HTTP_SIGNS = ("wrong version number", "wrong_version_number", "record layer failure",
                    "first record does not look like a tls handshake", "server gave http response to https client")


def plain_http(text: str) -> bool:
    """Whether a TLS failure's text says the server speaks plain HTTP (PLAIN_HTTP_SIGNS)."""
    lowered = text.lower()
    return any(sign in lowered for sign in PLAIN_HTTP_SIGNS)


def https_to_plain_http(url: str, flag: str) -> UsageError:
    """An https endpoint whose server speaks plain HTTP: no retry can get past it (64), the scheme is the fix."""
    return UsageError(f"{origin(url)} answers in plain HTTP, not TLS: its scheme is http, not https; write "
                      f"{flag} as http://...")


def _wrong_scheme(exc: Exception, flag: str) -> UsageError | None:
    if isinstance(exc, SSLError) and plain_http(str(exc)):
        return https_to_plain_http(str(exc.kwargs.get("endpoint_url") or "https://?"), flag)
    return None


# ---- regions ----------------------------------------------------------------------------------------


@functools.cache
def _partitions() -> tuple[tuple[re.Pattern[str], frozenset[str]], ...]:
    """Each AWS partition's pattern of region names and its known regions: botocore's partitions.json, the
    data its endpoint rules resolve a region with ("regionRegex" and "regions" of each partition)."""
    data = botocore.loaders.create_loader().load_data("partitions")
    return tuple((re.compile(part["regionRegex"]), frozenset(part["regions"])) for part in data["partitions"])


def region_shaped(name: str) -> bool:
    """A name some AWS partition could give a region: us-east-1, cn-north-1, us-gov-west-1, eusc-de-east-1."""
    return re.fullmatch(r"[a-z0-9-]+", name) is not None and any(p.match(name) for p, _ in _partitions())


def known_region(name: str) -> bool:
    """A region this botocore lists. A region opened later is shaped like one and works, but is not listed."""
    return region_shaped(name) and any(name in regions for _, regions in _partitions())


def _unknown_region(endpoint_url: str | None) -> str | None:
    """The region named in an AWS endpoint's host (batch.us-east-1.amazonaws.com) when botocore lists no such
    region; None for a known region or an endpoint that names none (--s3-endpoint http://127.0.0.1:9000)."""
    for label in (urlsplit(endpoint_url or "").hostname or "").split("."):
        if region_shaped(label):
            return None if known_region(label) else label
    return None


def _no_such_region(exc: EndpointConnectionError) -> UsageError | None:
    """An endpoint that does not answer in a region botocore does not list: a wrong region, not an outage."""
    url = str(exc.kwargs.get("endpoint_url") or "")
    region = _unknown_region(url)
    if region is None:
        return None
    return UsageError(f"region {region!r} does not exist: botocore {botocore.__version__} lists no such region "
                      f"and {urlsplit(url).hostname} does not answer; pass --region (or set AWS_REGION) to a "
                      "region such as us-east-1")


# ---- S3 (the job) -----------------------------------------------------------------------------------


def s3_error(exc: Exception, *, what: str) -> Exception:
    """An S3 failure as one of our errors, naming `what` (a bucket, key or URI); other exceptions as given."""
    if isinstance(exc, NoCredentialsError):
        return UsageError("no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile")
    if isinstance(exc, EndpointConnectionError):
        return _no_such_region(exc) or EndpointUnreachable(
            f"S3 endpoint does not answer for {what} ({_said(exc.kwargs.get('endpoint_url'))}): check "
            "--s3-endpoint and the network")
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code == "NoSuchBucket":
            return MissingObjectError(f"bucket of {what} does not exist: create it or fix the URI")
        if code in NOT_FOUND_CODES:
            return MissingObjectError(f"{what} does not exist: fix the manifest or upload it")
        if code in CREDENTIAL_CODES or code in DENIED_CODES:
            return refused(code, what)
        if is_retryable(exc):
            return RetryableError(f"S3 answered {code} for {what}: retry later")
        return PermanentError(f"S3 answered {code} for {what}: {_message(exc)}")
    if isinstance(exc, S3UploadFailedError):
        # boto3 wraps the last ClientError's text; permanent codes stay permanent.
        text = str(exc)
        if refusal := refused_code(text):
            return refused(refusal, what)
        if "(NoSuchBucket)" in text:
            return MissingObjectError(f"bucket of {what} does not exist: create it or fix the URI")
        if "(BadDigest)" in text or "(InvalidDigest)" in text:
            return TransferError(f"S3 rejected the upload of {what} as corrupt in transit (BadDigest): retry")
        return TransferError(f"uploading {what} failed: {text[:200]}")
    if wrong := _wrong_scheme(exc, f"--s3-endpoint (a job: {ENV.S3_ENDPOINT})"):
        return wrong
    if isinstance(exc, BotoCoreError):
        return RetryableError(f"S3 request for {what} failed: {_said(exc)}")
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
    if isinstance(exc, EndpointConnectionError) and (wrong := _no_such_region(exc)):
        return wrong
    if wrong := _wrong_scheme(exc, "AWS_ENDPOINT_URL"):
        return wrong
    if isinstance(exc, BotoCoreError):
        return RetryableError(f"AWS request failed while {doing}: {_said(exc)}")
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
        return _no_such_region(exc) or EndpointUnreachable(
            f"CloudWatch Logs endpoint does not answer ({_said(exc)}): check --region, --logs-endpoint and the "
            "network")
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code == "ResourceNotFoundException":
            return UsageError(f"log group {log_group} does not exist in this region: check --from-cloudwatch "
                              "and --region (the stack's output names the group)")
        if is_retryable(exc):
            return RetryableError(f"CloudWatch Logs kept answering {code} while reading {log_group}: wait a "
                                  "minute and retry")
        if code in CREDENTIAL_CODES:
            return UsageError(f"CloudWatch Logs refused the credentials ({code}): they are expired or invalid; "
                              "refresh them")
        if code in DENIED_CODES:
            return UsageError(f"CloudWatch Logs refused the read of {log_group} ({code}): grant the credentials "
                              "logs:FilterLogEvents on it")
        message = _message(exc).splitlines()[0][:160] if _message(exc) else ""
        return UsageError(f"CloudWatch Logs answered {code} while reading {log_group}: {message}".rstrip(": "))
    if wrong := _wrong_scheme(exc, "--logs-endpoint"):
        return wrong
    if isinstance(exc, BotoCoreError):
        return EndpointUnreachable(f"CloudWatch Logs read failed ({_said(exc)}): retry")
    if isinstance(exc, IobatchError):
        return exc
    raise exc
