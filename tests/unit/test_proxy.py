"""The throttling proxy's token bucket."""

from __future__ import annotations

import pytest

from pipeline.local.proxy import TokenBucket


def test_token_bucket_paces_to_the_rate() -> None:
    bucket = TokenBucket(1000.0, burst=100.0, now=0.0)
    assert bucket.delay_for(100, 0.0) == 0.0
    assert bucket.delay_for(500, 0.0) == pytest.approx(0.5)
    # after waiting out the debt, the bucket refills at the rate
    assert bucket.delay_for(100, 0.6) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        TokenBucket(0)
