"""What the profiler sidecar costs the job.

1. Wall time of a job with and without a sidecar beside it, alternating in one run, median of N rounds:
   - `--workload writer` (default): a job of three announced stages of file I/O on tmpfs, with no
     sidecar, a sidecar with the kernel counters only, and a sidecar with the per-call probes too;
   - `--workload demo`: the local demo with and without IOBATCH_NO_SIDECAR=1 (honoured by the local
     executor); the whole command and the batch alone (the executor's "in X s" line).
2. What one stage boundary costs the job (two acks), and what one sample costs.
3. The sidecar's own CPU: one sidecar at the given interval profiles one long stage of a job whose
   process tree keeps writing; utime + stime from /proc/<sidecar>/stat over the stage, as % of one core.

    python -m bench.sidecar_overhead [--workload writer|demo|none] [--rounds 7] [--cpu-seconds 30]

Prints a side-by-side table (markdown) for BENCHMARKS.md; ratios are of medians, and "paired" is the
median of the per-round ratios. Run it on a quiet machine: the ratio is only as good as the noise allows,
which is why the runs alternate and the medians are compared.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from profiling import protocol  # noqa: E402
from profiling.probes.procfs import read_cpu_ticks  # noqa: E402

BATCH_LINE = re.compile(r"children done, .* in ([0-9.]+) s")


def paired_ratio(times: dict[bool, list[float]]) -> float:
    """Median over rounds of (with / without) within the same round: robust to the machine's load drifting
    between rounds, which moves both runs of a round together."""
    return statistics.median(on / off for on, off in zip(times[True], times[False], strict=True))


def run_demo(run_dir: Path, *, sidecar: bool, images: int, image_mib: float) -> tuple[float, float]:
    """(wall seconds of the whole command, seconds of the batch alone)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if not sidecar:
        env["IOBATCH_NO_SIDECAR"] = "1"
    cmd = [sys.executable, "-m", "pipeline.cli", "demo", "--images", str(images), "--image-mib", str(image_mib),
           "--no-report", "--no-progress", "--run-dir", str(run_dir)]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"demo failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    match = BATCH_LINE.search(done.stdout)
    if not match:
        raise SystemExit(f"no batch time in the demo's output:\n{done.stdout[-2000:]}")
    if sidecar and not list((run_dir / "profiles").glob("*.jsonl")):
        raise SystemExit("the demo wrote no profiles: the sidecar did not run")
    return wall, float(match[1])


# A job whose stage keeps three writer processes busy (a tree for the sampler to walk).
CPU_JOB = r"""
import os, subprocess, sys, time
from pathlib import Path
from profiling.protocol import StageReporter
work, sock, seconds = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
writer = ("import os, sys, time\nend = time.monotonic() + float(sys.argv[2])\n"
          "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\nblock = b'w' * 65536\n"
          "while time.monotonic() < end:\n    os.pwrite(fd, block, 0)\n    time.sleep(0.001)\n")
reporter = StageReporter(sock)
with reporter.stage("process"):
    kids = [subprocess.Popen([sys.executable, "-c", writer, str(work / f"w{i}"), str(seconds)]) for i in range(3)]
    for kid in kids:
        kid.wait()
reporter.close()
"""


# A direct workload: three stages of real file I/O, announced to a sidecar or to none.
WRITER_JOB = r"""
import os, sys, time
from pathlib import Path
from profiling.protocol import StageReporter
work, sock, mib = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
reporter = StageReporter(Path(sock) if sock != "-" else None)
block = b"d" * 65536
files = [work / f"f{i}.bin" for i in range(16)]
started = time.monotonic()
with reporter.stage("download"):
    for path in files:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        for _ in range(mib * 16 // len(files)):
            os.write(fd, block)
        os.fsync(fd)
        os.close(fd)
with reporter.stage("process"):
    for path in files:
        data = path.read_bytes()
        (path.with_suffix(".out")).write_bytes(data[: len(data) // 4])
with reporter.stage("upload"):
    for path in files:
        path.with_suffix(".out").read_bytes()
        path.unlink()
        path.with_suffix(".out").unlink()
print(time.monotonic() - started)
reporter.close()
"""


WRITER_VARIANTS = {
    "none": None,
    "kernel counters": ["--no-call-probes"],
    "counters + per-call probes": [],
}


def run_writer(work: Path, *, sidecar_args: list[str] | None, mib: int) -> float:
    """Seconds the writer job's three stages took, with a sidecar at 1 Hz beside it (extra flags) or none."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    sock = work / "p.sock"
    sidecar = sidecar_args is not None
    proc = None
    if sidecar_args is not None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "sidecar", "--socket", str(sock), "--emf", str(work / "o.emf"),
             "--scratch-dir", str(work), *sidecar_args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE)
        while not sock.exists():
            if proc.poll() is not None:
                raise SystemExit("sidecar failed to start")
            time.sleep(0.02)
    done = subprocess.run([sys.executable, "-c", WRITER_JOB, str(work), str(sock) if sidecar else "-", str(mib)],
                          cwd=REPO, env=env, capture_output=True, text=True)
    if proc is not None:
        proc.wait(timeout=15)
    if done.returncode != 0 or "warning" in done.stderr:
        raise SystemExit(f"writer job failed: {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def stage_round_trip_ms(stages: int = 30) -> float:
    """What announcing one stage costs the job: stage_start + stage_end, each waiting for its ack."""
    from profiling.protocol import StageReporter

    with tempfile.TemporaryDirectory(prefix="iobatch-bench-") as tmp:
        sock = Path(tmp) / "p.sock"
        env = dict(os.environ, PYTHONPATH=str(REPO))
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "sidecar", "--socket", str(sock), "--emf", str(Path(tmp) / "o.emf"),
             "--scratch-dir", tmp, "--no-call-probes"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        reporter = StageReporter(sock, connect_timeout_s=30)
        costs = []
        for _ in range(stages):
            started = time.perf_counter()
            with reporter.stage("process"):
                pass
            costs.append((time.perf_counter() - started) * 1000)
        reporter.close()
        sidecar.wait(timeout=15)
        if not reporter.active and len((Path(tmp) / "o.emf").read_text().splitlines()) != stages:
            raise SystemExit("the sidecar did not record every stage")
    return statistics.median(costs)


def snapshot_cost_ms(scratch: Path) -> float:
    """What one sample costs: taken at every stage boundary (the job waits for it) and every interval."""
    from profiling.probes.procfs import device_of
    from profiling.sampler import take_snapshot

    device, _ = device_of(scratch)
    costs = []
    for _ in range(50):
        started = time.perf_counter()
        take_snapshot(os.getpid(), device)
        costs.append((time.perf_counter() - started) * 1000)
    return statistics.median(costs)


def sidecar_cpu(seconds: float, interval: float) -> tuple[float, float]:
    """(% of one core the sidecar used during a stage, stage wall seconds)."""
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory(prefix="iobatch-bench-") as tmp:
        work = Path(tmp)
        sock = work / "p.sock"
        env = dict(os.environ, PYTHONPATH=str(REPO))
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "sidecar", "--socket", str(sock), "--emf", str(work / "o.emf"),
             "--scratch-dir", str(work), "--interval", str(interval), "--no-call-probes"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while not sock.exists():
            if sidecar.poll() is not None:
                raise SystemExit(f"sidecar failed: {sidecar.communicate()[1]}")
            time.sleep(0.02)
        # The socket exists once imports and set-up are done: from here on it is the per-stage cost.
        before = read_cpu_ticks(sidecar.pid)
        started = time.monotonic()
        job = subprocess.run([sys.executable, "-c", CPU_JOB, str(work), str(sock), str(seconds)], cwd=REPO, env=env,
                             capture_output=True, text=True)
        wall = time.monotonic() - started
        after = read_cpu_ticks(sidecar.pid)
        sidecar.wait(timeout=15)
        if job.returncode != 0 or before is None or after is None:
            raise SystemExit(f"cpu job failed: {job.stderr[-2000:]}")
        return 100.0 * (after - before) / ticks_per_s / wall, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--image-mib", type=float, default=8.0)
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--workload", choices=("demo", "writer", "none"), default="writer",
                        help="writer: three stages of file I/O on tmpfs (default); demo: the local demo with "
                        "and without IOBATCH_NO_SIDECAR=1; none: only the per-stage and CPU figures")
    parser.add_argument("--writer-mib", type=int, default=1024)
    args = parser.parse_args()
    assert protocol.MAX_SOCKET_PATH  # the protocol module is importable from here

    rows: list[tuple[str, str, str, str]] = []
    if args.workload == "writer":
        series: dict[str, list[float]] = {name: [] for name in WRITER_VARIANTS}
        # tmpfs by default: other processes' disk traffic would drown a few-percent difference
        bench_dir = os.environ.get("IOBATCH_BENCH_DIR") or ("/dev/shm" if Path("/dev/shm").is_dir() else None)
        with tempfile.TemporaryDirectory(prefix="iobatch-bench-", dir=bench_dir) as tmp:
            run_writer(Path(tmp), sidecar_args=[], mib=args.writer_mib)  # warm-up
            names = list(WRITER_VARIANTS)
            for round_ in range(args.rounds):
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:  # rotate the order every round
                    seconds = run_writer(Path(tmp), sidecar_args=WRITER_VARIANTS[name], mib=args.writer_mib)
                    series[name].append(seconds)
                    print(f"round {round_ + 1}: {name}: {seconds:.2f} s", file=sys.stderr, flush=True)
        base = statistics.median(series["none"])
        for name in names[1:]:
            on = statistics.median(series[name])
            pair = {True: series[name], False: series["none"]}
            rows.append((f"writer job {args.writer_mib} MiB, 3 stages, s (median of {args.rounds}): sidecar with "
                         f"{name}", f"{base:.3f}", f"{on:.3f}",
                         f"{on / base:.3f}x (paired: {paired_ratio(pair):.3f}x)"))
    if args.workload == "demo":
        walls: dict[bool, list[float]] = {True: [], False: []}
        batches: dict[bool, list[float]] = {True: [], False: []}
        with tempfile.TemporaryDirectory(prefix="iobatch-bench-") as tmp:
            run_demo(Path(tmp) / "warm", sidecar=True, images=args.images, image_mib=args.image_mib)  # caches
            for round_ in range(args.rounds):
                order = (True, False) if round_ % 2 == 0 else (False, True)
                for with_sidecar in order:
                    wall, batch = run_demo(Path(tmp) / f"r{round_}-{int(with_sidecar)}", sidecar=with_sidecar,
                                           images=args.images, image_mib=args.image_mib)
                    walls[with_sidecar].append(wall)
                    batches[with_sidecar].append(batch)
                    print(f"round {round_ + 1}: sidecar={'on ' if with_sidecar else 'off'} wall {wall:.2f} s, "
                          f"batch {batch:.2f} s", file=sys.stderr, flush=True)
        for label, data in (("demo wall s", walls), ("batch s", batches)):
            on, off = statistics.median(data[True]), statistics.median(data[False])
            rows.append((f"{label} (median of {args.rounds})", f"{off:.2f}", f"{on:.2f}",
                         f"{on / off:.3f}x (paired: {paired_ratio(data):.3f}x)"))
    rows.append(("stage announce cost to the job (start + end acks), ms, median of 30", "0",
                 f"{stage_round_trip_ms():.2f}", "-"))
    snapshot_ms = snapshot_cost_ms(Path(tempfile.gettempdir()))
    rows.append(("one snapshot (tree + diskstats + vmstat + PSI), ms, median of 50", "-", f"{snapshot_ms:.2f}",
                 "-"))
    cpu_pct, wall = sidecar_cpu(args.cpu_seconds, args.interval)
    rows.append((f"sidecar CPU, % of one core ({args.interval:g} s interval, {wall:.0f} s stage)", "-",
                 f"{cpu_pct:.2f} %", "-"))

    print("| measure | without sidecar | with sidecar | ratio |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
