"""The report names why a figure is missing as the profilers said it, never a guess (a root run without bpffs was
once told the eBPF probe "needs root")."""

from __future__ import annotations

from profiling.report.sources import Entry, ReportData
from profiling.report.summary import ebpf_missing
from tests.support.profiles import full_profile


def _data(*notices: list[str]) -> ReportData:
    return ReportData(entries=[Entry(child=f"part-{i:05d}", profile=full_profile(notices=list(n)))
                               for i, n in enumerate(notices)], source="run", has_timelines=False)


def test_the_reason_the_ebpf_probe_did_not_run_is_the_profilers_own() -> None:
    said = "probe ebpf did not start (eBPF probe needs the kernel's BTF (/sys/kernel/btf/vmlinux))"
    assert ebpf_missing(_data([], ["io stall: host-wide", said])) == said


def test_without_a_reason_the_report_says_the_profiles_do_not_say() -> None:
    reason = ebpf_missing(_data(["io stall: host-wide"]))
    assert "do not say" in reason and "root" not in reason
