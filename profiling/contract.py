"""Mistral-style I/O contracts: rule files that say which per-call figures to report, per stage and time frame.

    2,monitortimeframe,1000s
    # LABEL,PATH,CALLTYPE,SIZERANGE,MEASUREMENT,THRESHOLD
    mean_lat_write,/,write,all,mean-latency,1us

In: a contract's text (`parse_contract`); `load_contract` reads one file, the only file this module touches. Out: a
Contract, then per stage (`evaluate_stage`) each rule's value per time frame, from the profile's per-call cells
(profiling.probes.callstats), else its procfs totals; a frame is reported when its value reaches the rule's
threshold, in the threshold's unit, and each label is an EMF metric (`contract_metrics`). Invariants: a malformed
contract is one ContractError naming the file, line and field; a contract fits one EMF document (at most MAX_RULES
rules, MAX_FRAMES frames a rule: a longer stage's frames are widened, and its rows say so); a rule a stage's figures
cannot answer is a row with no value and a note saying why. Every field and unit: docs/profiler.md, "Per-call
latency and contracts".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiling.emflimits import MAX_DATAPOINTS_PER_METRIC, MAX_DIMENSION_NAME_LENGTH, MAX_METRICS_PER_EVENT
from profiling.files import read_regular
from profiling.metrics import EMF_BODY_KEYS, METRICS_BY_NAME, StageProfile
from profiling.probes.callstats import CALLS, NO_SIZE, Cells, Stats, cells_from_list

CONTRACT_VERSION = "2"
CALL_TYPES: tuple[str, ...] = (*CALLS, "all")
MEASUREMENTS: tuple[str, ...] = ("count", "bandwidth", "mean-latency", "max-latency", "min-latency", "total-latency")
PATHS_UNAVAILABLE = "unavailable: the {probe} probe does not attribute calls to paths (the interposer does)"
PATHS_NO_SIZES = "unavailable: eBPF's per-file figures have no size classes (the interposer's per-path ones do)"
FILES_PAST_CAP = "leaves out this stage's calls on files past the eBPF probe's cap of {cap} files (kept without paths)"
LATENCY_UNAVAILABLE = "latency unavailable (static binary, no eBPF): counts and bytes are from procfs"
# The probes keep cumulative extremes: a stage's or frame's extreme call is known only to its log2 bucket
# when the cumulative one did not move in it (callstats.Stats.since).
EXTREME_BOUND = "bucket bound, not a measured call: the extreme call took at most 2x less (max) or more (min)"

TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
BYTE_UNITS = {"B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
COUNT_UNITS = {"": 1, "k": 1000, "M": 1_000_000}
LATENCY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
# CloudWatch unit names for the unit each value is reported in.
EMF_UNITS = {"": "Count", "k": "Count", "M": "Count", "B": "Bytes", "kB": "Kilobytes", "MB": "Megabytes",
             "GB": "Gigabytes", "us": "Microseconds", "ms": "Milliseconds", "s": "Seconds"}
# What one stage's EMF can carry, from the EMF library's own limits (aws_embedded_metrics/constants.py:
# MAX_METRICS_PER_EVENT, MAX_DATAPOINTS_PER_METRIC): a metric per rule, a value per time frame. A contract
# file past MAX_CONTRACT_BYTES cannot be 100 rules of sane lines, and is refused before it is read whole.
MAX_RULES = MAX_METRICS_PER_EVENT
MAX_FRAMES = MAX_DATAPOINTS_PER_METRIC
MAX_CONTRACT_BYTES = 256 * 1024
FRAMES_WIDENED = "time frame widened to {seconds:g} s: a stage reports at most {frames} frames a rule"
MAX_QUANTITY = 1e15  # far above any real figure; keeps sizes exact integers and out of float overflow
# A label is an EMF metric name: aws_embedded_metrics.validator.validate_metric refuses names longer than
# MAX_DIMENSION_NAME_LENGTH (250), and a name equal to a key of the document's body (a dimension or a
# property, metrics.EMF_BODY_KEYS) would overwrite it.
LABEL_RE = re.compile(rf"^[A-Za-z][A-Za-z0-9_.\-]{{0,{MAX_DIMENSION_NAME_LENGTH - 1}}}$")
QUANTITY_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)$")


class ContractError(ValueError):
    """A contract file that does not parse. The message names the file, line and field."""

    def __init__(self, source: str, line: int, field: str, value: str, expected: str) -> None:
        self.headline = f"{source}:{line}: {field} {value!r}: {expected}"
        super().__init__(self.headline)


@dataclass(frozen=True)
class Rule:
    label: str
    path: str
    call: str
    size_low: int  # bytes, inclusive
    size_high: int | None  # bytes, exclusive; None = no upper bound ("all")
    size_text: str
    measurement: str
    threshold: float  # in `unit`
    unit: str  # the threshold's unit, also the unit values are reported in
    line: int

    @property
    def emf_unit(self) -> str:
        # the count unit of a scaled threshold ("1k") is still a plain count of calls
        return EMF_UNITS[self.unit]

    @property
    def display_unit(self) -> str:
        return "calls" if self.measurement == "count" else self.unit


@dataclass(frozen=True)
class Contract:
    timeframe_s: float
    rules: tuple[Rule, ...]
    source: str = "<contract>"


def _quantity(text: str, units: Mapping[str, float], source: str, line: int, field: str) -> tuple[float, str]:
    match = QUANTITY_RE.match(text)
    if not match or match.group(2) not in units:
        choices = ", ".join(repr(u) if u else "no unit" for u in units)
        raise ContractError(source, line, field, text, f"expected a number with one of the units {choices}")
    value = float(match.group(1))
    if not math.isfinite(value) or value > MAX_QUANTITY:
        raise ContractError(source, line, field, text, f"expected a number up to {MAX_QUANTITY:.0e}")
    return value, match.group(2)


def parse_contract(text: str, source: str = "<contract>") -> Contract:
    """Parse a contract; raises ContractError naming the line and field of the first mistake."""
    timeframe: float | None = None
    rules: list[Rule] = []
    labels: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if timeframe is None:
            if len(fields) != 3:
                raise ContractError(source, number, "header", line,
                                    "expected VERSION,monitortimeframe,DURATION (e.g. 2,monitortimeframe,1000s)")
            if fields[0] != CONTRACT_VERSION:
                raise ContractError(source, number, "version", fields[0], f"expected {CONTRACT_VERSION}")
            if fields[1] != "monitortimeframe":
                raise ContractError(source, number, "header keyword", fields[1], "expected monitortimeframe")
            amount, unit = _quantity(fields[2], TIME_UNITS, source, number, "time frame")
            timeframe = amount * TIME_UNITS[unit]
            if timeframe <= 0:
                raise ContractError(source, number, "time frame", fields[2], "expected a duration above zero")
            continue
        if len(rules) == MAX_RULES:
            raise ContractError(source, number, "rule", line[:40], f"expected at most {MAX_RULES} rules (one EMF "
                                "metric each, and an EMF document holds at most that many): split the contract")
        rules.append(_parse_rule(fields, line, source, number, labels))
    if timeframe is None:
        raise ContractError(source, 1, "header", "", "expected VERSION,monitortimeframe,DURATION; the file is empty")
    if not rules:
        raise ContractError(source, len(text.splitlines()), "rules", "", "expected at least one rule after the header")
    return Contract(timeframe, tuple(rules), source)


def _parse_rule(fields: list[str], line: str, source: str, number: int, labels: set[str]) -> Rule:
    if len(fields) != 6:
        raise ContractError(source, number, "rule", line,
                            f"expected 6 fields LABEL,PATH,CALLTYPE,SIZERANGE,MEASUREMENT,THRESHOLD, got {len(fields)}")
    label, path, call, size, measurement, threshold = fields
    if not LABEL_RE.match(label):
        raise ContractError(source, number, "LABEL", label,
                            f"expected a name of letters, digits, '_', '.', '-' starting with a letter, at most "
                            f"{MAX_DIMENSION_NAME_LENGTH} characters (EMF's limit for a metric name)")
    if label in labels:
        raise ContractError(source, number, "LABEL", label, "expected a label not used by an earlier rule")
    if label in METRICS_BY_NAME:
        raise ContractError(source, number, "LABEL", label, "expected a name that is not one of iobatch's metrics")
    if label in EMF_BODY_KEYS:
        raise ContractError(source, number, "LABEL", label,
                            "expected a name that is not a dimension or property of the EMF document")
    labels.add(label)
    if not path.startswith("/"):
        raise ContractError(source, number, "PATH", path, "expected an absolute path prefix such as / or /scratch")
    if call not in CALL_TYPES:
        raise ContractError(source, number, "CALLTYPE", call, f"expected one of {', '.join(CALL_TYPES)}")
    low, high = _size_range(size, source, number)
    if measurement not in MEASUREMENTS:
        raise ContractError(source, number, "MEASUREMENT", measurement, f"expected one of {', '.join(MEASUREMENTS)}")
    units: Mapping[str, float]
    if measurement == "count":
        units = COUNT_UNITS
    elif measurement == "bandwidth":
        units = BYTE_UNITS
    else:
        units = LATENCY_UNITS
    amount, unit = _quantity(threshold, units, source, number, "THRESHOLD")
    if measurement == "count":  # counts are reported as plain numbers of calls
        amount, unit = amount * COUNT_UNITS[unit], ""
    return Rule(label, path, call, low, high, size, measurement, amount, unit, number)


def _size_range(text: str, source: str, number: int) -> tuple[int, int | None]:
    if text == "all":
        return 0, None
    parts = text.split("-")
    if len(parts) != 2:
        raise ContractError(source, number, "SIZERANGE", text, "expected all or LOW-HIGH, e.g. 4kB-1MB")
    low_q, low_u = _quantity(parts[0], {**BYTE_UNITS, "": 1}, source, number, "SIZERANGE")
    high_q, high_u = _quantity(parts[1], {**BYTE_UNITS, "": 1}, source, number, "SIZERANGE")
    low = int(low_q * (BYTE_UNITS.get(low_u, 1)))
    high = int(high_q * (BYTE_UNITS.get(high_u, 1)))
    if high <= low:
        raise ContractError(source, number, "SIZERANGE", text, "expected LOW below HIGH")
    # Calls are kept in power-of-two size classes, matched by their smallest size (rule_matches): a range
    # that holds none of 0, 1, 2, 4, 8, ... could never match a call.
    smallest = 0 if low == 0 else 1 << (low - 1).bit_length()
    if smallest >= high:
        raise ContractError(source, number, "SIZERANGE", text, f"expected a range holding a power of two (sizes are "
                            f"kept in power-of-two classes), e.g. {_bytes_text(smallest)}-{_bytes_text(2 * smallest)}")
    return low, high


def _bytes_text(size: int) -> str:
    for unit in ("GB", "MB", "kB"):
        if size >= BYTE_UNITS[unit] and size % BYTE_UNITS[unit] == 0:
            return f"{size // BYTE_UNITS[unit]}{unit}"
    return f"{size}B"


def load_contract(path: Path) -> Contract:
    """Read and parse a contract file (ContractError on a mistake, OSError when it cannot be read).

    The one reader of contract files: `profile`, `run`, `demo` and the sidecar all come here."""
    data = read_regular(path, MAX_CONTRACT_BYTES)  # a FIFO or a directory: refused at once, never waited on
    if len(data) > MAX_CONTRACT_BYTES:
        raise ContractError(str(path), 1, "file", f"over {MAX_CONTRACT_BYTES // 1024} KiB",
                            f"expected a contract of at most {MAX_RULES} rules")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ContractError(str(path), line, "byte", f"{data[exc.start]:#04x}",
                            "expected UTF-8 text: is this a contract file?") from None
    return parse_contract(text, str(path))


# ---- evaluation ---------------------------------------------------------------------------------------


def rule_matches(rule: Rule, path: str, call: str, size: int) -> bool:
    """Whether calls in cell (path, call, size class) count for `rule`."""
    if rule.call != "all" and call != rule.call:
        return False
    if rule.path != "/":
        prefix = rule.path.rstrip("/")
        if not (path == prefix or path.startswith(prefix + "/")):
            return False
    if rule.size_high is None:
        return True
    if size == NO_SIZE:
        return False
    low = 0 if size == 0 else 1 << (size - 1)  # the class's smallest size
    return rule.size_low <= low < rule.size_high


def measure(rule: Rule, stats: Stats) -> float | None:
    """The rule's value for a group of calls, in the rule's unit; None when there is nothing to measure."""
    if rule.measurement == "count":
        return float(stats.count)
    if rule.measurement == "bandwidth":
        return stats.bytes / BYTE_UNITS[rule.unit]
    if stats.count == 0:
        return None
    scale = LATENCY_UNITS[rule.unit] * 1e9  # ns per unit
    if rule.measurement == "mean-latency":
        return stats.total_ns / stats.count / scale
    if rule.measurement == "total-latency":
        return stats.total_ns / scale
    if rule.measurement == "max-latency":
        return None if stats.max_ns is None else stats.max_ns / scale
    return None if stats.min_ns is None else stats.min_ns / scale


def _select(rule: Rule, cells: Mapping[tuple[str, str, int], Stats]) -> Stats:
    total = Stats()
    for (path, call, size), stats in cells.items():
        if rule_matches(rule, path, call, size):
            total.add(stats)
    return total


def frame_cells(calls: Mapping[str, Any], timeframe_s: float, duration_s: float) -> list[Cells]:
    """The probe's per-interval cells grouped into contract time frames (at least one frame)."""
    count = max(1, math.ceil(duration_s / timeframe_s - 1e-9))
    frames: list[Cells] = [{} for _ in range(count)]
    interval_frames = calls.get("frames") or []
    if not interval_frames:
        frames[0] = cells_from_list(calls.get("cells", []))
        return frames
    for entry in interval_frames:
        index = min(count - 1, int(float(entry["t"]) // timeframe_s))
        for key, stats in cells_from_list(entry["cells"]).items():
            frames[index].setdefault(key, Stats()).add(stats)
    return frames


def evaluate_stage(contract: Contract, profile: StageProfile) -> list[dict[str, Any]]:
    """Every rule's value per time frame of the stage, where it reaches the rule's threshold.

    Values come from the per-call probe when the profile has one (profile.calls); otherwise from the
    procfs figures, which give read and write counts and bytes for "/" and "all" sizes only: rules
    they cannot answer are reported once with value None and a note saying why. A rule on a path
    prefix needs path attribution: when the main probe (eBPF) has none, its per-file figures
    (calls["files"]) answer it, or, for a rule with a size range, the interposer's kept beside it
    (calls["interpose"]).
    """
    results: list[dict[str, Any]] = []
    duration = max(profile.duration_s, 0.0)
    calls = profile.calls
    source = str(calls.get("probe", "calls")) if calls else "procfs"
    # A stage longer than MAX_FRAMES time frames is cut into MAX_FRAMES wider ones, and each row says so.
    timeframe = max(contract.timeframe_s, duration / MAX_FRAMES)
    widened = (FRAMES_WIDENED.format(seconds=round(timeframe, 3), frames=MAX_FRAMES)
               if timeframe > contract.timeframe_s else None)
    frames = frame_cells(calls, timeframe, duration) if calls else None
    beside = calls.get("interpose") if calls else None
    path_frames = (frame_cells(beside, timeframe, duration)
                   if isinstance(beside, Mapping) and beside.get("path_attribution", True) else None)
    files = calls.get("files") if calls else None
    file_frames = frame_cells(files, timeframe, duration) if isinstance(files, Mapping) else None
    past_cap = (FILES_PAST_CAP.format(cap=files.get("files_cap"))
                if isinstance(files, Mapping) and files.get("other_calls") else None)
    for rule in contract.rules:
        if frames is None:
            value, note = _procfs_value(rule, profile)
            if value is None or value >= rule.threshold:
                results.append(_row(rule, value, 0, 0.0, duration, source, note))
            continue
        rule_frames, rule_source, rule_note = frames, source, None
        if rule.path != "/" and calls is not None and not calls.get("path_attribution", True):
            if file_frames is not None and rule.size_high is None:
                rule_frames, rule_note = file_frames, past_cap
            elif path_frames is not None:
                rule_frames, rule_source = path_frames, "interpose"
            else:
                reason = PATHS_NO_SIZES if file_frames is not None else PATHS_UNAVAILABLE.format(probe=source)
                results.append(_row(rule, None, 0, 0.0, duration, source, reason))
                continue
        reported = len(results)
        for index, cells in enumerate(rule_frames):
            selected = _select(rule, cells)
            value = measure(rule, selected)
            if value is not None and value >= rule.threshold:
                start = index * timeframe
                bound = rule.measurement in ("max-latency", "min-latency") and selected.extremes_bound
                note = "; ".join(n for n in (EXTREME_BOUND if bound else None, widened, rule_note) if n) or None
                results.append(_row(rule, value, index, start, min(duration, start + timeframe), rule_source,
                                    note))
        if rule_note and len(results) == reported:  # below threshold, maybe only for want of the capped calls
            results.append(_row(rule, None, 0, 0.0, duration, rule_source, rule_note))
    return results


def _row(rule: Rule, value: float | None, frame: int, start: float, end: float, source: str,
         note: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "label": rule.label,
        "value": value,
        "unit": rule.display_unit,
        "emf_unit": rule.emf_unit,
        "frame": frame,
        "start_s": round(start, 3),
        "end_s": round(end, 3),
        "source": source,
    }
    if note:
        row["note"] = note
    return row


def _procfs_value(rule: Rule, profile: StageProfile) -> tuple[float | None, str | None]:
    """procfs has exact read/write call counts and bytes for the whole tree, and nothing else."""
    if rule.call not in ("read", "write") or rule.path != "/" or rule.size_high is not None:
        return None, "unavailable without a per-call probe (procfs has read and write totals only)"
    if rule.measurement.endswith("latency"):
        return None, LATENCY_UNAVAILABLE
    calls, nbytes = (
        (profile.read_calls, profile.read_bytes) if rule.call == "read" else (profile.write_calls, profile.write_bytes)
    )
    if calls is None or nbytes is None:
        return None, "unavailable: the job's /proc/<pid>/io could not be read (see the profile's notices)"
    stats = Stats(count=calls, bytes=nbytes)
    return measure(rule, stats), None


# ---- output -------------------------------------------------------------------------------------------


def contract_metrics(results: Iterable[Mapping[str, Any]]) -> list[tuple[str, float, str]]:
    """(label, value, CloudWatch unit) for every reported value, frame by frame.

    profiling/emf.py puts these in the stage's EMF document: one metric per label (several values
    when several time frames reported), dimensions Pipeline and Stage, rows in the "Contract" property.
    """
    return [(str(r["label"]), float(r["value"]), str(r["emf_unit"])) for r in results if r.get("value") is not None]


def format_results(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Human lines for `iobatch profile --contract`: label, value and unit, frame, source."""
    lines = []
    for row in results:
        if row.get("value") is None:
            shown = row.get("note", "unavailable")
        else:
            value = float(row["value"])
            number = f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:,.3f}"
            shown = f"{number} {row['unit']}"
        frame = f"frame {row['frame']} [{row['start_s']:g}s-{row['end_s']:g}s]"
        lines.append(f"{row['label']:<24} {shown}  ({frame}, {row['source']})")
    return lines
