"""What qualification costs a host at boot on a new st1 500 GiB: seconds, bytes and burst credits, measured on an
emulated st1 beside what the model predicts (tuning.qualify.cost), and what it measured against the expectation.

    python -m bench.qualify_cost [--where lab|guest|both]

- lab (root, fuse3, xfsprogs): the lab's st1 on this machine (tuning/lab: a FUSE device under a loop device that
  runs at the volume's burst while its bucket lasts and charges it as EBS does, by 1 MiB of sequential I/O and a
  whole MiB per small random I/O), a new volume's full bucket; the same measurement the user data runs
  (profiling.qualifyio.measure) on its XFS, and the credits the device charged, read from it before and after.
- guest: one boot of the cgroup v2 guest as a Batch host (tests/support/qualifyhost.py: the template's user data on
  a disk QEMU throttles at st1 500 GiB's burst); QEMU's bucket cannot be read, so its credits are EBS's accounting of
  the bytes the qualification moved, all sequential (bytes / 1 MiB). And the boot's whole user data time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuning.ebs import MIB, Volume

ST1 = Volume("st1", 500)


def _row(where: str, seconds: float, moved: int, credits: float, record: dict[str, Any] | None) -> str:
    share = credits / ST1.credit_capacity
    figures = "| - | - | - |" if record is None else (
        f"| {record['write']['mibps']:.1f} | {record['read']['mibps']:.1f} | {record['ratio']:.2f}x |")
    return f"| {where} | {seconds:.1f} | {moved / 2**30:.2f} | {credits:,.0f} | {share:.2%} {figures}"


def lab_row() -> str:
    from profiling.qualifyio import judge, measure
    from tuning.lab.config import LabConfig
    from tuning.lab.volume import Lab
    from tuning.qualify import expect

    if os.geteuid() != 0:
        return "| lab | skipped: needs root (loop device, mount, FUSE) | | | | | | |"
    want = expect(ST1)
    with tempfile.TemporaryDirectory(prefix="iobatch-qualify-lab-") as folder:
        config = LabConfig(volume=ST1, lab_dir=Path(folder) / "lab", state_dir=Path(folder) / "state",
                           loop_size_mib=4096, guard=False)
        with Lab(config, say=lambda _: None) as lab:
            before = lab.credits_gib
            record = measure(str(lab.mount))
            time.sleep(2.0)  # the device writes its figures every half second: the last ones after the reads
            spent = (before - lab.credits_gib) * 1024
    judge(record, want.write_mibps, want.read_mibps, 0.5)
    return _row("lab: FUSE st1, full bucket", record["seconds"], record["bytes"], spent, record)


def guest_rows() -> list[str]:
    from tests.support.qualifyhost import boot_qualified_host, nominal_throttle
    from tuning.guest.machine import unavailable

    if reason := unavailable():
        return [f"| guest | skipped: {reason} | | | | | | |"]
    with tempfile.TemporaryDirectory(prefix="iobatch-qualify-guest-") as folder:
        host = boot_qualified_host(Path(folder), nominal_throttle(), "i-0000000000000000a")
    if host.result.returncode != 0 or not host.record:
        return [f"| guest | the boot failed (exit {host.result.returncode}): {host.result.stderr[-200:]!r} "
                "| | | | | | |"]
    record = host.record
    return [_row("guest: QEMU st1 burst", record["seconds"], record["bytes"], record["bytes"] / MIB, record),
            f"\nthe guest's whole boot: {host.result.seconds:.0f} s (its first command at "
            f"{host.result.boot_seconds or 0:.0f} s), the qualification {record['seconds']:.1f} s of it"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--where", choices=("lab", "guest", "both"), default="both")
    args = parser.parse_args()
    from profiling.qualifyio import MAX_BYTES, SECONDS
    from tuning.qualify import cost, expect

    want = expect(ST1)
    model = cost(ST1, want)
    print(f"# What qualification costs a new {ST1.label} at boot, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          f", {os.cpu_count()} cores: at most {SECONDS:g} s and {MAX_BYTES / 2**30:g} GiB, 1 MiB O_DIRECT; "
          f"expected {want.write_mibps:.1f} MiB/s (burst, full bucket of {ST1.credit_capacity / 1024:,.0f} GiB)\n")
    print("| where | seconds | GiB moved | credits MiB | of the bucket | write MiB/s | read MiB/s | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(_row("model (tuning.qualify.cost)", model.seconds, model.bytes, model.credits, None))
    rows = ([lab_row()] if args.where in ("lab", "both") else []) + \
        (guest_rows() if args.where in ("guest", "both") else [])
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
