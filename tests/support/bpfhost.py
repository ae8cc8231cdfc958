"""What this host holds of our eBPF programs, read as a test reads it: the pins' builds and their profilers' slots
(the layout of profiling/probes/ebpf_host.py), and the kernel's own list of programs (bpftool), whoever loaded
them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from profiling.probes import ebpf_host


def builds() -> list[Path]:
    """One directory per set of programs pinned on this host."""
    return ebpf_host.builds(ebpf_host.pin_root())


def slots() -> list[str]:
    """The profilers' slots taken on those sets, by number."""
    return sorted(p.name for build in builds() for p in (build / "slots").iterdir())


def kernel_programs(name_prefix: str = "") -> set[int]:
    """The ids of the programs the kernel holds whose names start with `name_prefix` (ours are `iob_*`); skips the
    test where bpftool is missing."""
    if shutil.which("bpftool") is None:
        pytest.skip("needs bpftool (make setup installs it)")
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    return {p["id"] for p in json.loads(out) if p.get("name", "").startswith(name_prefix)}
