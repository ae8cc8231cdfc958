"""What build of iobatch this is: the package's version (its metadata) and, in a git checkout, `git describe`."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def version() -> str:
    """e.g. "0.1.0 (3266e73-dirty)" in a checkout, "0.1.0" in an image (no .git there)."""
    try:
        package = metadata.version("iobatch")
    except metadata.PackageNotFoundError:
        package = "unknown"
    if not (ROOT / ".git").exists():
        return package
    try:
        described = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--tags"],
                                   capture_output=True, text=True, timeout=5, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        described = ""
    return f"{package} ({described})" if described else package
