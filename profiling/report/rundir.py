"""A local run directory read as ReportData: its profile files (with timelines), else its EMF files.

A large run's files are read in worker processes (profiling.fanout), each chunk of files into its own Fleet,
merged in file order (Fleet.extend): the same ReportData as a read in one process, in about 1/cores of the
time. A small batch (PER_CHILD_LIMIT children, whose whole profiles the page shows) is read here, in order.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from profiling import fanout, runfiles
from profiling.emfnamespaces import namespaces_in, no_stage_documents
from profiling.metrics import DEFAULT_NAMESPACE, StageProfile
from profiling.report.fleet import PER_CHILD_LIMIT, Fleet
from profiling.report.sources import DamagedInputError, Entry, Reader, ReportData, ReportInputError

T = TypeVar("T")
Progress = Callable[[int, int], None]


def _unreadable(file: Path, exc: OSError) -> ReportInputError:
    return ReportInputError(f"cannot read {file} ({exc.strerror}): a run directory's profile and EMF files are "
                            "regular files the report can read; remove or fix that one")


def _reading(file: Path, read: Callable[[Path], Iterable[T]]) -> Iterator[T]:
    """What `read` gives of `file`, its damage or unreadability turned into the report's one-line errors."""
    try:
        yield from read(file)
    except runfiles.DamagedFileError as exc:
        raise DamagedInputError(f"{exc}: {exc.fix}") from None
    except OSError as exc:  # a FIFO or directory in a file's place (profiling.files.open_regular), no permission
        raise _unreadable(file, exc) from None


def _profiles_in(file: Path) -> Iterator[tuple[StageProfile, str]]:
    return ((profile, file.stem) for profile in _reading(file, runfiles.read_profiles))


def _points_in(file: Path) -> Iterator[tuple[StageProfile, list[dict[str, Any]]]]:
    return _reading(file, runfiles.read_profile_points)


def _emf_in(file: Path, namespace: str) -> Iterator[tuple[StageProfile, str]]:
    read = functools.partial(runfiles.read_emf, namespace=namespace)
    return ((profile, file.stem) for profile in _reading(file, read))


def _add_file(add: Callable[..., None], file: Path, emf_namespace: str | None) -> None:
    """Every profile of one file given to `add` (a Fleet's or a Reader's), as the report names it: a profile file's
    (`emf_namespace` None), or an EMF file's stage documents of that namespace."""
    if emf_namespace is not None:
        for profile, name in _emf_in(file, emf_namespace):
            add(profile, name, file)
    else:
        for profile, points in _points_in(file):
            add(profile, file.stem, file, points)


def _read_chunk(task: tuple[Sequence[Path], str | None]) -> Fleet:
    """One chunk of files in a worker process: its own Fleet, its traffic summed as one chunk."""
    files, emf_namespace = task
    fleet = Fleet()
    for file in files:
        _add_file(fleet.add, file, emf_namespace)
    fleet.end_chunk()
    return fleet


def _read_files(files: list[Path], emf_namespace: str | None, progress: Progress | None, workers: int | None) -> Reader:
    """Every profile of `files` in a Reader, in file order; in worker processes when there are many files
    (profiling.fanout.read_workers). Errors are the first file's in order, as one process would raise them."""
    chunks = fanout.chunked(files)
    try:
        count = fanout.read_workers(len(files), workers)
    except fanout.ReadWorkersError as exc:
        raise ReportInputError(str(exc)) from None
    if count > 1:
        reader = Reader(keep=False)
        done = 0
        tasks = [(chunk, emf_namespace) for chunk in chunks]
        with contextlib.closing(fanout.ordered_map(_read_chunk, tasks, count)) as fleets:
            for chunk, fleet in zip(chunks, fleets, strict=True):
                reader.fleet.extend(fleet)
                done += len(chunk)
                if progress is not None:
                    progress(done, len(files))
        if not reader.fleet.profiles or reader.fleet.children_added() > PER_CHILD_LIMIT:
            return reader
        # Many files but a small batch (files without profiles): read again here, its profiles kept whole.
    reader = Reader()
    for done, file in enumerate(files, 1):
        _add_file(reader.add, file, emf_namespace)
        if done % fanout.CHUNK_FILES == 0:
            reader.fleet.end_chunk()
        if progress is not None:
            progress(done, len(files))
    return reader


def load_run_dir(run_dir: Path, *, progress: Progress | None = None, workers: int | None = None,
                 namespace: str = DEFAULT_NAMESPACE) -> ReportData:
    """Read a local run directory one profile line at a time: profile JSON when present (with timelines),
    else the EMF files' stage documents of `namespace`. `progress(files read, files)` is called as the files are
    read. `workers`: the processes that read a large run (default: profiling.fanout.read_workers's choice; 1 reads
    here)."""
    if not run_dir.is_dir():
        raise ReportInputError(f"run directory {run_dir} does not exist: pass the --run-dir of a finished run")
    from_emf = False
    reader = _read_files(runfiles.profile_files(run_dir), None, progress, workers)
    if not reader.fleet.profiles:
        from_emf = True
        reader = _read_files(runfiles.emf_files(run_dir), namespace, progress, workers)
    count = reader.fleet.profiles
    if not count and from_emf and (found := namespaces_in(runfiles.emf_files(run_dir))):
        raise ReportInputError(no_stage_documents(str(run_dir / runfiles.EMF), namespace, found))
    if not count:
        raise ReportInputError(
            f"{run_dir} holds no {runfiles.PROFILES}/*.jsonl or {runfiles.EMF}/*.emf files: "
            "pass the run directory of a finished run (iobatch demo --run-dir DIR)"
        )
    if from_emf:
        source = f"local run {run_dir}: {count} EMF documents from {runfiles.EMF}/ (no profile files)"
    else:
        source = f"local run {run_dir}: {count} stage profiles from {runfiles.PROFILES}/"
    run: dict[str, Any] | None = None
    if runfiles.is_run_dir(run_dir):
        try:
            run = runfiles.read_run(run_dir)
        except runfiles.DamagedRunFileError as exc:  # damaged: bad input, as a damaged profile is
            raise DamagedInputError(f"{exc}: {exc.fix}") from None
        except OSError:
            run = None  # gone or unreadable since it was found: the profiles make the report
    fleet = reader.fleet

    def reread(children: set[str]) -> list[Entry]:
        found = fleet.profiles_of(children, functools.partial(_emf_in, namespace=namespace) if from_emf
                                  else _profiles_in)
        return [Entry(child, p, p.properties.get("InstanceId") or None) for child, p in found]

    data = reader.data(source=source, has_timelines=not from_emf, reread=reread)
    data.run = run
    if not from_emf and not fleet.timeline_points:
        data.notes.append("The profiles carry no timeline samples.")
    return data
