"""Endpoint URLs a person gives (--s3-endpoint, --logs-endpoint, IOBATCH_S3_ENDPOINT): one check for every flag
and variable that takes one, made before anything connects, and one way to show one.

An endpoint is scheme://HOST[:PORT], and nothing else:

- no user name or password (http://USER:SECRET@host): the AWS libraries sign with AWS's credentials, never the
  URL's, and an endpoint is written to run.json, the report and error lines, where a secret must not land. The
  refusal does not echo it either;
- http or https only (what botocore and s5cmd speak);
- a host botocore accepts (it refuses any other with a ValueError of its own when the client is made);
- no path, query or fragment: boto3 puts a path before every bucket, and the answer blames the bucket.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pipeline.errors import UsageError

__all__ = ["checked_endpoint", "endpoint_problem", "shown_endpoint"]

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
