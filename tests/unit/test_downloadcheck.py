"""The download stage's checks (pipeline/downloadcheck.py): each file as s5cmd reports it, failures in the batch's
order, nothing left running."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from pipeline.downloadcheck import DownloadCheck
from pipeline.errors import IntegrityError
from pipeline.manifest import ManifestEntry
from pipeline.s5cmd import CopyResult

BUCKET = "in"


def _landed(tmp_path: Path, bodies: dict[str, bytes], frozen: dict[str, bytes]) -> tuple[list[ManifestEntry],
                                                                                            list[Path]]:
    """Files as downloaded (`bodies`) beside entries frozen from other bytes (`frozen`: size and MD5)."""
    entries, paths = [], []
    for key, body in bodies.items():
        path = tmp_path / key
        path.write_bytes(body)
        was = frozen.get(key, body)
        entries.append(ManifestEntry(key, len(was), hashlib.md5(was, usedforsecurity=False).hexdigest()))
        paths.append(path)
    return entries, paths


def _copied(check: DownloadCheck, *keys: str) -> None:
    for key in keys:
        check.copied(CopyResult(f"s3://{BUCKET}/{key}", "", None, None))


def test_the_first_failure_in_the_batchs_order_whatever_landed_first(tmp_path: Path) -> None:
    bodies = {"a": b"a" * 5000, "b": b"b" * 5000, "c": b"c" * 5000}
    entries, paths = _landed(tmp_path, bodies, {"b": b"B" * 5000, "c": b"c" * 4000})
    with DownloadCheck(entries, paths, bucket=BUCKET, content=True) as check:
        _copied(check, "c", "b", "a")
        with pytest.raises(IntegrityError, match=r"^s3://in/b has MD5 .*the batch listed ETag .*refreeze"):
            check.finish()


def test_a_size_is_checked_too_and_names_both_sizes(tmp_path: Path) -> None:
    entries, paths = _landed(tmp_path, {"a": b"a" * 10, "c": b"c" * 5000}, {"c": b"c" * 4000})
    with DownloadCheck(entries, paths, bucket=BUCKET, content=True) as check:
        _copied(check, "a", "c")
        with pytest.raises(IntegrityError, match=r"^s3://in/c is 5000 bytes, the batch listed 4000"):
            check.finish()


def test_without_content_checks_only_sizes_are_checked_and_no_thread_starts(tmp_path: Path) -> None:
    # The built-in command checks the bytes itself: a same-size change is its to find, not the download's.
    entries, paths = _landed(tmp_path, {"a": b"a" * 100, "b": b"b" * 100}, {"b": b"B" * 100})
    before = threading.active_count()
    with DownloadCheck(entries, paths, bucket=BUCKET, content=False) as check:
        _copied(check, "a", "b")
        assert threading.active_count() == before
        check.finish()
    entries, paths = _landed(tmp_path, {"a": b"a" * 100}, {"a": b"a" * 99})
    with DownloadCheck(entries, paths, bucket=BUCKET, content=False) as check, \
            pytest.raises(IntegrityError, match="is 100 bytes, the batch listed 99"):
        check.finish()


def test_a_file_s5cmd_did_not_report_is_checked_at_the_end_and_a_multipart_etag_by_size(tmp_path: Path) -> None:
    entries, paths = _landed(tmp_path, {"a": b"a" * 100, "m": b"m" * 100}, {})
    entries[1] = ManifestEntry("m", 100, "0" * 32 + "-2")  # a multipart object's ETag is no MD5 of its bytes
    with DownloadCheck(entries, paths, bucket=BUCKET, content=True) as check:
        _copied(check, "m", "elsewhere")  # a source not in the batch is not the check's
        check.finish()
    entries[0] = ManifestEntry("a", 100, hashlib.md5(b"x", usedforsecurity=False).hexdigest())
    with DownloadCheck(entries, paths, bucket=BUCKET, content=True) as check, \
            pytest.raises(IntegrityError, match=r"^s3://in/a has MD5"):
        check.finish()


def test_no_check_is_left_running_on_the_way_out(tmp_path: Path) -> None:
    entries, paths = _landed(tmp_path, {f"f{i}": bytes([i]) * 200_000 for i in range(40)}, {})
    with pytest.raises(KeyboardInterrupt), DownloadCheck(entries, paths, bucket=BUCKET, content=True) as check:
        _copied(check, *(f"f{i}" for i in range(40)))
        raise KeyboardInterrupt  # the job's interruption while s5cmd runs
    assert not [t for t in threading.enumerate() if t.name.startswith("download-check")]
