"""The guest tier's boots, run in the background beside the tiers that time nothing (tests/conftest.py).

Under TCG the tier's four boots are most of its time, while a unit test runs on one core and leaves the other idle.
A boot needs nothing of this process's state (a QEMU with its own share), so the boots run one after another in one
thread, and each guest test waits only for the boot it reads; a boot's error is the error of the tests that read
it, as if they had booted it themselves. Not beside the tiers that run and time whole batches: the two cores they
share with an emulated guest slow both (a demo's first child flagged as a bad apple, the emulated disk short of its
throttle, both seen).

What a boot needs from this process (the synthesized templates, the static write benchmark, the accelerator) is made
first in that thread; jsii is not for two threads at once, so the synth tier waits for it (`Boots.prepared`).
No QEMU outlives the suite: each is killed by PR_SET_PDEATHSIG when this process ends (tuning/guest/machine.py),
whatever the tests did.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

# The fixture a guest test reads -> the boots it needs, in the order the thread boots them.
NOMINAL, SLOW_HOST = "i-0000000000000000a", "i-0000000000000000b"
BOOTS_OF = {"first_boot": ("first",), "packed_host": ("packed",), "hosts": (NOMINAL, SLOW_HOST)}


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
        self._prepared = threading.Event()
        if not names:
            self._prepared.set()
            return
        plan = [(name, _boot(name, folder(name))) for name in names]
        threading.Thread(target=self._run, args=(plan,), name="guest boots", daemon=True).start()

    def _run(self, plan: list[tuple[str, Callable[[], Any]]]) -> None:
        try:
            _prepare()
        except BaseException as exc:  # every boot's tests fail (or skip) with it
            for future in self._futures.values():
                future.set_exception(exc)
            return
        finally:
            self._prepared.set()
        for name, boot in plan:
            future = self._futures[name]
            try:
                future.set_result(boot())
            except BaseException as exc:  # the tests that read this boot fail with it
                future.set_exception(exc)

    def prepared(self) -> None:
        """Wait until what the boots need from this process is made: then jsii is free for this thread's tests."""
        self._prepared.wait()

    def result(self, name: str) -> Any:
        """The boot's result (FirstBoot, PackedHost or QualifiedHost), once it is done; its error, raised."""
        if name not in self._futures:
            raise LookupError(f"the {name} boot was not started: no guest test of this session reads it")
        return self._futures[name].result()


def _prepare() -> None:
    """What the boots need from this process, made once (each is cached): the accelerator, the static write
    benchmark, the two templates the hosts' user data come from. The synth tier waits for it (`Boots.prepared`)."""
    from tests.support.synth import synthesize
    from tests.support.writebench import writebench
    from tuning.guest.machine import accelerator

    accelerator()
    writebench()
    synthesize()
    synthesize(hostQualification="fence")
