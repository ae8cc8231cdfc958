"""The eBPF object is the same whatever machine builds it: profiling/bpf builds from the committed x86_64 vmlinux.h,
with the target architecture pinned, so hiding the build machine's BTF (and bpftool) changes nothing, and a build in
another folder gives the same bytes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BPF = Path(__file__).resolve().parents[2] / "profiling" / "bpf"
SOURCES = ("Makefile", "iobatch.bpf.c", "iobatch.h", "vmlinux.h")

pytestmark = pytest.mark.skipif(
    shutil.which("clang") is None or not Path("/usr/include/bpf/bpf_helpers.h").exists(),
    reason="clang and libbpf-dev are not installed (make setup installs them as root)")


def build(folder: Path, **make_vars: str) -> bytes:
    folder.mkdir(parents=True)
    for name in SOURCES:
        shutil.copy(BPF / name, folder / name)
    args = [f"{key}={value}" for key, value in make_vars.items()]
    done = subprocess.run(["make", "-s", "-C", str(folder), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return (folder / "iobatch.bpf.o").read_bytes()


def test_the_header_is_committed_and_x86_64s() -> None:
    header = (BPF / "vmlinux.h").read_text()
    assert "struct pt_regs {" in header and "\tunsigned long r15;" in header  # x86_64's registers
    assert len(header.splitlines()) < 5000  # the types the program uses, not the whole kernel's


def test_a_build_with_the_machines_btf_hidden_gives_the_same_object(tmp_path: Path) -> None:
    plain = build(tmp_path / "a")
    hidden = build(tmp_path / "elsewhere" / "b", VMLINUX_BTF="/nonexistent/vmlinux", BPFTOOL="/bin/false")
    assert hidden == plain
