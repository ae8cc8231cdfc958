"""The write microbenchmark (profiling/interpose/writebench.c), built and run once before any probe sees it."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import pytest

WRITEBENCH = Path(__file__).resolve().parents[2] / "profiling" / "interpose" / "writebench"


@functools.cache
def writebench() -> Path:
    """The built binary, already exec'd once: the first exec of a new binary updates its atime (relatime), and
    on a journal-less ext4 that dirties an inode-table block in the exec'ing task, a real page a probe counts."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the workload")
    subprocess.run(["make", "-s", "-C", str(WRITEBENCH.parent)], check=True, capture_output=True)
    subprocess.run([str(WRITEBENCH), "/dev/null", "1"], check=True, capture_output=True)
    return WRITEBENCH
