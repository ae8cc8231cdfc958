"""The built-in process command (`iobatch process IN OUT`, the default of the process stage: pipeline/process.py):
decode camera images, resize them to the training resolution, normalise them, and write one training shard.

A shard is a WebDataset-style tar: for sample NNNNN, `NNNNN.npy` (float16, HxWx3, per-image standardised)
and `NNNNN.json` (its source key and statistics). Beside it, `index.json` lists every sample and every
skipped image. The output is byte-for-byte deterministic: fixed tar metadata, sorted samples, no clocks.
Works on local paths only; it knows nothing of S3.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from PIL import Image, UnidentifiedImageError

from pipeline.errors import BadImageError, PermanentError
from profiling.files import kind_of, read_regular

SHARD_NAME = "shard.tar"
INDEX_NAME = "index.json"
INDEX_SCHEMA = 1


@dataclass(frozen=True)
class Sample:
    """One processed image: the array that goes into the shard and what the index says of it."""

    array: np.ndarray  # float16, H x W x 3, zero mean and unit variance per channel
    width: int
    height: int
    source_size: tuple[int, int]
    mean: tuple[float, float, float]  # per channel, of the resized image in [0, 1], before normalising
    std: tuple[float, float, float]


@dataclass
class ShardResult:
    images: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    shard_bytes: int = 0
    index_bytes: int = 0


def normalise(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 HxWx3 -> (float16 standardised array, per-channel mean, per-channel std) over [0, 1] values."""
    values = pixels.astype(np.float32) / 255.0
    mean = values.mean(axis=(0, 1))
    std = values.std(axis=(0, 1))
    safe_std = np.where(std < 1e-6, 1.0, std)
    return ((values - mean) / safe_std).astype(np.float16), mean, std


def process_image(source: Path | BinaryIO, size: tuple[int, int], *, key: str) -> Sample:
    """Decode, convert to RGB, resize to `size` (width, height) and normalise. BadImageError names the key."""
    try:
        with Image.open(source) as image:
            source_size = image.size
            rgb = image.convert("RGB")
            resized = rgb.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise BadImageError(f"image {key} does not decode ({type(exc).__name__}): fix or remove it, "
                            "or run with --skip-bad-images") from None
    array, mean, std = normalise(np.asarray(resized, dtype=np.uint8))
    return Sample(array, size[0], size[1], source_size,
                  tuple(round(float(v), 6) for v in mean),  # type: ignore[arg-type]
                  tuple(round(float(v), 6) for v in std))  # type: ignore[arg-type]


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def write_shard(
    items: Sequence[tuple[str, Path]],
    out_dir: Path,
    *,
    size: tuple[int, int],
    skip_bad_images: bool = False,
    child: str = "",
    check: Callable[[str, bytes], None] | None = None,
) -> ShardResult:
    """Process (key, local path) pairs in key order into out_dir/shard.tar and out_dir/index.json.

    Each image is read once; `check(key, data)` sees those bytes before they are decoded (the job
    verifies them against the batch's ETag there, rather than reading every image a second time).
    Both files are written under temporary names and renamed into place, so a killed or failed stage
    never leaves a shard that looks complete.
    """
    _check_regular(items)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = ShardResult()
    index: dict[str, Any] = {"schema": INDEX_SCHEMA, "child": child, "train_size": list(size),
                             "format": "npy float16 HxWx3, per-image standardised", "samples": [], "skipped": []}
    shard_tmp = out_dir / (SHARD_NAME + ".partial")
    try:
        _write_samples(shard_tmp, items, size, skip_bad_images, check, index, result)
    except BaseException:
        shard_tmp.unlink(missing_ok=True)
        raise
    index_bytes = (json.dumps(index, indent=1, sort_keys=True) + "\n").encode()
    index_tmp = out_dir / (INDEX_NAME + ".partial")
    index_tmp.write_bytes(index_bytes)
    os.replace(shard_tmp, out_dir / SHARD_NAME)
    os.replace(index_tmp, out_dir / INDEX_NAME)
    result.shard_bytes = (out_dir / SHARD_NAME).stat().st_size
    result.index_bytes = len(index_bytes)
    return result


def _check_regular(items: Sequence[tuple[str, Path]]) -> None:
    """Every input is a regular file (or a link to one), judged by stat before any is read: a FIFO is never
    opened (its open would wait for a writer), and a FIFO, device, socket or directory is one error naming it
    (65), never a sample silently missing from the shard."""
    for key, path in items:
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise PermanentError(f"image {key} ({path}) does not exist (a broken symbolic link?): remove it or give "
                                 "the file") from None
        except OSError as exc:
            raise PermanentError(f"image {key} ({path}) cannot be read ({exc.strerror}): give an image file") from None
        if not stat.S_ISREG(mode):
            raise PermanentError(f"image {key} ({path}) is {kind_of(mode)}, not a regular file: a shard is made of "
                                 "image files; remove it from the folder")


def _write_samples(shard_tmp: Path, items: Sequence[tuple[str, Path]], size: tuple[int, int],
                   skip_bad_images: bool, check: Callable[[str, bytes], None] | None,
                   index: dict[str, Any], result: ShardResult) -> None:
    with tarfile.open(shard_tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, path in sorted(items):
            data = read_regular(path)  # an image that is a FIFO is refused, not waited on
            if check is not None:
                check(key, data)
            try:
                sample = process_image(io.BytesIO(data), size, key=key)
            except BadImageError as exc:
                if not skip_bad_images:
                    raise
                index["skipped"].append({"key": key, "error": exc.headline})
                result.skipped.append({"key": key, "error": exc.headline})
                continue
            name = f"{result.images:05d}"
            payload = _npy_bytes(sample.array)
            meta = {"key": key, "source_width": sample.source_size[0], "source_height": sample.source_size[1],
                    "source_bytes": len(data), "mean": sample.mean, "std": sample.std}
            _add(tar, f"{name}.npy", payload)
            _add(tar, f"{name}.json", json.dumps(meta, sort_keys=True).encode())
            index["samples"].append({"sample": name, "sha256": hashlib.sha256(payload).hexdigest(), **meta})
            result.images += 1


def process_directory(input_dir: Path, output_dir: Path, *, images: Sequence[Mapping[str, Any]] | None,
                      size: tuple[int, int], skip_bad_images: bool = False, child: str = "",
                      check: Callable[[Mapping[str, Any], bytes], None] | None = None) -> ShardResult:
    """The built-in command: the images of `input_dir` into one shard in `output_dir`.

    `images` are the job's lines for them (pipeline.process.write_images_file: file, key, size, etag), which
    name each sample by its S3 key; without them (a folder by hand) each image is named by its file name.
    `check(line, data)` sees each image's bytes before they are decoded.
    """
    if images is None:  # every entry, whatever it is: write_shard refuses one that is not a regular file
        rows: list[Mapping[str, Any]] = [{"file": p.name, "key": p.name} for p in sorted(input_dir.iterdir())]
    else:
        rows = list(images)
    by_key = {str(row["key"]): row for row in rows}
    checker = None if check is None else (lambda key, data: check(by_key[key], data))
    return write_shard([(str(row["key"]), input_dir / str(row["file"])) for row in rows], output_dir, size=size,
                       skip_bad_images=skip_bad_images, child=child, check=checker)
