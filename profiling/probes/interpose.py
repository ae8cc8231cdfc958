"""Reader for the LD_PRELOAD interposer's records (profiling/interpose/iobatch_interpose.c): InterposeProbe.

In: the records of the processes the job started with `preload_env(scratch)`: each appends its cumulative figures
to a file of its own under `record_dir(scratch)` (RECORD_GLOB, one per program run) once per interval, at exit and
when the probe asks. Out: per stage, the per-call dict of profiling.probes.callstats, plus "record_bytes": the
record lines the processes appended in the stage, which the kernel counts as their writes and the library does not
(profiling/finish.py counts them as seen). Invariants: a stage boundary (start(), stop()) is exact: the probe bumps
the generation and waits, at most FLUSH_WAIT_S, until every live process that still has the library mapped has
written a record of it, while the job waits for the ack; a process that does not answer in time leaves the stage's
figures approximate, said in one notice. What it cannot see (static programs such as s5cmd, libc's own stdio calls,
memory-mapped I/O): docs/profiler.md, the interposer.
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiling.probes.callstats import CALLS, NO_SIZE, Cells, Stats, add_cells, calls_dict, cells_since

NAME = "interpose"
# The names and numbers shared with the library are its C source's (file names, variables, FLUSH_POLL_MS, the
# call order): tests/unit/test_interpose_protocol.py checks them against it.
RECORD_DIR_NAME = ".iobatch-calls"
GENERATION_NAME = "generation"  # in the record directory; its size is the generation (see the C header)
RECORD_GLOB = "calls-*.jsonl"  # the library's record files: calls-<pid>-<since_ns>.jsonl
LIB_NAME = "libiobatch_interpose.so"
ENV_LIB = "IOBATCH_INTERPOSE_LIB"  # override where the library is
ENV_DIR = "IOBATCH_INTERPOSE_DIR"  # read by the library: where records go
ENV_INTERVAL_MS = "IOBATCH_INTERPOSE_INTERVAL_MS"
DEFAULT_INTERVAL_S = 1.0
FLUSH_POLL_MS = 20  # the library's: how often its timer thread looks at the generation
FLUSH_WAIT_S = 0.2  # the longest a boundary waits for the processes' records (many polls of the library's)
POLL_S = 0.002


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
    others = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p != str(lib)]
    return {"LD_PRELOAD": " ".join([str(lib), *others]), ENV_DIR: str(directory)}


def recording_into(scratch_dir: Path, environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started with `preload_env(scratch_dir)` (its calls are being recorded)."""
    env = os.environ if environ is None else environ
    lib = library_path(env)
    return (lib is not None and env.get(ENV_DIR) == str(record_dir(scratch_dir))
            and str(lib) in env.get("LD_PRELOAD", "").replace(":", " ").split())


@dataclass(frozen=True)
class Record:
    """One line of a process's record file: cumulative figures at monotonic time `t`."""

    pid: int
    t: float
    final: bool
    cells: Cells
    since: float = 0.0  # when these counters started: the program's start, or its fork
    born: int = 0  # the generation then
    gen: int = 0  # the generation this record answers


@dataclass(frozen=True)
class Boundary:
    """A stage boundary: when it was, and the generation the probe set then (None: it could not, and the
    records' time stamps decide, to within the record interval)."""

    t: float
    gen: int | None = None


def parse_record(line: str) -> Record:
    """One record line -> Record. Raises ValueError on a malformed line."""
    data = json.loads(line)
    paths = [str(p) for p in data["paths"]]
    cells: Cells = {}
    for path_index, call, size, count, nbytes, total, lo, hi, hist in data["cells"]:
        key = (paths[path_index], CALLS[call], NO_SIZE if size < 0 else int(size))
        stats = Stats(int(count), int(nbytes), int(total), int(lo), int(hi), {int(k): int(v) for k, v in hist.items()})
        cells.setdefault(key, Stats()).add(stats)
    return Record(int(data["pid"]), float(data["t"]), bool(data["final"]), cells, float(data.get("since", 0.0)),
                  int(data.get("born", 0)), int(data.get("gen", 0)))


ProcessKey = tuple[int, float]  # (pid, since): a program exec'd in the same pid counts from zero again


class RecordLog:
    """The record files of one directory, read as they grow: each process's records in the order written.

    A file holds one program run (the library's naming): once its final record is read, or a later program
    of the same pid has written (an exec), it never grows again and is no longer looked at."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.processes: dict[ProcessKey, list[Record]] = {}
        #: Bytes of record lines read so far: the recording processes wrote them, so the kernel counts them
        #: as their writes, while the library (whose own calls bypass it) does not.
        self.bytes_read = 0
        self._offsets: dict[str, int] = {}
        self._files: dict[ProcessKey, str] = {}  # which file a program run writes
        self._done: set[str] = set()

    def poll(self, processes: Iterable[int] | None = None) -> None:
        """Read the complete lines appended since the last poll (a line being written waits for the next)
        to every file not done, or, given `processes` (pids a boundary waits for), only to theirs and to
        files that are new (a program one of them exec'd)."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if fnmatch.fnmatchcase(n, RECORD_GLOB))
        except OSError:
            return
        latest = self._latest()
        focus = {self._files[(pid, latest[pid])] for pid in processes or () if pid in latest}
        for name in names:
            if name in self._done or (processes is not None and name in self._offsets and name not in focus):
                continue
            self._read(name)
        latest = self._latest()
        running = {name for (pid, since), name in self._files.items()
                   if since == latest[pid] and not self.processes[(pid, since)][-1].final}
        self._done.update(set(self._files.values()) - running)

    def _read(self, name: str) -> None:
        offset = self._offsets.get(name, 0)
        try:
            if (self.directory / name).stat().st_size <= offset:  # nothing new
                return
            with (self.directory / name).open("rb") as stream:
                stream.seek(offset)
                data = stream.read()
        except OSError:
            return
        complete = data.rfind(b"\n") + 1
        self._offsets[name] = offset + complete
        self.bytes_read += complete
        for line in data[:complete].splitlines():
            try:
                record = parse_record(line.decode())
            except (ValueError, KeyError, IndexError, TypeError):
                continue
            key = (record.pid, record.since)
            self.processes.setdefault(key, []).append(record)
            self._files[key] = name

    def _latest(self) -> dict[int, float]:
        """Each pid's latest program run (its `since`): an earlier one exec'd it."""
        latest: dict[int, float] = {}
        for pid, since in self.processes:
            latest[pid] = max(since, latest.get(pid, since))
        return latest

    def unanswered(self, gen: int) -> list[int]:
        """Pids of live recording processes with no record of generation `gen` yet."""
        latest = self._latest()
        waiting = []
        for (pid, since), records in self.processes.items():
            last = records[-1]
            if since == latest[pid] and not last.final and last.gen < gen and last.born < gen and _alive(pid):
                waiting.append(pid)
        return sorted(waiting)

    def keep_from(self, boundary: Boundary) -> None:
        """Forget what no later stage needs: records before each process's state at `boundary`, and
        processes that had ended by then."""
        for key, records in list(self.processes.items()):
            first = boundary_index(records, boundary)
            if first >= 0 and records[-1].final and first == len(records) - 1:
                del self.processes[key]
                self._files.pop(key, None)
            elif first > 0:
                self.processes[key] = records[first:]


def _alive(pid: int, proc: Path = Path("/proc")) -> bool:
    """A process that can still write a record: it exists and is no zombie (proc(5), /proc/pid/stat state)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    return bool(fields) and fields[0] not in ("Z", "X")


def _has_library(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether the interposer is still mapped into process `pid` (proc(5), /proc/pid/maps): not after it
    exec'd a static or unpreloaded program, nor when the kernel gave its pid to another program. A map that
    cannot be read (another user's process) says yes: waiting is the safe side."""
    try:
        with (proc / str(pid) / "maps").open("rb") as maps:
            # A library file replaced on disk since it was mapped is listed with " (deleted)" after its path.
            name = b"/" + LIB_NAME.encode()
            return any(line.rstrip().removesuffix(b" (deleted)").endswith(name) for line in maps)
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True


def read_records(directory: Path) -> dict[ProcessKey, list[Record]]:
    """Every process's records, in the order written. A line being written right now is skipped."""
    log = RecordLog(directory)
    log.poll()
    return log.processes


def boundary_index(records: list[Record], boundary: Boundary) -> int:
    """Which of a process's records holds its figures at `boundary`; -1 when none does (all zero then).

    With a generation: the first record answering it, unless the process started after it (zero); a process
    with none ended before the boundary (its last record is final) or did not answer in time (its last).
    Without: the last record at or before the boundary's time."""
    if boundary.gen is None:
        index = -1
        for i, record in enumerate(records):
            if record.t > boundary.t:
                break
            index = i
        return index
    if not records or records[0].born >= boundary.gen:
        return -1
    for i, record in enumerate(records):
        if record.gen >= boundary.gen:
            return i
    return len(records) - 1


def stage_calls(
    records: Mapping[Any, list[Record]],
    start: Boundary | float,
    stop: Boundary | float,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> tuple[Cells, list[tuple[float, Cells]]]:
    """Calls made between two boundaries (a bare number: a monotonic time), in total and per interval
    since start. Interior interval edges are resolved to the records' time stamps."""
    first_b = start if isinstance(start, Boundary) else Boundary(start)
    last_b = stop if isinstance(stop, Boundary) else Boundary(stop)
    span = last_b.t - first_b.t
    edges = [first_b.t + i * interval_s for i in range(int(span / interval_s) + 1)]
    if edges[-1] < last_b.t:
        edges.append(last_b.t)
    frames: list[tuple[float, Cells]] = [(edge - first_b.t, {}) for edge in edges[:-1]]
    total: Cells = {}
    for proc in records.values():
        first, last = boundary_index(proc, first_b), boundary_index(proc, last_b)
        begin = proc[first].cells if first >= 0 else {}
        end = proc[last].cells if last > first else begin
        add_cells(total, cells_since(end, begin))
        previous, at = begin, first
        for i, edge in enumerate(edges[1:-1]):
            while at + 1 <= last and proc[at + 1].t <= edge:
                at += 1
            current = proc[at].cells if at > first else begin
            add_cells(frames[i][1], cells_since(current, previous))
            previous = current
        if frames:
            add_cells(frames[-1][1], cells_since(end, previous))
    return total, frames


class InterposeProbe:
    """A CallProbe over the interposer's record directory (all processes preloaded with it)."""

    name = NAME

    def __init__(self, directory: Path, interval_s: float = DEFAULT_INTERVAL_S,
                 flush_wait_s: float = FLUSH_WAIT_S) -> None:
        self.directory = Path(directory)
        self.interval_s = interval_s
        self.flush_wait_s = flush_wait_s
        self._log = RecordLog(self.directory)
        self._start: Boundary | None = None
        self._late: list[str] = []
        self._pid = 0
        self._record_bytes = 0  # bytes_read at the stage's start

    def start(self, pid: int) -> None:
        self._pid = pid
        self._late = []
        self._start = self._boundary("start")
        self._record_bytes = self._log.bytes_read
        self._log.keep_from(self._start)

    def stop(self) -> dict[str, Any] | None:
        if self._start is None:
            return None
        start, self._start = self._start, None
        stop = self._boundary("end")
        total, frames = stage_calls(self._log.processes, start, stop, self.interval_s)
        if not total:
            return None
        result = calls_dict(
            NAME,
            total,
            frames,
            filter_text=f"processes started with the LD_PRELOAD interposer recording into {self.directory}",
            duration_s=stop.t - start.t,
            interval_s=self.interval_s,
            notes=["statically linked programs (Go: s5cmd) are not seen by LD_PRELOAD", *self._late],
        )
        # The record lines the processes appended in the stage: their writes to the kernel, not to the library.
        result["record_bytes"] = self._log.bytes_read - self._record_bytes
        if self._late:
            result["approximate"] = list(self._late)
        return result

    def _boundary(self, which: str) -> Boundary:
        """Set a new generation and wait (at most flush_wait_s) for every live process's record of it."""
        t = time.monotonic()
        gen, problem = bump_generation(self.directory)
        if gen is None:
            if problem:
                self._late.append(f"interposer per-call figures approximate at the stage's {which}: {problem}; "
                                  "calls within a record interval of it may be counted in the neighbouring stage")
            return Boundary(t)
        deadline = t + self.flush_wait_s
        self._log.poll()
        # Only processes that still have the library can answer (not one that exec'd a static program).
        waiting = [pid for pid in self._log.unanswered(gen) if _has_library(pid)]
        while True:
            if not waiting:
                return Boundary(t, gen)
            if time.monotonic() >= deadline:
                pids = ", ".join(map(str, waiting[:5])) + (" ..." if len(waiting) > 5 else "")
                self._late.append(f"interposer per-call figures approximate at the stage's {which}: process "
                                  f"{pids} did not write its record within {self.flush_wait_s * 1000:.0f} ms; its "
                                  "calls near the boundary may be counted in the neighbouring stage")
                return Boundary(t, gen)
            time.sleep(POLL_S)
            self._log.poll(waiting)
            waiting = [pid for pid in self._log.unanswered(gen) if pid in waiting]


def bump_generation(directory: Path) -> tuple[int | None, str | None]:
    """Append one byte to the generation file: (the new generation, None), or (None, why not). No directory
    yet means no process records into it: (None, None)."""
    try:
        fd = os.open(directory / GENERATION_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot write {directory / GENERATION_NAME} ({exc.strerror})"
    try:
        os.write(fd, b"\n")
        return os.fstat(fd).st_size, None
    except OSError as exc:
        return None, f"cannot write {directory / GENERATION_NAME} ({exc.strerror})"
    finally:
        os.close(fd)
