"""The eBPF probe on the AL2023 kernel line (the cgroup v2 guest's Debian 6.1): the programs take their fentry/fexit
hooks there (this build machine's kernel refuses them, so only here do they run), one copy serves two profilers,
a static program's and forked processes' writes are exact, and nothing stays pinned after the last one leaves.
Run in the guest tier's first boot (tests/guest/conftest.py)."""

from __future__ import annotations

import json

from tests.support.firstboot import FirstBoot


def test_fentry_hooks_exact_counts_and_nothing_left_on_61(first_boot: FirstBoot) -> None:
    assert first_boot.result.returncode == 0, first_boot.result.stderr
    err = (first_boot.share / "fentry.err").read_text()
    assert "fentry=0" in first_boot.result.stdout, err[-3000:]
    out = json.loads((first_boot.share / "fentry.json").read_text().strip().splitlines()[-1])
    assert out["release"].startswith("6.1.")
    assert out["hooks"] == "fentry"
    assert out["programs"] > 0 and out["shared"] == out["programs"]  # the second profiler added none
    assert out["static"] == [3000, 3000 * 4096]
    assert out["forked"] == [1200, 500 * 512 + 700 * 100]
    assert out["left"] == []
