"""pipeline.submit.submission: SubmitJob calls (fake clients)."""

from __future__ import annotations

import pytest

from pipeline import submit as sub
from pipeline.aws import Backoff
from pipeline.errors import RetryableError
from pipeline.settings import S3Uri
from tests.support.aws import Flaky, client_error


def _request() -> sub.SubmitRequest:
    return sub.SubmitRequest.build(manifest=None, prefix="s3://inb/img/", images_per_child=5, output=None,
                                   input_bucket="inb", output_bucket="outb")


def test_submit_never_retries_a_5xx_which_may_have_created_the_job() -> None:
    class Batch:
        def __init__(self) -> None:
            self.submit_job = Flaky(client_error("TooManyRequestsException", 429), client_error("Server", 500))

    batch = Batch()
    planned = sub.plan_requests(_request(), sub.BatchTarget("q", "d"), manifest=S3Uri("obk", "m"), children=3,
                                images=15)
    with pytest.raises(RetryableError):
        sub.submit_planned(batch, planned, Backoff(retry_server_errors=False, sleep=lambda _s: None))
    assert batch.submit_job.calls == 2  # the throttle was retried, the 500 was not
