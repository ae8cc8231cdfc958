"""Probes: the sources of a stage's figures, and the factories that pick the ones that can run here.

- procfs.py: /proc/<pid>/io, /proc/diskstats, /proc/vmstat, /proc/pressure/io. Always on; exact bytes
  and call counts for any binary.
- ebpf.py (with bpftrace.py, its program) / interpose.py: per-call latency (optional). See `CallProbe`;
  callstats.py defines the per-call dict they return (per call type, size class, path prefix and time
  frame) and how the results of several probes are merged.

Imports flow one way: this package's factories import the probes, the probes import callstats.py and
procfs.py, and those import neither.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from profiling.probes import ebpf, interpose
from profiling.probes.callstats import merge_results
from profiling.probes.interpose import preload_env

__all__ = ["CallProbe", "Warn", "call_probes_for", "merge_results", "preload_env", "start_command_probe"]

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
        dirty_throttle_ms                 eBPF only: writeback:balance_dirty_pages pauses
    STATS = {count, bytes, total_us, mean_us, min_us, max_us, hist}; hist maps k to the calls that
    took [2^k, 2^(k+1)) ns.

    Optional `close()` (not part of the structural type, looked up with getattr): a probe that keeps
    something running between stages (the eBPF probe keeps one bpftrace per job, so a stage boundary
    costs the job ~0.1 s instead of an attach) ends it there. The sidecar calls it once when it exits,
    on every path (job_end, EOF, SIGTERM, error); it must be idempotent and must not raise.
    """

    name: str

    def start(self, pid: int) -> None: ...

    def stop(self) -> dict[str, Any] | None: ...


def _warn(text: str) -> None:
    print(f"note: profiler: {text}", file=sys.stderr, flush=True)


def call_probes_for(scratch_dir: Path | None, *, warn: Warn = _warn) -> list[CallProbe]:
    """The per-call probes the sidecar runs for a job working in `scratch_dir`, best first.

    eBPF when root with bpftrace and tracefs (any binary, static Go included; one bpftrace for the
    whole job, closed by the sidecar), then the LD_PRELOAD interposer's records in `scratch_dir`
    (dynamically linked programs the job starts with `preload_env`). The sidecar starts each with the
    stage's pid and merges their `stop()` results (callstats.merge_results). A probe that cannot run
    is left out with one notice through `warn`; nothing here raises.
    """
    probes: list[CallProbe] = []
    reason = ebpf.available()
    if reason is None:
        probes.append(ebpf.EbpfProbe(keep_running=True))
    else:
        warn(f"{reason}; per-call latency only for programs run with the LD_PRELOAD interposer")
    if scratch_dir is not None and interpose.library_path() is not None:
        probes.append(interpose.InterposeProbe(interpose.record_dir(scratch_dir)))
    return probes


def start_command_probe(warn: Warn) -> CallProbe | None:
    """An eBPF probe on the processes this process starts from now on (not on itself), started; or
    None with one notice through `warn` when eBPF cannot run here. For `iobatch profile -- CMD`."""
    reason = ebpf.available()
    if reason is not None:
        warn(f"{reason}: no per-call latency; counts and bytes come from procfs")
        return None
    probe = ebpf.EbpfProbe(count_root=False)
    try:
        probe.start(os.getpid())
    except RuntimeError as exc:
        warn(f"eBPF probe did not start ({exc}): no per-call latency; counts and bytes come from procfs")
        return None
    return probe
