"""Fakes for botocore answers: client errors, calls that fail a few times, a back-off that never sleeps."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from pipeline.aws import Backoff


def client_error(code: str, status: int = 400, message: str = "m") -> ClientError:
    """The ClientError botocore raises for an AWS answer with this code and HTTP status."""
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


def no_sleep() -> Backoff:
    """The default back-off, without sleeping and with the largest jitter (so waits are exact)."""
    return Backoff(sleep=lambda _s: None, jitter=lambda: 1.0)


class Flaky:
    """A client method that raises the given failures in turn, then answers with its arguments."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return {"ok": kwargs}
