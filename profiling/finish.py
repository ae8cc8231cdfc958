"""Finishing a stage: the sampled StageProfile, plus its per-call figures and its contract results.

`finish_stage` is the one place that does it, for the sidecar (every stage of a job) and for
`iobatch profile` (one command as one stage):

- per-call figures: the probes' `stop()` results, best first, merged by callstats.merge_results; the
  first non-empty one is StageProfile.calls and its probe is sources["calls"]; eBPF's time paused in
  balance_dirty_pages becomes dirty_throttle_ms (wall time with a writer paused) and
  dirty_throttle_thread_sum_ms (summed over threads), and its socket bytes the child's network bytes
  (in place of the host-wide interface counters). An interposer that saw less than INTERPOSER_COVERAGE of
  the bytes the kernel counted for the tree (a static binary ran in the stage) is left out, with a notice.
- contract results: a contract is loaded once per job (`load_rules`) into an `Evaluator`, which gives
  the rows stored in StageProfile.contract at every stage end (profiling/contract.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from profiling.contract import evaluate_stage, load_contract
from profiling.metrics import StageProfile, by_call
from profiling.probes import Warn, merge_results

Evaluator = Callable[[StageProfile], list[dict[str, Any]]]
RulesLoader = Callable[[Path], Evaluator]


def contract_rules(path: Path) -> Evaluator:
    """The contract in `path` as an Evaluator (ContractError on a mistake, OSError when unreadable)."""
    return functools.partial(evaluate_stage, load_contract(path))


def load_rules(path: Path | None, loader: RulesLoader = contract_rules) -> Evaluator | None:
    """The Evaluator of the contract in `path`, or None when no contract was given.

    Raises ValueError naming the file when the contract does not load."""
    if path is None:
        return None
    try:
        return loader(path)
    except OSError as exc:  # missing, unreadable, or not a regular file (profiling.files.open_regular)
        raise ValueError(f"contract {path}: {exc.strerror or exc}: give a contract file") from None
    except ValueError as exc:
        raise ValueError(f"contract {path}: {exc}") from None


#: The share of the tree's bytes (wchar, rchar) an interposer must have seen to speak for the whole stage,
#: unless what it missed is below INTERPOSER_SLACK: the dynamic loader reads each library's ELF header before
#: the interposer is in place (a few KiB), and glibc's internal writes bypass it.
INTERPOSER_COVERAGE = 0.9
INTERPOSER_SLACK = 64 * 1024
PARTIAL = ("the LD_PRELOAD interposer saw {seen} of the stage's {total} {what} (/proc/<pid>/io): the rest came "
           "from calls it cannot see (static binaries such as s5cmd, stdio's internal writes, "
           "sendfile/copy_file_range), so its per-call figures are left out of this stage (latency needs the "
           "eBPF probe); counts and bytes are procfs's")


def _partial(profile: StageProfile, name: str, calls: Mapping[str, Any]) -> str | None:
    """Why an interposer's figures cannot stand for the stage, or None: they must cover at least
    INTERPOSER_COVERAGE of the bytes the kernel counted for the whole process tree (or miss less than
    INTERPOSER_SLACK). Its own record lines (calls["record_bytes"]) are writes the kernel counts and it sees."""
    if name != "interpose":
        return None  # eBPF selects the job's whole cgroup, static binaries included
    figures = by_call(calls)
    for call, total in (("write", profile.write_bytes), ("read", profile.read_bytes)):
        seen = int((figures.get(call) or {}).get("bytes") or 0)
        if call == "write":
            seen += int(calls.get("record_bytes") or 0)
        if total and seen < INTERPOSER_COVERAGE * total and total - seen > INTERPOSER_SLACK:
            return PARTIAL.format(seen=f"{seen:,} B", total=f"{total:,} B", what=f"{call} bytes")
    return None


def _with_calls(profile: StageProfile, name: str, calls: Mapping[str, Any]) -> StageProfile:
    """`profile` with a call probe's result: calls, the probe as source, dirty throttling, the scratch device's
    random share and socket bytes (eBPF)."""
    wall, summed = calls.get("dirty_throttle_wall_ms"), calls.get("dirty_throttle_ms")
    changes: dict[str, Any] = {
        "calls": dict(calls),
        "sources": {**profile.sources, "calls": name},
        "dirty_throttle_ms": profile.dirty_throttle_ms if wall is None else float(wall),
        "dirty_throttle_thread_sum_ms": profile.dirty_throttle_thread_sum_ms if summed is None else float(summed),
    }
    requests = calls.get("device_requests")
    if isinstance(requests, Mapping):
        moved = int(requests.get("seq_bytes") or 0) + int(requests.get("random_bytes") or 0)
        if moved > 0:  # no request in the window: the share is not known, and stays absent
            changes["device_random_pct"] = 100.0 * int(requests.get("random_bytes") or 0) / moved
    sockets = calls.get("socket")
    if isinstance(sockets, Mapping) and "sent_bytes" in sockets and "received_bytes" in sockets:
        # The job's own sockets (its cgroup): the host's interface counters are no longer needed.
        changes.update(net_sent_bytes=int(sockets["sent_bytes"]), net_received_bytes=int(sockets["received_bytes"]),
                       host_net_sent_bytes=None, host_net_received_bytes=None)
        changes["sources"]["network"] = name
    return dataclasses.replace(profile, **changes)


def finish_stage(
    profile: StageProfile,
    results: Iterable[tuple[str, Mapping[str, Any] | None]] = (),
    rules: Evaluator | None = None,
    *,
    warn: Warn | None = None,
) -> StageProfile:
    """`profile` (the stage's kernel counters) with its per-call figures and contract results.

    `results` are (probe name, `stop()` result) of the stage's call probes, best first. A contract that
    fails to evaluate is one warning through `warn` and the profile is kept without it (the sidecar
    never fails the job); with no `warn` the error propagates.
    """
    calls, name = merge_results(results)
    if calls is not None and name is not None:
        if (partial := _partial(profile, name, calls)) is not None:
            profile = dataclasses.replace(profile, notices=[*profile.notices, partial])
        else:
            # The interposer kept beside eBPF (for size classes per path) is held to the same coverage.
            beside = calls.get("interpose")
            if isinstance(beside, Mapping) and (partial := _partial(profile, "interpose", beside)) is not None:
                calls = {key: value for key, value in calls.items() if key != "interpose"}
                profile = dataclasses.replace(profile, notices=[*profile.notices, partial])
            profile = _with_calls(profile, name, calls)
    if rules is not None:
        try:
            profile = dataclasses.replace(profile, contract=list(rules(profile)))
        except Exception as exc:
            if warn is None:
                raise
            warn(f"contract evaluation failed ({exc})")
    return profile
