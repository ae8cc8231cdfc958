"""Probes: the sources of a stage's figures.

- procfs.py: /proc/<pid>/io, /proc/diskstats, /proc/vmstat, /proc/pressure/io. Always on; exact bytes
  and call counts for any binary.
- interpose.py / ebpf.py: per-call latency (optional). See `CallProbe`.
"""

from __future__ import annotations

from typing import Any, Protocol


class CallProbe(Protocol):
    """A per-call probe the sidecar starts at stage_start and stops at stage_end.

    `stop()` returns the per-call figures stored in StageProfile.calls (or None if it saw nothing);
    `name` is what StageProfile.sources records as the producer of those figures.
    """

    name: str

    def start(self, pid: int) -> None: ...

    def stop(self) -> dict[str, Any] | None: ...
