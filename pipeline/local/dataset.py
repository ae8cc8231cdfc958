"""Synthetic camera images for demos, tests and benchmarks.

Each image is a road scene (sky gradient, road, lane markings, a few vehicles) with sensor noise,
saved as PNG. The noise keeps PNG from compressing it much, so the file size follows the pixel count
closely, as a real camera frame's does. Images are deterministic for a given seed and index.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

# PNG (compress_level 1) of these scenes takes about this many bytes per pixel (3 channels, noise sigma 10).
BYTES_PER_PIXEL = 2.3
NOISE_SIGMA = 10.0
ASPECT = 4 / 3


@dataclass(frozen=True)
class DatasetSpec:
    images: int = 40
    image_mib: float = 25.0
    seed: int = 0

    def dimensions(self) -> tuple[int, int]:
        """(width, height) whose PNG is about image_mib MiB."""
        pixels = max(64 * 48, self.image_mib * 2**20 / BYTES_PER_PIXEL)
        height = int((pixels / ASPECT) ** 0.5)
        return max(64, int(height * ASPECT)), max(48, height)

    def key(self, index: int) -> str:
        return f"cam{index % 4}/frame-{index:06d}.png"

    @property
    def fingerprint(self) -> str:
        body = json.dumps({"images": self.images, "image_mib": self.image_mib, "seed": self.seed, "v": 1})
        return hashlib.sha256(body.encode()).hexdigest()[:12]


def render_scene(width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """A road scene as uint8 HxWx3."""
    rows = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    cols = np.linspace(-1.0, 1.0, width, dtype=np.float32)[None, :]
    horizon = 0.45 + rng.uniform(-0.05, 0.05)
    sky = np.stack([120 + 80 * rows, 160 + 60 * rows, 230 - 20 * rows], axis=-1) * np.ones((1, width, 1))
    image = sky.astype(np.float32)
    below = rows > horizon
    depth = np.clip((rows - horizon) / (1 - horizon), 0, 1)
    road = np.abs(cols) < (0.1 + 0.9 * depth)
    ground = np.where(road[..., None], np.array([90, 90, 95], np.float32), np.array([70, 120, 60], np.float32))
    image = np.where(below[..., None], ground, image)
    lane = (np.abs(np.abs(cols) - 0.33 * (0.1 + 0.9 * depth)) < 0.004 + 0.01 * depth) & below
    image[lane] = (235, 235, 225)
    for _ in range(int(rng.integers(2, 6))):
        y = int(height * rng.uniform(horizon + 0.05, 0.9))
        x = int(width * rng.uniform(0.2, 0.8))
        size = int(height * 0.04 + (y / height - horizon) * height * 0.25)
        color = rng.uniform(20, 240, size=3).astype(np.float32)
        image[max(0, y - size):y, max(0, x - size):min(width, x + size)] = color
    image += rng.standard_normal(image.shape, dtype=np.float32) * NOISE_SIGMA
    return np.clip(image, 0, 255).astype(np.uint8)


def render_png(spec: DatasetSpec, index: int) -> bytes:
    width, height = spec.dimensions()
    rng = np.random.default_rng([spec.seed, index])
    buffer = io.BytesIO()
    Image.fromarray(render_scene(width, height, rng)).save(buffer, "PNG", compress_level=1)
    return buffer.getvalue()


def _write_one(args: tuple[DatasetSpec, int, str]) -> int:
    spec, index, target = args
    data = render_png(spec, index)
    # Unique per process: two demos may fill the same cache at once; the rename makes either one's file whole.
    tmp = Path(f"{target}.{os.getpid()}.partial")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return len(data)


def generate(spec: DatasetSpec, out_dir: Path, *, workers: int | None = None,
             on_image: Callable[[int], None] | None = None) -> list[Path]:
    """Write the dataset under out_dir (keys as relative paths); reuse files already complete."""
    todo = [(spec, i, str(out_dir / spec.key(i))) for i in range(spec.images)
            if not (out_dir / spec.key(i)).exists()]
    if todo:
        with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
            for size in pool.map(_write_one, todo):
                if on_image:
                    on_image(size)
    return [out_dir / spec.key(i) for i in range(spec.images)]


def corrupt_copy(paths: Sequence[Path], index: int) -> None:
    """Truncate one image so that it no longer decodes (for bad-input tests and demos)."""
    path = paths[index]
    data = path.read_bytes()
    path.write_bytes(data[: max(16, len(data) // 3)])
