"""Host tuning: the scratch volume's filesystem and mount options, and the page-cache sysctls.

This is the single source of host tuning. The CDK launch template renders `HostTuning.render_script()`
into its user data, the lab applies the same values to a loop device, and `iobatch advise` prints them as
CDK context keys (`to_context()`), which the stack reads back with `from_context()`.

Everything here is pure: validating and rendering touch no files. The rendered script is what touches
the machine.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from profiling.identity import INSTANCE_FILE
from profiling.qualification import QUALIFICATION_FILE
from profiling.qualifyio import MAX_BYTES, SECONDS
from tuning.ebs import Volume
from tuning.hostprogram import LAUNCHER, program_blob
from tuning.hostqualify import EVENT_PREFIX
from tuning.hostscript import SCRIPT
from tuning.instancestore import KIND as STORE_KIND
from tuning.mountopts import FILESYSTEMS, MountOptionError, check_mount_options
from tuning.qualify import CONTEXT_KEYS as QUALIFY_CONTEXT_KEYS
from tuning.qualify import QualifyPolicy, QualifyPolicyError, expected_table

SYSCTL_CONF_PATH = "/etc/sysctl.d/90-iobatch.conf"
# The block device name the launch template gives the scratch volume. On Nitro instances the kernel
# names it nvme<N>n1; Amazon Linux's udev rules (amazon-ec2-utils) add this name as a symlink.
SCRATCH_DEVICE_NAME = "/dev/xvdb"
# Where scratch comes from: an EBS volume the launch template attaches (SCRATCH_DEVICE_NAME), or the instance's own
# NVMe instance store, which grows with the instance, has no credits and is erased with it. Nitro instances show
# the store without any block device mapping ("NVMe instance store volumes are automatically enumerated and
# assigned a device name. Including them in your block device mapping has no effect": EC2 API Reference,
# BlockDeviceMapping, VirtualName), each device with the NVMe model STORE_MODEL (EBS's is "Amazon Elastic Block
# Store"), which the script picks by. One store device only: striping several (mdadm, not on the ECS-optimized AMI)
# is not built, and the stack refuses types with more (infra/settings.py).
SCRATCH_KINDS = ("ebs", "instance-store")
STORE_MODEL = "Amazon EC2 NVMe Instance Storage"
# Written on the mounted scratch volume as the script's last step, after every check passed: a job that
# does not find it (pipeline/scratch.py) is on a host whose setup failed, and exits to be retried elsewhere.
SCRATCH_READY_MARKER = ".iobatch-scratch-ready"
# Each host's qualification event goes to the log group under this stream prefix (tuning/hostqualify.py owns it; the
# dashboard reads it from here, as infra reads host tuning).
QUALIFICATION_STREAM_PREFIX = EVENT_PREFIX
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./-]*$")
# The kernel rejects dirty_bytes below two pages.
_MIN_DIRTY_BYTES = 2 * 4096


class HostTuningError(ValueError):
    """A tuning value the host would reject or misuse; the message names the option and the fix."""


@dataclass(frozen=True)
class HostReport:
    """Where a host whose setup failed says why before it shuts down: a CloudWatch Logs group of the pipeline (names
    may be CDK tokens, resolved in the user data), in the host's own region (from IMDS: tuning/hostpost.py)."""

    log_group: str
    pipeline: str


# CDK context keys (camelCase) and the HostTuning fields they set.
CONTEXT_KEYS: dict[str, str] = {
    "dirtyRatio": "dirty_ratio",
    "dirtyBackgroundRatio": "dirty_background_ratio",
    "dirtyBytes": "dirty_bytes",
    "dirtyBackgroundBytes": "dirty_background_bytes",
    "dirtyExpireCentisecs": "dirty_expire_centisecs",
    "dirtyWritebackCentisecs": "dirty_writeback_centisecs",
    "mountOptions": "mount_options",
    "scratch": "scratch",
    **dict.fromkeys(QUALIFY_CONTEXT_KEYS, "qualification"),  # tuning.qualify owns these
}
_SYSCTL_FIELDS: dict[str, str] = {
    "dirty_ratio": "vm.dirty_ratio",
    "dirty_background_ratio": "vm.dirty_background_ratio",
    "dirty_bytes": "vm.dirty_bytes",
    "dirty_background_bytes": "vm.dirty_background_bytes",
    "dirty_expire_centisecs": "vm.dirty_expire_centisecs",
    "dirty_writeback_centisecs": "vm.dirty_writeback_centisecs",
}


# A `uname -r` release, whole: MAJOR.MINOR[.PATCH] and a suffix of letters, digits and . _ - + ~ (6.1.0-18-amd64,
# 6.1.115-126.197.amzn2023.x86_64, 6.12.0-rc1+), at most 64 characters (utsname's release field, __NEW_UTS_LEN).
_KERNEL_RELEASE = re.compile(r"(\d{1,4})\.(\d{1,4})(?:\.\d{1,6})?(?:[-+_.~][A-Za-z0-9._+~-]*)?", re.ASCII)


def parse_kernel_release(release: str, what: str = "kernel release") -> tuple[int, int]:
    """(major, minor) of a whole `uname -r` string such as '6.1.0-18-amd64'; HostTuningError naming `what` for
    anything else (a release followed by other text is not a release)."""
    text = release.strip()
    match = _KERNEL_RELEASE.fullmatch(text) if len(text) <= 64 else None
    if not match:
        raise HostTuningError(f"{what} {release[:70]!r} is not a whole `uname -r` release like '6.1.0-18-amd64': "
                              "pass the hosts' `uname -r` output")
    return int(match[1]), int(match[2])


def sysctl_path(key: str) -> str:
    """The /proc/sys file behind a sysctl key: 'vm.dirty_ratio' -> '/proc/sys/vm/dirty_ratio'."""
    return "/proc/sys/" + key.replace(".", "/")


@dataclass(frozen=True)
class HostTuning:
    """Page-cache sysctls and scratch mount settings for a Batch host.

    A sysctl left as None keeps the kernel's value. The ratio form (percent of available memory) and
    the bytes form of the dirty limits are exclusive, as in the kernel: writing one zeroes the other.
    """

    dirty_ratio: int | None = 30
    dirty_background_ratio: int | None = 20
    dirty_bytes: int | None = None
    dirty_background_bytes: int | None = None
    dirty_expire_centisecs: int | None = None
    dirty_writeback_centisecs: int | None = None
    filesystem: str = "xfs"
    mount_options: tuple[str, ...] = ("noatime", "nodiratime", "logbufs=8", "logbsize=256k", "nofail")
    mount_point: str = "/scratch"
    scratch: str = "ebs"  # one of SCRATCH_KINDS
    qualification: QualifyPolicy = field(default_factory=QualifyPolicy)  # measured at boot (tuning/qualify.py)

    def sysctls(self) -> dict[str, str]:
        """The sysctls this tuning sets, e.g. {"vm.dirty_ratio": "30"}; unset values are left out."""
        return {
            key: str(getattr(self, name))
            for name, key in _SYSCTL_FIELDS.items()
            if getattr(self, name) is not None
        }

    def mount_option_string(self) -> str:
        """The options as `mount -o` and fstab take them."""
        return ",".join(self.mount_options)

    def validate(self, kernel_release: str | None = None) -> None:
        """Raise HostTuningError for anything the kernel or mount would reject, or that defeats the point.

        `kernel_release` (`uname -r`) decides whether removed XFS options are refused; unknown means
        a current kernel (Amazon Linux 2023 runs 6.x), so they are refused.
        """
        kernel = parse_kernel_release(kernel_release) if kernel_release else None
        try:
            self.qualification.validate()
        except QualifyPolicyError as exc:
            raise HostTuningError(str(exc)) from None
        self._validate_sysctls()
        self._validate_mount(kernel)

    def _validate_sysctls(self) -> None:
        for name in ("dirty_ratio", "dirty_background_ratio"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 100:
                raise HostTuningError(f"{name}={value} is not a percentage: use 0-100 (e.g. 30)")
        for name in ("dirty_bytes", "dirty_background_bytes"):
            value = getattr(self, name)
            if value is not None and value < _MIN_DIRTY_BYTES:
                raise HostTuningError(
                    f"{name}={value} is below the kernel's minimum of {_MIN_DIRTY_BYTES}: give bytes, "
                    "e.g. 1073741824 for 1 GiB"
                )
        for name in ("dirty_expire_centisecs", "dirty_writeback_centisecs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise HostTuningError(f"{name}={value} is negative: give centiseconds (e.g. 3000)")
        ratios = self.dirty_ratio is not None or self.dirty_background_ratio is not None
        sizes = self.dirty_bytes is not None or self.dirty_background_bytes is not None
        if ratios and sizes:
            raise HostTuningError(
                "dirty limits mix the ratio and the bytes form: set dirtyRatio/dirtyBackgroundRatio "
                "or dirtyBytes/dirtyBackgroundBytes, not both (the kernel zeroes one when the other is set)"
            )
        pairs = ((self.dirty_background_ratio, self.dirty_ratio, "dirty_background_ratio", "dirty_ratio"),
                 (self.dirty_background_bytes, self.dirty_bytes, "dirty_background_bytes", "dirty_bytes"))
        for background, dirty, bname, dname in pairs:
            if background is not None and dirty is not None and background >= dirty:
                raise HostTuningError(
                    f"{bname}={background} is not below {dname}={dirty}: background writeback must "
                    f"start before writers block; lower {bname}"
                )

    def _validate_mount(self, kernel: tuple[int, int] | None) -> None:
        if self.scratch not in SCRATCH_KINDS:
            raise HostTuningError(f"scratch {self.scratch!r} is not a scratch kind: use {' or '.join(SCRATCH_KINDS)}")
        if self.filesystem not in FILESYSTEMS:
            raise HostTuningError(
                f"filesystem {self.filesystem!r} is not supported: use one of {', '.join(FILESYSTEMS)}"
            )
        if not _SAFE_PATH.match(self.mount_point) or self.mount_point == "/":
            raise HostTuningError(
                f"mount point {self.mount_point!r} is not an absolute directory path like /scratch"
            )
        try:
            check_mount_options(self.mount_options, self.filesystem, kernel)
        except MountOptionError as exc:
            raise HostTuningError(str(exc)) from None

    @classmethod
    def from_context(cls, ctx: Mapping[str, Any]) -> HostTuning:
        """Build from CDK context values (numbers or strings, as `cdk -c key=value` gives them).

        A missing key keeps the default; 'none' (or an empty string) for a sysctl leaves the kernel's
        value. Giving dirtyBytes or dirtyBackgroundBytes switches the defaults to the bytes form.
        """
        values: dict[str, Any] = {}
        try:
            values["qualification"] = QualifyPolicy.from_context(ctx)
        except QualifyPolicyError as exc:
            raise HostTuningError(str(exc)) from None
        for key, name in CONTEXT_KEYS.items():
            if key not in ctx or ctx[key] is None or name == "qualification":
                continue
            raw = ctx[key]
            if name == "mount_options":
                values[name] = _parse_options(raw, key)
            elif name == "scratch":
                values[name] = str(raw).strip().lower()
            else:
                values[name] = _parse_int(raw, key)
        if values.get("dirty_bytes") is not None or values.get("dirty_background_bytes") is not None:
            # The bytes form replaces the default ratios unless they were given explicitly.
            values.setdefault("dirty_ratio", None)
            values.setdefault("dirty_background_ratio", None)
        return replace(cls(), **values)

    def to_context(self) -> dict[str, str]:
        """The CDK context keys that rebuild this tuning through from_context (the inverse)."""
        ctx: dict[str, str] = {}
        for key, name in CONTEXT_KEYS.items():
            value = getattr(self, name)
            if name == "qualification":
                continue
            if name == "mount_options":
                ctx[key] = ",".join(value)
            elif name == "scratch":
                if value != "ebs":  # the default stays out of the advice's context
                    ctx[key] = value
            elif name in ("dirty_ratio", "dirty_background_ratio"):
                # Always written: absent would mean the default, not "leave the kernel's value".
                ctx[key] = "none" if value is None else str(value)
            elif value is not None:
                ctx[key] = str(value)
        return {**ctx, **self.qualification.to_context()}

    def render_script(self, *, device: str | None = None, report: HostReport | None = None,
                      volume: Volume | None = None, instance_types: Sequence[str] = ()) -> str:
        """A bash script for EC2 user data that prepares scratch and applies the sysctls.

        It finds the scratch device (or uses `device`), makes the filesystem if the device is blank,
        mounts it at mount_point with the options (and records it in fstab), writes the sysctls to
        /etc/sysctl.d/90-iobatch.conf and applies them, then checks all of it. Any failure exits non-zero
        with a line in the cloud-init log, so jobs never run on the root disk by accident.

        It also writes the instance's id and type from IMDS where the profiler reads them (INSTANCE_FILE on the
        volume), and on a failure says why in the console output and, given `report`, in that log group.

        With scratch "instance-store" the device is the one NVMe device of model STORE_MODEL (none or several:
        the setup fails, and the host is fenced like any other failed setup).

        Seven variables exist for tests on a machine that is not a Batch host: IOBATCH_SYSCTL_CONF
        (where the sysctl file goes), IOBATCH_FSTAB (empty: do not touch fstab), IOBATCH_IMDS (empty: no IMDS),
        IOBATCH_SYS_BLOCK (the sysfs block folder the disks' NVMe models are read from), IOBATCH_DEVICE_WAIT (how
        many seconds the EBS volume may take to attach; default 120), IOBATCH_LOGS_ENDPOINT
        (a stand-in for CloudWatch Logs, on a loopback address only: tuning/hostpost.py) and
        IOBATCH_QUALIFICATION_FILE (where the qualification's figures go: tuning/hostqualify.py).

        Before the ready marker it qualifies scratch (tuning/hostqualify.py): the figures against what `volume`
        (default: the stack's) should do on each of `instance_types` (tuning.qualify.expected_table), in
        QUALIFICATION_FILE, and a slow host flagged or fenced by the policy. The script carries no comments (they
        are in tuning/hostscript.py): user data is limited to 16 KB, Batch's part included.
        """
        self.validate()
        sysctl_lines = "".join(f"{key} = {value}\n" for key, value in self.sysctls().items())
        mkfs = "mkfs.xfs -q" if self.filesystem == "xfs" else "mkfs.ext4 -q -F"
        q = shlex.quote
        script = SCRIPT.format(
            device=q(device or ""),
            default_device=q(SCRATCH_DEVICE_NAME if self.scratch == "ebs" else ""),
            scratch=q(self.scratch),
            store_model=q(STORE_MODEL),
            mount_point=q(self.mount_point),
            options=q(self.mount_option_string()),
            filesystem=q(self.filesystem),
            mkfs=mkfs,
            sysctl_conf=q(SYSCTL_CONF_PATH),
            sysctl_body=sysctl_lines,
            sysctl_keys=" ".join(self.sysctls()),
            ready_marker=q(SCRATCH_READY_MARKER),
            instance_file=q(INSTANCE_FILE),
            failure_log_group=q(report.log_group if report else ""),
            pipeline=q(report.pipeline if report else ""),
            host_py=program_blob(),
            launcher=q(LAUNCHER),
            qualify=q(self.qualification.mode),
            qualify_conf=q(self.qualify_conf(report, volume or Volume(), instance_types)),
        )
        return strip_comments(script)

    def qualify_conf(self, report: HostReport | None, volume: Volume, instance_types: Sequence[str]) -> str:
        """The JSON tuning/hostqualify.py takes (see there)."""
        policy, store = self.qualification, self.scratch == "instance-store"
        types = list(instance_types)
        label = STORE_KIND if store else volume.label
        return json.dumps({
            "target": self.mount_point, "io": policy.io_bytes, "seconds": SECONDS, "max_bytes": MAX_BYTES,
            "small": store, "min_ratio": policy.min_ratio, "mode": policy.mode, "per_hour": policy.fences_per_hour,
            "expected": expected_table(volume, types, policy.io_bytes, store=store), "file": QUALIFICATION_FILE,
            "volume": label, "pipeline": report.pipeline if report else "iobatch"}, separators=(",", ":"))


def strip_comments(script: str) -> str:
    """`script` without its whole-line comments, blank lines and indents (the shebang kept, heredoc bodies whole; a
continued line keeps one space, which separated its words)."""
    out: list[str] = []
    heredoc = None
    for number, line in enumerate(script.splitlines()):
        if heredoc is not None:
            out.append(line)
            heredoc = None if line == heredoc else heredoc
            continue
        if number and (not line.strip() or line.lstrip().startswith("#")):
            continue
        line = (" " if out and out[-1].endswith("\\") else "") + line.lstrip()
        out.append(line)
        opened = re.search(r"<<'(\w+)'", line)
        heredoc = opened[1] if opened else None
    return "\n".join(out) + "\n"


def _parse_int(raw: Any, key: str) -> int | None:
    if isinstance(raw, bool):
        raise HostTuningError(f"context {key}={raw!r} is not a whole number: give e.g. -c {key}=30")
    if isinstance(raw, int):
        return raw
    text = str(raw).strip()
    if text.lower() in ("", "none", "null", "kernel"):
        return None
    try:
        return int(text)
    except ValueError:
        raise HostTuningError(
            f"context {key}={raw!r} is not a whole number: give e.g. -c {key}=30, or 'none' to keep "
            "the kernel's value"
        ) from None


def _parse_options(raw: Any, key: str) -> tuple[str, ...]:
    items = [str(x) for x in raw] if isinstance(raw, list | tuple) else str(raw).split(",")
    options = tuple(item.strip() for item in items if item.strip())
    if not options:
        raise HostTuningError(f"context {key} is empty: give comma-separated options, e.g. noatime,nofail")
    return options



# What an untuned host has (the kernel's defaults for the dirty limits).
KERNEL_DEFAULTS = HostTuning(dirty_ratio=20, dirty_background_ratio=10)
