"""The LD_PRELOAD interposer against the truth: exact counts, strace -T latency, errno, fork, threads."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profiling.metrics import by_call
from profiling.probes.callstats import Cells, Stats
from profiling.probes.interpose import InterposeProbe, library_path, preload_env, read_records

INTERPOSE_DIR = Path(__file__).resolve().parents[2] / "profiling" / "interpose"
WRITEBENCH = INTERPOSE_DIR / "writebench"


@pytest.fixture(scope="module")
def built() -> Path:
    """The library, built with the machine's C compiler (what `make setup` does)."""
    if shutil.which("cc") is None or shutil.which("make") is None:
        pytest.skip("no C compiler (cc) or make: the interposer cannot be built")
    subprocess.run(["make", "-s", "-C", str(INTERPOSE_DIR)], check=True, capture_output=True)
    lib = library_path({})
    assert lib is not None
    return lib


def run_preloaded(argv: list[str], scratch: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **preload_env(scratch), **env}
    return subprocess.run(argv, env=full, capture_output=True, text=True, check=False)


def final_cells(scratch: Path) -> dict[int, Cells]:
    records = read_records(scratch / ".iobatch-calls")
    return {pid: recs[-1].cells for pid, recs in records.items() if recs and recs[-1].final}


def write_stats(cells: Cells, path: str) -> Stats:
    """Writes to `path`, attributed to any recorded prefix of it."""
    total = Stats()
    for (prefix, call, _size), stats in cells.items():
        if call == "write" and prefix and (path == prefix or path.startswith(prefix.rstrip("/") + "/")):
            total.add(stats)
    return total


def test_million_4k_writes_are_counted_exactly(built: Path, tmp_path: Path) -> None:
    proc = run_preloaded([str(WRITEBENCH), "/dev/null", "1000000", "4096"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    (cells,) = final_cells(tmp_path).values()
    stats = write_stats(cells, "/dev/null")
    assert stats.count == 1_000_000
    assert stats.bytes == 4_096_000_000
    # All 4 KiB: size class 13 covers [4096, 8192).
    assert {k for (_p, c, k) in cells if c == "write"} == {13}
    assert sum(stats.hist.values()) == 1_000_000
    assert stats.min_ns is not None and stats.max_ns is not None
    assert 0 < stats.min_ns <= stats.total_ns / stats.count <= stats.max_ns


PACED_WRITER = "import os, sys, time\nfor _ in range({n}):\n    os.write(1, b'x' * 4096)\n    time.sleep(0.0005)\n"


def test_mean_latency_agrees_with_strace(built: Path, tmp_path: Path) -> None:
    """dd reads 4 KiB blocks from a pipe a writer fills every ~0.5 ms: each read() waits that long.

    A latency set by the workload, not the shared disk, and long enough that strace's own stop
    overhead (~tens of us) stays small. Interposer and strace -T runs alternate; medians compared.
    """
    if shutil.which("strace") is None or shutil.which("dd") is None:
        pytest.skip("strace or dd not installed")
    n = 1000
    writer = [sys.executable, "-c", PACED_WRITER.format(n=n)]
    dd = ["dd", "bs=4096", f"count={n}", "of=/dev/null"]
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(3):
        scratch = tmp_path / f"run{i}"
        feed = subprocess.Popen(writer, stdout=subprocess.PIPE)
        proc = subprocess.run(dd, stdin=feed.stdout, env={**os.environ, **preload_env(scratch)},
                              capture_output=True, check=False)
        feed.wait()
        assert proc.returncode == 0, proc.stderr  # dd closes stderr at exit: the library must cope
        (cells,) = final_cells(scratch).values()
        pipe_reads = Stats()
        for (prefix, call, _k), stats in cells.items():
            if call == "read" and prefix == "":
                pipe_reads.add(stats)
        assert pipe_reads.count == n and pipe_reads.bytes == 4096 * n
        ours.append(pipe_reads.total_ns / n / 1000)
        log = tmp_path / f"strace{i}.txt"
        feed = subprocess.Popen(writer, stdout=subprocess.PIPE)
        subprocess.run(["strace", "-T", "-e", "trace=read", "-o", str(log), *dd], stdin=feed.stdout,
                       check=True, capture_output=True)
        feed.wait()
        times = [float(t) for t in re.findall(r"^read\(0,.*<([0-9.]+)>$", log.read_text(), re.M)]
        assert len(times) == n
        theirs.append(statistics.mean(times) * 1e6)
    ratio = statistics.median(ours) / statistics.median(theirs)
    assert 0.8 <= ratio <= 1.2, f"interposer {ours} us vs strace -T {theirs} us"


PROBE_SCRIPT = textwrap.dedent(
    """
    import errno, os, sys, threading
    out = []
    # errno and return values pass through untouched
    try:
        os.write(987, b"x")
    except OSError as e:
        out.append(e.errno)
    try:
        os.open("/nonexistent/iobatch", os.O_RDONLY)
    except OSError as e:
        out.append(e.errno)
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    out.append(os.write(fd, b"abc"))
    os.fsync(fd)
    os.close(fd)
    # threads: per-thread counters, merged when a thread exits
    def burst():
        null = os.open("/dev/null", os.O_WRONLY)
        for _ in range(5000):
            os.write(null, b"y" * 100)
        os.close(null)
    threads = [threading.Thread(target=burst) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    # fork: the child records its own calls in its own file
    pid = os.fork()
    if pid == 0:
        null = os.open("/dev/null", os.O_WRONLY)
        for _ in range(7):
            os.write(null, b"z")
        os._exit(0)  # skips exit handlers: the library wraps _exit for its final record
    os.waitpid(pid, 0)
    print(out, pid)
    """
)


def test_errno_threads_fork_and_paths(built: Path, tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c" / "file.bin"
    target.parent.mkdir(parents=True)
    script = tmp_path / "probe.py"
    script.write_text(PROBE_SCRIPT)
    plain = subprocess.run([sys.executable, str(script), str(target)], capture_output=True, text=True, check=True)
    preloaded = run_preloaded([sys.executable, str(script), str(target)], tmp_path / "scratch",
                              IOBATCH_INTERPOSE_INTERVAL_MS="100")
    assert preloaded.returncode == 0, preloaded.stderr
    assert preloaded.stdout.split("]")[0] == plain.stdout.split("]")[0]  # same errnos, same return values
    child_pid = int(preloaded.stdout.split()[-1])
    records = read_records(tmp_path / "scratch" / ".iobatch-calls")
    parent = next(recs[-1].cells for pid, recs in records.items() if pid != child_pid)
    assert write_stats(parent, "/dev/null").count == 20_000
    assert write_stats(parent, "/dev/null").bytes == 2_000_000
    # Paths are kept to 3 components (the default depth); Python itself reads probe.py under the same one.
    prefix = "/" + "/".join(str(target).strip("/").split("/")[:3])
    file_cells = {(c, k): s.count for (p, c, k), s in parent.items() if p == prefix and c in ("write", "fsync")}
    assert file_cells == {("write", 2): 1, ("fsync", -1): 1}
    # The child left with _exit, in less than one record interval.
    child = records[child_pid][-1].cells
    assert write_stats(child, "/dev/null").count == 7
    assert write_stats(parent, "/dev/null").count == 20_000  # nothing of the child's leaked into the parent


def test_depth_keeps_a_path_prefix(built: Path, tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "file"
    target.parent.mkdir(parents=True)
    proc = run_preloaded([str(WRITEBENCH), str(target), "3"], tmp_path / "s", IOBATCH_INTERPOSE_DEPTH="2")
    assert proc.returncode == 0
    (cells,) = final_cells(tmp_path / "s").values()
    expected = "/" + "/".join(str(target).strip("/").split("/")[:2])
    assert write_stats(cells, expected).count == 3


def test_probe_reports_one_stage(built: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    probe = InterposeProbe(scratch / ".iobatch-calls", interval_s=0.2)
    probe.start(os.getpid())
    proc = run_preloaded([str(WRITEBENCH), str(tmp_path / "out.bin"), "1000", "65536"], scratch,
                         IOBATCH_INTERPOSE_INTERVAL_MS="200")
    assert proc.returncode == 0
    calls = probe.stop()
    assert calls is not None
    assert calls["probe"] == "interpose"
    assert by_call(calls)["write"]["count"] == 1000
    assert by_call(calls)["write"]["bytes"] == 65_536_000
    assert calls["by_size"]["write"] == {"64KiB-128KiB": by_call(calls)["write"]}
    assert sum(c["count"] for f in calls["frames"] for c in f["cells"] if c["call"] == "write") == 1000


def test_preload_env_points_at_the_library(built: Path, tmp_path: Path) -> None:
    env = preload_env(tmp_path, {"LD_PRELOAD": "other.so"})
    assert env["LD_PRELOAD"] == f"{built} other.so"
    assert Path(env["IOBATCH_INTERPOSE_DIR"]).is_dir()
