from __future__ import annotations

import io

import pytest
from PIL import Image

from pipeline.local.dataset import DatasetSpec, render_png
from pipeline.local.proxy import TokenBucket

pytestmark = pytest.mark.unit


def test_images_are_deterministic_and_near_the_asked_size() -> None:
    spec = DatasetSpec(images=2, image_mib=0.25, seed=3)
    first = render_png(spec, 1)
    assert first == render_png(spec, 1)
    assert first != render_png(spec, 0)
    assert 0.5 < len(first) / (0.25 * 2**20) < 1.5
    with Image.open(io.BytesIO(first)) as image:
        assert image.size == spec.dimensions()


def test_token_bucket_paces_to_the_rate() -> None:
    bucket = TokenBucket(1000.0, burst=100.0, now=0.0)
    assert bucket.delay_for(100, 0.0) == 0.0
    assert bucket.delay_for(500, 0.0) == pytest.approx(0.5)
    # after waiting out the debt, the bucket refills at the rate
    assert bucket.delay_for(100, 0.6) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        TokenBucket(0)
