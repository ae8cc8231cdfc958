"""The sidecar's seams, in process: injected per-call probes and contract rules, with the real job client."""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from profiling import protocol
from profiling.emf import RecordingSink
from profiling.metrics import StageProfile, by_call
from profiling.protocol import StageReporter
from profiling.sidecar import Sidecar, SidecarConfig


class FakeProbe:
    name = "fake"

    def __init__(self, fail_start: bool = False) -> None:
        self.fail_start = fail_start
        self.events: list[str] = []

    def start(self, pid: int) -> None:
        if self.fail_start:
            raise RuntimeError("no tracer here")
        self.events.append(f"start {pid}")

    def stop(self) -> dict[str, Any] | None:
        self.events.append("stop")
        return {"probe": "fake", "calls": {"write": {"count": 3}}, "dirty_throttle_ms": 1.5}


def _run(tmp_path: Path, sidecar: Sidecar, job: Any) -> list[str]:
    warnings: list[str] = []
    sidecar.bind()
    server = threading.Thread(target=sidecar.serve, kwargs={"poll_s": 0.05})
    server.start()
    reporter = StageReporter(sidecar.config.socket_path, warn=warnings.append)
    job(reporter)
    reporter.close()
    server.join(timeout=10)
    assert not server.is_alive()
    return warnings


def test_probe_results_are_stored_and_a_failing_probe_is_one_warning(tmp_path: Path) -> None:
    good, bad = FakeProbe(), FakeProbe(fail_start=True)
    sink = RecordingSink()
    warned: list[str] = []
    config = SidecarConfig(socket_path=tmp_path / "s.sock", emf_sink=sink, interval_s=0.1)
    sidecar = Sidecar(config, warn=warned.append, probes=[bad, good])

    def job(reporter: StageReporter) -> None:
        with reporter.stage("download"):
            (tmp_path / "x").write_bytes(b"x" * 4096)

    assert _run(tmp_path, sidecar, job) == []
    (profile,) = sidecar.profiles
    assert good.events == [f"start {os.getpid()}", "stop"] and bad.events == []
    assert profile.calls == {"probe": "fake", "calls": {"write": {"count": 3}}, "dirty_throttle_ms": 1.5}
    assert profile.sources["calls"] == "fake" and profile.dirty_throttle_thread_sum_ms == 1.5
    # Besides the probe's: at most the host's one notice about its cgroup's controllers (cgroupfs.own_cgroup).
    assert [w for w in warned if "controller files" not in w] == ["probe fake did not start (no tracer here)"]
    assert len(sink.lines) == 1
    # and the reason stays with the profile, for the report to name (profiling.report.summary.ebpf_missing)
    assert "probe fake did not start (no tracer here)" in profile.notices


def test_contract_rules_results_land_in_the_profile(tmp_path: Path) -> None:
    seen: list[tuple[Any, str]] = []

    def evaluate_stage(contract: Any, profile: StageProfile) -> list[dict[str, Any]]:
        seen.append((contract, profile.stage))
        return [{"label": "num_write", "value": float(profile.write_calls)}]

    def load(path: Path) -> Any:
        return functools.partial(evaluate_stage, {"from": str(path)})

    config = SidecarConfig(socket_path=tmp_path / "s.sock", emf_sink=RecordingSink(), interval_s=0.1,
                           contract_path=tmp_path / "rules.contract")
    # Its warnings kept, not printed: the job runs in this process, and a warning printed inside the stage (the
    # host's cgroup notice, from the sampler's thread) is a write of the stage's process (seen: 8 writes for 7).
    warned: list[str] = []
    sidecar = Sidecar(config, warn=warned.append, probes=[], rules_loader=load)

    def job(reporter: StageReporter) -> None:
        with reporter.stage("process"), (tmp_path / "y").open("wb", buffering=0) as out:
            for _ in range(7):
                out.write(b"y" * 100)

    _run(tmp_path, sidecar, job)
    (profile,) = sidecar.profiles
    assert profile.write_calls == 7
    assert profile.contract == [{"label": "num_write", "value": 7.0}]
    assert seen == [({"from": str(tmp_path / "rules.contract")}, "process")]


def test_a_contract_that_does_not_load_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    def broken(path: Path) -> Any:
        raise ValueError("line 3: no such field 'lat'")

    warned: list[str] = []
    config = SidecarConfig(socket_path=tmp_path / "s.sock", emf_sink=RecordingSink(),
                           contract_path=tmp_path / "bad.contract")
    Sidecar(config, warn=warned.append, probes=[], rules_loader=broken)
    assert len(warned) == 1 and "line 3" in warned[0] and "bad.contract" in warned[0]


class ClosingProbe(FakeProbe):
    def __init__(self, name: str = "fake", result: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.name = name
        self.result = result

    def stop(self) -> dict[str, Any] | None:
        self.events.append("stop")
        return self.result

    def close(self) -> None:
        self.events.append("close")


def test_a_second_probe_result_is_nested_and_probes_are_closed_at_job_end(tmp_path: Path) -> None:
    first = ClosingProbe("ebpf", {"probe": "ebpf", "calls": {"write": {"count": 2}}, "path_attribution": False})
    second = ClosingProbe("interpose", {"probe": "interpose", "by_path": {"/in": {"write": {"count": 2}}}})
    config = SidecarConfig(socket_path=tmp_path / "s.sock", emf_sink=RecordingSink(), interval_s=0.1)
    sidecar = Sidecar(config, probes=[first, second])

    def job(reporter: StageReporter) -> None:
        for stage in ("download", "process"):
            with reporter.stage(stage):
                pass

    _run(tmp_path, sidecar, job)
    assert [p.sources["calls"] for p in sidecar.profiles] == ["ebpf", "ebpf"]
    calls = sidecar.profiles[0].calls
    assert calls is not None and by_call(calls) == {"write": {"count": 2}}
    assert calls["interpose"]["by_path"] == {"/in": {"write": {"count": 2}}}
    pid = os.getpid()
    assert first.events == [f"start {pid}", "stop", f"start {pid}", "stop", "close"]


@pytest.mark.parametrize("how", ["eof", "stop"])
def test_probes_are_closed_when_the_job_vanishes_or_the_sidecar_is_stopped(tmp_path: Path, how: str) -> None:
    probe = ClosingProbe()
    config = SidecarConfig(socket_path=tmp_path / "s.sock", emf_sink=RecordingSink(), interval_s=0.1)
    sidecar = Sidecar(config, probes=[probe])
    sidecar.bind()
    server = threading.Thread(target=sidecar.serve, kwargs={"poll_s": 0.05})
    server.start()
    job = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    job.connect(str(config.socket_path))
    job.sendall(protocol.encode({"type": "stage_start", "stage": "download", "pid": os.getpid()}))
    assert b'"ack"' in job.recv(4096)
    # a stage that never ends: the job dies (EOF) or the sidecar gets SIGTERM (stop)
    if how == "eof":
        job.close()
    else:
        sidecar.stop()
    server.join(timeout=10)
    assert not server.is_alive()
    assert probe.events[-2:] == ["stop", "close"]
    assert [p.outcome for p in sidecar.profiles] == ["interrupted"]
    job.close()


class SlowBuildProbe(FakeProbe):
    """Reads at once at a stage's end; building its figures takes `build_s` (a stage with many files)."""

    name = "slow"

    def __init__(self, build_s: float) -> None:
        super().__init__()
        self.build_s = build_s
        self.stage = 0

    def stop_later(self) -> Any:
        self.stage += 1
        stage = self.stage
        self.events.append(f"read {stage}")

        def build() -> dict[str, Any]:
            time.sleep(self.build_s)
            self.events.append(f"built {stage}")
            return {"probe": "slow", "calls": {"write": {"count": stage}}}

        return build


def test_a_stage_start_does_not_wait_for_the_previous_stages_figures(tmp_path: Path) -> None:
    probe = SlowBuildProbe(build_s=0.4)
    config = SidecarConfig(socket_path=tmp_path / "s.sock", emf_sink=RecordingSink(), interval_s=0.1)
    sidecar = Sidecar(config, probes=[probe])
    waits: list[float] = []

    def job(reporter: StageReporter) -> None:
        for name in ("download", "process", "upload"):
            began = time.monotonic()
            with reporter.stage(name):  # the start's ack, then at the end the end's ack
                waits.append(time.monotonic() - began)
                time.sleep(1.0)  # the stage: the previous stage's figures are built once it is 0.5 s old
            waits.append(time.monotonic() - began - waits[-1] - 1.0)

    assert _run(tmp_path, sidecar, job) == []
    # Each boundary answered at once, not after a 0.4 s build; all built, in order, before serve returned.
    assert max(waits) < 0.3, waits
    assert [p.stage for p in sidecar.profiles] == ["download", "process", "upload"]
    assert [by_call(p.calls or {})["write"]["count"] for p in sidecar.profiles] == [1, 2, 3]
    assert [e for e in probe.events if e.startswith("built")] == ["built 1", "built 2", "built 3"]
