from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.errors import BadImageError
from pipeline.imaging import INDEX_NAME, SHARD_NAME, normalise, process_image, write_shard


def _png(path: Path, seed: int, size: tuple[int, int] = (80, 60)) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


def test_normalise_gives_zero_mean_unit_std_per_channel() -> None:
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)
    out, mean, std = normalise(pixels)
    assert out.dtype == np.float16 and out.shape == (32, 48, 3)
    np.testing.assert_allclose(out.astype(np.float32).mean(axis=(0, 1)), 0, atol=2e-3)
    np.testing.assert_allclose(out.astype(np.float32).std(axis=(0, 1)), 1, atol=2e-3)
    np.testing.assert_allclose(mean, pixels.mean(axis=(0, 1)) / 255, rtol=1e-5)
    np.testing.assert_allclose(std, (pixels / 255).std(axis=(0, 1)), rtol=1e-4)


def test_flat_image_does_not_divide_by_zero() -> None:
    out, _, std = normalise(np.full((4, 4, 3), 7, np.uint8))
    assert np.all(std == 0) and np.all(out == 0)


def test_process_resizes_to_training_size(tmp_path: Path) -> None:
    sample = process_image(_png(tmp_path / "a.png", 0), (32, 24), key="cam/a.png")
    assert sample.array.shape == (24, 32, 3)
    assert sample.source_size == (80, 60)


def test_undecodable_image_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG not really")
    with pytest.raises(BadImageError, match=re.escape("image cam/bad.png does not decode")):
        process_image(bad, (32, 24), key="cam/bad.png")


def test_shard_is_deterministic_and_complete(tmp_path: Path) -> None:
    items = [(f"cam/{i}.png", _png(tmp_path / f"{i}.png", i)) for i in range(3)]
    first = write_shard(items, tmp_path / "one", size=(32, 24), child="part-00000")
    second = write_shard(list(reversed(items)), tmp_path / "two", size=(32, 24), child="part-00000")
    assert first.images == second.images == 3
    for name in (SHARD_NAME, INDEX_NAME):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    with tarfile.open(tmp_path / "one" / SHARD_NAME) as tar:
        names = tar.getnames()
        assert names == ["00000.npy", "00000.json", "00001.npy", "00001.json", "00002.npy", "00002.json"]
        array = np.load(io.BytesIO(tar.extractfile("00001.npy").read()))  # type: ignore[union-attr]
        assert array.shape == (24, 32, 3)
    index = json.loads((tmp_path / "one" / INDEX_NAME).read_text())
    assert [s["key"] for s in index["samples"]] == ["cam/0.png", "cam/1.png", "cam/2.png"]
    assert not list((tmp_path / "one").glob("*.partial"))


def test_bad_image_fails_or_is_recorded(tmp_path: Path) -> None:
    good = _png(tmp_path / "good.png", 0)
    bad = tmp_path / "bad.png"
    bad.write_bytes(good.read_bytes()[:100])
    items = [("a/good.png", good), ("a/bad.png", bad)]
    with pytest.raises(BadImageError):
        write_shard(items, tmp_path / "strict", size=(16, 16))
    assert not (tmp_path / "strict" / SHARD_NAME).exists()
    result = write_shard(items, tmp_path / "lenient", size=(16, 16), skip_bad_images=True)
    assert result.images == 1
    index = json.loads((tmp_path / "lenient" / INDEX_NAME).read_text())
    assert index["skipped"][0]["key"] == "a/bad.png"
