"""tuning.host: validation, context round trips and the rendered script (pure)."""

from __future__ import annotations

import subprocess

import pytest

from tuning.host import (
    KERNEL_DEFAULTS,
    SYSCTL_CONF_PATH,
    HostTuning,
    HostTuningError,
    parse_kernel_release,
    sysctl_path,
)


def test_defaults_are_the_case_study_tuning() -> None:
    tuning = HostTuning()
    tuning.validate()
    assert tuning.sysctls() == {"vm.dirty_ratio": "30", "vm.dirty_background_ratio": "20"}
    assert tuning.mount_option_string() == "noatime,nodiratime,logbufs=8,logbsize=256k,nofail"
    assert KERNEL_DEFAULTS.sysctls() == {"vm.dirty_ratio": "20", "vm.dirty_background_ratio": "10"}


def test_unset_values_are_left_out_of_the_sysctls() -> None:
    tuning = HostTuning(dirty_ratio=None, dirty_background_ratio=None, dirty_expire_centisecs=1500)
    assert tuning.sysctls() == {"vm.dirty_expire_centisecs": "1500"}


@pytest.mark.parametrize(
    ("tuning", "message"),
    [
        (HostTuning(mount_options=("noatime", "nobarrier", "nofail")), "'nobarrier' makes the mount fail.*4.19"),
        (HostTuning(mount_options=("osyncisdsync", "nofail")), "'osyncisdsync'.*4.0"),
        (HostTuning(mount_options=("noatime", "nobootwait", "nofail")), "nobootwait.*x-systemd.device-timeout"),
        (HostTuning(mount_options=("noatime",)), "lack 'nofail'"),
        (HostTuning(dirty_ratio=120), "dirty_ratio=120 is not a percentage"),
        (HostTuning(dirty_ratio=20, dirty_background_ratio=20), "dirty_background_ratio=20 is not below"),
        (HostTuning(dirty_bytes=1 << 30), "mix the ratio and the bytes form"),
        (HostTuning(dirty_ratio=None, dirty_background_ratio=None, dirty_bytes=4096), "below the kernel's minimum"),
        (HostTuning(dirty_ratio=None, dirty_background_ratio=None, dirty_bytes=1 << 28,
                    dirty_background_bytes=1 << 29), "dirty_background_bytes=.* is not below"),
        (HostTuning(filesystem="btrfs"), "filesystem 'btrfs' is not supported"),
        (HostTuning(filesystem="ext4"), "'logbufs=8' is XFS-only"),
        (HostTuning(mount_options=("noatime;reboot", "nofail")), "characters mount does not take"),
        (HostTuning(mount_point="scratch"), "not an absolute directory"),
        (HostTuning(dirty_writeback_centisecs=-1), "negative"),
    ],
)
def test_validate_names_the_option_and_the_fix(tuning: HostTuning, message: str) -> None:
    with pytest.raises(HostTuningError, match=message):
        tuning.validate()


def test_removed_options_are_refused_only_from_the_kernel_that_removed_them() -> None:
    old = HostTuning(mount_options=("nobarrier", "nofail"))
    old.validate(kernel_release="4.14.355-275.570.amzn2.x86_64")
    with pytest.raises(HostTuningError, match="nobarrier"):
        old.validate(kernel_release="6.1.0-18-amd64")
    with pytest.raises(HostTuningError, match="nobarrier"):
        old.validate()
    with pytest.raises(HostTuningError, match="uname -r"):
        HostTuning().validate(kernel_release="latest")


def test_kernel_release_and_sysctl_path() -> None:
    assert parse_kernel_release("6.1.0-18-amd64") == (6, 1)
    assert parse_kernel_release("4.19.0") == (4, 19)
    assert sysctl_path("vm.dirty_ratio") == "/proc/sys/vm/dirty_ratio"


@pytest.mark.parametrize(
    "tuning",
    [
        HostTuning(),
        KERNEL_DEFAULTS,
        HostTuning(dirty_ratio=None, dirty_background_ratio=None, dirty_bytes=1 << 30,
                   dirty_background_bytes=1 << 28, dirty_expire_centisecs=1000, dirty_writeback_centisecs=200),
        HostTuning(dirty_ratio=None, dirty_background_ratio=None, mount_options=("noatime", "nofail")),
    ],
)
def test_context_round_trip(tuning: HostTuning) -> None:
    assert HostTuning.from_context(tuning.to_context()) == tuning


def test_from_context_reads_cli_strings_and_switches_to_the_bytes_form() -> None:
    tuning = HostTuning.from_context({"dirtyBytes": "1073741824", "dirtyBackgroundBytes": 268435456,
                                      "mountOptions": " noatime , nofail "})
    assert (tuning.dirty_ratio, tuning.dirty_background_ratio) == (None, None)
    assert tuning.sysctls() == {"vm.dirty_bytes": "1073741824", "vm.dirty_background_bytes": "268435456"}
    assert tuning.mount_options == ("noatime", "nofail")
    assert HostTuning.from_context({"dirtyRatio": "none"}).dirty_ratio is None
    assert HostTuning.from_context({}) == HostTuning()
    assert HostTuning.from_context({"mountOptions": ["noatime", "nofail"]}).mount_options == ("noatime", "nofail")


@pytest.mark.parametrize(("ctx", "message"), [
    ({"dirtyRatio": "thirty"}, "dirtyRatio='thirty' is not a whole number"),
    ({"dirtyRatio": True}, "dirtyRatio=True"),
    ({"mountOptions": " , "}, "mountOptions is empty"),
])
def test_from_context_rejects_bad_values(ctx: dict[str, object], message: str) -> None:
    with pytest.raises(HostTuningError, match=message):
        HostTuning.from_context(ctx)


def test_render_script_is_valid_bash_with_the_settings() -> None:
    script = HostTuning().render_script(device="/dev/nvme1n1")
    assert script.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in script
    assert "DEVICE=/dev/nvme1n1\n" in script
    assert "MOUNT_OPTIONS=noatime,nodiratime,logbufs=8,logbsize=256k,nofail\n" in script
    assert "mkfs.xfs -q" in script
    assert f"SYSCTL_CONF=\"${{IOBATCH_SYSCTL_CONF:-{SYSCTL_CONF_PATH}}}\"" in script
    assert "vm.dirty_ratio = 30\nvm.dirty_background_ratio = 20\n" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_render_script_validates_first() -> None:
    with pytest.raises(HostTuningError, match="nobarrier"):
        HostTuning(mount_options=("nobarrier", "nofail")).render_script()


def test_render_script_quotes_the_device() -> None:
    script = HostTuning().render_script(device="/dev/x; rm -rf /")
    assert "DEVICE='/dev/x; rm -rf /'\n" in script
