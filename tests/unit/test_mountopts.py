"""Mount option values as XFS takes them (Documentation/admin-guide/xfs.rst), checked before a host boots."""

from __future__ import annotations

import pytest

from tuning.host import HostTuning, HostTuningError
from tuning.mountopts import MountOptionError, check_mount_options, parse_size


@pytest.mark.parametrize("option", ["logbufs=2", "logbufs=8", "logbsize=16k", "logbsize=32768", "logbsize=256k",
                                    "logbsize=262144", "allocsize=4k", "allocsize=64m", "allocsize=1g",
                                    "allocsize=1073741824", "allocsize=4096"])
def test_values_in_range_are_taken(option: str) -> None:
    check_mount_options(("noatime", option, "nofail"), "xfs", None)


ALLOC = "allocsize a power of two from 4k to 1g"


@pytest.mark.parametrize(("option", "takes"), [
    ("logbufs=1", "logbufs 2-8"), ("logbufs=9", "logbufs 2-8"), ("logbufs=eight", "logbufs 2-8"),
    ("logbufs=", "logbufs 2-8"), ("logbufs", "logbufs 2-8"),
    ("logbsize=8k", "logbsize 16k, 32k, 64k, 128k or 256k"), ("logbsize=48k", "logbsize 16k, 32k, 64k, 128k or 256k"),
    ("logbsize=1m", "logbsize 16k, 32k, 64k, 128k or 256k"),
    *((f"allocsize={size}", ALLOC) for size in ("2k", "3m", "2g", "big")),
])
def test_values_out_of_range_are_refused_in_one_line_naming_the_option_and_range(option: str, takes: str) -> None:
    with pytest.raises(MountOptionError) as raised:
        check_mount_options(("noatime", option, "nofail"), "xfs", None)
    message = str(raised.value)
    assert "\n" not in message and repr(option) in message and f"XFS takes {takes}; e.g. " in message


@pytest.mark.parametrize("option", ["delaylog", "nodelaylog", "ihashsize=64", "irixsgid", "nobarrier"])
def test_removed_options_are_refused_on_current_kernels_and_taken_on_old_ones(option: str) -> None:
    with pytest.raises(HostTuningError, match="makes the mount fail: it was removed from XFS in Linux"):
        HostTuning(mount_options=(option, "nofail")).validate()
    HostTuning(mount_options=(option, "nofail")).validate(kernel_release="3.10.0-1160.el7.x86_64")


def test_sizes_are_powers_of_1024_and_nothing_else() -> None:
    assert parse_size("256k") == 262144 and parse_size("1G") == 1 << 30 and parse_size("4096") == 4096
    assert parse_size("1.5m") is None and parse_size("-4k") is None and parse_size("4kb") is None


def test_ext4_takes_no_xfs_option_values() -> None:
    with pytest.raises(MountOptionError, match="is XFS-only but the filesystem is ext4"):
        check_mount_options(("logbufs=8", "nofail"), "ext4", None)
