"""Probes: the sources of a stage's figures.

- procfs.py: /proc/<pid>/io, /proc/diskstats, /proc/vmstat, /proc/pressure/io. Always on; exact bytes
  and call counts for any binary.
- interpose.py / ebpf.py: per-call latency (optional). See `CallProbe`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class CallProbe(Protocol):
    """A per-call probe the sidecar starts at stage_start and stops at stage_end.

    `stop()` returns the per-call figures stored in StageProfile.calls (or None if it saw nothing);
    `name` is what StageProfile.sources records as the producer of those figures.
    """

    name: str

    def start(self, pid: int) -> None: ...

    def stop(self) -> dict[str, Any] | None: ...


def call_probes_for(scratch_dir: Path) -> list[CallProbe]:
    """The per-call probes the sidecar runs for a job working in `scratch_dir` (seam for the interposer
    and eBPF probes). The sidecar starts each with the stage's pid and stores the first non-empty
    `stop()` result in StageProfile.calls. Must not raise for a missing tool: return fewer probes."""
    return []
