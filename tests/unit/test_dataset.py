"""The synthetic dataset: deterministic PNGs near the asked size."""

from __future__ import annotations

import io

from PIL import Image

from pipeline.local.dataset import DatasetSpec, render_png


def test_images_are_deterministic_and_near_the_asked_size() -> None:
    spec = DatasetSpec(images=2, image_mib=0.25, seed=3)
    first = render_png(spec, 1)
    assert first == render_png(spec, 1)
    assert first != render_png(spec, 0)
    assert 0.5 < len(first) / (0.25 * 2**20) < 1.5
    with Image.open(io.BytesIO(first)) as image:
        assert image.size == spec.dimensions()
