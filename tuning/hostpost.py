"""A failed host's one event, posted to CloudWatch Logs with python3's standard library alone.

The ECS-optimized AL2023 AMI is built from the minimal AL2023 image and never installs the AWS CLI
(aws/amazon-ecs-ami: release-al2023.auto.pkrvars.hcl `source_ami_al2023 = "al2023-ami-minimal-..."`,
variables.pkr.hcl `packages_al2023` has no awscli); cloud-init's python3 is there (3.9 on AL2023: nothing newer
than 3.9's syntax here, tests/unit/test_hostpost.py). So the user data (tuning/hostscript.py, report_failure) runs
this file's source as `python3 -I -`, and it signs the two Logs calls itself (Signature Version 4), with the
instance role's credentials, the region and the partition's domain from IMDSv2.

Its inputs are environment variables: IOBATCH_IMDS (IMDS's base URL), IOBATCH_LOG_GROUP, IOBATCH_LOG_STREAM,
IOBATCH_MESSAGE, and, for tests only, IOBATCH_LOGS_ENDPOINT: honoured only when its host is a loopback address, so
the role's credentials can never be sent anywhere but to AWS or to this machine itself. Exit 0 when the event was
written, 1 with one line on stderr when not.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

# No proxy for IMDS (link-local) nor for Logs: the host reaches Logs as its VPC routes it (NAT or an endpoint).
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TIMEOUT_S = 5
ATTEMPTS = 3


def fetch(url: str, method: str = "GET", headers: dict[str, str] | None = None, data: bytes | None = None) -> bytes:
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    with OPENER.open(request, timeout=TIMEOUT_S) as response:
        body: bytes = response.read()
        return body


def metadata(imds: str) -> tuple[dict[str, Any], str, str]:
    """The instance role's credentials, the region and the partition's domain, through IMDSv2 (a session token
    from PUT /latest/api/token, then each path with it: "Use the Instance Metadata Service to access instance
    metadata", EC2 User Guide; the role's credentials at iam/security-credentials/<role>)."""
    token = fetch(f"{imds}/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "300"}).decode()

    def get(path: str) -> str:
        return fetch(f"{imds}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token}).decode().strip()

    role = get("iam/security-credentials/").splitlines()[0]
    credentials = json.loads(get(f"iam/security-credentials/{role}"))
    region, domain = get("placement/region"), get("services/domain")
    if not re.fullmatch(r"[a-z0-9-]+", region) or not re.fullmatch(r"[a-z0-9.-]+", domain):
        raise ValueError(f"IMDS gave region {region[:40]!r}, domain {domain[:40]!r}")
    return credentials, region, domain


def endpoint(region: str, domain: str) -> str:
    """CloudWatch Logs' regional endpoint (logs.<region>.<domain>), or the test's, which must be on loopback."""
    override = os.environ.get("IOBATCH_LOGS_ENDPOINT", "")
    if not override:
        return f"https://logs.{region}.{domain}/"
    host = urllib.parse.urlsplit(override).hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"IOBATCH_LOGS_ENDPOINT {override[:60]!r} is not on a loopback address: not sent")
    return override


def signed_headers(url: str, region: str, credentials: dict[str, Any], target: str, body: bytes) -> dict[str, str]:
    """The headers of a Signature Version 4 POST to `url` for service logs ("Create a signed AWS API request",
    IAM User Guide: canonical request, string to sign, the key derived from date/region/service/aws4_request)."""
    parts = urllib.parse.urlsplit(url)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    headers = {"content-type": "application/x-amz-json-1.1", "host": parts.netloc, "x-amz-date": stamp,
               "x-amz-target": target}
    if credentials.get("Token"):
        headers["x-amz-security-token"] = credentials["Token"]
    names = ";".join(sorted(headers))
    canonical = "\n".join(["POST", parts.path or "/", "", "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                           names, hashlib.sha256(body).hexdigest()])
    scope = f"{stamp[:8]}/{region}/logs/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + credentials["SecretAccessKey"]).encode()
    for part in (stamp[:8], region, "logs", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={credentials['AccessKeyId']}/{scope}, "
                                f"SignedHeaders={names}, Signature={signature}")
    return headers


def call(url: str, region: str, credentials: dict[str, Any], action: str, payload: dict[str, Any]) -> dict[str, Any]:
    """One Logs API call (JSON 1.1, X-Amz-Target Logs_20140328.<action>) and its answer, retried on throttling, 5xx
    and network errors; an existing stream is no error for CreateLogStream."""
    body = json.dumps(payload).encode()
    for attempt in range(ATTEMPTS):
        try:
            answer = fetch(url, "POST", signed_headers(url, region, credentials, f"Logs_20140328.{action}", body), body)
            found = json.loads(answer or b"{}")
            return found if isinstance(found, dict) else {}
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            if "ResourceAlreadyExistsException" in detail:
                return {}
            if (exc.code < 500 and "Throttling" not in detail) or attempt == ATTEMPTS - 1:
                raise ValueError(f"{action}: HTTP {exc.code} {detail[:200]}") from None
        except OSError:
            if attempt == ATTEMPTS - 1:
                raise
        time.sleep(1 + attempt)
    raise ValueError(f"{action}: no answer")


def post_event(imds: str, group: str, stream: str, message: str) -> None:
    """One event in `stream` of `group` (the stream made first; an existing one is no error)."""
    credentials, region, domain = metadata(imds)
    url = endpoint(region, domain)
    where = {"logGroupName": group, "logStreamName": stream}
    call(url, region, credentials, "CreateLogStream", where)
    event = {"timestamp": int(time.time() * 1000), "message": message}
    call(url, region, credentials, "PutLogEvents", {**where, "logEvents": [event]})


def main() -> int:
    env = os.environ
    try:
        post_event(env["IOBATCH_IMDS"], env["IOBATCH_LOG_GROUP"], env["IOBATCH_LOG_STREAM"], env["IOBATCH_MESSAGE"])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        print(f"iobatch-host: the failure was not written to the log group ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
