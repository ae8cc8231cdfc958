"""Per-call figures shared by the call probes (interpose.py, ebpf.py) and contracts (contract.py). Pure.

Owns the shape of StageProfile.calls. A probe's raw figures are cells: one Stats (count, bytes, latency in ns, a log2
histogram, min and max) per (path prefix, call type of CALLS, size class). `calls_dict` builds from them the dict a
probe's stop() returns (per call type, per size class, per path, the cells, per-interval frames), and `merge_results`
keeps the first probe's dict as the calls and adds each later one under its probe's name. Size class K of a read or
write is the bit length of its bytes (it moved [2^(K-1), 2^K)), NO_SIZE for open, close and fsync; histogram bucket k
holds the calls that took [2^k, 2^(k+1)) ns. A difference of cumulative counters (`Stats.since`) is exact but for
its min and max, which may be a bucket's bound (extremes_bound). The whole format: docs/profiler.md, "The per-call
figures in a profile".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from profiling.metrics import BY_CALL

# Each a family: read (read, pread64, readv, preadv*), write (write, pwrite64, writev, pwritev*), open (open, openat,
# creat and their 64-bit variants), close, fsync (fsync, fdatasync).
CALLS: tuple[str, ...] = ("read", "write", "open", "close", "fsync")
NO_SIZE = -1
CellKey = tuple[str, str, int]  # (path prefix, call, size class)


@dataclass
class Stats:
    """Count, bytes and latency of a group of calls. Latencies in nanoseconds."""

    count: int = 0
    bytes: int = 0
    total_ns: int = 0
    min_ns: int | None = None
    max_ns: int | None = None
    hist: dict[int, int] = field(default_factory=dict)
    # True when min_ns or max_ns is a histogram bucket's bound, not a measured call (see `since`): up to 2x
    # off, and shown as a bound wherever it appears.
    extremes_bound: bool = False
    max_bytes: int | None = None  # the bytes the slowest call moved, when the probe tells (eBPF)

    def add(self, other: Stats) -> None:
        if other.count == 0:
            return
        self.extremes_bound = self.extremes_bound or other.extremes_bound
        if other.min_ns is not None and (self.min_ns is None or other.min_ns < self.min_ns):
            self.min_ns = other.min_ns
        if other.max_ns is not None and (self.max_ns is None or other.max_ns > self.max_ns):
            self.max_ns, self.max_bytes = other.max_ns, other.max_bytes
        self.count += other.count
        self.bytes += other.bytes
        self.total_ns += other.total_ns
        for bucket, n in other.hist.items():
            self.hist[bucket] = self.hist.get(bucket, 0) + n

    def since(self, before: Stats) -> Stats:
        """The calls made after `before` (an earlier cumulative state of the same counters).

        Count, bytes, total and histogram subtract exactly. The new extremes are exact when they
        moved (the largest call since `before` is the new maximum); otherwise they are bounded by the
        histogram bucket of the extreme call, the best cumulative counters allow.
        """
        if before.count == 0:
            return Stats(self.count, self.bytes, self.total_ns, self.min_ns, self.max_ns, dict(self.hist),
                         max_bytes=self.max_bytes)
        hist = {k: n - before.hist.get(k, 0) for k, n in self.hist.items() if n - before.hist.get(k, 0) > 0}
        count = self.count - before.count
        if count <= 0:
            return Stats()
        low = min(hist) if hist else 0
        high = max(hist) if hist else 0
        min_ns = self.min_ns if self.min_ns != before.min_ns else (1 << low if low else 0)
        max_ns = self.max_ns if self.max_ns != before.max_ns else (1 << (high + 1)) - 1
        if self.max_ns is not None:
            max_ns = min(max_ns or 0, self.max_ns)
        if self.min_ns is not None and min_ns is not None:
            min_ns = max(min_ns, self.min_ns)
        bound = self.min_ns == before.min_ns or self.max_ns == before.max_ns or self.extremes_bound
        max_bytes = self.max_bytes if self.max_ns != before.max_ns else None
        return Stats(count, self.bytes - before.bytes, self.total_ns - before.total_ns, min_ns, max_ns, hist, bound,
                     max_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "bytes": self.bytes,
            "total_us": self.total_ns / 1000,
            "mean_us": self.total_ns / self.count / 1000 if self.count else None,
            "min_us": None if self.min_ns is None else self.min_ns / 1000,
            "max_us": None if self.max_ns is None else self.max_ns / 1000,
            "hist": {str(k): n for k, n in sorted(self.hist.items())},
            **({"extremes_bound": True} if self.extremes_bound else {}),
            **({"max_bytes": self.max_bytes} if self.max_bytes is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stats:
        def ns(key: str) -> int | None:
            value = data.get(key)
            return None if value is None else round(float(value) * 1000)

        return cls(
            count=int(data.get("count", 0)),
            bytes=int(data.get("bytes", 0)),
            total_ns=round(float(data.get("total_us", 0)) * 1000),
            min_ns=ns("min_us"),
            max_ns=ns("max_us"),
            hist={int(k): int(v) for k, v in dict(data.get("hist", {})).items()},
            extremes_bound=bool(data.get("extremes_bound", False)),
            max_bytes=None if data.get("max_bytes") is None else int(data["max_bytes"]),
        )


Cells = dict[CellKey, Stats]


def size_class(nbytes: int) -> int:
    """The size class of a call that moved `nbytes`: its bit length (0 for none)."""
    return max(0, nbytes).bit_length()


def size_label(k: int) -> str:
    """A readable name for size class k, e.g. "4KiB-8KiB"."""
    if k < 0:
        return "none"
    if k == 0:
        return "0B"
    return f"{_bytes_label(1 << (k - 1))}-{_bytes_label(1 << k)}"


def _bytes_label(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n // size}{unit}"
    return f"{n}B"


def add_cells(into: Cells, more: Mapping[CellKey, Stats]) -> None:
    for key, stats in more.items():
        into.setdefault(key, Stats()).add(stats)


def cells_since(now: Mapping[CellKey, Stats], before: Mapping[CellKey, Stats]) -> Cells:
    """Per-cell difference of two cumulative states of the same process."""
    out: Cells = {}
    for key, stats in now.items():
        delta = stats.since(before.get(key, Stats()))
        if delta.count:
            out[key] = delta
    return out


def cells_to_list(cells: Mapping[CellKey, Stats]) -> list[dict[str, Any]]:
    return [{"path": p, "call": c, "size": k, **s.to_dict()} for (p, c, k), s in sorted(cells.items())]


def cells_from_list(rows: Iterable[Mapping[str, Any]]) -> Cells:
    cells: Cells = {}
    for row in rows:
        key = (str(row["path"]), str(row["call"]), int(row["size"]))
        cells.setdefault(key, Stats()).add(Stats.from_dict(row))
    return cells


def calls_dict(
    probe: str,
    cells: Mapping[CellKey, Stats],
    frames: Iterable[tuple[float, Mapping[CellKey, Stats]]],
    *,
    filter_text: str,
    duration_s: float,
    interval_s: float,
    notes: Iterable[str] = (),
    dirty_throttle_ms: float | None = None,
    path_attribution: bool = True,
) -> dict[str, Any]:
    """The dict a call probe returns (its shape: docs/profiler.md, "The per-call figures in a profile")."""
    by_call: dict[str, Stats] = {}
    by_size: dict[str, dict[str, Stats]] = {}
    by_path: dict[str, dict[str, Stats]] = {}
    for (path, call, k), stats in sorted(cells.items()):
        by_call.setdefault(call, Stats()).add(stats)
        if k != NO_SIZE:
            by_size.setdefault(call, {}).setdefault(size_label(k), Stats()).add(stats)
        by_path.setdefault(path, {}).setdefault(call, Stats()).add(stats)
    out: dict[str, Any] = {
        "probe": probe,
        "filter": filter_text,
        "duration_s": round(duration_s, 6),
        "interval_s": interval_s,
        BY_CALL: {c: by_call[c].to_dict() for c in CALLS if c in by_call},
        "by_size": {c: {label: s.to_dict() for label, s in sizes.items()} for c, sizes in by_size.items()},
        "by_path": {p: {c: s.to_dict() for c, s in calls.items()} for p, calls in by_path.items()},
        "cells": cells_to_list(cells),
        "frames": [{"t": round(t, 3), "cells": cells_to_list(fc)} for t, fc in frames if fc],
        "notes": list(notes),
        "path_attribution": path_attribution,
    }
    if dirty_throttle_ms is not None:
        out["dirty_throttle_ms"] = dirty_throttle_ms
    return out


def merge_results(
    results: Iterable[tuple[str, Mapping[str, Any] | None]],
) -> tuple[dict[str, Any] | None, str | None]:
    """(calls, source name) from the (probe name, `stop()` result) of the stage's probes, best first: the
    first non-empty result is StageProfile.calls, every later one is added under calls[<its name>] (eBPF first:
    any binary; the interposer's per-path figures beside it). (None, None) when no probe saw anything."""
    calls: dict[str, Any] | None = None
    name: str | None = None
    for probe, result in results:
        if not result:
            continue
        if calls is None:
            calls, name = dict(result), probe
        elif probe not in calls:
            calls[probe] = dict(result)
    return calls, name

