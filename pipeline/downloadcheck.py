"""The download stage's checks of what landed on scratch: each file has the size the batch was frozen with and, for a
process command other than the built-in one, the MD5 (single-part objects' ETag). The built-in resizer checks the
bytes as it reads them in the process stage, so each image is read once there.

MD5 runs at ~0.5 GB/s a core, so reading every image again after the download would add seconds to a stage of
seconds (1 GiB from a local server: 2.2 s more on a download of 0.7 s). The files are checked as s5cmd reports each
one done, by a few threads (hashlib lets go of the GIL on large buffers), while the rest are still coming: against S3
the checks hide under the download. Each file is read in blocks, never whole (a training image can be gigabytes).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from pipeline.errors import IntegrityError
from pipeline.manifest import ManifestEntry
from pipeline.process import CHANGED_AFTER_FREEZE, check_md5
from pipeline.s5cmd import CopyResult

# At most this many files are read at once: enough to keep up with a download on the cores a child has.
MAX_CHECKERS = 4


def checkers() -> int:
    """How many files are read at once: MAX_CHECKERS, or the CPUs this process may run on when fewer."""
    return min(MAX_CHECKERS, len(os.sched_getaffinity(0)))


def verify_size(entry: ManifestEntry, path: Path, *, bucket: str) -> None:
    """The downloaded file has the size the batch was frozen with (a stat, no read)."""
    size = path.stat().st_size
    if entry.size is not None and size != entry.size:
        raise IntegrityError(f"s3://{bucket}/{entry.key} is {size} bytes, the batch listed {entry.size}: "
                             f"{CHANGED_AFTER_FREEZE}")


def verify_content(entry: ManifestEntry, path: Path, *, bucket: str) -> None:
    """The downloaded bytes have the MD5 the batch was frozen with, for a single-part object (an ETag without '-')."""
    with path.open("rb") as stream:
        check_md5(entry.key, stream, entry.etag, bucket=bucket)


def _verify(entry: ManifestEntry, path: Path, bucket: str, content: bool) -> None:
    verify_size(entry, path, bucket=bucket)
    if content:
        verify_content(entry, path, bucket=bucket)


class DownloadCheck:
    """Checks a download's files, each as s5cmd reports it (`copied`, run_copies' on_copied), then `finish()`: the
    first failure in the batch's order is raised, as a check after the download would. Use it as a context manager:
    on every way out no check is left running (those not started are dropped)."""

    def __init__(self, entries: Sequence[ManifestEntry], paths: Sequence[Path], *, bucket: str, content: bool) -> None:
        self._entries, self._paths, self._bucket, self._content = entries, paths, bucket, content
        self._index = {f"s3://{bucket}/{entry.key}": i for i, entry in enumerate(entries)}
        self._pending: dict[int, Future[None]] = {}
        self._pool = ThreadPoolExecutor(max_workers=checkers(),
                                        thread_name_prefix="download-check") if content else None

    def __enter__(self) -> DownloadCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def copied(self, result: CopyResult) -> None:
        """One file s5cmd finished: its check starts now (content checks) or in finish() (sizes alone: a stat)."""
        index = self._index.get(result.source)
        if self._pool is not None and index is not None and index not in self._pending:
            self._pending[index] = self._pool.submit(_verify, self._entries[index], self._paths[index], self._bucket,
                                                     True)

    def finish(self) -> None:
        """Every file checked, in the batch's order: the first failure raised."""
        for index, entry in enumerate(self._entries):
            pending = self._pending.get(index)
            if pending is not None:
                pending.result()
            else:
                _verify(entry, self._paths[index], self._bucket, self._content)
