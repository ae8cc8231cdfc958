"""Benchmarks as data: each run of `make bench` leaves its result in bench/results/, and BENCHMARKS.md's current
figures are rendered from those files (`python -m bench --render`), never pasted by hand.

    bench/results/<run>-<UTC time>.json   {run, section, command, date, machine, exit, seconds, output}

`output` is what the benchmark printed (its tables, its figures against their targets); `machine` is what the
figures are true for. The page shows, per section of RUNS, the newest result's output first, then every recorded
result of that run as one history row. What BENCHMARKS.md says below its generated part (the measurements made
before results were kept as data, and their analysis) is kept as it is.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "BENCHMARKS.md"
BEGIN = "<!-- begin: rendered from bench/results by `python -m bench --render`; do not edit by hand -->"
END = "<!-- end: rendered from bench/results -->"


@dataclass(frozen=True)
class Result:
    run: str  # the benchmark's name and its variant (env, args), as RUNS shows it
    section: str
    command: str
    date: str  # UTC, ISO 8601 to the second
    machine: dict[str, object]
    exit: int
    seconds: float
    output: str


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80]


def machine() -> dict[str, object]:
    """What the figures are true for: cores, memory, kernel, and whether they ran as root."""
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        mem_kib = int(meminfo.readline().split()[1])
    return {"cores": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1), "kernel": platform.release(),
            "root": os.geteuid() == 0, "load_1m": round(os.getloadavg()[0], 2)}


def record(run: str, section: str, command: str, exit_code: int, seconds: float, output: str,
           folder: Path = RESULTS) -> Path:
    """Write one run's result; its file name sorts by run, then time."""
    now = time.gmtime()
    result = Result(run, section, command, time.strftime("%Y-%m-%dT%H:%M:%SZ", now), machine(), exit_code,
                    round(seconds, 1), output)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{slug(command)}-{time.strftime('%Y%m%dT%H%M%SZ', now)}.json"
    path.write_text(json.dumps(result.__dict__, indent=1) + "\n", encoding="utf-8")
    return path


def load(folder: Path = RESULTS) -> list[Result]:
    return [Result(**json.loads(p.read_text(encoding="utf-8"))) for p in sorted(folder.glob("*.json"))]


def render(results: list[Result], sections: list[str]) -> str:
    """The generated part of BENCHMARKS.md: per section, in RUNS's order, the newest result and the history."""
    parts = [BEGIN, "", "## Current figures", "",
             "Each section: what the newest `make bench` run of it printed, then every recorded run as one row. The "
             "figures are this machine kind's (the machine column says cores, memory, kernel, root, load).", ""]
    for section in sections:
        mine = sorted((r for r in results if r.section == section), key=lambda r: r.date)
        if not mine:
            continue
        newest = mine[-1]
        parts += [f"### {section}", "",
                  f"`{newest.command}`, {newest.date}, exit {newest.exit}, {newest.seconds:.0f} s:", "",
                  newest.output.strip(), "",
                  "| date (UTC) | command | exit | seconds | machine |", "|---|---|---:|---:|---|"]
        for r in reversed(mine):
            m = r.machine
            parts.append(f"| {r.date} | `{r.command}` | {r.exit} | {r.seconds:.0f} | {m.get('cores')} cores, "
                         f"{m.get('memory_gib')} GiB, {m.get('kernel')}, {'root' if m.get('root') else 'user'}, "
                         f"load {m.get('load_1m')} |")
        parts.append("")
    parts.append(END)
    return "\n".join(parts) + "\n"


def rendered_page(page: str, generated: str) -> str:
    """`page` with its generated part replaced (or put after the title and the introduction when it has none)."""
    if BEGIN in page and END in page:
        return page[:page.index(BEGIN)] + generated + page[page.index(END) + len(END) + 1:]
    first_section = page.find("\n## ")
    at = len(page) if first_section < 0 else first_section + 1
    return page[:at] + generated + "\n## Earlier measurements (before results were kept as data)\n\n" + page[at:]
