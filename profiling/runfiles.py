"""Where a local run keeps its files, and the one reader and writer of them (executor, report, advise, runs).

    <run>/run.json                 what was run: settings, children, start and end
    <run>/profiles/part-NNNNN.jsonl one profile JSON object per stage ("schema": 1)
    <run>/emf/part-NNNNN.emf        the EMF documents the sidecar emitted, one per line
    <run>/logs/part-NNNNN.log       the child's stdout and stderr
    <run>/report.html               `iobatch report`

A run is read back from its profiles when it kept any (they carry timelines), else from its EMF files
(the per-stage figures only).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar

import orjson

from profiling import fanout
from profiling.emf import profiles_from_emf
from profiling.files import open_regular
from profiling.metrics import DEFAULT_NAMESPACE, PROFILE_SCHEMA, StageProfile, TimelinePoint, figure_problem
from profiling.profilefields import ProfileFields, without_timeline

RUN_FILE = "run.json"
PROFILES = "profiles"
EMF = "emf"
LOGS = "logs"
REPORT = "report.html"
T = TypeVar("T")


class DamagedFileError(ValueError):
    """A profile or EMF file exists but a line in it does not parse; the message names the file and line.
    Bad input wherever it is read: the report and the advisor both exit 65 for it (EXIT_PERMANENT)."""

    #: What to do about it, after the message.
    fix = "the file is damaged: rerun the child, or delete the file"


class NewerSchemaError(DamagedFileError):
    """A profile line of a newer schema than this version reads: not damaged, just newer."""

    fix = f"it was written by a newer iobatch (this one reads schema {PROFILE_SCHEMA}): read it with that version"


class DamagedRunFileError(DamagedFileError):
    """A run.json that is not what a run wrote (truncated, or a field outside what its flag takes)."""

    fix = "rerun the batch to write it again, or delete it"


# ---- paths -------------------------------------------------------------------------------------------


def run_file_path(run_dir: Path) -> Path:
    return run_dir / RUN_FILE


def profile_path(run_dir: Path, child: str) -> Path:
    return run_dir / PROFILES / f"{child}.jsonl"


def emf_path(run_dir: Path, child: str) -> Path:
    return run_dir / EMF / f"{child}.emf"


def log_path(run_dir: Path, child: str) -> Path:
    return run_dir / LOGS / f"{child}.log"


def profile_files(run_dir: Path) -> list[Path]:
    """The run's profile files, in child order (by name: Path's own order, one folder's, at a tenth of its cost)."""
    return sorted((run_dir / PROFILES).glob("*.jsonl"), key=attrgetter("name"))


def emf_files(run_dir: Path) -> list[Path]:
    """The run's EMF files, in child order."""
    return sorted((run_dir / EMF).glob("*.emf"), key=attrgetter("name"))


def report_path(run_dir: Path) -> Path:
    return run_dir / REPORT


def read_paths(run_dir: Path) -> list[Path]:
    """What a reader of the run (the report, the advisor) reads in `run_dir`: an output there would replace it."""
    return [run_file_path(run_dir), run_dir / PROFILES, run_dir / EMF, run_dir / LOGS]


def is_run_dir(path: Path) -> bool:
    """True when `path` holds a run file: a directory a run wrote and may empty again."""
    return run_file_path(path).is_file()


# ---- run.json ----------------------------------------------------------------------------------------


def write_text_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` through a .partial file, so a reader never sees half of it; on any failure
    (a full disk, `path` a directory, Ctrl-C) the .partial file is removed and the error raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def write_run(run_dir: Path, meta: Mapping[str, Any]) -> Path:
    """Write (or replace) the run file; values JSON cannot hold are written as their str()."""
    return write_text_atomic(run_file_path(run_dir), json.dumps(meta, indent=1, default=str) + "\n")


def read_run(run_dir: Path) -> dict[str, Any]:
    """The run file as a dict. Raises OSError when it is missing and DamagedRunFileError (naming the file) when it
    is not one JSON object: a truncated file is damaged, never a file that says nothing. What its fields may hold
    is the pipeline's to check (pipeline.local.runjson), with the bounds of the flags they came from."""
    path = run_file_path(run_dir)
    try:
        with _text(path) as text:
            body = json.loads(text.read())
    except ValueError as exc:  # not JSON, or bytes that are not UTF-8
        raise DamagedRunFileError(f"{path} is not JSON ({' '.join(str(exc).split())[:80]})") from None
    if not isinstance(body, dict):
        raise DamagedRunFileError(f"{path} holds a JSON {type(body).__name__}, not an object")
    return body


def _text(path: Path, errors: str = "strict") -> io.TextIOWrapper:
    """A run's file opened as UTF-8 text, which must be a regular file: a FIFO or a directory in its place is
    an OSError at once (profiling.files.open_regular), never a read that waits for a writer."""
    return io.TextIOWrapper(open_regular(path), encoding="utf-8", errors=errors)


# ---- profiles and EMF --------------------------------------------------------------------------------


def _allowed(annotation: str) -> tuple[set[str], bool]:
    """The JSON kinds a dataclass field's annotation (a string: annotations are postponed) admits."""
    kinds = {"int": "number", "float": "number", "str": "str", "dict": "dict", "list": "list"}
    parts = [part.strip().split("[", 1)[0] for part in annotation.split("|")]
    return {kinds[part] for part in parts if part in kinds}, "None" in parts


_KIND_TYPES: dict[str, tuple[type, ...]] = {"number": (int, float), "str": (str,), "dict": (dict,), "list": (list,)}


@functools.cache
def _field_checks(cls: type) -> tuple[tuple[str, bool, tuple[type, ...], str, bool], ...]:
    """Per field of a dataclass: (name, required, the Python types JSON gives it, their names, None allowed)."""
    checks = []
    for spec in dataclasses.fields(cls):
        kinds, optional = _allowed(str(spec.type))
        required = spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        types = tuple(t for kind in sorted(kinds) for t in _KIND_TYPES[kind])
        checks.append((spec.name, required, types, " or ".join(sorted(kinds)), optional))
    return tuple(checks)


@functools.cache
def _field_groups(cls: type) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Any, ...]]:
    """(the number fields of a dataclass, those that must be there and not None, the _field_checks of the others)."""
    numbers = [check for check in _field_checks(cls) if set(check[2]) == _NUMBER_TYPES]
    return (tuple(check[0] for check in numbers), tuple(check[0] for check in numbers if check[1] or not check[4]),
            tuple(check for check in _field_checks(cls) if check not in numbers))


def _check_fields(body: Any, cls: type, what: str) -> None:
    """Each known field of `body` has its dataclass's type; numbers are finite and not negative (a profile
    holds times, durations, bytes, counts and rates only). Raises ValueError naming the field.

    The number fields all at once (the sidecar writes each a figure, or None where it may be: one pass says
    they are finite and 0 or more), the others one by one; anything amiss, every field one by one for the exact
    message (as _check_points does)."""
    if not isinstance(body, dict):
        raise ValueError(f"{what} is a JSON {type(body).__name__}, not an object")
    numbers, firm, others = _field_groups(cls)
    values = [body[name] for name in numbers if name in body]
    if set(map(type, values)) <= _POINT_TYPES and all(body.get(name) is not None for name in firm):
        figures = [value for value in values if value is not None]
        if not figures or (min(figures) >= 0 and math.isfinite(sum(figures))):
            _check_each(body, others, what)
            return
    _check_each(body, _field_checks(cls), what)


def _check_each(body: dict[str, Any], checks: Iterable[tuple[str, bool, tuple[type, ...], str, bool]],
                what: str) -> None:
    where = "" if what == "the line" else f"{what}: "
    for name, required, types, kinds, optional in checks:
        if name not in body:
            if required:
                raise ValueError(f"{what} has no {name!r}")
            continue
        value = body[name]
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            raise ValueError(f"{where}{name} is {json.dumps(value)[:40]}, not a {kinds}")
        if isinstance(value, int | float) and (problem := figure_problem(value)):
            raise ValueError(f"{where}{name} is {value}: {problem}")


def _properties(body: dict[str, Any]) -> None:
    """The per-job properties as text: a number (an ArrayIndex written as 7) is read as its text ('7'); any
    other kind (a list, an object, true, null) raises ValueError naming the property."""
    props = body.get("properties")
    if not props:
        return
    for key, value in props.items():
        if isinstance(value, str):
            continue
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            props[key] = str(int(value)) if float(value).is_integer() else str(value)
            continue
        raise ValueError(f"properties.{key} is {json.dumps(value)[:40]}, not a string or number")


def _check_points(points: list[Any]) -> None:
    """_check_fields on every timeline point, all the points at once (a profile line holds dozens to hundreds:
    point by point was most of the cost of reading a fleet); when anything looks wrong, point by point for the
    exact message."""
    checks = _field_checks(TimelinePoint)
    names = {check[0] for check in checks}
    required = [check[0] for check in checks if not check[4]]
    # The sidecar writes every field of every point, each a number (None where it could not be read, for the
    # optional ones): then one pass over all the values says they are finite figures of 0 or more. A sum that
    # overflows only sends a good line to the exact check.
    if all(type(point) is dict and point.keys() == names for point in points):
        values = [v for point in points for v in point.values()]
        numbers = [v for v in values if v is not None]
        if (set(map(type, values)) <= _POINT_TYPES
                and all(point[n] is not None for point in points for n in required)
                and (not numbers or (min(numbers) >= 0 and math.isfinite(sum(numbers))))):
            return
    for point in points:
        _check_fields(point, TimelinePoint, "a timeline point")


_POINT_TYPES = {int, float, type(None)}
_NUMBER_TYPES = {int, float}


def _decoded(line: str) -> dict[str, Any]:
    """A profile line decoded and checked against StageProfile (its properties read as text, see _properties);
    a line of a newer schema than PROFILE_SCHEMA raises NewerSchemaError before any field is checked."""
    body = orjson.loads(line)
    schema = body.get("schema") if isinstance(body, dict) else None
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > PROFILE_SCHEMA:
        raise NewerSchemaError(f"profile schema {schema}")
    _check_fields(body, StageProfile, "the line")
    _properties(body)
    return body


def profile_from_line(line: str, *, timeline: bool = True) -> StageProfile:
    """One profile line as the sidecar writes it, checked field by field against StageProfile (and each
    timeline point against TimelinePoint) before it is built. Raises ValueError naming the field.

    `timeline=False` leaves the timeline out unread (a third of the time a line takes) and shares the strings
    and source maps that repeat from child to child: a profile then weighs about 1.5 KiB instead of 10, for
    readers of 100,000 children that need only the per-stage figures (the advisor)."""
    body = _decoded(line)
    if timeline:
        _check_points(body.get("timeline") or [])
        return StageProfile.from_dict(body)
    return StageProfile.from_dict(without_timeline(body))


def profile_and_points(line: str) -> tuple[StageProfile, list[dict[str, Any]]]:
    """profile_from_line, everything checked alike, but the timeline's points handed back as they were read
    (dicts with TimelinePoint's fields) and the profile built without them: for a reader of a whole fleet that
    sums the points and keeps no profile (profiling.report.fleet)."""
    body = _decoded(line)
    points = body.get("timeline") or []
    _check_points(points)
    body["timeline"] = []
    return StageProfile.from_dict(body), points


def _read_lines(file: Path, read: Callable[[str], T]) -> Iterator[T]:
    """read(line) of every line of one .jsonl file but blank ones. Raises DamagedFileError (NewerSchemaError)
    naming the file and line of the first line that is not a profile."""
    # Bytes that are not UTF-8 become U+FFFD, so such a line fails as JSON with its number.
    with _text(file, errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield read(line)
            except NewerSchemaError as exc:
                raise NewerSchemaError(f"{file}:{number}: {exc}") from None
            except (ValueError, TypeError, RecursionError) as exc:
                raise DamagedFileError(f"{file}:{number}: not a profile ({exc})") from None


def read_profile_points(file: Path) -> Iterator[tuple[StageProfile, list[dict[str, Any]]]]:
    """profile_and_points of every line of one .jsonl file; DamagedFileError as read_profiles."""
    return _read_lines(file, profile_and_points)


def read_profiles(path: Path, *, timeline: bool = True) -> Iterator[StageProfile]:
    """Profiles from a .jsonl file, or from every .jsonl file under a run directory (`timeline`: see
    profile_from_line).

    Raises DamagedFileError naming the file and line of the first line that is not a profile.
    """
    files = profile_files(path) if path.is_dir() else [path]
    for file in files:
        yield from _read_lines(file, functools.partial(profile_from_line, timeline=timeline))


def emf_documents(lines: Iterable[str], *, where: str) -> Iterator[dict[str, Any]]:
    """The JSON objects among `lines`; other lines (a log's text around the documents) are skipped.

    A line that starts like JSON but does not parse raises DamagedFileError naming `where` and the line.
    """
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text.startswith("{"):
            continue
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DamagedFileError(f"{where}:{number}: not an EMF document ({exc.msg})") from None
        if isinstance(doc, dict):
            yield doc


def profiles_from_documents(docs: Iterable[Mapping[str, Any]], *, where: str,
                            namespace: str | None = DEFAULT_NAMESPACE) -> list[StageProfile]:
    """The stage profiles EMF documents describe (profiling.emf.profiles_from_emf), of the pipeline's namespace
    unless told (None: any). A document whose figures no profile could hold (NaN, a string, a negative byte
    count) raises DamagedFileError naming `where`, as a profile line with them does."""
    try:
        return profiles_from_emf(docs, namespace=namespace)
    except DamagedFileError:
        raise
    except ValueError as exc:
        raise DamagedFileError(f"{where}: {exc}") from None


def profiles_from_emf_lines(lines: Iterable[str], *, where: str,
                            namespace: str | None = DEFAULT_NAMESPACE) -> list[StageProfile]:
    """Stage profiles from EMF text lines (a run's .emf file or a log group's messages).

    Documents that are not stage documents of `namespace` (the pipeline's unless told; None: any) are skipped.
    """
    return profiles_from_documents(emf_documents(lines, where=where), where=where, namespace=namespace)


def read_emf_documents(path: Path) -> list[dict[str, Any]]:
    """Every JSON object in an EMF (or log) file; see emf_documents."""
    with _text(path, errors="replace") as lines:  # bytes that are not UTF-8 fail as JSON, naming the line
        return list(emf_documents(lines, where=str(path)))


def read_emf(path: Path, *, namespace: str | None = DEFAULT_NAMESPACE) -> list[StageProfile]:
    """The stage profiles in one EMF file (profiles_from_emf_lines)."""
    with _text(path, errors="replace") as lines:
        return profiles_from_emf_lines(lines, where=str(path), namespace=namespace)


@dataclass(frozen=True)
class RunProfiles:
    """A run directory's stage profiles, each with the name of the file it came from (the child)."""

    profiles: list[tuple[StageProfile, str]]
    from_emf: bool  # True when the run kept no profiles and these came from its EMF files (no timelines)

    @property
    def kept(self) -> str:
        """The folder the profiles came from."""
        return EMF if self.from_emf else PROFILES


def read_run_profiles(run_dir: Path, *, timeline: bool = True, workers: int | None = None,
                      fields: ProfileFields | None = None, namespace: str = DEFAULT_NAMESPACE) -> RunProfiles:
    """The profiles of a run directory: its profile files when they hold any, else its EMF files' stage documents
    of `namespace`.

    The result is empty when the run kept neither; damaged files raise DamagedFileError (the first in file
    order). `timeline`: see profile_from_line. A large run's files are read in worker processes
    (profiling.fanout: `workers`, else its choice), their profiles handed back in file order. `fields`: the workers
    send back only these of each profile, every line still checked whole (no timeline: see
    profiling.profilefields), and the profiles are built of them: for a reader of a few figures of a fleet.
    """
    pairs = _read_files(profile_files(run_dir), None, timeline, workers, fields)
    if pairs:
        return RunProfiles(pairs, from_emf=False)
    return RunProfiles(_read_files(emf_files(run_dir), namespace, timeline, workers, fields), from_emf=True)


def _read_files(files: list[Path], emf_namespace: str | None, timeline: bool, workers: int | None,
                fields: ProfileFields | None) -> list[tuple[StageProfile, str]]:
    """Profile files (`emf_namespace` None), or EMF files' stage documents of that namespace."""
    tasks = [(chunk, emf_namespace, timeline, fields) for chunk in fanout.chunked(files)]
    count = fanout.read_workers(len(files), workers)
    parts = fanout.ordered_map(_read_chunk, tasks, count)
    if fields is None:
        return [pair for part in parts for pair in part]
    return [(fields.profile(values), name) for part in parts for values, name in part]


def _read_chunk(task: tuple[Sequence[Path], str | None, bool, ProfileFields | None]) -> list[tuple[Any, str]]:
    """One chunk of a run's files (in a worker process): their profiles, or the `fields` of each, with the name
    of its file."""
    files, namespace, timeline, fields = task
    if fields is not None:
        if namespace is not None:
            return [(fields.of_profile(p), file.stem) for file in files for p in read_emf(file, namespace=namespace)]
        read = fields.of_line  # of a line checked as profile_from_line checks it, without its timeline
        return [(values, file.stem) for file in files
                for values in _read_lines(file, lambda line: read(without_timeline(_decoded(line))))]
    if namespace is not None:
        return [(p, file.stem) for file in files for p in read_emf(file, namespace=namespace)]
    return [(p, file.stem) for file in files for p in read_profiles(file, timeline=timeline)]
