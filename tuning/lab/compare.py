"""Running a workload on the lab volume under the kernel's default and the tuned write cache, and the
comparison of the runs.

The workload is a plain writer (`write_files`: the burst of one instance as files) and, when the caller
passes one, a batch: `run_comparison` takes the batch as a callable, so this package needs no pipeline
code. The columns of the comparison take their display scale from profiling.metrics (METRICS).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from profiling.metrics import METRICS_BY_NAME, median
from tuning.ebs import GIB, MIB
from tuning.host import KERNEL_DEFAULTS, HostTuning
from tuning.lab.config import LabConfig
from tuning.lab.credits import read_device_counters, read_host_sample
from tuning.lab.volume import Lab

StageFigures = dict[str, dict[str, float | None]]  # per stage: metric name -> value (profiling summarize)
# Runs one batch on the lab volume: (run number, setting name, scratch directory on the volume) -> the
# batch's per-stage figures. It raises when the batch fails.
RunBatch = Callable[[int, str, Path], StageFigures]


# ---- a plain writer workload ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WriterResult:
    """N files written by P threads: when the writes returned, and when the data was on the volume."""

    files: int
    file_mib: float
    written_s: float  # until every write() returned (the stage as a job sees it)
    durable_s: float  # until syncfs returned (the data is on the device)
    peak_dirty_bytes: int
    dirty_threshold_bytes: int
    io_stall_ms: float
    device_mib: float


def write_files(lab: Lab, *, files: int, file_mib: float, threads: int = 2, subdir: str = "writer") -> WriterResult:
    """Write `files` files of `file_mib` MiB on the lab volume, then syncfs; timed from the first write."""
    root = lab.mount / subdir
    root.mkdir(exist_ok=True)
    block = b"\xa5" * MIB
    size = int(file_mib * MIB)
    names = [root / f"f{i:05d}.bin" for i in range(files)]
    device = Path(lab.device).name
    before = read_device_counters(device)
    start = time.monotonic()
    host0 = read_host_sample(start)

    def worker(mine: list[Path]) -> None:
        for path in mine:
            with open(path, "wb") as out:
                left = size
                while left > 0:
                    left -= out.write(block[: min(left, MIB)])

    pool = [threading.Thread(target=worker, args=(names[i::threads],)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    written = time.monotonic()
    at_written = read_host_sample(written)
    lab.sync()
    durable = time.monotonic()
    host1 = read_host_sample(durable)
    after = read_device_counters(device)
    points = lab.controller.window(start, durable) if lab.controller else []
    peak = max([p.host.dirty_bytes for p in points] + [at_written.dirty_bytes])
    threshold = max((p.host.dirty_threshold_bytes for p in points), default=host1.dirty_threshold_bytes)
    for path in names:
        path.unlink()
    return WriterResult(files, file_mib, written - start, durable - start, peak, threshold,
                        (host1.io_some_us - host0.io_some_us) / 1000,
                        (after.write_bytes - before.write_bytes) / MIB)


# ---- default versus tuned ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabRun:
    """One workload run under one write-cache setting, as the lab comparison shows it."""

    setting: str  # "default" or "tuned"
    sysctls: dict[str, str]
    stages: StageFigures
    elapsed_s: float
    credits_before_gib: float
    credits_after_gib: float
    limit_mibps_after: float
    writer: WriterResult | None = None


@dataclass(frozen=True)
class ComparePlan:
    """What to run on the lab volume: `rounds` pairs of (kernel defaults, `tuned`), alternating (in the
    closed loop, tuning.lab.loop: `rounds` runs of each of its settings), on an emulated memory of
    `memory_gib`; the batch's shape sizes the plain writer's burst."""

    tuned: HostTuning
    memory_gib: float = 4.0
    rounds: int = 1
    workers: int = 2  # children at once
    images: int = 40
    image_mib: float = 25.0
    images_per_child: int = 10

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def children(self) -> int:
        return -(-self.images // self.images_per_child)

    @property
    def burst_files(self) -> int:
        """The files the children at once download together: the writer writes as many."""
        return min(self.workers, self.children) * self.images_per_child

    def settings(self) -> list[tuple[str, HostTuning]]:
        """The runs in order: default, tuned, default, tuned, ..."""
        return [("default", KERNEL_DEFAULTS), ("tuned", self.tuned)] * self.rounds


def run_comparison(config: LabConfig, plan: ComparePlan, *, run_batch: RunBatch | None = None,
                   say: Callable[[str], None] = print, open_lab: Callable[..., Lab] = Lab,
                   write: Callable[..., WriterResult] = write_files) -> list[LabRun]:
    """Build the lab volume and run the plan on it: per run, drain the cache, set the run's write cache, run
    the batch (when `run_batch` is given) and then the plain writer. Returns the runs in order.

    `open_lab` and `write` are the lab volume and the writer (other ones in tests). LabError and
    LabInterrupted come through, after the lab has restored everything.
    """
    runs: list[LabRun] = []
    with open_lab(config, say=say) as lab:
        say(f"lab: emulating {plan.memory_gib:g} GiB of memory; {plan.workers} children at once, {plan.images} "
            f"images of ~{plan.image_mib:g} MiB, {plan.images_per_child} per child ({plan.children} children)")
        for number, (name, tuning) in enumerate(plan.settings(), 1):
            lab.drain()
            sysctls = lab.apply_cache(tuning, plan.memory_bytes)
            before = lab.credits_gib
            start = time.monotonic()
            stages: StageFigures = {}
            if run_batch is not None:
                scratch = lab.mount / f"run-{number}"
                scratch.mkdir()
                stages = run_batch(number, name, scratch)
            writer = write(lab, files=plan.burst_files, file_mib=plan.image_mib, threads=min(plan.workers, 8),
                           subdir=f"writer-{number}")
            lab.check()
            runs.append(LabRun(name, sysctls, stages, time.monotonic() - start, before, lab.credits_gib,
                               lab.limit_mibps, writer))
            say(f"lab: run {number} ({name}, {', '.join(f'{k}={v}' for k, v in sysctls.items())}) done in "
                f"{time.monotonic() - start:.1f} s; credits {before:,.1f} -> {lab.credits_gib:,.1f} GiB")
    return runs


# ---- the comparison ------------------------------------------------------------------------------------


# The per-stage columns of the comparison: (metric name, heading); values are shown at the metric's scale.
COMPARE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("StageDuration", "median s"),
    ("PeakDirtyBytes", "peak dirty MiB"),
    ("DirtyThresholdBytes", "dirty limit MiB"),
    ("IoStallSome", "io stall ms"),
    ("DirtyThrottle", "dirty pause ms"),
)


def render_comparison(runs: list[LabRun], stages: tuple[str, ...] = ("download", "process", "upload")) -> str:
    """Per-stage figures of each run side by side, and the download ratio of default over tuned."""
    lines: list[str] = []
    header = ["run", "setting", "credits GiB", "limit MiB/s", "stage"] + [h for _, h in COMPARE_COLUMNS]
    rows: list[list[str]] = []
    for number, run in enumerate(runs, 1):
        for stage in stages:
            row = run.stages.get(stage)
            if row is None:
                continue
            cells = [str(number), run.setting, f"{run.credits_before_gib:,.1f}", f"{run.limit_mibps_after:,.1f}",
                     stage]
            for name, _ in COMPARE_COLUMNS:
                value = row.get(name)
                cells.append("-" if value is None else f"{value / METRICS_BY_NAME[name].scale:,.1f}")
            rows.append(cells)
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    writers = [r for r in runs if r.writer is not None]
    if writers:
        lines.append("")
        lines.append("plain writer, same burst: setting  all written s  durable s  peak dirty MiB  dirty limit MiB"
                     "  io stall ms")
        for run in writers:
            w = run.writer
            assert w is not None
            lines.append(f"  {run.setting:<8} {w.files} x {w.file_mib:g} MiB: {w.written_s:8.2f}  {w.durable_s:9.2f}"
                         f"  {w.peak_dirty_bytes / MIB:14,.0f}  {w.dirty_threshold_bytes / MIB:15,.0f}"
                         f"  {w.io_stall_ms:11,.0f}")
    ratio = download_ratio(runs)
    if ratio is not None:
        lines.append("")
        lines.append(f"download stage, median over runs: default / tuned = {ratio:.2f}x")
    return "\n".join(lines)


def download_ratio(runs: list[LabRun]) -> float | None:
    """Median default download time over median tuned download time (None without both)."""
    def med(setting: str) -> float | None:
        values = [v for r in runs if r.setting == setting
                  for v in [r.stages.get("download", {}).get("StageDuration")] if v is not None]
        return median(values) if values else None
    default, tuned = med("default"), med("tuned")
    if default is None or tuned is None or tuned <= 0:
        return None
    return default / tuned
