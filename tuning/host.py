"""Host tuning: the scratch volume's filesystem and mount options, and the page-cache sysctls.

This is the single source of host tuning. The CDK launch template renders `HostTuning.render_script()`
into its user data, the lab applies the same values to a loop device, and `iobatch advise` prints them as
CDK context keys (`to_context()`), which the stack reads back with `from_context()`.

Everything here is pure: validating and rendering touch no files. The rendered script is what touches
the machine.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

SYSCTL_CONF_PATH = "/etc/sysctl.d/90-iobatch.conf"
# The block device name the launch template gives the scratch volume. On Nitro instances the kernel
# names it nvme<N>n1; Amazon Linux's udev rules (amazon-ec2-utils) add this name as a symlink.
SCRATCH_DEVICE_NAME = "/dev/xvdb"
# Written on the mounted scratch volume as the script's last step, after every check passed: a job that
# does not find it (pipeline/scratch.py) is on a host whose setup failed, and exits to be retried elsewhere.
SCRATCH_READY_MARKER = ".iobatch-scratch-ready"
FILESYSTEMS: tuple[str, ...] = ("xfs", "ext4")
# Options only XFS understands; rejected for other filesystems.
_XFS_ONLY = ("logbufs", "logbsize", "allocsize", "largeio", "inode64", "swalloc", "sunit", "swidth")
# Mount options that make the mount fail on kernels at or after the given release.
_REMOVED_XFS_OPTIONS: dict[str, tuple[tuple[int, int], str]] = {
    "nobarrier": ((4, 19), "removed from XFS in Linux 4.19; drop it (write barriers cost little on EBS)"),
    "barrier": ((4, 19), "removed from XFS in Linux 4.19; drop it (barriers are always on)"),
    "osyncisdsync": ((4, 0), "removed from XFS in Linux 4.0; drop it"),
    "osyncisosync": ((4, 0), "removed from XFS in Linux 4.0; drop it"),
}
_SAFE_OPTION = re.compile(r"^[A-Za-z0-9_.:/=+-]+$")
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./-]*$")
# The kernel rejects dirty_bytes below two pages.
_MIN_DIRTY_BYTES = 2 * 4096


class HostTuningError(ValueError):
    """A tuning value the host would reject or misuse; the message names the option and the fix."""


# CDK context keys (camelCase) and the HostTuning fields they set.
CONTEXT_KEYS: dict[str, str] = {
    "dirtyRatio": "dirty_ratio",
    "dirtyBackgroundRatio": "dirty_background_ratio",
    "dirtyBytes": "dirty_bytes",
    "dirtyBackgroundBytes": "dirty_background_bytes",
    "dirtyExpireCentisecs": "dirty_expire_centisecs",
    "dirtyWritebackCentisecs": "dirty_writeback_centisecs",
    "mountOptions": "mount_options",
}
_SYSCTL_FIELDS: dict[str, str] = {
    "dirty_ratio": "vm.dirty_ratio",
    "dirty_background_ratio": "vm.dirty_background_ratio",
    "dirty_bytes": "vm.dirty_bytes",
    "dirty_background_bytes": "vm.dirty_background_bytes",
    "dirty_expire_centisecs": "vm.dirty_expire_centisecs",
    "dirty_writeback_centisecs": "vm.dirty_writeback_centisecs",
}


def parse_kernel_release(release: str) -> tuple[int, int]:
    """(major, minor) of a `uname -r` string such as '6.1.0-18-amd64'."""
    match = re.match(r"^\s*(\d+)\.(\d+)", release)
    if not match:
        raise HostTuningError(f"kernel release {release!r} is not like '6.1.0': pass `uname -r` output")
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
        if self.filesystem not in FILESYSTEMS:
            raise HostTuningError(
                f"filesystem {self.filesystem!r} is not supported: use one of {', '.join(FILESYSTEMS)}"
            )
        if not _SAFE_PATH.match(self.mount_point) or self.mount_point == "/":
            raise HostTuningError(
                f"mount point {self.mount_point!r} is not an absolute directory path like /scratch"
            )
        if not self.mount_options:
            raise HostTuningError("mount options are empty: give at least 'nofail'")
        for option in self.mount_options:
            name = option.split("=", 1)[0]
            if not _SAFE_OPTION.match(option):
                raise HostTuningError(
                    f"mount option {option!r} has characters mount does not take: write options "
                    "separated by commas, e.g. noatime,nofail"
                )
            if name in _REMOVED_XFS_OPTIONS:
                removed_in, why = _REMOVED_XFS_OPTIONS[name]
                if kernel is None or kernel >= removed_in:
                    raise HostTuningError(f"mount option {name!r} makes the mount fail: it was {why}")
            if name == "nobootwait":
                raise HostTuningError(
                    "mount option 'nobootwait' is not a util-linux option and fails the mount: "
                    "use nofail,x-systemd.device-timeout=30s"
                )
            if self.filesystem != "xfs" and name in _XFS_ONLY:
                raise HostTuningError(
                    f"mount option {option!r} is XFS-only but the filesystem is {self.filesystem}: drop it"
                )
        if "nofail" not in self.mount_options:
            raise HostTuningError(
                "mount options lack 'nofail': without it a missing scratch volume stops the host at "
                "boot; add nofail"
            )

    @classmethod
    def from_context(cls, ctx: Mapping[str, Any]) -> HostTuning:
        """Build from CDK context values (numbers or strings, as `cdk -c key=value` gives them).

        A missing key keeps the default; 'none' (or an empty string) for a sysctl leaves the kernel's
        value. Giving dirtyBytes or dirtyBackgroundBytes switches the defaults to the bytes form.
        """
        values: dict[str, Any] = {}
        for key, name in CONTEXT_KEYS.items():
            if key not in ctx or ctx[key] is None:
                continue
            raw = ctx[key]
            if name == "mount_options":
                values[name] = _parse_options(raw, key)
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
            if name == "mount_options":
                ctx[key] = ",".join(value)
            elif name in ("dirty_ratio", "dirty_background_ratio"):
                # Always written: absent would mean the default, not "leave the kernel's value".
                ctx[key] = "none" if value is None else str(value)
            elif value is not None:
                ctx[key] = str(value)
        return ctx

    def render_script(self, *, device: str | None = None) -> str:
        """A bash script for EC2 user data that prepares scratch and applies the sysctls.

        It finds the scratch device (or uses `device`), makes the filesystem if the device is blank,
        mounts it at mount_point with the options (and records it in fstab), writes the sysctls to
        /etc/sysctl.d/90-iobatch.conf and applies them, then checks all of it. Any failure exits non-zero
        with a line in the cloud-init log, so jobs never run on the root disk by accident.

        Two variables exist for tests on a machine that is not a Batch host: IOBATCH_SYSCTL_CONF
        (where the sysctl file goes) and IOBATCH_FSTAB (empty: do not touch fstab).
        """
        self.validate()
        sysctl_lines = "".join(f"{key} = {value}\n" for key, value in self.sysctls().items())
        mkfs = "mkfs.xfs -q" if self.filesystem == "xfs" else "mkfs.ext4 -q -F"
        q = shlex.quote
        return _SCRIPT.format(
            device=q(device or ""),
            default_device=q(SCRATCH_DEVICE_NAME),
            mount_point=q(self.mount_point),
            options=q(self.mount_option_string()),
            filesystem=q(self.filesystem),
            mkfs=mkfs,
            sysctl_conf=q(SYSCTL_CONF_PATH),
            sysctl_body=sysctl_lines,
            sysctl_keys=" ".join(self.sysctls()),
            ready_marker=q(SCRATCH_READY_MARKER),
        )


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

# Braces that belong to bash are doubled for str.format.
_SCRIPT = """\
#!/bin/bash
# iobatch host tuning: scratch volume and page-cache settings (rendered by tuning/host.py).
# Output goes to the cloud-init log; any failure exits non-zero so the problem is visible there.
set -euo pipefail

DEVICE={device}
DEFAULT_DEVICE={default_device}
MOUNT_POINT={mount_point}
MOUNT_OPTIONS={options}
FILESYSTEM={filesystem}
SYSCTL_CONF="${{IOBATCH_SYSCTL_CONF:-{sysctl_conf}}}"
FSTAB="${{IOBATCH_FSTAB-/etc/fstab}}"

log() {{ echo "iobatch-host: $*" >&2; }}
die() {{ echo "iobatch-host: FATAL: $*" >&2; exit 1; }}

# A host that could not prepare scratch must not take jobs: the ECS agent starts after cloud-init whether
# or not this script succeeded, and every job would then fail on the root disk. So on any failure: no
# ready marker, the agent stopped and masked (it cannot start or register), and the host shut down. A
# stopped instance is unhealthy to its Auto Scaling group, which replaces it ("Health checks for
# instances in an Auto Scaling group": any state other than running is unhealthy); the launch template
# terminates it on shutdown anyway. Only on a host with the ECS agent: elsewhere (tests) it only says so.
READY_MARKER={ready_marker}
fence_host() {{
  local rc=$?
  [ "$rc" -eq 0 ] && return 0
  rm -f "$MOUNT_POINT/$READY_MARKER" 2>/dev/null || true
  if systemctl cat ecs.service >/dev/null 2>&1; then
    log "scratch setup failed (exit $rc): masking the ECS agent and shutting this host down"
    systemctl mask --now ecs.service || log "could not mask ecs.service"
    shutdown -h now "iobatch: scratch setup failed" || log "could not shut down"
  else
    log "scratch setup failed (exit $rc); no ECS agent here, nothing to fence"
  fi
  exit "$rc"
}}
trap fence_host EXIT

# The scratch device: the name the launch template gave it, or else the one NVMe/xvd disk that has
# no partitions, no filesystem and is not mounted (the root disk always has one of those).
find_device() {{
  if [ -b "$DEFAULT_DEVICE" ]; then readlink -f "$DEFAULT_DEVICE"; return 0; fi
  local dev
  for dev in $(lsblk -dnpo NAME,TYPE | awk '$2 == "disk" {{print $1}}'); do
    if [ "$(lsblk -npo NAME "$dev" | wc -l)" -eq 1 ] \\
       && [ -z "$(blkid -p -s TYPE -o value "$dev" || true)" ] \\
       && ! findmnt -rn -S "$dev" >/dev/null; then
      echo "$dev"; return 0
    fi
  done
  return 1
}}

if [ -z "$DEVICE" ]; then
  # EBS volumes can attach a little after boot: wait up to two minutes.
  for _ in $(seq 1 60); do
    DEVICE="$(find_device || true)"
    [ -n "$DEVICE" ] && break
    sleep 2
  done
  [ -n "$DEVICE" ] \\
    || die "no scratch device ($DEFAULT_DEVICE or a blank disk); not running jobs on the root disk"
fi
[ -b "$DEVICE" ] || die "scratch device $DEVICE is not a block device"
log "scratch device $DEVICE"

current_fs="$(blkid -p -s TYPE -o value "$DEVICE" || true)"
if [ -z "$current_fs" ]; then
  log "making $FILESYSTEM on blank $DEVICE"
  {mkfs} "$DEVICE"
elif [ "$current_fs" != "$FILESYSTEM" ]; then
  die "$DEVICE holds $current_fs, not $FILESYSTEM; not formatting a device that has data"
fi

mkdir -p "$MOUNT_POINT"
if ! findmnt -rn -S "$DEVICE" -M "$MOUNT_POINT" >/dev/null; then
  mount -t "$FILESYSTEM" -o "$MOUNT_OPTIONS" "$DEVICE" "$MOUNT_POINT" \\
    || die "mount -t $FILESYSTEM -o $MOUNT_OPTIONS $DEVICE $MOUNT_POINT failed"
fi
if [ -n "$FSTAB" ]; then
  uuid="$(blkid -s UUID -o value "$DEVICE")"
  grep -q "UUID=$uuid " "$FSTAB" 2>/dev/null \\
    || echo "UUID=$uuid $MOUNT_POINT $FILESYSTEM $MOUNT_OPTIONS 0 2" >> "$FSTAB"
fi
# Containers run as any user; the sticky bit keeps children from deleting each other's files.
chmod 1777 "$MOUNT_POINT"

mounted_fs="$(findmnt -rn -o FSTYPE -M "$MOUNT_POINT" || true)"
[ "$mounted_fs" = "$FILESYSTEM" ] || die "$MOUNT_POINT is not mounted as $FILESYSTEM (found '$mounted_fs')"
log "mounted $DEVICE on $MOUNT_POINT: $(findmnt -rn -o OPTIONS -M "$MOUNT_POINT")"

mkdir -p "$(dirname "$SYSCTL_CONF")"
cat > "$SYSCTL_CONF" <<'IOBATCH_SYSCTL'
# iobatch page-cache tuning (tuning/host.py)
{sysctl_body}IOBATCH_SYSCTL
sysctl -q -p "$SYSCTL_CONF" || die "sysctl -p $SYSCTL_CONF failed"
for key in {sysctl_keys}; do
  want="$(awk -F' = ' -v k="$key" '$1 == k {{print $2}}' "$SYSCTL_CONF")"
  have="$(sysctl -n "$key")"
  [ "$have" = "$want" ] || die "$key is $have after applying $SYSCTL_CONF, not $want"
done
log "sysctls applied from $SYSCTL_CONF"

# Last: the marker that tells jobs this is the prepared volume (written whole, then renamed).
echo "prepared $(date -u +%Y-%m-%dT%H:%M:%SZ) device=$DEVICE filesystem=$FILESYSTEM" \\
  > "$MOUNT_POINT/$READY_MARKER.tmp"
mv -f "$MOUNT_POINT/$READY_MARKER.tmp" "$MOUNT_POINT/$READY_MARKER"
log "scratch ready: $MOUNT_POINT/$READY_MARKER"
"""
