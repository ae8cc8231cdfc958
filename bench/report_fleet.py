"""`iobatch report` and `iobatch advise` at fleet size: N children's profiles made from a real demo's.

A small demo runs first (`iobatch demo`, 16 images of 4 MiB, 4 children; or `--from RUN_DIR`, a finished
run's directory); its median child (by total duration) is the template: every field, property and timeline
sample of a real profile. For each N, child i is the template with its ArrayIndex, JobId and InstanceId (eight
children an instance) rewritten, its stages moved to its wave (`--concurrency` children run at once, one wave
after the other) and its durations scaled by a fixed factor between 0.85 and 1.15 (its rates and timeline
with them): the spread of like instances, not the 2-core demo machine's, whose children are 6x apart.
Per-call records are dropped, as CloudWatch's EMF carries none. One child two thirds into the batch
downloads 8x slower, or more so that it loses SLOW_LOST_S: the report must name it.

The advisor runs side by side in alternating rounds (`--advise-rounds`, medians): as it is, its read workers sending
back only the fields it reads of each profile (tuning.situation.ADVISOR_FIELDS, profiling.profilefields), and as it
was, the workers sending back whole profiles (the same command with ADVISOR_FIELDS set to None); their advice must be
the same, byte for byte.

Each command runs in a fresh process (`python -m pipeline.cli ...`, start-up included), as a user runs it: a
large run's files are read in worker processes, one per core (profiling.fanout; IOBATCH_READ_WORKERS=1 reads
in one). Measured: wall time; CPU time of the command and its workers (os.wait4, which counts the children it
reaped); peak memory of the command with its workers, the sum of their PSS (proportional set size: pages the
workers share with the parent after fork counted once) sampled every 0.2 s from /proc/PID/smaps_rollup, and
the largest single process's peak RSS (ru_maxrss). The page is opened in headless Chromium (`--dump-dom`, which
returns after the load event, when every inline plot has been drawn) beside a blank page, the bare tool:
the difference is the page's own cost.

    python -m bench.report_fleet [--children 1000,20000,100000] [--advise-rounds 3] [--from RUN_DIR] [--keep DIR]

Targets (issue: fleet-sized batches): report of 100,000 children <= 60 s, <= 1 GiB, page <= 10 MB opening in
<= 5 s; of 20,000 children <= 15 s; advise of 100,000 profiles <= 30 s, <= 1 GiB. Prints a markdown table
for BENCHMARKS.md ("Reports and advice at fleet size").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from profiling.fanout import READ_WORKERS_ENV, read_workers

REPO = Path(__file__).resolve().parents[1]
SLOW_FACTOR = 8.0
# ... or more: the slow child's download loses at least this long against the median, four times the report's
# MIN_LOST_S (profiling/report/badapples.py), whatever the template's download took (a demo's 16 MiB: 0.06-0.09 s).
SLOW_LOST_S = 2.0
CHILDREN_PER_INSTANCE = 8
ADVISE_FLAGS = ("--jobs-per-instance", "8", "--memory-gib", "32", "--jobs-per-day", "500", "--json")
TARGET_ADVISE_S = 30.0  # advise over 100,000 children's profiles
TARGET_ADVISE_MIB = 1024.0
# `iobatch advise` with its read workers sending back whole profiles, as before they sent the advisor's fields alone.
WHOLE_PROFILES = ("import sys, tuning.advise as a; a.ADVISOR_FIELDS = None; from pipeline.cli import main; "
                  "main(sys.argv[1:])")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def _tree(root: int) -> list[int]:
    """`root` and its descendants (from /proc/PID/stat's parent field)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, grew = {root}, True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= found
        grew = bool(found)
    return sorted(tree)


def _pss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue  # ended between the listing and the read
        match = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
        total += int(match.group(1)) if match else 0
    return total / 1024


def measure(command: list[str], *, quiet: bool = True, env: dict[str, str] | None = None, out: Path | None = None
            ) -> tuple[float, float, float, float, int]:
    """(wall s, CPU s, peak PSS MiB of the process and its workers, largest process's peak RSS MiB, exit code)
    of one command in a fresh process (its stdout into `out` when given). On a shared machine the CPU time is the
    steadier figure: the wall time includes waiting for a core."""
    began = time.monotonic()
    handle = out.open("wb") if out is not None else None
    try:
        proc = subprocess.Popen(command, env=env or _env(), stderr=subprocess.PIPE,
                                stdout=handle if handle is not None else subprocess.DEVNULL if quiet else None)
    finally:
        if handle is not None:
            handle.close()  # the command has its own
    assert proc.stderr is not None
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], _pss_mib(_tree(proc.pid)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    err = proc.stderr.read()
    done.set()
    sampler.join()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - began
    if proc.returncode != 0:
        sys.stderr.write(err.decode(errors="replace")[-2000:])
    return wall, usage.ru_utime + usage.ru_stime, peak[0], usage.ru_maxrss / 1024, proc.returncode


def demo_run(keep: Path) -> Path:
    run = keep / "demo"
    command = [sys.executable, "-m", "pipeline.cli", "demo", "--images", "16", "--image-mib", "4", "--run-dir",
               str(run), "--no-progress", "--no-report"]
    subprocess.run(command, env=_env(), check=True, stdout=subprocess.DEVNULL)
    return run


def templates(run: Path) -> list[list[dict[str, Any]]]:
    """Each child's profile lines (as dicts) of a finished run, in child order."""
    children = []
    for file in sorted((run / "profiles").glob("*.jsonl")):
        lines = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        if lines:
            children.append(lines)
    if not children:
        raise SystemExit(f"{run} holds no profiles/*.jsonl: give the run directory of a finished demo")
    return children


def _stretched(stage: dict[str, Any], factor: float, start: float) -> dict[str, Any]:
    """The stage taking `factor` times as long from `start`, at 1/factor of its rates."""
    p = dict(stage)
    p["started_at"] = start
    p["duration_s"] = stage["duration_s"] * factor
    p["timeline"] = [{**q, "t": q["t"] * factor,
                      "read_bps": None if q["read_bps"] is None else q["read_bps"] / factor,
                      "write_bps": None if q["write_bps"] is None else q["write_bps"] / factor}
                     for q in stage["timeline"]]
    return p


def template_of(base: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The median child by total duration."""
    return sorted(base, key=lambda child: sum(p["duration_s"] for p in child))[len(base) // 2]


def slow_factor(template: list[dict[str, Any]]) -> float:
    """How many times slower the slow child downloads: SLOW_FACTOR, or more to lose SLOW_LOST_S."""
    download = sum(p["duration_s"] for p in template if p["stage"] == "download")
    return max(SLOW_FACTOR, 1 + SLOW_LOST_S / download) if download > 0 else SLOW_FACTOR


def make_fleet(base: list[list[dict[str, Any]]], children: int, concurrency: int, out: Path) -> int:
    """Write `children` children's profile files under out/profiles; returns the slow child's index."""
    profiles = out / "profiles"
    profiles.mkdir(parents=True)
    template = template_of(base)
    slowness = slow_factor(template)
    first = min(p["started_at"] for p in template)
    period = (max(p["started_at"] + p["duration_s"] for p in template) - first) * 1.15 * slowness / 4
    slow = children * 2 // 3 + 1
    for i in range(children):
        factor = 0.85 + 0.3 * ((i * 7919) % 101) / 100  # fixed, so runs compare
        at = first + (i // concurrency) * period + (i % concurrency) * 0.01
        lines = []
        late = 0.0  # how much later the stages after a stretched one begin
        for stage in template:
            stretch = factor * (slowness if i == slow and stage["stage"] == "download" else 1)
            p = _stretched(stage, stretch, at + (stage["started_at"] - first) * factor + late)
            late += stage["duration_s"] * (stretch - factor)
            p["calls"] = None  # per-call records: CloudWatch carries none
            p["properties"] = {**stage["properties"], "ArrayIndex": str(i), "JobId": f"bench-job:{i}",
                               "InstanceId": f"i-{i // CHILDREN_PER_INSTANCE:08x}"}
            lines.append(json.dumps(p, separators=(",", ":")))
        (profiles / f"part-{i:06d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return slow


def chromium_open(page: Path, blank: Path) -> float | None:
    """Seconds headless Chromium takes to load `page` beyond a blank page (None without Chromium)."""
    browser = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
                   None)
    if browser is None:
        return None
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--dump-dom"]
    times = {}
    for name, target in (("blank", blank), ("page", page)):
        began = time.monotonic()
        subprocess.run([browser, *flags, target.resolve().as_uri()], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=600, check=False)
        times[name] = time.monotonic() - began
    return times["page"] - times["blank"]


def one_size(base: list[list[dict[str, Any]]], children: int, concurrency: int, work: Path,
             one_process: bool = False, rounds: int = 3) -> dict[str, Any]:
    run = work / f"fleet-{children}"
    began = time.monotonic()
    slow = make_fleet(base, children, concurrency, run)
    made = time.monotonic() - began
    size = sum(f.stat().st_size for f in (run / "profiles").iterdir())
    page = run / "report.html"
    wall, cpu, pss, rss, code = measure([sys.executable, "-m", "pipeline.cli", "report", str(run), "--out",
                                         str(page)])
    text = page.read_text(encoding="utf-8") if code == 0 else ""
    found = re.search(rf"data-stage='download' data-scope='child' data-name='child {slow}'", text) is not None
    blank = work / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>\n", encoding="utf-8")
    opened = chromium_open(page, blank) if code == 0 else None
    (a_wall, a_cpu, a_pss, a_rss, a_code), whole, same = advise_side_by_side(run, rounds)
    single: dict[str, Any] = {}
    if one_process:  # the same commands reading in one process
        alone = _env(**{READ_WORKERS_ENV: "1"})
        command = [sys.executable, "-m", "pipeline.cli", "report", str(run), "--out", str(run / "one.html")]
        single["report_1"] = measure(command, env=alone)
        single["advise_1"] = measure([sys.executable, "-m", "pipeline.cli", "advise", str(run), *ADVISE_FLAGS],
                                     env=alone)
    return {**single, "children": children, "profiles_mb": size / 1e6, "made_s": made, "report_s": wall,
            "report_cpu": cpu,
            "report_mib": pss, "report_rss": rss, "report_exit": code,
            "page_mb": page.stat().st_size / 1e6 if code == 0 else None,
            "open_s": opened,
            "straggler": found, "advise_s": a_wall, "advise_cpu": a_cpu, "advise_mib": a_pss, "advise_rss": a_rss,
            "advise_exit": a_code, "advise_whole": whole, "advise_same": same}


def advise_side_by_side(run: Path, rounds: int) -> tuple[tuple[float, float, float, float, int],
                                                           tuple[float, float, float, float, int], bool]:
    """`iobatch advise` as it is and with whole profiles sent back, alternating for `rounds` rounds: the medians of
    each (wall, CPU, the largest peak PSS and RSS, the worst exit code) and whether every advice was the same."""
    import statistics

    command = ["advise", str(run), *ADVISE_FLAGS]
    found: dict[str, list[tuple[float, float, float, float, int]]] = {"fields": [], "whole": []}
    advice: set[bytes] = set()
    for _ in range(max(1, rounds)):
        for name, argv in (("fields", [sys.executable, "-m", "pipeline.cli", *command]),
                           ("whole", [sys.executable, "-c", WHOLE_PROFILES, *command])):
            out = run / f"advice-{name}.json"
            found[name].append(measure(argv, out=out))
            advice.add(out.read_bytes())
            out.unlink()

    def medians(rows: list[tuple[float, float, float, float, int]]) -> tuple[float, float, float, float, int]:
        return (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows),
                max(r[2] for r in rows), max(r[3] for r in rows), max(r[4] for r in rows))

    print(f"  advise, every round (wall s): as it is {', '.join(f'{r[0]:.1f}' for r in found['fields'])}; whole "
          f"profiles {', '.join(f'{r[0]:.1f}' for r in found['whole'])}", flush=True)
    return medians(found["fields"]), medians(found["whole"]), len(advice) == 1


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--children", default="1000,20000,100000", help="comma-separated batch sizes")
    parser.add_argument("--concurrency", type=int, default=1000, help="children running at once (one wave)")
    parser.add_argument("--from", dest="source", type=Path, help="a finished run directory to take profiles from "
                        "(default: run a small demo)")
    parser.add_argument("--one-process-too", action="store_true", help="also run report and advise reading in "
                        f"one process ({READ_WORKERS_ENV}=1), side by side")
    parser.add_argument("--keep", type=Path, help="keep the generated runs here (default: a temporary directory)")
    parser.add_argument("--advise-rounds", type=int, default=3, help="rounds of advise as it is and with whole "
                        "profiles, alternating (medians)")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.children.split(",") if n.strip()]
    work = args.keep or Path(tempfile.mkdtemp(prefix="iobatch-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        source = args.source or demo_run(work)
        base = templates(source)
        print(f"templates: {len(base)} children of {source}; {args.concurrency} children at once; child 2N/3+1 "
              f"downloads {slow_factor(template_of(base)):.1f}x slower", flush=True)
        results = []
        for n in sizes:
            results.append(one_size(base, n, args.concurrency, work, args.one_process_too, args.advise_rounds))
            r = results[-1]
            print(f"{n} children: report {r['report_s']:.1f} s ({r['report_cpu']:.1f} s CPU), "
                  f"{r['report_mib']:.0f} MiB; advise {r['advise_s']:.1f} s ({r['advise_cpu']:.1f} s CPU), "
                  f"{r['advise_mib']:.0f} MiB", flush=True)
            if args.keep is None:
                shutil.rmtree(work / f"fleet-{n}", ignore_errors=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"\nworkers: {read_workers(max(sizes, default=0))} (profiling.fanout, at the largest size); CPU s: the "
          "command's and its workers'; peak MiB: their PSS summed (the largest process's RSS)")
    print("\n| children | profiles MB | report s (CPU s) | report peak MiB | page MB | Chromium open s (beyond a "
          "blank page) | straggler named | advise s (CPU s) | advise peak MiB |")
    print("|---:|---:|---:|---:|---:|---:|:---:|---:|---:|")
    for r in results:
        report = f"{_fmt(r['report_s'])} ({_fmt(r['report_cpu'])})" if r["report_exit"] == 0 \
            else f"exit {r['report_exit']}"
        advise = f"{_fmt(r['advise_s'])} ({_fmt(r['advise_cpu'])})" if r["advise_exit"] == 0 \
            else f"exit {r['advise_exit']}"
        print(f"| {r['children']:,} | {_fmt(r['profiles_mb'], 0)} | {report} | {_fmt(r['report_mib'], 0)} "
              f"({_fmt(r['report_rss'], 0)}) | "
              f"{_fmt(r['page_mb'], 2)} | {_fmt(r['open_s'])} | {_fmt(r['straggler'])} | {advise} | "
              f"{_fmt(r['advise_mib'], 0)} ({_fmt(r['advise_rss'], 0)}) |")
    if any("report_1" in r for r in results):
        print(f"\nIn one process ({READ_WORKERS_ENV}=1), the same commands:\n")
        print("| children | report s (CPU s) | report peak MiB | advise s (CPU s) | advise peak MiB |")
        print("|---:|---:|---:|---:|---:|")
        for r in results:
            (rw, rc, rp, _, rx), (aw, ac, ap, _, ax) = r["report_1"], r["advise_1"]
            print(f"| {r['children']:,} | {_fmt(rw)} ({_fmt(rc)}){'' if rx == 0 else f' exit {rx}'} | "
                  f"{_fmt(rp, 0)} | {_fmt(aw)} ({_fmt(ac)}){'' if ax == 0 else f' exit {ax}'} | {_fmt(ap, 0)} |")
    print(f"\nThe advisor as it is (its read workers send back the fields it reads) beside whole profiles sent back "
          f"(as before): medians of {args.advise_rounds} alternating rounds\n")
    print("| children | advise s (CPU s) | peak MiB | whole profiles: advise s (CPU s) | peak MiB | as it is / whole "
          "profiles, wall | the same advice |")
    print("|---:|---:|---:|---:|---:|---:|:---:|")
    for r in results:
        ww, wc, wp, _, wx = r["advise_whole"]
        print(f"| {r['children']:,} | {_fmt(r['advise_s'])} ({_fmt(r['advise_cpu'])}) | {_fmt(r['advise_mib'], 0)} | "
              f"{_fmt(ww)} ({_fmt(wc)}){'' if wx == 0 else f' exit {wx}'} | {_fmt(wp, 0)} | "
              f"{r['advise_s'] / ww:.2f} | {_fmt(r['advise_same'])} |")
    largest = max(results, key=lambda r: r["children"], default=None)
    if largest is not None:
        print(f"\nadvise over {largest['children']:,} children ({3 * largest['children']:,} profiles): "
              f"{largest['advise_s']:.1f} s against {TARGET_ADVISE_S:.0f} s "
              f"({largest['advise_s'] / TARGET_ADVISE_S:.2f}), {largest['advise_mib']:.0f} MiB against "
              f"{TARGET_ADVISE_MIB:.0f} MiB ({largest['advise_mib'] / TARGET_ADVISE_MIB:.2f})"
              + ("" if largest["children"] >= 100_000 else " (the target is for 100,000 children)"))
    failed = [r for r in results if r["report_exit"] or r["advise_exit"] or not r["straggler"] or not r["advise_same"]
              or r["advise_whole"][4]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
