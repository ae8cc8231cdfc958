"""Probes: the sources of a stage's figures.

- procfs.py: /proc/<pid>/io, /proc/diskstats, /proc/vmstat, /proc/pressure/io. Always on; exact bytes
  and call counts for any binary.
- interpose.py / ebpf.py: per-call latency (optional). See `CallProbe`; callstats.py defines the
  per-call dict they return (per call type, size class, path prefix and time frame).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


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


def call_probes_for(scratch_dir: Path) -> list[CallProbe]:
    """The per-call probes the sidecar runs for a job working in `scratch_dir` (seam for the interposer
    and eBPF probes). The sidecar starts each with the stage's pid and stores the first non-empty
    `stop()` result in StageProfile.calls, the others under calls[<probe name>]
    (callstats.merge_results), and calls each probe's `close()`, if it has one, when it exits. Must not
    raise for a missing tool: return fewer probes.

    Best first: eBPF when root with bpftrace and tracefs (any binary, static Go included), then the
    LD_PRELOAD interposer's records in `scratch_dir` (dynamically linked programs the job starts with
    `profiling.probes.interpose.preload_env`). A missing eBPF prerequisite is one notice on stderr.
    The dict `stop()` returns is described in profiling/probes/callstats.py."""
    import sys

    from profiling.probes.callstats import available_call_probes

    def notice(text: str) -> None:
        print(f"note: profiler: {text}", file=sys.stderr, flush=True)

    return list(available_call_probes(scratch_dir, warn=notice))
