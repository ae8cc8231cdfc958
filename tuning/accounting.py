"""AWS's HDD accounting applied to a stream of block requests by offset (HddAccountant): what the lab's emulated
st1 device charges, and how a request trace's random share is measured. Pure.

In: each request's offset and size, in order. Out: the 1 MiB units (MiB of credits) each costs, the units in all, and
the bytes moved by sequential and by random requests. Invariant: a request that starts where the previous one ended
pays only for the units it opens; any other opens at least one.
"""

from __future__ import annotations

from tuning.ebs import HDD_IO_UNIT


# The rule (https://docs.aws.amazon.com/ebs/latest/userguide/hdd-vols.html, "Inefficiency of small read/writes on
# HDD", as of 2025-09): st1 and sc1 count throughput in 1 MiB I/O units; sequential I/O is merged into 1 MiB units,
# and a random I/O smaller than 1 MiB costs a whole unit.
class HddAccountant:
    """AWS's HDD accounting applied to a stream of requests, by offset (tuning.ebs [HDD, IO]).

    A request that starts where the previous one ended continues the open 1 MiB unit: it is charged only
    for the units it opens past what the open unit still holds. Any other request is random: it opens new
    units, at least one, so a random 4 KiB write costs a whole MiB while eight sequential 128 KiB writes
    cost one. `charge(offset, size)` returns the units (MiB of credits) one request costs.
    """

    def __init__(self, unit: int = HDD_IO_UNIT) -> None:
        self.unit = unit
        self._next = -1  # where a sequential request would start
        self._room = 0  # bytes left in the open unit
        self.units = 0
        self.sequential_bytes = 0
        self.random_bytes = 0

    def charge(self, offset: int, size: int) -> int:
        if size <= 0:
            return 0
        if offset == self._next:
            self.sequential_bytes += size
            extra = max(0, size - self._room)
        else:
            self.random_bytes += size
            extra = size
            self._room = 0
        opened = -(-extra // self.unit)
        self._room = self._room + opened * self.unit - size
        self._next = offset + size
        self.units += opened
        return opened

    @property
    def random_share(self) -> float | None:
        """The share of bytes moved by random requests; None before any request."""
        total = self.sequential_bytes + self.random_bytes
        return None if total == 0 else self.random_bytes / total
