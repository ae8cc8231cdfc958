"""What the lab builds: LabConfig's validation, its starting credits, and the sysctls of an emulated memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuning.ebs import GIB, Volume
from tuning.host import KERNEL_DEFAULTS, HostTuning
from tuning.lab.config import LabConfig, LabError, emulated_sysctls

KERNEL = "6.1.0-18-amd64"


def test_emulated_memory_turns_ratios_into_bytes() -> None:
    values = emulated_sysctls(HostTuning(), 4 * GIB)  # 30 / 20 of 4 GiB x 0.9 dirtyable
    assert values == {"vm.dirty_bytes": str(int(4 * GIB * 0.9 * 0.30)),
                      "vm.dirty_background_bytes": str(int(4 * GIB * 0.9 * 0.20))}
    defaults = emulated_sysctls(KERNEL_DEFAULTS, 4 * GIB)
    assert int(defaults["vm.dirty_bytes"]) < int(values["vm.dirty_bytes"])
    as_bytes = HostTuning(dirty_ratio=None, dirty_background_ratio=None, dirty_bytes=GIB,
                          dirty_background_bytes=GIB // 2)
    assert emulated_sysctls(as_bytes, 4 * GIB) == {"vm.dirty_bytes": str(GIB),
                                                   "vm.dirty_background_bytes": str(GIB // 2)}
    assert emulated_sysctls(HostTuning(), None) == {"vm.dirty_ratio": "30", "vm.dirty_background_ratio": "20"}


def test_the_default_config_is_the_case_study_volume() -> None:
    config = LabConfig(lab_dir=Path("/lab"))
    config.validate(KERNEL)
    assert config.volume == Volume("st1", 500)
    assert config.initial_credits == Volume("st1", 500).credit_capacity


@pytest.mark.parametrize(("change", "message"), [
    ({"volume": Volume("gp2", 2000)}, "cannot be emulated"),
    ({"loop_size_mib": 200}, "too small for XFS"),
    ({"time_scale": 0.5}, "at least 1"),
    ({"initial_credits_mib": 600 * 1024.0}, "outside 0-"),
    ({"initial_credits_mib": -1.0}, "outside 0-"),
    ({"tuning": HostTuning(filesystem="ext4")}, "builds XFS"),
])
def test_validate_names_the_cause(change: dict[str, object], message: str) -> None:
    config = LabConfig(**change)  # type: ignore[arg-type]
    with pytest.raises(LabError, match=message):
        config.validate(KERNEL)


def test_starting_credits_as_asked_or_none_when_held_empty() -> None:
    assert LabConfig(initial_credits_mib=54 * 1024.0).initial_credits == 54 * 1024
    assert LabConfig(initial_credits_mib=54 * 1024.0, hold_empty=True).initial_credits == 0.0
