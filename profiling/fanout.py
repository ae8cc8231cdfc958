"""Many files read in worker processes, the results handed back in file order: the one owner of how many
workers a fleet-sized read uses (READ_WORKERS_ENV) and when they are worth starting (PARALLEL_MIN_FILES).

A report or the advisor over 100,000 children reads 300,000 profile lines of ~6 KB; each costs ~200 us of CPU
(decoding, checking, columns), so one core takes a minute. The files are cut into chunks of CHUNK_FILES, each
chunk read by one worker into a small result (the report's columns, the advisor's slim profiles) that is sent
back and merged in order: the outcome is the one a serial read gives, whatever the number of workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Generator, Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext
from multiprocessing.process import BaseProcess
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Set to a number of worker processes (1: read in this process); default: the cores this process may run on.
READ_WORKERS_ENV = "IOBATCH_READ_WORKERS"
# Files a worker reads at a time. A reader also merges its own figures chunk by chunk (profiling.report.fleet
# sums traffic per chunk), so a serial and a parallel read of the same files agree to the last bit.
CHUNK_FILES = 256
# Below this many files a read stays in one process: starting workers and sending results back costs more
# than it saves (1,000 children read in about a second), and small runs behave as they always have.
PARALLEL_MIN_FILES = 1024


class ReadWorkersError(ValueError):
    """READ_WORKERS_ENV is set to something other than a whole number of at least 1."""


def cores() -> int:
    """The CPUs this process may run on (its affinity mask, as taskset or a container's cpuset sets it), at
    most os.cpu_count()."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def read_workers(files: int, workers: int | None = None) -> int:
    """How many processes read `files` files: `workers` when given (tests), else READ_WORKERS_ENV (at most the
    cores), else one per core; never more than chunks. Unless `workers` is given: 1 below PARALLEL_MIN_FILES,
    and 1 when this process runs other threads (see _context)."""
    chunks = max(1, -(-files // CHUNK_FILES))
    if workers is not None:
        return max(1, min(workers, chunks))
    text = os.environ.get(READ_WORKERS_ENV, "").strip()
    if text:
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            raise ReadWorkersError(f"{READ_WORKERS_ENV}={text[:20]!r} is not a number of worker processes: set "
                                   f"a whole number of 1 or more (1 reads in one process), or unset it")
        wanted = min(int(text), cores())
    else:
        wanted = cores()
    if files < PARALLEL_MIN_FILES or threading.active_count() > 1:
        return 1
    return max(1, min(wanted, chunks))


def chunked(items: Sequence[T], size: int | None = None) -> list[Sequence[T]]:
    """`items` cut into runs of `size` (default CHUNK_FILES), in order."""
    step = size or CHUNK_FILES
    return [items[i:i + step] for i in range(0, len(items), step)]


def _context() -> ForkContext | None:
    # 'fork', deliberately: the workers start at once with every module already imported (numpy, orjson, the
    # readers), where 'spawn' or 'forkserver' import them again in each and must import the caller's __main__
    # (a script read from stdin cannot be: a Pool of them restarted its failing workers for ever). Forking a
    # process that runs other threads can copy a lock one of them holds (Python warns of it from 3.12), so
    # read_workers's own choice is 1 then; the CLI reads before it starts any thread. None: no fork here.
    return multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# How long the workers have to exit once the reader is done with them, before they are killed.
_EXIT_WAIT_S = 5.0


def _worker_start(parent: int) -> None:
    # Ctrl-C reaches every process of the terminal's foreground group: the workers ignore it and the parent,
    # which gets KeyboardInterrupt, kills them (ordered_map's `finally`). Should the parent die without that
    # (SIGKILL), the kernel sends the worker SIGKILL too: prctl(2), PR_SET_PDEATHSIG, "the signal that the
    # calling process will get when its parent dies". SIGTERM is the default's, whatever the parent had.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the parent's kill still ends them on Ctrl-C
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the call above took effect
        os._exit(1)


def _serve(function: Callable[[T], R], tasks: Sequence[T], first: int, step: int, out: Connection,
           parent: int) -> None:
    """A worker: tasks first, first + step, ... in order, each result (or the exception that ended it) sent
    back on `out`, which only the parent reads."""
    _worker_start(parent)
    for task in tasks[first::step]:
        try:
            result: tuple[bool, object] = (True, function(task))
        except Exception as exc:  # sent back, raised by the parent when it reaches this task
            result = (False, exc)
        try:
            out.send(result)
        except BrokenPipeError:  # the reader is gone (it stopped early, or died): nothing left to tell
            os._exit(0)
        if not result[0]:
            break
    out.close()


def ordered_map(function: Callable[[T], R], tasks: Sequence[T], workers: int) -> Generator[R, None, None]:
    """function(task) for every task, in task order: in this process when `workers` is 1, else in `workers`
    forked processes (at most len(tasks)), worker k taking tasks k, k + workers, ... and sending each result
    back on its own pipe, which the parent reads in task order. The first task (in order) that raises stops
    the read with that exception, as a serial loop would; the workers are killed when the caller stops
    iterating, on an error, or on Ctrl-C.

    Not multiprocessing.Pool: its teardown joins its workers without a limit, and a unit tier under a shifted
    wall clock hung there; here nothing is shared between the workers (no queue lock, no handler thread), and
    nothing waits without a limit but the parent on a worker's next result, whose death ends that wait."""
    context = _context()
    if workers <= 1 or len(tasks) <= 1 or context is None:
        yield from map(function, tasks)
        return
    count = min(workers, len(tasks))
    finished = False
    readers: list[Connection] = []
    processes: list[BaseProcess] = []
    try:
        for k in range(count):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=_serve, args=(function, tasks, k, count, writer, os.getpid()),
                                      daemon=True)
            process.start()
            writer.close()  # the worker's end: the parent keeps only its reader, so a dead worker reads as EOF
            readers.append(reader)
            processes.append(process)
        for index in range(len(tasks)):
            try:
                ok, value = readers[index % count].recv()
            except EOFError:
                worker = processes[index % count]
                worker.join(_EXIT_WAIT_S)
                raise RuntimeError(f"a read worker ended before its task {index + 1} of {len(tasks)} (exit code "
                                   f"{worker.exitcode}): run again with {READ_WORKERS_ENV}=1 to read in one "
                                   "process") from None
            if not ok:
                assert isinstance(value, BaseException)
                raise value.with_traceback(None) from None
            yield value
        finished = True
    finally:
        for started in processes:
            if finished:  # every result read: the worker is exiting
                started.join(_EXIT_WAIT_S)
            if started.is_alive():  # stopped early, an error, Ctrl-C, or a worker that did not exit
                started.kill()
                started.join(_EXIT_WAIT_S)
        for reader in readers:
            reader.close()
