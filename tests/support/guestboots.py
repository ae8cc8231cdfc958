"""The guest tier's boots, run in the background beside the tiers that time nothing (tests/conftest.py).

Under TCG the tier's four boots are most of its time, while a unit test runs on one core and leaves the other idle.
A boot needs nothing of this process's state (a QEMU with its own share), so the boots run one after another in one
thread, and each guest test waits only for the boot it reads; a boot's error is the error of the tests that read
it, as if they had booted it themselves. Not beside the tiers that run and time whole batches: the two cores they
share with an emulated guest slow both (a demo's first child flagged as a bad apple, the emulated disk short of its
throttle, both seen).

What the first boot needs from this process (the static write benchmark, the accelerator) is made first in that
thread; the two syntheses the hosts' user data come from run in a thread of their own beside the first boot (at a
lower priority than its QEMU), and the later boots wait for them. jsii is not for two threads at once, so the synth
tier waits for them too (`Boots.prepared`).
No QEMU outlives the suite: each is killed by PR_SET_PDEATHSIG when this process ends (tuning/guest/machine.py),
whatever the tests did.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

# The fixture a guest test reads -> the boots it needs, in the order the thread boots them.
NOMINAL, SLOW_HOST = "i-0000000000000000a", "i-0000000000000000b"
BOOTS_OF = {"first_boot": ("first",), "packed_host": ("packed",), "hosts": (NOMINAL, SLOW_HOST)}
SYNTH_NICE = 10  # the syntheses beside the first boot yield the CPU to its QEMU


def _boot(name: str, folder: Path) -> Callable[[], Any]:
    # Imported here: the guest's own pytest (tests/support/firstboot.py) loads tests/conftest.py under emulation.
    from tests.support.firstboot import boot_first
    from tests.support.packedhost import boot_packed_host
    from tests.support.qualifyhost import boot_qualified_host, nominal_throttle, slow_throttle

    if name == "first":
        return lambda: boot_first(folder)
    if name == "packed":
        return lambda: boot_packed_host(folder)
    if name == NOMINAL:
        return lambda: boot_qualified_host(folder, nominal_throttle(), NOMINAL)
    return lambda: boot_qualified_host(folder, slow_throttle(), SLOW_HOST, fence=True)


class Boots:
    """The boots `fixtures` need, booting in a thread of their own; `result(name)` waits for one."""

    def __init__(self, fixtures: Iterable[str], folder: Callable[[str], Path]) -> None:
        names = [name for fixture in BOOTS_OF if fixture in set(fixtures) for name in BOOTS_OF[fixture]]
        self._futures: dict[str, Future[Any]] = {name: Future() for name in names}
        self._synthesized: Future[None] = Future()
        self.booting = bool(names)
        if not names:
            self._synthesized.set_result(None)
            return
        plan = [(name, _boot(name, folder(name))) for name in names]
        threading.Thread(target=self._run, args=(plan,), name="guest boots", daemon=True).start()

    def _run(self, plan: list[tuple[str, Callable[[], Any]]]) -> None:
        try:
            _prepare_first()
        except BaseException as exc:  # every boot's tests fail (or skip) with it
            self._synthesized.set_result(None)
            for future in self._futures.values():
                future.set_exception(exc)
            return
        threading.Thread(target=self._synthesize, name="guest boots' syntheses", daemon=True).start()
        for name, boot in plan:
            future = self._futures[name]
            try:
                if name != "first":
                    self._synthesized.result()  # its error, if any, is this boot's
                future.set_result(boot())
            except BaseException as exc:  # the tests that read this boot fail with it
                future.set_exception(exc)

    def _synthesize(self) -> None:
        os.nice(SYNTH_NICE)  # this thread's, and its jsii's node (setpriority(2) is per thread on Linux)
        try:
            _synthesize()
        except BaseException as exc:
            self._synthesized.set_exception(exc)
        else:
            self._synthesized.set_result(None)

    def prepared(self) -> None:
        """Wait until the boots' syntheses are done (or failed): then jsii is free for this thread's tests."""
        self._synthesized.exception()

    def result(self, name: str) -> Any:
        """The boot's result (FirstBoot, PackedHost or QualifiedHost), once it is done; its error, raised."""
        if name not in self._futures:
            raise LookupError(f"the {name} boot was not started: no guest test of this session reads it")
        return self._futures[name].result()


def _prepare_first() -> None:
    """What the first boot needs from this process, made once (each is cached): the accelerator, the static write
    benchmark."""
    from tests.support.writebench import writebench
    from tuning.guest.machine import accelerator

    accelerator()
    writebench()


def _synthesize() -> None:
    """The two templates the later hosts' user data come from (cached by tests/support/synth.py)."""
    from tests.support.synth import synthesize

    synthesize()
    synthesize(hostQualification="fence")
