"""A stand-in for tuning.lab.volume.Lab: what the lab's runs use of it (run_comparison, run_advise_loop),
without root, a loop device or a FUSE daemon."""

from __future__ import annotations

from pathlib import Path

from tuning.host import HostTuning
from tuning.lab.config import emulated_sysctls


class StandInLab:
    """A mount directory, a credit count the test sets (and may lower), and each call as an event:
    "open", "drain", "cache <vm.dirty_bytes>", "check", "close"."""

    def __init__(self, mount: Path, events: list[str], *, credits_gib: float = 500.0,
                 limit_mibps: float = 122.1) -> None:
        self.mount = mount
        self.events = events
        self.credits_gib = credits_gib
        self.limit_mibps = limit_mibps

    def __enter__(self) -> StandInLab:
        self.events.append("open")
        return self

    def __exit__(self, *exc: object) -> None:
        self.events.append("close")

    def drain(self) -> None:
        self.events.append("drain")

    def apply_cache(self, tuning: HostTuning, memory_bytes: int | None = None) -> dict[str, str]:
        """The sysctls the real lab would write for `tuning` on an emulated memory of `memory_bytes`."""
        values = emulated_sysctls(tuning, memory_bytes)
        self.events.append(f"cache {values['vm.dirty_bytes']}")
        return values

    def check(self) -> None:
        self.events.append("check")
