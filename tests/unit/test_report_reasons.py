"""Why the eBPF probe gave no figures, as the profilers said it, never a guess (a root run without bpffs was once
told the eBPF probe "needs root"): the report's per-file section and the demo's console share one answer."""

from __future__ import annotations

from profiling.report.summary import ebpf_absent
from tests.support.profiles import full_profile


def test_the_reason_the_ebpf_probe_did_not_run_is_the_profilers_own() -> None:
    said = "probe ebpf did not start (eBPF probe needs the kernel's BTF (/sys/kernel/btf/vmlinux))"
    profiles = [full_profile(notices=[]), full_profile(notices=["io stall: host-wide", said])]
    assert ebpf_absent(profiles) == said


def test_without_a_reason_it_says_the_profiles_do_not_say() -> None:
    reason = ebpf_absent([full_profile(notices=["io stall: host-wide"])])
    assert reason is not None and "do not say" in reason and "root" not in reason


def test_a_run_the_probe_measured_has_no_reason() -> None:
    said = "probe ebpf did not start (a first child's slot was taken)"
    measured = full_profile(sources={"calls": "ebpf"})
    assert ebpf_absent([full_profile(notices=[said]), measured]) is None
