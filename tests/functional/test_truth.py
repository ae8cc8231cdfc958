"""Truth: where the kernel's counts are exact, so are the profiler's, for Python, C and Go programs.

Each workload program takes `MODE PATH [N]`:

    noop                do nothing (its start-up I/O is the baseline for the read counters)
    small PATH N        N write(2) calls of 4 KiB
    big PATH N          N MiB in 1 MiB write(2) calls, then fsync
    read PATH           posix_fadvise(DONTNEED) on the file, then read it in 64 KiB calls to EOF

Write counters are asserted absolutely (no runtime writes at start-up); read counters relative to a
`noop` run of the same binary, because the dynamic loader, the Python importer and the Go runtime read
files at start-up.

Device-level checks run as root on a fresh loop device with XFS, so that no one else's I/O lands on the
device; the controlled slowdown is the root blkio cgroup v1 throttle on the loop device below it (see
`xfs_loop`), restored on every exit path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiling.command import profile_command
from profiling.metrics import StageProfile
from profiling.probes.procfs import BlockDevice, device_of

KIB, MIB = 1024, 1024 * 1024
SMALL_WRITES = 10_000
BIG_MIB = 100
READ_MIB = 8
READ_CHUNK = 64 * KIB
# XFS writes its log and inode/extent metadata beside the data on fsync; on a fresh 512 MiB
# file system this stays far below 4 MiB per 100 MiB of data.
DEVICE_TOLERANCE_BYTES = 4 * MIB
# /proc/<pid>/io write_bytes counts pages as they are dirtied, so a page redirtied after writeback
# counts twice; the logical counters (wchar, syscw) have no such slack.
STORAGE_SLACK_BYTES = 256 * KIB

PY_PROGRAM = textwrap.dedent("""
    import os, sys
    mode = sys.argv[1]
    if mode == "small":
        fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        block = b"s" * 4096
        for _ in range(int(sys.argv[3])):
            os.write(fd, block)
        os.close(fd)
    elif mode == "big":
        fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        block = b"b" * (1024 * 1024)
        for _ in range(int(sys.argv[3])):
            os.write(fd, block)
        os.fsync(fd)
        os.close(fd)
    elif mode == "read":
        fd = os.open(sys.argv[2], os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, 65536):
            pass
        os.close(fd)
""")

C_PROGRAM = textwrap.dedent("""
    #define _GNU_SOURCE
    #include <fcntl.h>
    #include <stdlib.h>
    #include <string.h>
    #include <unistd.h>
    static char buf[1 << 20];
    int main(int argc, char **argv) {
        if (argc < 2 || strcmp(argv[1], "noop") == 0) return 0;
        memset(buf, 'c', sizeof buf);
        if (strcmp(argv[1], "small") == 0 || strcmp(argv[1], "big") == 0) {
            int big = argv[1][0] == 'b';
            int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
            long n = atol(argv[3]);
            for (long i = 0; i < n; i++)
                if (write(fd, buf, big ? sizeof buf : 4096) < 0) return 2;
            if (big && fsync(fd) != 0) return 3;
            return close(fd);
        }
        int fd = open(argv[2], O_RDONLY);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        while (read(fd, buf, 65536) > 0) {}
        return close(fd);
    }
""")

GO_PROGRAM = textwrap.dedent("""
    package main

    import (
        "os"
        "strconv"
        "syscall"
    )

    func main() {
        if len(os.Args) < 2 || os.Args[1] == "noop" {
            return
        }
        buf := make([]byte, 1<<20)
        switch os.Args[1] {
        case "small", "big":
            f, err := os.OpenFile(os.Args[2], os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
            if err != nil {
                os.Exit(2)
            }
            n, _ := strconv.Atoi(os.Args[3])
            size := 4096
            if os.Args[1] == "big" {
                size = len(buf)
            }
            for i := 0; i < n; i++ {
                if _, err := f.Write(buf[:size]); err != nil {
                    os.Exit(2)
                }
            }
            if os.Args[1] == "big" {
                f.Sync()
            }
            f.Close()
        case "read":
            f, err := os.Open(os.Args[2])
            if err != nil {
                os.Exit(2)
            }
            // POSIX_FADV_DONTNEED = 4
            syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, 4, 0, 0)
            for {
                n, _ := f.Read(buf[:65536])
                if n <= 0 {
                    break
                }
            }
            f.Close()
        }
    }
""")


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Commands per language: Python always; C when cc exists (static, so no loader reads); Go when go
    exists (else s5cmd cannot be driven to these exact workloads, so Go is skipped)."""
    build = tmp_path_factory.mktemp("programs")
    out: dict[str, list[str]] = {}
    (build / "w.py").write_text(PY_PROGRAM)
    out["python"] = [sys.executable, "-S", "-B", "-I", str(build / "w.py")]
    if shutil.which("cc"):
        (build / "w.c").write_text(C_PROGRAM)
        static = subprocess.run(["cc", "-O1", "-static", "-o", str(build / "w-c"), str(build / "w.c")],
                                capture_output=True)
        if static.returncode != 0:
            subprocess.run(["cc", "-O1", "-o", str(build / "w-c"), str(build / "w.c")], check=True)
        out["c"] = [str(build / "w-c")]
    if shutil.which("go"):
        (build / "main.go").write_text(GO_PROGRAM)
        env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GO111MODULE": "off"}
        done = subprocess.run(["go", "build", "-o", str(build / "w-go"), str(build / "main.go")],
                              cwd=build, env=env, capture_output=True, timeout=300)
        if done.returncode == 0:
            out["go"] = [str(build / "w-go")]
    return out


def _run(cmd: list[str], *args: str, device: BlockDevice | None = None) -> StageProfile:
    result = profile_command([*cmd, *args], interval_s=0.2, device=device)
    assert result.returncode == 0, f"{cmd} {args} exited {result.returncode}"
    assert result.profile.outcome == "ok"
    return result.profile


LANGUAGES = ["python", "c", "go"]


def _command(programs: dict[str, list[str]], language: str) -> list[str]:
    if language not in programs:
        pytest.skip(f"no {language} toolchain ({'cc' if language == 'c' else language}) on this machine")
    return programs[language]


@pytest.mark.parametrize("language", LANGUAGES)
def test_small_writes_are_counted_exactly(programs: dict[str, list[str]], language: str, tmp_path: Path) -> None:
    cmd = _command(programs, language)
    noop = _run(cmd, "noop")
    assert (noop.write_calls, noop.write_bytes) == (0, 0), "start-up wrote something: the test's premise"
    p = _run(cmd, "small", str(tmp_path / "small.bin"), str(SMALL_WRITES))
    assert p.write_calls == SMALL_WRITES
    assert p.write_bytes == SMALL_WRITES * 4 * KIB
    # Storage bytes are counted when a page turns dirty: a page that writeback cleans while the file is
    # still being written can be dirtied, and counted, again. Seen: one extra page under load.
    assert SMALL_WRITES * 4 * KIB <= p.storage_write_bytes <= SMALL_WRITES * 4 * KIB + STORAGE_SLACK_BYTES
    assert (p.read_calls, p.read_bytes) == (noop.read_calls, noop.read_bytes)


@pytest.mark.parametrize("language", LANGUAGES)
def test_reads_after_dropping_the_file_from_the_page_cache(programs: dict[str, list[str]], language: str,
                                                           tmp_path: Path) -> None:
    cmd = _command(programs, language)
    target = tmp_path / "read.bin"
    with target.open("wb") as f:
        f.write(os.urandom(READ_MIB * MIB))
        f.flush()
        os.fsync(f.fileno())  # DONTNEED drops only clean pages
    _run(cmd, "noop")  # once to warm the program's own files (a fresh clone's first start reads some from disk)
    noop = _run(cmd, "noop")
    p = _run(cmd, "read", str(target))
    assert p.read_bytes - noop.read_bytes == READ_MIB * MIB
    assert p.read_calls - noop.read_calls == READ_MIB * MIB // READ_CHUNK + 1  # + the read that returns 0
    # storage reads: the whole file came from the device again (readahead stops at EOF)
    assert p.storage_read_bytes - noop.storage_read_bytes >= READ_MIB * MIB
    assert p.storage_read_bytes - noop.storage_read_bytes <= READ_MIB * MIB + 256 * KIB
    assert (p.write_calls, p.write_bytes) == (0, 0)


# ---- device level: a loop device with XFS (root) ----------------------------------------------------


def _root_tools_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: loop devices and mounts")
    for tool in ("losetup", "mkfs.xfs", "mount", "umount"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool}")


@pytest.fixture(scope="module")
def xfs_loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, BlockDevice, BlockDevice]]:
    """A fresh 512 MiB XFS file system used by no one else: (mount point, its device, the device below).

    Two stacked loop devices: XFS on the upper one, which does direct I/O to the lower one. A blkio
    throttle holds bios back before they are counted in the throttled device's own diskstats, so the
    slowdown is applied to the lower device and shows up as latency and queue on the upper one, the way
    a slow EBS volume shows up on the instance's nvme device.
    """
    _root_tools_or_skip()
    base = tmp_path_factory.mktemp("xfs")
    image, mountpoint = base / "disk.img", base / "mnt"
    mountpoint.mkdir()
    with image.open("wb") as f:
        f.truncate(512 * MIB)
    attached: list[str] = []
    mounted = False
    try:
        for backing, extra in ((str(image), []), (None, ["--direct-io=on"])):
            loop = subprocess.run(["losetup", "--find", "--show", *extra, backing or attached[-1]],
                                  capture_output=True, text=True)
            if loop.returncode != 0:
                pytest.skip(f"no loop device: {loop.stderr.strip()}")
            attached.append(loop.stdout.strip())
        lower_dev, upper_dev = attached
        subprocess.run(["mkfs.xfs", "-q", "-f", upper_dev], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "noatime", upper_dev, str(mountpoint)], check=True, capture_output=True)
        mounted = True
        upper, notice = device_of(mountpoint)
        lower, _ = device_of(Path(lower_dev))
        assert upper is not None and lower is not None, notice
        assert upper.name == Path(upper_dev).name and lower.name == Path(lower_dev).name
        yield mountpoint, upper, lower
    finally:
        if mounted:
            subprocess.run(["umount", str(mountpoint)], check=False)
        for dev in reversed(attached):
            subprocess.run(["losetup", "-d", dev], check=False)


@pytest.mark.root
@pytest.mark.parametrize("language", LANGUAGES)
def test_big_file_with_fsync_reaches_the_device(programs: dict[str, list[str]], language: str,
                                                xfs_loop: tuple[Path, BlockDevice, BlockDevice]) -> None:
    cmd = _command(programs, language)
    mountpoint, block, _ = xfs_loop
    target = mountpoint / f"big-{language}.bin"
    p = _run(cmd, "big", str(target), str(BIG_MIB), device=block)
    target.unlink()
    assert (p.write_calls, p.write_bytes) == (BIG_MIB, BIG_MIB * MIB)
    assert BIG_MIB * MIB <= p.storage_write_bytes <= BIG_MIB * MIB + STORAGE_SLACK_BYTES
    assert p.device == block.name and p.device_write_bytes is not None
    # fsync returned, so every data byte is on the device; the rest is XFS log and metadata
    assert BIG_MIB * MIB <= p.device_write_bytes <= BIG_MIB * MIB + DEVICE_TOLERANCE_BYTES
    assert p.device_write_ops and p.device_write_latency_ms is not None


BLKIO_WRITE_BPS = Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")
THROTTLE_BPS = 16 * MIB


@contextlib.contextmanager
def write_throttle(block: BlockDevice, bps: int) -> Iterator[None]:
    """Root blkio v1 write throttle on one device; the old setting is restored on every path."""
    old = 0
    for line in BLKIO_WRITE_BPS.read_text().splitlines():
        dev, _, value = line.partition(" ")
        if dev == block.dev:
            old = int(value)
    BLKIO_WRITE_BPS.write_text(f"{block.dev} {bps}\n")
    try:
        yield
    finally:
        BLKIO_WRITE_BPS.write_text(f"{block.dev} {old}\n")  # 0 removes the rule


@pytest.mark.root
def test_device_latency_and_io_stall_follow_a_controlled_slowdown(programs: dict[str, list[str]],
                                                                   xfs_loop: tuple[Path, BlockDevice, BlockDevice],
                                                                   ) -> None:
    if not BLKIO_WRITE_BPS.exists():
        pytest.skip("no blkio cgroup v1 throttle on this kernel")
    cmd = programs.get("c", programs["python"])
    mountpoint, block, lower = xfs_loop
    target = mountpoint / "throttle.bin"
    size_mib = 32

    fast = _run(cmd, "big", str(target), str(size_mib), device=block)
    target.unlink()
    with write_throttle(lower, THROTTLE_BPS):
        slow = _run(cmd, "big", str(target), str(size_mib), device=block)
    target.unlink()
    assert f"{lower.dev} " not in BLKIO_WRITE_BPS.read_text(), "throttle not restored"

    assert fast.device_write_latency_ms is not None and slow.device_write_latency_ms is not None
    assert slow.io_stall_some_ms is not None and fast.io_stall_some_ms is not None
    # 32 MiB at 16 MiB/s takes about 2 s; unthrottled it is a small fraction of that
    assert slow.duration_s >= 1.5
    assert slow.device_write_latency_ms > 3 * fast.device_write_latency_ms + 5
    assert slow.io_stall_some_ms > 0.3 * slow.duration_s * 1000  # the writer waited on I/O (~50 % measured)
    assert slow.io_stall_some_ms > 2 * fast.io_stall_some_ms
    assert slow.device_queue_depth is not None and slow.device_queue_depth > 0.5
