"""Reader for the LD_PRELOAD interposer's records (profiling/interpose/iobatch_interpose.c).

The job starts its dynamically linked children with `preload_env(scratch)`; every such process appends
cumulative records to `<scratch>/.iobatch-calls/calls-<pid>.jsonl` once per interval and at exit.
`InterposeProbe` turns them into the per-call dict of profiling.probes.callstats for one stage.

What it cannot see: statically linked programs and Go binaries such as s5cmd (they make system calls
directly), stdio's internal reads and writes inside libc, and memory-mapped I/O. Stage boundaries are
resolved to the record interval (1 s by default): a record is the state at its time stamp.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiling.probes.callstats import CALLS, NO_SIZE, Cells, Stats, add_cells, calls_dict, cells_since

NAME = "interpose"
RECORD_DIR_NAME = ".iobatch-calls"
LIB_NAME = "libiobatch_interpose.so"
ENV_LIB = "IOBATCH_INTERPOSE_LIB"  # override where the library is
ENV_DIR = "IOBATCH_INTERPOSE_DIR"  # read by the library: where records go
ENV_INTERVAL_MS = "IOBATCH_INTERPOSE_INTERVAL_MS"
DEFAULT_INTERVAL_S = 1.0


def library_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The built interposer library, or None when `make setup` has not built it."""
    env = os.environ if environ is None else environ
    candidates = [Path(env[ENV_LIB])] if env.get(ENV_LIB) else []
    candidates.append(Path(__file__).resolve().parent.parent / "interpose" / LIB_NAME)
    for path in candidates:
        if path.is_file():
            return path
    return None


def record_dir(scratch_dir: Path) -> Path:
    return Path(scratch_dir) / RECORD_DIR_NAME


def preload_env(scratch_dir: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables that make a child process record its calls into `scratch_dir`.

    Returns {} when the library is not built. LD_PRELOAD keeps any library already preloaded.
    """
    env = os.environ if environ is None else environ
    lib = library_path(env)
    if lib is None:
        return {}
    directory = record_dir(scratch_dir)
    directory.mkdir(parents=True, exist_ok=True)
    preload = " ".join(p for p in (str(lib), env.get("LD_PRELOAD", "")) if p)
    return {"LD_PRELOAD": preload, ENV_DIR: str(directory)}


@dataclass(frozen=True)
class Record:
    """One line of a process's record file: cumulative figures at monotonic time `t`."""

    pid: int
    t: float
    final: bool
    cells: Cells


def parse_record(line: str) -> Record:
    """One record line -> Record. Raises ValueError on a malformed line."""
    data = json.loads(line)
    paths = [str(p) for p in data["paths"]]
    cells: Cells = {}
    for path_index, call, size, count, nbytes, total, lo, hi, hist in data["cells"]:
        key = (paths[path_index], CALLS[call], NO_SIZE if size < 0 else int(size))
        stats = Stats(int(count), int(nbytes), int(total), int(lo), int(hi), {int(k): int(v) for k, v in hist.items()})
        cells.setdefault(key, Stats()).add(stats)
    return Record(int(data["pid"]), float(data["t"]), bool(data["final"]), cells)


def read_records(directory: Path) -> dict[int, list[Record]]:
    """Every process's records, oldest first. A line being written right now (no newline yet) is skipped."""
    out: dict[int, list[Record]] = {}
    if not directory.is_dir():
        return out
    for file in sorted(directory.glob("calls-*.jsonl")):
        try:
            text = file.read_text(encoding="utf-8")
        except OSError:
            continue
        for line in text.splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            try:
                record = parse_record(line)
            except (ValueError, KeyError, IndexError, TypeError):
                continue
            out.setdefault(record.pid, []).append(record)
    for records in out.values():
        records.sort(key=lambda r: r.t)
    return out


def state_at(records: list[Record], t: float) -> Cells:
    """A process's cumulative cells at time t: its last record at or before t."""
    state: Cells = {}
    for record in records:
        if record.t > t:
            break
        state = record.cells
    return state


def stage_calls(
    records: Mapping[int, list[Record]],
    start: float,
    stop: float,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> tuple[Cells, list[tuple[float, Cells]]]:
    """Calls made in [start, stop] (monotonic seconds), in total and per interval since start."""
    total: Cells = {}
    edges = [start + i * interval_s for i in range(int((stop - start) / interval_s) + 1)]
    if edges[-1] < stop:
        edges.append(stop)
    frames: list[tuple[float, Cells]] = [(edge - start, {}) for edge in edges[:-1]]
    for proc in records.values():
        add_cells(total, cells_since(state_at(proc, stop), state_at(proc, start)))
        previous = state_at(proc, edges[0])
        for i, edge in enumerate(edges[1:]):
            current = state_at(proc, edge)
            add_cells(frames[i][1], cells_since(current, previous))
            previous = current
    return total, frames


class InterposeProbe:
    """A CallProbe over the interposer's record directory (all processes preloaded with it)."""

    name = NAME

    def __init__(self, directory: Path, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.directory = Path(directory)
        self.interval_s = interval_s
        self._start: float | None = None
        self._pid = 0

    def start(self, pid: int) -> None:
        self._pid = pid
        self._start = time.monotonic()

    def stop(self) -> dict[str, Any] | None:
        if self._start is None:
            return None
        start, self._start = self._start, None
        stop = time.monotonic()
        records = read_records(self.directory)
        total, frames = stage_calls(records, start, stop, self.interval_s)
        if not total:
            return None
        return calls_dict(
            NAME,
            total,
            frames,
            filter_text=f"processes started with the LD_PRELOAD interposer recording into {self.directory}",
            duration_s=stop - start,
            interval_s=self.interval_s,
            notes=["statically linked programs (Go: s5cmd) are not seen by LD_PRELOAD"],
        )
