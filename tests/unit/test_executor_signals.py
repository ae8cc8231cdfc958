"""The local executor's stop signals: Ctrl-C and SIGTERM while children run are noted and raised by the batch's
own loop (pipeline.local.executor._StopSignals), not where they land: an exception raised inside a lock's `with`
can leave the lock held, and a demo stopped with SIGTERM at that moment once hung in the pool's shutdown."""

from __future__ import annotations

import os
import signal
import threading

from pipeline.local.executor import _StopSignals


def test_a_signal_while_children_run_is_noted_not_raised_and_the_handlers_come_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with _StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)  # would raise (or end the process) without it
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGINT
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_an_ignored_sigint_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and stop.signum == 0
    finally:
        signal.signal(signal.SIGINT, previous)


def test_outside_the_main_thread_nothing_is_installed() -> None:
    seen: list[object] = []

    def run() -> None:
        with _StopSignals():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [before]
