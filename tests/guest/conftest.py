"""The guest tier's shared first boot (tests/support/firstboot.py), once a session."""

from __future__ import annotations

import pytest

from tests.support.firstboot import FirstBoot, boot_first
from tuning.guest.machine import unavailable


@pytest.fixture(scope="session")
def first_boot(tmp_path_factory: pytest.TempPathFactory) -> FirstBoot:
    if reason := unavailable():
        pytest.skip(f"no cgroup v2 guest: {reason}")
    return boot_first(tmp_path_factory.mktemp("first-boot"))
