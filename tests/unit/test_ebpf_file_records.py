"""eBPF's per-file figures as the probe hands them on (ebpf._files_dict, the producer) and the contract rules on a
path prefix they answer: which source answers which rule, and the note when the stage had calls on files past
the cap."""

from __future__ import annotations

from typing import Any

from profiling.contract import FILES_PAST_CAP, PATHS_NO_SIZES, evaluate_stage, parse_contract
from profiling.metrics import StageProfile
from profiling.probes import ebpf
from profiling.probes.callstats import Stats, calls_dict
from profiling.probes.ebpf_maps import OTHER_FILES, FileRecord

CONTRACT = parse_contract("""2,monitortimeframe,1000s
in_reads,/scratch/in,read,all,count,1
in_bytes,/scratch/in,read,all,bandwidth,1B
in_max,/scratch/in,read,all,max-latency,1us
small_out,/scratch/out,write,0-4kB,count,1
""")

FILES: dict[int, FileRecord] = {
    0: FileRecord("/scratch/in/a.jpg", {"read": Stats(10, 40960, 10_000, 500, 4000, max_bytes=4096),
                                        "open": Stats(1, 0, 900, 900, 900, max_bytes=0)},
                  (9, 0), (9, 0), {4096: 10}),
    1: FileRecord("/scratch/in/b.jpg", {"read": Stats(5, 5000, 5_000, 600, 7000, max_bytes=1000)},
                  (4, 0), (2, 0), {1000: 5}),
    2: FileRecord("/scratch/out/shard.tar", {"write": Stats(3, 300, 900, 100, 500, max_bytes=100)}),
}
OTHER = {3: FileRecord(OTHER_FILES, {"read": Stats(7, 70, 70, 5, 20, max_bytes=10)})}  # the files past the cap


def _state(other_files: int) -> dict[str, int]:
    """The window's change of the program's counters."""
    return {"other_files": other_files, "other_lost": 0}


def _profile(calls: dict[str, Any]) -> StageProfile:
    return StageProfile(stage="download", outcome="ok", started_at=0.0, duration_s=5.0, calls=calls)


def _ebpf_calls(other_files: int, other_calls: bool = False, files: dict[int, FileRecord] | None = None,
                **beside: Any) -> dict[str, Any]:
    everything = {("", "read", 13): Stats(22, 46030, 15_070, 5, 7000)}
    main = calls_dict("ebpf", everything, [(0.0, everything)], filter_text="t", duration_s=5, interval_s=1.0,
                      path_attribution=False)
    window = {**(FILES if files is None else files), **(OTHER if other_calls else {})}
    cells = ebpf.file_cells(window)
    main["files"] = ebpf._files_dict(window, [(0.0, cells)], _state(other_files), 3, "t", 5.0, 1.0)
    return {**main, **beside}


def test_the_files_dict_has_per_file_figures_and_access_patterns() -> None:
    files = _ebpf_calls(0)["files"]
    assert files["by_path"]["/scratch/in/a.jpg"]["read"]["count"] == 10
    assert files["by_path"]["/scratch/in/b.jpg"]["read"]["max_bytes"] == 1000
    assert files["size_classes"] is False and files["files_cap"] == 3 and files["notes"] == []
    # access patterns only for files read or written, never for the summed rest
    assert [r["path"] for r in files["records"]] == ["/scratch/in/a.jpg", "/scratch/in/b.jpg",
                                                     "/scratch/out/shard.tar"]
    assert files["records"][1]["read"] == {"sequential": 4, "consecutive": 2}


def test_path_rules_without_a_size_range_come_from_the_files() -> None:
    rows = {r["label"]: r for r in evaluate_stage(CONTRACT, _profile(_ebpf_calls(0)))}
    assert (rows["in_reads"]["value"], rows["in_reads"]["source"]) == (15.0, "ebpf")
    assert rows["in_bytes"]["value"] == 45960.0
    assert rows["in_max"]["value"] == 7.0 and "note" not in rows["in_max"]  # b.jpg's slowest read, exact
    # no size classes per file: a rule with a size range is unavailable, and says why
    assert (rows["small_out"]["value"], rows["small_out"]["note"]) == (None, PATHS_NO_SIZES)


def test_a_size_range_path_rule_goes_to_the_interposer_beside() -> None:
    on_out = {("/scratch/out", "write", 7): Stats(3, 300, 900, 100, 500)}
    interpose = calls_dict("interpose", on_out, [(0.0, on_out)], filter_text="t", duration_s=5, interval_s=1.0)
    rows = {r["label"]: r for r in evaluate_stage(CONTRACT, _profile(_ebpf_calls(0, interpose=interpose)))}
    assert (rows["small_out"]["value"], rows["small_out"]["source"]) == (3.0, "interpose")
    assert rows["in_reads"]["source"] == "ebpf"  # the files see every binary: they answer what they can


def test_calls_past_the_cap_in_the_stage_are_named_in_every_path_row() -> None:
    calls = _ebpf_calls(40, other_calls=True)
    assert calls["files"]["notes"] == [f"calls on files past the cap of 3 files are summed as {OTHER_FILES!r} "
                                       "(40 such files first seen in this stage)"]
    assert (calls["files"]["other_calls"], calls["files"]["other_files"]) == (True, 40)
    rows = {r["label"]: r for r in evaluate_stage(CONTRACT, _profile(calls))}
    assert rows["in_reads"]["value"] == 15.0  # the summed rest has no path: it matches no prefix
    assert rows["in_reads"]["note"] == FILES_PAST_CAP.format(cap=3)


def test_a_stage_without_calls_past_the_cap_has_no_note_though_the_job_had_some() -> None:
    """The probe stays loaded for the whole job: files summed in earlier stages are not this stage's."""
    calls = _ebpf_calls(0, other_calls=False)
    assert calls["files"]["notes"] == [] and calls["files"]["other_calls"] is False
    rows = {r["label"]: r for r in evaluate_stage(CONTRACT, _profile(calls))}
    assert "note" not in rows["in_reads"]


def test_a_path_rule_below_threshold_with_calls_past_the_cap_is_unknown_not_omitted() -> None:
    """Its files may have gone to "(other files)": the row says so with no value, rather than vanish."""
    only_out = {2: FILES[2]}
    rows = {r["label"]: r for r in evaluate_stage(CONTRACT, _profile(_ebpf_calls(5, True, only_out)))}
    assert (rows["in_reads"]["value"], rows["in_reads"]["note"]) == (None, FILES_PAST_CAP.format(cap=3))
    assert rows["in_reads"]["source"] == "ebpf"
    without = {r["label"] for r in evaluate_stage(CONTRACT, _profile(_ebpf_calls(0, False, only_out)))}
    assert "in_reads" not in without  # no calls past the cap: below threshold means below threshold


def test_a_cut_path_is_named_once() -> None:
    cut = {7: FileRecord("/deep/" + "d" * 240, {"read": Stats(1, 1, 1, 1, 1, max_bytes=1)}, cut=True)}
    notes = _ebpf_calls(0, files={**FILES, **cut})["files"]["notes"]
    assert len(notes) == 1 and notes[0].startswith("paths not whole (longer than 255 bytes") and ": 1, e.g." in notes[0]
    assert {r["path"]: r for r in _ebpf_calls(0, files=cut)["files"]["records"]}["/deep/" + "d" * 240]["path_cut"]
