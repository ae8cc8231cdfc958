"""The guest tier's boots, run in the background beside the tiers that time nothing (tests/conftest.py).

Under TCG the tier's four boots are most of its time, while a unit test runs on one core and leaves the other idle.
A boot needs nothing of this process's state (a QEMU with its own share), so the boots run in threads of their own,
each starting once the boots it comes after have reached their point (START_AFTER: no two timed parts at once),
and each guest test waits only for the boot it reads; a boot's error is the error of the tests that read
it, as if they had booted it themselves. Not beside the tiers that run and time whole batches: the two cores they
share with an emulated guest slow both (a demo's first child flagged as a bad apple, the emulated disk short of its
throttle, both seen).

What the first boot needs from this process (the static write benchmark, the accelerator) is made first; the two
syntheses the hosts' user data come from run meanwhile in a thread of their own, beside the first boot too (at a
lower priority than its QEMU), and the later boots wait for them. jsii is not for two threads at once, so the synth
tier waits for them too (`Boots.prepared`).
A boot whose guest kernel hangs (tuning.guest.machine.GuestHung: under TCG on busy cores, now and then) is booted
once more from nothing, and the session's summary says so (`Boots.retried`); a second hang is the tests' error.
No QEMU outlives the suite: each is killed by PR_SET_PDEATHSIG when this process ends (tuning/guest/machine.py),
whatever the tests did.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from tuning.guest.machine import GuestHung

# The fixture a guest test reads -> the boots it needs.
NOMINAL, SLOW_HOST = "i-0000000000000000a", "i-0000000000000000b"
BOOTS_OF = {"first_boot": ("first",), "packed_host": ("packed",), "hosts": (NOMINAL, SLOW_HOST)}
SYNTH_NICE = 10  # the syntheses beside the first boot yield the CPU to its QEMU


# When each boot starts, besides the syntheses (all but the first): once each boot named has reached its point,
# "ready" (its timed part is done: the first boot's scratch check, the nominal host's user data with its
# qualification) or "done". What overlaps is never two timed parts: the packed host boots and prepares its scratch
# beside the first boot's eBPF checks (exact counts, untimed); the slow host (throttled to 1/30: light work for the
# emulated cores) beside the nominal host's child in containers (untimed). A boot the session does not run is not
# waited for.
START_AFTER: dict[str, tuple[tuple[str, str], ...]] = {
    "first": (),
    "packed": (("first", "ready"),),
    NOMINAL: (("first", "done"), ("packed", "done")),
    SLOW_HOST: ((NOMINAL, "ready"),),
}


def _boot(name: str, folder: Callable[[], Path], on_output: Callable[[str, str], None] | None) -> Callable[[], Any]:
    """The boot `name`, in a new folder each time it is called."""
    # Imported here: a session that boots nothing never loads the hosts' modules (a CDK synthesis among them).
    from tests.support.firstboot import boot_first
    from tests.support.packedhost import boot_packed_host
    from tests.support.qualifyhost import boot_qualified_host, nominal_throttle, slow_throttle

    if name == "first":
        return lambda: boot_first(folder(), on_output=on_output)
    if name == "packed":
        return lambda: boot_packed_host(folder())
    if name == NOMINAL:
        return lambda: boot_qualified_host(folder(), nominal_throttle(), NOMINAL, on_output=on_output)
    return lambda: boot_qualified_host(folder(), slow_throttle(), SLOW_HOST, fence=True, on_output=on_output)


def _ready_when(name: str) -> Callable[[str, str], bool] | None:
    """What in a boot's output says it is "ready" (START_AFTER); None: ready when done."""
    from tests.support.firstboot import scratch_checked
    from tests.support.guest import first_wave_started

    return {"first": scratch_checked, NOMINAL: first_wave_started}.get(name)


class Boots:
    """The boots `fixtures` need, booting in threads of their own; `result(name)` waits for one."""

    def __init__(self, fixtures: Iterable[str], folder: Callable[[str], Path]) -> None:
        names = [name for fixture in BOOTS_OF if fixture in set(fixtures) for name in BOOTS_OF[fixture]]
        self._futures: dict[str, Future[Any]] = {name: Future() for name in names}
        self._synthesized: Future[None] = Future()
        self._points: dict[tuple[str, str], threading.Event] = {}
        self.retried: list[str] = []  # one line per boot that hung and was booted again
        self.began = time.monotonic()
        self.spans: dict[str, tuple[float, float]] = {}  # each boot's (start, end), seconds after `began`
        if not names:
            self._synthesized.set_result(None)
            return
        self._points = {(name, point): threading.Event() for name in names for point in ("ready", "done")}
        plan = [(name, _boot(name, functools.partial(folder, name), self._watch(name))) for name in names]
        threading.Thread(target=self._run, args=(plan,), name="guest boots", daemon=True).start()

    @property
    def booting(self) -> bool:
        """Whether any boot was started (the session reads one)."""
        return bool(self._futures)

    def _watch(self, name: str) -> Callable[[str, str], None] | None:
        said, ready = _ready_when(name), self._points[name, "ready"]
        return None if said is None else (lambda stream, text: ready.set() if said(stream, text) else None)

    def _run(self, plan: list[tuple[str, Callable[[], Any]]]) -> None:
        threading.Thread(target=self._synthesize, name="guest boots' syntheses", daemon=True).start()
        try:
            _prepare_first()
        except BaseException as exc:  # every boot's tests fail (or skip) with it
            for future in self._futures.values():
                future.set_exception(exc)
            return
        for name, boot in plan:
            threading.Thread(target=self._boot, args=(name, boot), name=f"guest boot {name}", daemon=True).start()

    def _boot(self, name: str, boot: Callable[[], Any]) -> None:
        """Wait for the points this boot starts after, then boot it (in this thread: QEMU's PR_SET_PDEATHSIG is
        the thread's that started it, and this one waits for it)."""
        future = self._futures[name]
        try:
            for other, point in START_AFTER[name]:
                if (other, point) in self._points:
                    self._points[other, point].wait()
            if name != "first":
                self._synthesized.result()  # its error, if any, is this boot's
            started = time.monotonic() - self.began
            try:
                result = boot()
            except GuestHung as hung:  # the emulator's fault, not the host's under test: once more, from nothing
                self.retried.append(f"guest boot {name}: {str(hung).splitlines()[0]}; booted once more")
                result = boot()
            finally:
                self.spans[name] = (started, time.monotonic() - self.began)
            future.set_result(result)
        except BaseException as exc:  # the tests that read this boot fail with it
            future.set_exception(exc)
        finally:  # whatever happened, the boots waiting for this one go on
            self._points[name, "ready"].set()
            self._points[name, "done"].set()

    def _synthesize(self) -> None:
        os.nice(SYNTH_NICE)  # this thread's, and its jsii's node (setpriority(2) is per thread on Linux)
        try:
            _synthesize()
        except BaseException as exc:
            self._synthesized.set_exception(exc)
        else:
            self._synthesized.set_result(None)

    def summary(self) -> list[str]:
        """Lines for the session's summary: when each boot ran, and each one booted again."""
        spans = ", ".join(f"{name} {start:.0f}-{end:.0f}" for name, (start, end) in self.spans.items())
        return ([f"guest boots (s after the first test beside them): {spans}"] if spans else []) + self.retried

    def first_checked(self) -> None:
        """Wait until the first boot's timed part (its raw scratch disk's throughput) is done, or the boot ended: the
        tests beside the boots start then. Beside them it read 10 MiB/s of a 19.5 MiB/s throttle once (a new
        machine's suite, its emulated dd short of CPU while the untimed modules started podman, FUSE and servers)."""
        event = self._points.get(("first", "ready"))
        if event is not None:
            event.wait()

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
