"""Test data on disk and in buckets: the repository's root, and a local folder uploaded to S3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def upload_dir(s3: Any, bucket: str, prefix: str, source: Path) -> list[str]:
    """Upload every file under `source` to s3://bucket/prefix, keys relative to source; return the keys."""
    keys = []
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        key = prefix + path.relative_to(source).as_posix()
        s3.upload_file(str(path), bucket, key)
        keys.append(key)
    return keys
