"""The eBPF probe's per-file figures against workloads whose every call is known: counts, bytes, the access
pattern as Darshan counts it, the cap on files kept one by one, and a contract's path rules answered from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from profiling.metrics import by_call
from profiling.probes import ebpf
from profiling.probes import ebpf_maps as layout
from profiling.probes.ebpf_maps import OTHER_FILES
from profiling.probes.libbpf import BpfError
from tests.support.probed import run_probed

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def probe_ok() -> None:
    reason = ebpf.available()
    if reason is not None:
        pytest.skip(reason)


def probed(script: str, *args: str) -> dict[str, Any]:
    """Run `script` in a Python started after the probe attached; the probe's result."""
    return run_probed([sys.executable, "-c", script, *args], timeout=120)


BIG = 32 << 20  # one write of this size among 512 B ones: by far the slowest, so its size is max_bytes

# seq.bin: 100 x 4 KiB write() from the start, fsync, then read back in 8 KiB read()s (50, and one at the end
# that reads nothing). strided.bin: 50 x 512 B pwrite() walking backwards (never sequential), then 30 x 1000 B
# pwrite() 2000 B apart (sequential, never consecutive). big.bin: 20 x 512 B write(), one of BIG bytes, 20 more.
TWO_FILES = r"""
import os, sys
d = sys.argv[1]
fd = os.open(f"{d}/big.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for i in range(41):
    os.write(fd, b"z" * (""" + str(BIG) + r""" if i == 20 else 512))
os.close(fd)
fd = os.open(f"{d}/seq.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for _ in range(100):
    os.write(fd, b"a" * 4096)
os.fsync(fd)
os.close(fd)
fd = os.open(f"{d}/strided.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
for i in range(50):
    os.pwrite(fd, b"b" * 512, (49 - i) * 8192)
for i in range(30):
    os.pwrite(fd, b"c" * 1000, i * 2000)
os.close(fd)
fd = os.open(f"{d}/seq.bin", os.O_RDONLY)
while os.read(fd, 8192):
    pass
os.close(fd)
"""


def test_two_files_exact_per_file_with_their_access_pattern(probe_ok: None, tmp_path: Path) -> None:
    calls = probed(TWO_FILES, str(tmp_path))
    files = calls["files"]
    seq, strided, big = (files["by_path"][str(tmp_path / name)] for name in ("seq.bin", "strided.bin", "big.bin"))
    assert {c: (s["count"], s["bytes"]) for c, s in seq.items()} == {
        "open": (2, 0), "write": (100, 409600), "fsync": (1, 0), "read": (51, 409600), "close": (2, 0)}
    assert {c: (s["count"], s["bytes"]) for c, s in strided.items()} == {
        "open": (1, 0), "write": (80, 50 * 512 + 30 * 1000), "close": (1, 0)}
    assert big["write"]["count"] == 41 and big["write"]["max_bytes"] == BIG  # the slowest call's own size
    records = {r["path"]: r for r in files["records"]}
    # Darshan's counters: the first access has no previous one; a consecutive access is sequential too.
    assert records[str(tmp_path / "seq.bin")] == {
        "path": str(tmp_path / "seq.bin"), "read": {"sequential": 50, "consecutive": 50},
        "write": {"sequential": 99, "consecutive": 99},
        "access_sizes": [{"bytes": 4096, "count": 100}, {"bytes": 8192, "count": 50}, {"bytes": 0, "count": 1}]}
    assert records[str(tmp_path / "strided.bin")] == {
        "path": str(tmp_path / "strided.bin"), "write": {"sequential": 29, "consecutive": 0},
        "access_sizes": [{"bytes": 512, "count": 50}, {"bytes": 1000, "count": 30}]}
    # The job-wide figures hold the same calls (and the interpreter's own); the slowest write's size is its own.
    assert by_call(calls)["write"]["count"] >= 221
    assert by_call(calls)["write"]["max_bytes"] == BIG and files["other_files"] == 0 and not files["other_calls"]


MANY_FILES = r"""
import os, sys
for i in range(int(sys.argv[2])):
    fd = os.open(f"{sys.argv[1]}/f{i:05d}", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"x" * 3)
    os.close(fd)
"""


def test_files_past_the_cap_are_summed_and_counted(probe_ok: None, tmp_path: Path) -> None:
    made = 4200
    calls = probed(MANY_FILES, str(tmp_path), str(made))
    files = calls["files"]
    cap = files["files_cap"]
    assert cap < made  # the header's IOB_FILES, read from the object
    by_path = files["by_path"]
    kept = [p for p in by_path if p != OTHER_FILES]
    ours = [p for p in kept if p.startswith(f"{tmp_path}/")]
    # Every record is handed out (the interpreter's own files came first); the rest are summed, each counted once.
    assert len(kept) == cap
    assert files["other_files"] == made - len(ours)
    assert by_path[OTHER_FILES]["write"] == {**by_path[OTHER_FILES]["write"], "count": made - len(ours),
                                             "bytes": 3 * (made - len(ours))}
    assert all(by_path[p]["write"]["count"] == 1 for p in ours)
    assert files["other_calls"] and any(f"past the cap of {cap} files" in note and f"({made - len(ours)} such files"
                                        in note for note in files["notes"])


def test_the_loader_refuses_an_object_whose_values_it_would_misread(probe_ok: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The real object's value sizes are the decoder's (every probe above loaded it); a decoder expecting
    another layout is refused at load, in one line."""
    wrong = {**layout.VALUE_SIZES, "files": layout.FILE_SIZE + 8}
    monkeypatch.setattr(layout, "VALUE_SIZES", wrong)
    with pytest.raises(BpfError) as refused:
        ebpf._Loaded()
    message = str(refused.value)
    assert f"files {layout.FILE_SIZE} bytes (read as {layout.FILE_SIZE + 8})" in message and "\n" not in message


# Two descriptions of one file read in turn (each one sequential on its own), a directory listed, and a file
# whose path is longer than the program keeps.
SHARED = r"""
import os, sys
d = sys.argv[1]
with open(f"{d}/shared.bin", "wb") as f:
    f.write(b"s" * 40960)
one, two = (os.open(f"{d}/shared.bin", os.O_RDONLY) for _ in range(2))
for _ in range(10):
    os.read(one, 4096)
    os.read(two, 4096)
os.close(one)
os.close(two)
os.listdir(d)
deep = os.path.join(d, *["n" * 100] * 3)
os.makedirs(deep)
with open(os.path.join(deep, "leaf.bin"), "wb") as f:
    f.write(b"x")
"""


def test_descriptions_keep_their_own_pattern_directories_get_no_record_and_long_paths_say_so(
        probe_ok: None, tmp_path: Path) -> None:
    files = probed(SHARED, str(tmp_path))["files"]
    records = {r["path"]: r for r in files["records"]}
    # 20 reads, 10 per description: all but each description's first follow on from that description's own
    assert records[str(tmp_path / "shared.bin")]["read"] == {"sequential": 18, "consecutive": 18}
    assert str(tmp_path) not in files["by_path"]  # the directory opened to list it
    cut = [r for r in files["records"] if r.get("path_cut")]
    assert len(cut) == 1 and len(cut[0]["path"]) == 255 and cut[0]["path"].startswith(str(tmp_path))
    assert any(note.startswith("paths not whole") for note in files["notes"])


CONTRACT = """2,monitortimeframe,1000s
dir_writes,{dir},write,all,count,1
dir_bytes,{dir},write,all,bandwidth,1B
dir_max,{dir},write,all,max-latency,1us
elsewhere,/nowhere,write,all,count,1
dir_small,{dir},write,0-1kB,count,1
"""


def test_a_contract_path_rule_is_answered_from_the_files(probe_ok: None, tmp_path: Path) -> None:
    """`iobatch profile --contract` with the eBPF probe: rules on a path prefix come from its per-file figures;
    a path rule with a size range cannot (no size classes per file) and says so."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    contract = tmp_path / "c.contract"
    contract.write_text(CONTRACT.format(dir=out_dir))
    report = tmp_path / "profile.json"
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "profile", "--contract", str(contract), "--json",
                           str(report), "--", sys.executable, "-c", TWO_FILES, str(out_dir)],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    body = json.loads(report.read_text())
    assert body["sources"]["calls"] == "ebpf"
    rows = {r["label"]: r for r in body["contract"]}
    assert (rows["dir_writes"]["value"], rows["dir_writes"]["source"]) == (221, "ebpf")
    assert rows["dir_bytes"]["value"] == 409600 + 50 * 512 + 30 * 1000 + 40 * 512 + BIG
    assert rows["dir_max"]["value"] > 0 and "note" not in rows["dir_max"]
    assert "elsewhere" not in rows  # no call there: nothing reaches the threshold
    assert rows["dir_small"]["value"] is None and "size classes" in rows["dir_small"]["note"]
