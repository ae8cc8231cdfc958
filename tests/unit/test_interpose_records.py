"""The interposer's record files as the probe reads them: a finished file is not looked at again, a boundary
reads only the files of the processes it waits for, and the record lines' bytes count as seen writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from profiling.finish import finish_stage
from profiling.metrics import StageProfile
from profiling.probes.callstats import Stats, calls_dict
from profiling.probes.interpose import RecordLog


def line(pid: int, since: float, t: float, writes: int, final: bool = False) -> str:
    """A record line as the library writes it: `writes` writes of 4 KiB under /scratch."""
    return (f'{{"pid":{pid},"since":{since},"born":0,"gen":0,"t":{t},"wall":0,"final":{str(final).lower()},'
            f'"paths":["","/scratch"],"cells":[[1,1,13,{writes},{writes * 4096},{writes * 900},800,1000,'
            f'{{"9":{writes}}}]]}}\n')


def append(path: Path, text: str) -> None:
    with path.open("a") as stream:
        stream.write(text)


def test_a_finished_or_execd_programs_file_is_not_read_again(tmp_path: Path) -> None:
    ended, execd, running = (tmp_path / name for name in ("calls-7-1000.jsonl", "calls-8-1000.jsonl",
                                                          "calls-8-2000.jsonl"))
    append(ended, line(7, 1.0, 1.5, 3) + line(7, 1.0, 1.6, 4, final=True))
    append(execd, line(8, 1.0, 1.5, 1))
    append(running, line(8, 2.0, 2.5, 2))
    log = RecordLog(tmp_path)
    log.poll()
    assert log.bytes_read == sum(p.stat().st_size for p in (ended, execd, running))
    # The library never appends to them again; if anything did, it would not be read.
    append(ended, line(7, 1.0, 1.7, 5))
    append(execd, line(8, 1.0, 1.7, 5))
    append(running, line(8, 2.0, 2.6, 6))
    log.poll()
    assert {key: len(records) for key, records in log.processes.items()} == {(7, 1.0): 2, (8, 1.0): 1, (8, 2.0): 2}


def test_a_boundary_reads_the_files_of_the_processes_it_waits_for_and_new_ones(tmp_path: Path) -> None:
    append(tmp_path / "calls-9-1.jsonl", line(9, 1.0, 1.5, 1))
    append(tmp_path / "calls-10-1.jsonl", line(10, 1.0, 1.5, 1))
    log = RecordLog(tmp_path)
    log.poll()
    append(tmp_path / "calls-9-1.jsonl", line(9, 1.0, 1.6, 2))
    append(tmp_path / "calls-10-1.jsonl", line(10, 1.0, 1.6, 2))
    append(tmp_path / "calls-9-2.jsonl", line(9, 2.0, 2.0, 0))  # pid 9 exec'd a program that records
    log.poll([9])
    assert {key: len(records) for key, records in log.processes.items()} == {(9, 1.0): 2, (10, 1.0): 1, (9, 2.0): 1}
    log.poll()
    assert len(log.processes[(10, 1.0)]) == 2


def interposer(write_bytes: int, record_bytes: int | None) -> dict[str, Any]:
    cells = {("/scratch", "write", 13): Stats(write_bytes // 4096, write_bytes, 15_000, 9000, 30_000, {13: 1})}
    calls = calls_dict("interpose", cells, [(0.0, cells)], filter_text="t", duration_s=2700.0, interval_s=1.0)
    if record_bytes is not None:
        calls["record_bytes"] = record_bytes
    return calls


def test_the_record_lines_count_as_the_interposers_writes() -> None:
    """A 45-minute stage that writes 40 KiB: 2,700 record lines of ~400 B are most of its wchar, and they
    are the interposer's own writes, not calls it missed."""
    kernel = StageProfile(stage="process", outcome="ok", started_at=0.0, duration_s=2700.0, sources={"io": "procfs"},
                          write_bytes=40_960 + 1_080_000, write_calls=2710)
    done = finish_stage(kernel, [("interpose", interposer(40_960, 1_080_000))])
    assert done.sources.get("calls") == "interpose" and done.notices == []
    left_out = finish_stage(kernel, [("interpose", interposer(40_960, None))])
    assert left_out.calls is None
    [notice] = left_out.notices
    assert "calls it cannot see (static binaries such as s5cmd, stdio's internal writes" in notice


MAPS = ("55d0c8a00000-55d0c8a28000 r--p 00000000 fd:01 1311 /usr/bin/sleep\n"
        "7f3a1c000000-7f3a1c002000 r-xp 00002000 fd:01 2622 {lib}\n"
        "7ffd5e1f0000-7ffd5e211000 rw-p 00000000 00:00 0                          [stack]\n")


def test_a_process_has_the_library_while_its_maps_name_it(tmp_path: Path) -> None:
    from profiling.probes.interpose import _has_library

    for pid, lib in ((1, "/opt/iobatch/lib/libiobatch_interpose.so"),
                     (2, "/opt/iobatch/lib/libiobatch_interpose.so (deleted)"),  # rebuilt since it was mapped
                     (3, "/usr/lib/x86_64-linux-gnu/libc.so.6")):  # exec'd a program without it
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "maps").write_text(MAPS.format(lib=lib))
    assert [_has_library(pid, tmp_path) for pid in (1, 2, 3, 4)] == [True, True, False, False]
