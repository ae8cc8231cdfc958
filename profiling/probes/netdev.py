"""Bytes over the network, from the interface counters of the job's network namespace.

/proc/<pid>/net/dev lists the interfaces of the network namespace `pid` is in, with bytes received and
sent since each was created (proc(5)). Python's socket sends do not count in /proc/<pid>/io's wchar (send
and recv are not read and write), so these are what shows an upload's bytes when no eBPF probe counts the
job's sockets.

Whose bytes they are depends on the namespace. A job in a network namespace of its own (a Batch task's
container in bridge mode) is alone there: its interfaces, loopback left out, carry only its traffic, so
the figures are the child's. A job in the profiler's own namespace (this machine, a pod) shares it with
the host or the pod: the figures are labelled host-wide and loopback is kept, since a local S3 server is
reached over it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


def parse_net_dev(text: str, *, loopback: bool) -> tuple[int, int]:
    """(bytes received, bytes sent) summed over the interfaces of a /proc/<pid>/net/dev.

    Each interface line is "NAME: rx_bytes rx_packets ... (8 receive fields) tx_bytes ..."."""
    received = sent = 0
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 9 or (name.strip() == "lo" and not loopback):
            continue
        received += int(fields[0])
        sent += int(fields[8])
    return received, sent


@dataclass(frozen=True)
class NetCounters:
    """Bytes received and sent so far, and whether they are the child's own (its own namespace)."""

    received: int
    sent: int
    own: bool


def _netns(pid: int | str, proc: Path) -> int | None:
    try:
        return os.stat(proc / str(pid) / "ns" / "net").st_ino
    except OSError:
        return None


def read_net(pid: int, proc: Path = PROC) -> NetCounters | None:
    """The counters of `pid`'s network namespace, or None when they cannot be read."""
    job_ns = _netns(pid, proc)
    if job_ns is None:
        return None
    own = job_ns != _netns("self", proc)
    try:
        received, sent = parse_net_dev((proc / str(pid) / "net" / "dev").read_text(), loopback=not own)
    except (OSError, ValueError, IndexError):
        return None
    return NetCounters(received, sent, own)
