"""The guest tier's first boot (tests/support/firstboot.py), booted in the background from the session's start
(tests/support/guestboots.py)."""

from __future__ import annotations

import pytest

from tests.support.firstboot import FirstBoot
from tests.support.guestboots import Boots
from tuning.guest.machine import unavailable


@pytest.fixture(scope="session")
def first_boot(guest_boots: Boots) -> FirstBoot:
    if reason := unavailable():
        pytest.skip(f"no cgroup v2 guest: {reason}")
    return guest_boots.result("first")
