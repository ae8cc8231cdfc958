"""Figures that are true for the child they name, or absent with a notice: on this machine's kernel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.local.s3server import EmbeddedS3
from pipeline.scratch import sweep
from profiling.command import profile_command
from profiling.probes import start_command_probe
from profiling.probes.ebpf import available as ebpf_unavailable
from profiling.probes.procfs import ProcIo, device_of
from profiling.probes.sharing import DeviceRegister
from profiling.sampler import Sources, StageSampler
from profiling.table import profile_row, render_stage_table

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


@pytest.mark.skipif(ebpf_unavailable() is not None, reason=f"the eBPF probe cannot run here: {ebpf_unavailable()}")
def test_the_upload_stage_shows_the_bytes_it_sent_over_the_network(
        s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> None:
    # The upload stage's own code (boto3 through pipeline.s3): its sends are not in wchar.
    shard = tmp_path / "shard.tar"
    shard.write_bytes(os.urandom(24 * MIB))
    script = tmp_path / "upload.py"
    script.write_text(textwrap.dedent(f"""
        from pipeline.local.s3server import EmbeddedS3
        from pipeline.s3 import upload_verified
        from pipeline.settings import S3Uri
        import boto3
        from botocore.config import Config
        s3 = boto3.session.Session().client("s3", endpoint_url={s3_server.endpoint!r},
            aws_access_key_id={s3_server.access_key!r}, aws_secret_access_key={s3_server.secret_key!r},
            region_name="us-east-1", config=Config(s3={{"addressing_style": "path"}}))
        upload_verified(s3, {str(shard)!r}, S3Uri.parse("s3://{bucket}/train/shard.tar", what="output"))
    """))
    notes: list[str] = []
    probe = start_command_probe(notes.append, [sys.executable])
    result = profile_command([sys.executable, str(script)], call_probe=probe)
    profile = result.profile
    assert result.returncode == 0
    assert profile.write_bytes is not None and profile.write_bytes < MIB  # wchar misses every send
    assert profile.net_sent_bytes == pytest.approx(24 * MIB, rel=0.02), profile.sources
    assert profile.sources["network"] == "ebpf" and profile.host_net_sent_bytes is None


def test_an_unreadable_proc_io_gives_absent_figures_and_a_notice() -> None:
    # /proc/<pid>/io needs ptrace read access (proc(5)): a reader without CAP_SYS_PTRACE may not read a
    # process holding capabilities it lacks, as a profiler may not read a non-dumpable or foreign process.
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv: the reader drops CAP_SYS_PTRACE to be refused")
    target = subprocess.Popen(["sleep", "30"])
    try:
        code = textwrap.dedent(f"""
            import json
            from profiling.sampler import StageSampler
            sampler = StageSampler(stage="s", pid={target.pid}, device=None, interval_s=1.0)
            sampler.start()
            p = sampler.finish(outcome="ok")
            print(json.dumps([p.read_bytes, p.write_calls, p.throughput_bps, p.notices, p.sources]))
        """)
        out = subprocess.run(["setpriv", "--bounding-set=-sys_ptrace", sys.executable, "-c", code], cwd=REPO,
                             capture_output=True, text=True, timeout=60, check=False)
    finally:
        target.kill()
        target.wait()
    assert out.returncode == 0, out.stderr
    read_bytes, write_calls, throughput, notices, sources = json.loads(out.stdout)
    assert read_bytes is None and write_calls is None and throughput is None  # never 0
    assert "io" not in sources
    (notice,) = notices
    assert f"/proc/{target.pid}/io is unreadable (Permission denied)" in notice


def test_children_on_one_volume_count_each_other_and_a_dead_ones_entry_goes(tmp_path: Path) -> None:
    first, second = DeviceRegister(tmp_path), DeviceRegister(tmp_path)
    first.join()
    assert first.count() == 1
    second.join()
    assert first.count() == 2 and second.count() == 2
    # A profiler killed with SIGKILL leaves its file; its lock went with it.
    child = subprocess.run([sys.executable, "-c", "import os, sys; from profiling.probes.sharing import "
                            f"DeviceRegister; r = DeviceRegister({str(tmp_path)!r}); r.join(); os._exit(9)"],
                           cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=30, check=False)
    assert child.returncode == 9
    assert len(list((tmp_path / ".iobatch-profilers").glob("*.lock"))) == 3
    assert first.count() == 2
    assert len(list((tmp_path / ".iobatch-profilers").glob("*.lock"))) == 2
    second.leave()
    first.leave()
    assert not (tmp_path / ".iobatch-profilers").exists()  # nothing is left on scratch




def test_a_profile_says_its_device_figures_are_shared_by_the_children_on_the_device(tmp_path: Path) -> None:
    device, notice = device_of(tmp_path)
    if device is None:
        pytest.skip(notice)
    registers = [DeviceRegister(tmp_path), DeviceRegister(tmp_path)]  # two children's profilers
    for register in registers:
        register.join()
    try:
        writer = subprocess.Popen([sys.executable, "-c", f"open({str(tmp_path / 'out')!r}, 'wb').write(b'x' * 65536)"])
        sampler = StageSampler(stage="process", pid=writer.pid, device=device, interval_s=1.0,
                               base_io=ProcIo(), sources=Sources(register=registers[0]))
        sampler.start()
        writer.wait()
        profile = sampler.finish(outcome="ok")
    finally:
        for register in registers:
            register.leave()
    assert profile.device == device.name and profile.device_sharers == 2
    headers = [str(column.header) for column in render_stage_table({"process": profile_row(profile)}, "c").columns]
    assert "dev queue [device]" in headers and "peak dirty MiB [host]" in headers and "read MiB, net incl." in headers
def _killed_profiler(scratch_root: Path) -> None:
    """A profiler that joined the register of `scratch_root` and died by SIGKILL-like exit (no leave)."""
    child = subprocess.run([sys.executable, "-c", "import os; from profiling.probes.sharing import DeviceRegister; "
                            f"DeviceRegister({str(scratch_root)!r}).join(); os._exit(9)"],
                           cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=30, check=False)
    assert child.returncode == 9


def test_the_jobs_scratch_sweep_removes_a_killed_profilers_entry_and_keeps_a_live_one(tmp_path: Path) -> None:
    register = tmp_path / ".iobatch-profilers"
    live = DeviceRegister(tmp_path)
    live.join()
    _killed_profiler(tmp_path)
    assert len(list(register.glob("*.lock"))) == 2
    sweep(tmp_path)  # what the next attempt's claim on the volume does
    assert len(list(register.glob("*.lock"))) == 1 and live.count() == 1
    live.leave()
    # Killed, and no profiler starts on the volume again: the job's sweep still leaves nothing on scratch.
    _killed_profiler(tmp_path)
    assert register.exists()
    sweep(tmp_path)
    assert list(tmp_path.iterdir()) == []
