"""s5cmd against the embedded versitygw: exact sizes, named failures, retryable vs permanent."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline import s3 as s3io
from pipeline.errors import EndpointUnreachable, ManifestError, MissingObjectError
from pipeline.local.s3server import EmbeddedS3, free_port
from pipeline.manifest import ManifestEntry
from pipeline.s5cmd import Copy, run_copies
from pipeline.settings import S3Uri


def test_download_reports_every_object_with_its_exact_size(
    s3_server: EmbeddedS3, s3: Any, bucket: str, tmp_path: Path
) -> None:
    sizes = {f"img/{i}.bin": 1000 * i + 1 for i in range(5)}
    for key, size in sizes.items():
        s3.put_object(Bucket=bucket, Key=key, Body=os.urandom(size))
    copies = [Copy(f"s3://{bucket}/{key}", str(tmp_path / key.replace("/", "_"))) for key in sizes]
    results = run_copies(copies, command_file=tmp_path / "cmds", endpoint=s3_server.endpoint, workers=4)
    assert {r.source: r.size for r in results} == {f"s3://{bucket}/{k}": v for k, v in sizes.items()}
    for copy in copies:
        key = copy.source.split("/", 3)[3]
        assert Path(copy.destination).stat().st_size == sizes[key]


def test_missing_key_is_permanent_and_named(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> None:
    copies = [Copy(f"s3://{bucket}/img/missing.png", str(tmp_path / "m.png"))]
    with pytest.raises(MissingObjectError, match=re.escape(f"s3://{bucket}/img/missing.png does not exist")):
        run_copies(copies, command_file=tmp_path / "cmds", endpoint=s3_server.endpoint, workers=1)


def test_unreachable_endpoint_is_retryable(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    copies = [Copy(f"s3://{bucket}/a", str(tmp_path / "a"))]
    with pytest.raises(EndpointUnreachable) as caught:
        run_copies(copies, command_file=tmp_path / "cmds", endpoint=dead, workers=1, retries=1)
    assert caught.value.retryable and caught.value.exit_code == 75


def test_freeze_batch_from_prefix_and_child_slices(s3_server: EmbeddedS3, s3: Any, bucket: str) -> None:
    for i in range(7):
        s3.put_object(Bucket=bucket, Key=f"images/{i:02d}.png", Body=b"x" * (i + 1))
    s3.put_object(Bucket=bucket, Key="images/_SUCCESS", Body=b"")
    frozen = s3io.freeze_batch(s3, input=S3Uri(bucket, "images/"), manifest=None,
                               output=S3Uri(bucket, "out/"), per_child=3)
    assert (frozen.children, frozen.images, frozen.bytes) == (3, 7, sum(range(1, 8)))
    got = [s3io.read_child_entries(s3, frozen.manifest, c, bucket=bucket) for c in range(3)]
    assert got[2] == [ManifestEntry("images/06.png", 7)]
    assert [e.key for part in got for e in part] == [f"images/{i:02d}.png" for i in range(7)]


def test_freeze_refuses_bad_manifest_and_empty_prefix(s3_server: EmbeddedS3, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="m.jsonl", Body=b'{"key": "a.png"}\n{"uri": "s3://elsewhere/b.png"}\n')
    with pytest.raises(ManifestError, match=re.escape("line 2: s3://elsewhere/b.png is outside the input bucket")):
        s3io.freeze_batch(s3, input=S3Uri(bucket, ""), manifest=S3Uri(bucket, "m.jsonl"),
                          output=S3Uri(bucket, "out/"), per_child=1)
    assert not s3io.exists(s3, S3Uri(bucket, "out/_batch/manifest.jsonl"))
    with pytest.raises(ManifestError, match="holds no images"):
        s3io.freeze_batch(s3, input=S3Uri(bucket, "nothing/"), manifest=None, output=S3Uri(bucket, "o/"),
                          per_child=1)


@pytest.mark.parametrize(("body", "fragment"), [
    (b'{"key": "images/a.png"}\n{"key": "raw/b.png"}\n', "line 2: key raw/b.png is outside the input prefix images/"),
    (b'{"key": "images/a.png"}\n{"key": "images/../b.png"}\n', "line 2: key images/../b.png has an empty"),
    (b'{"key": "images/a.png"}\n\n{"uri": "s3://BUCKET/images/a.png"}\n', "line 3 lists the key of line 1 again"),
])
def test_freeze_refuses_keys_outside_the_prefix_odd_or_twice(s3_server: EmbeddedS3, s3: Any, bucket: str,
                                                            body: bytes, fragment: str) -> None:
    s3.put_object(Bucket=bucket, Key="m.jsonl", Body=body.replace(b"BUCKET", bucket.encode()))
    with pytest.raises(ManifestError, match=re.escape(f"s3://{bucket}/m.jsonl {fragment}")):
        s3io.freeze_batch(s3, input=S3Uri(bucket, "images/"), manifest=S3Uri(bucket, "m.jsonl"),
                          output=S3Uri(bucket, "out/"), per_child=1)
    assert not s3io.exists(s3, S3Uri(bucket, "out/_batch/manifest.jsonl"))


def test_missing_bucket_is_named(s3_server: EmbeddedS3, s3: Any) -> None:
    with pytest.raises(MissingObjectError, match="bucket of s3://no-such-bucket-x/images/ does not exist"):
        list(s3io.list_images(s3, S3Uri("no-such-bucket-x", "images/")))


def test_throttled_proxy_limits_all_connections_together(
    s3_server: EmbeddedS3, s3: Any, bucket: str, tmp_path: Path
) -> None:
    from pipeline.local.proxy import ThrottledProxy

    for i in range(4):
        s3.put_object(Bucket=bucket, Key=f"slow/{i}", Body=os.urandom(512 * 1024))
    copies = [Copy(f"s3://{bucket}/slow/{i}", str(tmp_path / f"{i}")) for i in range(4)]
    with ThrottledProxy(s3_server.port, 1024 * 1024) as slow:
        started = time.monotonic()
        run_copies(copies, command_file=tmp_path / "cmds", endpoint=slow.endpoint, workers=4)
        elapsed = time.monotonic() - started
    # 2 MiB at 1 MiB/s shared by four parallel connections: ~2 s less the 0.1 s burst. A limit per
    # connection would let the four finish in ~0.5 s. Load on the machine only makes it slower.
    assert elapsed >= 1.5


def test_each_success_is_handed_on_as_s5cmd_prints_it(s3_server: EmbeddedS3, s3: Any, bucket: str,
                                                      tmp_path: Path) -> None:
    from pipeline.local.proxy import ThrottledProxy

    s3.put_object(Bucket=bucket, Key="soon", Body=os.urandom(4096))
    s3.put_object(Bucket=bucket, Key="late", Body=os.urandom(2 * 1024 * 1024))
    copies = [Copy(f"s3://{bucket}/{key}", str(tmp_path / key)) for key in ("soon", "late")]
    handed: dict[str, float] = {}
    with ThrottledProxy(s3_server.port, 1024 * 1024) as slow:
        run_copies(copies, command_file=tmp_path / "cmds", endpoint=slow.endpoint, workers=2,
                   on_copied=lambda result: handed.setdefault(result.source, time.monotonic()))
        ended = time.monotonic()
    assert set(handed) == {c.source for c in copies}
    # 2 MiB at 1 MiB/s: the small object lands and is handed on about two seconds before s5cmd ends.
    assert ended - handed[f"s3://{bucket}/soon"] >= 1.0
    assert (tmp_path / "soon").stat().st_size == 4096
