"""Probes: the sources of a stage's figures, and the factories that pick the ones that can run here.

- procfs.py: /proc/<pid>/io, /proc/diskstats, /proc/vmstat, /proc/pressure/io. Always on; exact bytes
  and call counts for any binary.
- ebpf.py (the CO-RE program profiling/bpf/iobatch.bpf.c, loaded by libbpf.py, its maps read by
  ebpf_maps.py, its processes selected by cgroup with cgroup.py) / interpose.py: per-call latency
  (optional). See `CallProbe`; callstats.py defines the per-call dict they return (per call type, size
  class, path prefix and time frame) and how the results of several probes are merged.

Imports flow one way: this package's factories import the probes, the probes import callstats.py and
procfs.py (and their own helpers), and those import no probe.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from profiling.probes import ebpf, interpose
from profiling.probes.callstats import merge_results
from profiling.probes.disk import disk_of, whole_disk
from profiling.probes.interpose import preload_env
from profiling.probes.procfs import BlockDevice

__all__ = ["CallProbe", "Warn", "call_probes_for", "command_environment", "merge_results", "preload_env", "prepare",
           "start_command_probe", "stop_later"]

Warn = Callable[[str], None]


class CallProbe(Protocol):
    """A per-call probe the sidecar starts at stage_start and stops at stage_end.

    `stop()` returns the per-call figures stored in StageProfile.calls (or None if it saw nothing);
    `name` is what StageProfile.sources records as the producer of those figures.

    The dict (full description in profiling/probes/callstats.py):
        probe, filter, duration_s, interval_s, path_attribution, notes
        calls    {call: STATS}            call in read, write, open, close, fsync
        by_size  {call: {"4KiB-8KiB": STATS}}   read and write, power-of-two size classes
        by_path  {prefix: {call: STATS}}  "" = sockets, pipes, fds opened before the probe
        cells    [{path, call, size, **STATS}]  the cross product, what contracts evaluate
        frames   [{t, cells}]             per interval since start
        dirty_throttle_ms                 eBPF only: writeback:balance_dirty_pages pauses, summed over tasks
        dirty_throttle_wall_ms            eBPF only: time during which any of the job's writers was paused
        dirtied_bytes                     eBPF only: page-cache pages the job dirtied, in bytes
        socket {sent_bytes, received_bytes}   eBPF only (Linux 6.3+): bytes moved on sockets
        device_requests {disk, seq_bytes, random_bytes, random_ios}   eBPF only: the scratch disk's read and
                                          write requests by sector continuity (device-wide, not the job's own)
    (an eBPF figure whose hook this kernel lacks is absent, with a note)
    STATS = {count, bytes, total_us, mean_us, min_us, max_us, hist}; hist maps k to the calls that
    took [2^k, 2^(k+1)) ns.

    Optional `prepare()` (looked up with getattr): what start() would do first that does not depend on the pid
    (eBPF: join the host's programs); the sidecar calls it when it binds its socket, while the job starts up.

    Optional `stop_later()` (looked up with getattr, like `close()`): stop() in two halves, the closing reading
    taken at once and a function returned that builds the dict from it; the sidecar calls it before answering the
    job's stage_end and builds the figures afterwards, so the job does not wait for the building.

    Optional `close()` (not part of the structural type, looked up with getattr): a probe that keeps
    something running between stages (the eBPF probe keeps its program loaded for the whole job, so a
    stage boundary costs the job a reading of its memory instead of a load) ends it there. The sidecar
    calls it once when it exits, on every path (job_end, EOF, SIGTERM, error); it must be idempotent
    and must not raise.
    """

    name: str

    def start(self, pid: int) -> None: ...

    def stop(self) -> dict[str, Any] | None: ...


def prepare(probes: Sequence[CallProbe]) -> None:
    """`probe.prepare()` of each probe that has one (eBPF: join the host's programs), errors left to start()."""
    for probe in probes:
        with contextlib.suppress(Exception):  # start() tries again, and says why once if it fails
            getattr(probe, "prepare", lambda: None)()


def stop_later(probe: CallProbe) -> Callable[[], dict[str, Any] | None]:
    """`probe.stop_later()` where it has one, else stop() now and its result as the function's."""
    later = getattr(probe, "stop_later", None)
    if later is not None:
        return later()
    result = probe.stop()
    return lambda: result


def _warn(text: str) -> None:
    print(f"note: profiler: {text}", file=sys.stderr, flush=True)


def call_probes_for(scratch_dir: Path | None, *, warn: Warn = _warn) -> list[CallProbe]:
    """The per-call probes the sidecar runs for a job working in `scratch_dir`, best first.

    eBPF when root (or given the capabilities) with the kernel's BTF (any binary, static Go included;
    one loaded program for the whole job, closed by the sidecar), then the LD_PRELOAD interposer's
    records in `scratch_dir` (dynamically linked programs the job starts with `preload_env`). The
    sidecar starts each with the stage's pid and merges their `stop()` results
    (callstats.merge_results). A probe that cannot run is left out with one notice through `warn`;
    nothing here raises.
    """
    probes: list[CallProbe] = []
    reason = ebpf.available()
    if reason is None:
        probes.append(ebpf.EbpfProbe(keep_running=True, disk=None if scratch_dir is None else whole_disk(scratch_dir)))
    else:
        warn(f"{reason}; per-call latency only for programs run with the LD_PRELOAD interposer")
    if scratch_dir is not None and interpose.library_path() is not None:
        probes.append(interpose.InterposeProbe(interpose.record_dir(scratch_dir)))
    return probes


def _dynamically_linked(program: str) -> bool:
    """Whether `program` (a name on PATH or a path) is an ELF file with an interpreter (PT_INTERP), i.e. a
    dynamically linked program LD_PRELOAD reaches; the ELF header layout is elf(5)'s."""
    import shutil
    import struct

    path = shutil.which(program)
    if path is None:
        return False
    try:
        with open(path, "rb") as elf:
            head = elf.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
                return False
            order = "<" if head[5] == 1 else ">"
            phoff, = struct.unpack_from(order + "Q", head, 32)
            phentsize, phnum = struct.unpack_from(order + "HH", head, 54)
            elf.seek(phoff)
            table = elf.read(phentsize * phnum)
    except OSError:
        return False
    return any(struct.unpack_from(order + "I", table, i * phentsize)[0] == 3 for i in range(phnum))  # PT_INTERP


class _CommandInterposeProbe(interpose.InterposeProbe):
    """The interposer's records of one command, in a directory of their own that stop() removes; `environment`
    is what the command is started with on top of this process's (never set in this process's own environment:
    it would reach every program this process starts later)."""

    def __init__(self, scratch: Path) -> None:
        super().__init__(interpose.record_dir(scratch))
        self.environment = preload_env(scratch)

    def stop(self) -> dict[str, Any] | None:
        import shutil

        try:
            return super().stop()
        finally:
            shutil.rmtree(self.directory.parent, ignore_errors=True)


def command_environment(probe: CallProbe | None) -> dict[str, str]:
    """What the command a probe of `start_command_probe` watches is started with, on top of this process's
    environment: the interposer's preload, or nothing."""
    return dict(probe.environment) if isinstance(probe, _CommandInterposeProbe) else {}


def start_command_probe(warn: Warn, argv: Sequence[str] = (), *,
                        device: BlockDevice | None = None) -> CallProbe | None:
    """A per-call probe on the processes this process starts from now on (not on itself), started; or
    None with one notice through `warn` when none can run here. For `iobatch profile -- CMD`.

    eBPF when it can run (any binary); else, for a dynamically linked `argv[0]`, the LD_PRELOAD
    interposer, preloaded through the command's environment (`command_environment`). eBPF also classes
    the requests of `device`'s disk (DeviceRandomShare)."""
    reason = ebpf.available()
    if reason is None:
        probe = ebpf.EbpfProbe(count_root=False, disk=None if device is None else disk_of(device))
        try:
            probe.start(os.getpid())
            return probe
        except (RuntimeError, OSError) as exc:
            reason = f"eBPF probe did not start ({exc})"
    if argv and _dynamically_linked(argv[0]) and interpose.library_path() is not None:
        import tempfile

        scratch = Path(tempfile.mkdtemp(prefix="iobatch-calls-"))
        warn(f"{reason}: per-call figures from the LD_PRELOAD interposer")
        command_probe = _CommandInterposeProbe(scratch)
        command_probe.start(os.getpid())
        return command_probe
    warn(f"{reason}: no per-call latency; counts and bytes come from procfs")
    return None
