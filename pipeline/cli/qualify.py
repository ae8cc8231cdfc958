"""`iobatch qualify`: measure a scratch device as a Batch host's user data does before it takes jobs, against the
expectation of a volume and instance type (tuning/qualify.py; the measurement is profiling/qualifyio.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from pipeline.cli.advise import _instance
from pipeline.errors import UsageError
from tuning.instances import DEFAULT_VCPUS_PER_JOB

if TYPE_CHECKING:
    from tuning.ebs import Volume

MAX_SECONDS = 600.0
MAX_GIB = 64.0


def _volume(volume: str | None, volume_type: str | None, volume_size_gib: int | None) -> Volume:
    """--volume as the advisor spells it (TYPE:SIZE_GIB[:iops=N][:throughput=MIBPS] or nvme:INSTANCE_TYPE), or
    --volume-type and --volume-size-gib, through the advisor's one parser (tuning.plan.parse_candidate)."""
    from tuning.ebs import VolumeError
    from tuning.plan import AdviseError, parse_candidate

    if volume is not None and (volume_type is not None or volume_size_gib is not None):
        raise UsageError("give --volume or --volume-type and --volume-size-gib, not both: e.g. --volume st1:500")
    if volume is None:
        if (volume_type is None) != (volume_size_gib is None):
            raise UsageError("--volume-type and --volume-size-gib go together: e.g. --volume-type st1 "
                             "--volume-size-gib 500")
        volume = f"{volume_type}:{volume_size_gib}" if volume_type is not None else "st1:500"
        flag = "--volume-type/--volume-size-gib" if volume_type is not None else "--volume"
    else:
        flag = "--volume"
    try:
        return parse_candidate(volume, instance_store=True, what=flag)
    except (AdviseError, VolumeError) as exc:
        raise UsageError(str(exc)) from None


def qualify(
    target: Path = typer.Argument(Path("."), metavar="DEVICE_OR_DIR", help="A directory on the volume (a file there "
                                  "is written and read back, then removed: no root needed), or a block device (read "
                                  "only, as root). Default: the current directory."),
    volume: str | None = typer.Option(None, "--volume", metavar="VOLUME", help="The volume to expect: "
                                      "TYPE:SIZE_GIB[:iops=N][:throughput=MIBPS] as `iobatch advise` takes it, or "
                                      "nvme:INSTANCE_TYPE for an instance store. Default: st1:500 (the stack's)."),
    volume_type: str | None = typer.Option(None, "--volume-type", metavar="TYPE", help="The volume's type (st1, sc1, "
                                           "gp2, gp3, io1, io2), with --volume-size-gib: the same as --volume "
                                           "TYPE:SIZE_GIB."),
    volume_size_gib: int | None = typer.Option(None, "--volume-size-gib", min=1, max=65536, metavar="GIB",
                                               help="The volume's size in GiB, with --volume-type."),
    instance_type: str | None = typer.Option(None, "--instance-type", metavar="TYPE", help="An EC2 instance type of "
                                             "the project's table: its EBS bandwidth caps the expectation."),
    io_size_kib: int = typer.Option(1024, "--io-size-kib", min=4, max=16384, metavar="KIB", help="The sequential "
                                    "I/O size (a multiple of 4), the plan's; the user data's is qualifyIoSizeKiB."),
    seconds: float = typer.Option(10.0, "--seconds", min=1.0, max=MAX_SECONDS, metavar="SECONDS", help="The time "
                                  "budget in all."),
    max_gib: float = typer.Option(2.0, "--max-gib", min=0.01, max=MAX_GIB, metavar="GIB", help="The most bytes moved "
                                  "in all (writes at most half)."),
    small: bool | None = typer.Option(None, "--small/--no-small", help="Also 4 KiB random reads (default: for an "
                                      "instance store, as the user data does)."),
    min_ratio: float = typer.Option(0.5, "--min-ratio", min=0.01, max=0.99, metavar="RATIO", help="Below this ratio "
                                    "to the expectation the device is slow (the stack's qualifyMinRatio)."),
    as_json: bool = typer.Option(False, "--json", help="Print the record, the expectation and the cost as JSON."),
) -> None:
    """Measure a scratch device as a host's user data does at boot (sequential O_DIRECT writes and reads, small
    random reads on instance stores, bounded by time and bytes) and print MiB/s, latency percentiles, the figure the
    volume model expects and their ratio. Exit 0 when measured, slow or not (the verdict says which)."""
    from profiling.qualifyio import QualifyError, judge, measure
    from tuning.ebs import GIB, KIB
    from tuning.instancestore import InstanceStore
    from tuning.qualify import QualifyPolicy, QualifyPolicyError, cost, expect, render

    chosen = _volume(volume, volume_type, volume_size_gib)
    kind = _instance(instance_type, DEFAULT_VCPUS_PER_JOB)
    try:
        QualifyPolicy(io_kib=io_size_kib, min_ratio=min_ratio).validate()
    except QualifyPolicyError as exc:
        raise UsageError(str(exc).replace("qualifyIoSizeKiB", "--io-size-kib").split(": e.g.")[0]
                         + ": e.g. --io-size-kib 1024") from None
    store = isinstance(chosen, InstanceStore)
    expectation = expect(chosen, kind, io_size_kib * KIB)
    if not target.exists():
        raise UsageError(f"{str(target)[:80]}: no such directory or device: give the volume's mount point")
    try:
        record = measure(str(target), io_size_kib * KIB, seconds, int(max_gib * GIB), store if small is None else small)
    except QualifyError as exc:
        raise UsageError(str(exc)) from None
    except PermissionError:
        raise UsageError(f"{str(target)[:80]}: permission denied: give a directory you can write on the volume, or "
                         "run as root for a device") from None
    except OSError as exc:
        raise UsageError(f"{str(target)[:80]}: {exc.strerror or exc}: give a directory on the volume") from None
    judge(record, expectation.write_mibps, expectation.read_mibps, min_ratio)
    spent = cost(chosen, expectation, seconds=seconds, max_bytes=int(max_gib * GIB),
                 io_size=io_size_kib * KIB, small=store)
    if as_json:
        out = {"record": record, "expected": expectation.to_json(),
               "cost": {"seconds": round(spent.seconds, 2), "bytes": spent.bytes, "credits": round(spent.credits, 1),
                        "bucket_share": spent.bucket_share}}
        print(json.dumps(out, indent=1))
    else:
        print(render(record, expectation, chosen, spent))
