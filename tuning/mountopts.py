"""The scratch volume's mount options, checked as the kernel would check them, before any host boots with them.

A value the kernel refuses makes every host's mount fail: the host fences itself and shuts down, Batch launches
another, and children stay RUNNABLE. So names and values are checked at synth, each refusal one line naming the option,
what it takes and an example. The XFS rules are Documentation/admin-guide/xfs.rst's ("Mount Options", "Removed Mount
Options"):

- logbufs: "Valid numbers range from 2-8 inclusive";
- logbsize: bytes or kilobytes with a "k" suffix; 16384 and 32768, and for version 2 logs (mkfs.xfs's default since
  xfsprogs 3.2) 65536, 131072 and 262144;
- allocsize: "page size (typically 4KiB) through to 1GiB, inclusive, in power-of-2 increments", with k, m or g;
- removed in 4.0: delaylog/nodelaylog, ihashsize, irixsgid, osyncisdsync/osyncisosync; in 4.19: barrier/nobarrier.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

FILESYSTEMS: tuple[str, ...] = ("xfs", "ext4")
# Options only XFS understands; refused for other filesystems.
XFS_ONLY = ("logbufs", "logbsize", "allocsize", "largeio", "inode64", "swalloc", "sunit", "swidth")
_REMOVED_IN_4_0 = "removed from XFS in Linux 4.0; drop it"
# Mount options that make the mount fail on kernels at or after the given release.
REMOVED_XFS_OPTIONS: dict[str, tuple[tuple[int, int], str]] = {
    "nobarrier": ((4, 19), "removed from XFS in Linux 4.19; drop it (write barriers cost little on EBS)"),
    "barrier": ((4, 19), "removed from XFS in Linux 4.19; drop it (barriers are always on)"),
    "osyncisdsync": ((4, 0), _REMOVED_IN_4_0),
    "osyncisosync": ((4, 0), _REMOVED_IN_4_0),
    "delaylog": ((4, 0), _REMOVED_IN_4_0 + " (delayed logging is always on)"),
    "nodelaylog": ((4, 0), _REMOVED_IN_4_0),
    "ihashsize": ((4, 0), _REMOVED_IN_4_0),
    "irixsgid": ((4, 0), _REMOVED_IN_4_0),
}
LOGBUFS = range(2, 9)
LOGBSIZES: tuple[int, ...] = (16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10)
ALLOCSIZE_MIN, ALLOCSIZE_MAX = 4 << 10, 1 << 30  # the page size on x86_64 and arm64's 4 KiB kernels, and 1 GiB
_SAFE_OPTION = re.compile(r"^[A-Za-z0-9_.:/=+-]+$")
_SIZE = re.compile(r"^([0-9]{1,12})([kKmMgG]?)$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class MountOptionError(ValueError):
    """An option the mount would refuse; the message names the option, what it takes and an example."""


def parse_size(text: str) -> int | None:
    """Bytes of a mount option size: '262144', '256k', '1g' (k, m, g are powers of 1024); None if not one."""
    match = _SIZE.match(text)
    return int(match[1]) * _UNITS[match[2].lower()] if match else None


def _value(option: str, name: str, accepted: str, example: str) -> str:
    if "=" not in option or not option.split("=", 1)[1]:
        raise MountOptionError(f"mount option {option!r} needs a value: XFS takes {name} {accepted}; e.g. {example}")
    return option.split("=", 1)[1]


def check_xfs_value(option: str) -> None:
    """Refuse an out-of-range value of logbufs, logbsize or allocsize (other options carry none checked here)."""
    name = option.split("=", 1)[0]
    if name == "logbufs":
        raw = _value(option, name, "2-8", "logbufs=8")
        if not raw.isascii() or not raw.isdigit() or int(raw) not in LOGBUFS:
            raise MountOptionError(f"mount option {option!r} is out of range: XFS takes logbufs 2-8; e.g. logbufs=8")
    elif name == "logbsize":
        accepted = "16k, 32k, 64k, 128k or 256k"
        if parse_size(_value(option, name, accepted, "logbsize=256k")) not in LOGBSIZES:
            raise MountOptionError(
                f"mount option {option!r} is out of range: XFS takes logbsize {accepted}; e.g. logbsize=256k")
    elif name == "allocsize":
        accepted = "a power of two from 4k to 1g"
        size = parse_size(_value(option, name, accepted, "allocsize=64m"))
        if size is None or not ALLOCSIZE_MIN <= size <= ALLOCSIZE_MAX or size & (size - 1):
            raise MountOptionError(
                f"mount option {option!r} is out of range: XFS takes allocsize {accepted}; e.g. allocsize=64m")


def check_mount_options(options: Sequence[str], filesystem: str, kernel: tuple[int, int] | None) -> None:
    """Raise MountOptionError for the first option the mount would refuse, or that defeats the point.

    `kernel` (major, minor) decides whether removed XFS options are refused; None means a current kernel (Amazon Linux
    2023 runs 6.x), so they are."""
    if not options:
        raise MountOptionError("mount options are empty: give at least 'nofail'")
    for option in options:
        name = option.split("=", 1)[0]
        if not _SAFE_OPTION.match(option):
            raise MountOptionError(
                f"mount option {option!r} has characters mount does not take: write options separated by commas, "
                "e.g. noatime,nofail")
        if name in REMOVED_XFS_OPTIONS:
            removed_in, why = REMOVED_XFS_OPTIONS[name]
            if kernel is None or kernel >= removed_in:
                raise MountOptionError(f"mount option {name!r} makes the mount fail: it was {why}")
        if name == "nobootwait":
            raise MountOptionError(
                "mount option 'nobootwait' is not a util-linux option and fails the mount: "
                "use nofail,x-systemd.device-timeout=30s")
        if filesystem != "xfs" and name in XFS_ONLY:
            raise MountOptionError(f"mount option {option!r} is XFS-only but the filesystem is {filesystem}: drop it")
        if filesystem == "xfs":
            check_xfs_value(option)
    if "nofail" not in options:
        raise MountOptionError(
            "mount options lack 'nofail': without it a missing scratch volume stops the host at boot; add nofail")
