"""The eBPF probe on the AL2023 kernel line (the cgroup v2 guest's Debian 6.1): the programs take their fentry/fexit
hooks there (this build machine's kernel refuses them, so only here do they run), one copy serves two profilers,
a static program's and forked processes' writes are exact, this suite's exact-count tests hold on the shared copy,
and nothing stays pinned after the last profiler leaves. Run in the guest tier's first boot
(tests/support/guestprobe.py).
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.firstboot import EBPF_ERR, EBPF_OUT, FirstBoot
from tests.support.guestprobe import EBPF_EXACT


def checks(first_boot: FirstBoot) -> dict[str, Any]:
    assert first_boot.result.returncode == 0, first_boot.result.stderr
    err = (first_boot.share / EBPF_ERR).read_text()
    assert "ebpf=0" in first_boot.result.stdout, err[-3000:]
    found = json.loads((first_boot.share / EBPF_OUT).read_text().strip().splitlines()[-1])
    assert isinstance(found, dict)
    return found


def test_fentry_hooks_exact_counts_and_nothing_left_on_61(first_boot: FirstBoot) -> None:
    out = checks(first_boot)
    assert out["release"].startswith("6.1.")
    assert out["hooks"] == "fentry"
    assert out["programs"] > 0 and out["shared"] == out["programs"]  # the second profiler added none
    assert out["static"] == [3000, 3000 * 4096]
    assert out["forked"] == [1200, 500 * 512 + 700 * 100]
    assert out["left"] == []


def test_the_exact_count_tests_hold_on_61(first_boot: FirstBoot) -> None:
    tests = checks(first_boot)["tests"]
    assert list(tests) == list(EBPF_EXACT)
    failed = {node: outcome for node, outcome in tests.items() if outcome != "passed"}
    assert not failed, "\n".join(f"{node}:\n{outcome}" for node, outcome in failed.items())
