"""The guest's pure parts: QEMU's command line, the volume's throttle, the initramfs archive, the lab's inner call;
and a run's hang watch, against a stand-in QEMU."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tuning.ebs import MIB, Volume
from tuning.guest.assets import Cpio, GuestAssets, module_closure
from tuning.guest.machine import HUNG_AFTER_S, QEMU, Guest, GuestHung
from tuning.guest.qemu import (
    HOST_ADDRESS,
    GuestConfigError,
    MachineSpec,
    ScratchDisk,
    kernel_command_line,
    loopback_to_guest,
    qemu_argv,
    scratch_throttle,
)
from tuning.lab.config import LabConfig
from tuning.lab.inguest import credits_for_qemu, inner_argv


def spec(tmp_path: Path, **changes: object) -> MachineSpec:
    values: dict[str, object] = dict(kernel=tmp_path / "vmlinuz", initramfs=tmp_path / "initramfs.cpio", vcpus=2,
                                     memory_mib=1024, share=tmp_path / "share", stage2=Path("/opt/stage2.sh"),
                                     modules=Path("/opt/modules"))
    values.update(changes)
    return MachineSpec(**values)  # type: ignore[arg-type]


def test_st1_at_baseline_is_its_baseline_in_bytes_and_in_1_mib_units() -> None:
    st1 = Volume("st1", 500)
    throttle = scratch_throttle(st1, credits_mib=0)
    assert throttle.baseline_bps == throttle.burst_bps == int(st1.baseline_mibps * MIB)
    options = throttle.drive_options()
    assert f"throttling.bps-total={int(st1.baseline_mibps * MIB)}" in options
    assert "throttling.iops-size=1048576" in options  # EBS charges a small HDD I/O as 1 MiB
    assert f"throttling.iops-total={int(st1.baseline_mibps)}" in options
    assert not any("max" in o for o in options)


def test_a_bucket_of_credits_lasts_credits_over_burst_seconds_at_full_rate() -> None:
    st1 = Volume("st1", 500)
    throttle = scratch_throttle(st1, credits_mib=6000)
    assert throttle.burst_bps == int(st1.burst_mibps * MIB)
    assert throttle.burst_seconds == round(6000 / st1.burst_mibps)
    assert f"throttling.bps-total-max-length={throttle.burst_seconds}" in throttle.drive_options()
    full = scratch_throttle(st1)
    assert full.burst_seconds == round(st1.credit_capacity / st1.burst_mibps)


def test_a_volume_without_credits_runs_at_its_ceiling_and_charges_bytes() -> None:
    gp3 = Volume("gp3", 100)
    throttle = scratch_throttle(gp3)
    assert throttle.baseline_bps == throttle.burst_bps and throttle.io_unit is None
    with pytest.raises(GuestConfigError, match="negative"):
        scratch_throttle(Volume("st1", 500), credits_mib=-1)


def test_the_command_line_shares_root_read_only_and_attaches_the_throttled_scratch(tmp_path: Path) -> None:
    disk = ScratchDisk(tmp_path / "scratch.img", scratch_throttle(Volume("st1", 500), credits_mib=0))
    argv = qemu_argv(spec(tmp_path, scratch=disk), console=tmp_path / "console")
    joined = " ".join(argv)
    assert "-no-reboot" in argv and "-nodefaults" in argv
    assert "local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on" in joined
    assert f"local,path={tmp_path / 'share'},mount_tag=share,security_model=passthrough" in joined
    assert "throttling.bps-total=" in joined and "serial=iobatch-scratch" in joined
    assert argv[argv.index("-accel") + 1].startswith("tcg")
    unprivileged = " ".join(qemu_argv(spec(tmp_path, passthrough=False), console=tmp_path / "c"))
    assert "security_model=none" in unprivileged and "passthrough" not in unprivileged


def test_init_settings_reach_init_as_environment_words(tmp_path: Path) -> None:
    line = kernel_command_line(spec(tmp_path))
    assert "IOBATCH_STAGE2=/opt/stage2.sh" in line.split() and "panic=-1" in line.split()
    # Words with a dot are module parameters, not init's environment (kernel-parameters.rst).
    assert all("." not in w.split("=", 1)[0] for w in line.split() if w.startswith("IOBATCH_"))


@pytest.mark.parametrize(("change", "message"), [({"vcpus": 0}, "vcpus"), ({"memory_mib": 64}, "memory_mib"),
                                                 ({"accel": "hvf"}, "accel"),
                                                 ({"share": Path("/tmp/a,b")}, "commas")])
def test_a_guest_that_cannot_be_built_is_refused_in_one_line(tmp_path: Path, change: dict[str, object],
                                                             message: str) -> None:
    with pytest.raises(GuestConfigError, match=message):
        qemu_argv(spec(tmp_path, **change), console=tmp_path / "console")


def test_loopback_urls_are_rewritten_to_the_host_address() -> None:
    assert loopback_to_guest("http://127.0.0.1:7070") == f"http://{HOST_ADDRESS}:7070"
    assert loopback_to_guest("http://localhost:7070/x") == f"http://{HOST_ADDRESS}:7070/x"
    assert loopback_to_guest("https://s3.amazonaws.com") == "https://s3.amazonaws.com"


def read_newc(data: bytes) -> dict[str, tuple[int, bytes]]:
    """name -> (mode, contents), read as the kernel reads a newc archive (buffer-format.rst): a 110-byte header
    of "070701" and 13 hex fields, the name NUL-terminated, each padded to 4 bytes."""
    entries, at = {}, 0
    while True:
        assert data[at:at + 6] == b"070701", at
        fields = [int(data[at + 6 + 8 * i: at + 14 + 8 * i], 16) for i in range(13)]
        mode, size, name_size = fields[1], fields[6], fields[11]
        name_at = at + 110
        name = data[name_at:name_at + name_size - 1].decode()
        body_at = name_at + name_size + (-(110 + name_size) % 4)
        if name == "TRAILER!!!":
            return entries
        entries[name] = (mode, data[body_at:body_at + size])
        at = body_at + size + (-size % 4)


def build_archive() -> bytes:
    archive = Cpio()
    archive.directory("bin")
    archive.file("bin/hello", b"#!/bin/sh\necho hi\n", executable=True)
    archive.file("data", b"x" * 5)
    archive.char_device("dev/console", 5, 1)
    return archive.bytes()


def test_the_cpio_archive_holds_the_files_their_modes_and_nothing_else() -> None:
    data = build_archive()
    assert len(data) % 4 == 0 and data == build_archive()  # the same bytes for the same inputs
    entries = read_newc(data)
    assert set(entries) == {"bin", "bin/hello", "data", "dev/console"}
    assert entries["bin/hello"] == (0o100755, b"#!/bin/sh\necho hi\n")
    assert entries["data"] == (0o100644, b"xxxxx")
    assert entries["bin"][0] == 0o40755 and entries["dev/console"][0] == 0o20600


def test_modules_come_after_their_dependencies(tmp_path: Path) -> None:
    (tmp_path / "modules.dep").write_text(
        "kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko\n"
        "kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko\n"
        "kernel/fs/netfs/netfs.ko:\nkernel/net/9p/9pnet.ko:\n"
        "kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko\n")
    order = module_closure(tmp_path, ("9pnet_virtio", "9p", "not_a_module"))
    assert order == ["kernel/net/9p/9pnet.ko", "kernel/net/9p/9pnet_virtio.ko", "kernel/fs/netfs/netfs.ko",
                     "kernel/fs/fscache/fscache.ko", "kernel/fs/9p/9p.ko"]


def test_the_lab_in_the_guest_runs_on_the_throttled_disk_with_the_bucket_scaled() -> None:
    argv = inner_argv(["--advise", "--throttle", "fuse", "--run-dir", "rel"], Path("/abs/run"))
    # Later options win (click): the guest's throttle, place and run directory.
    assert argv[-8:] == ["--where", "host", "--throttle", "hypervisor", "--lab-dir", "/var/tmp/iobatch-lab",
                         "--run-dir", "/abs/run"]
    config = LabConfig(initial_credits_mib=8000, time_scale=4)
    assert credits_for_qemu(config) == 2000
    assert credits_for_qemu(LabConfig(hold_empty=True)) == 0


def test_lab_json_in_the_guest_leaves_stdout_to_the_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`iobatch lab --json` run in the guest: this side's lines (the guest's boot, the images made here) go to
    stderr, so stdout is the JSON the lab inside prints (it was the boot line and then the JSON)."""
    from pipeline.cli import app
    from tests.support.cli import CliRunner

    def fake_run(*_args: object, say: Callable[[str], None], **_kwargs: object) -> int:
        say("lab: in the cgroup v2 guest")
        print('{"runs": []}')
        return 0

    monkeypatch.setattr("pipeline.cli.tuning._lab_where", lambda where: "guest")
    monkeypatch.setattr("pipeline.local.demo.lab_dataset", lambda plan, say: tmp_path)
    monkeypatch.setattr("tuning.lab.inguest.run_in_guest", fake_run)
    result = CliRunner().invoke(app, ["lab", "--json", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"runs": []}
    assert "lab: in the cgroup v2 guest" in result.stderr


def test_a_guest_whose_kernel_hangs_is_killed_when_it_says_so_not_at_the_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in QEMU prints what the kernel's watchdog prints of a stuck CPU (twice: under HUNG_AFTER_S, then
    over it) and would sleep for ten minutes: the run ends within seconds with GuestHung naming the CPU."""
    fake = tmp_path / "bin" / QEMU
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n"
                    'for a; do case "$a" in file:*) console="${a#file:}";; esac; done\n'
                    f'echo $$ > {tmp_path}/pid\n'
                    'echo "watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [bash:141]" >> "$console"\n'
                    "sleep 1\n"
                    f'echo "watchdog: BUG: soft lockup - CPU#0 stuck for {HUNG_AFTER_S + 4}s! [bash:1]" >> "$console"\n'
                    "exec sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    assets = GuestAssets(kernel=tmp_path / "vmlinuz", modules=tmp_path / "modules", initramfs=tmp_path / "initrd",
                         release="6.1.0")
    start = time.monotonic()
    guest = Guest(vcpus=1, memory_mib=512, share=tmp_path / "share", assets=assets, accel="tcg")
    with guest, pytest.raises(GuestHung, match=f"CPU#0 stuck for {HUNG_AFTER_S + 4} s"):
        guest.run("true", timeout=300)
    assert time.monotonic() - start < 15
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_the_accelerator_is_probed_once_a_boot_and_read_after(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """The probe's answer is kept for this boot (`make guest` probes, the suite and the lab read it): a record of
    another boot, or none, is probed again and rewritten."""
    import tuning.guest.machine as machine

    boot = tmp_path / "boot_id"
    boot.write_text("boot-b\n")
    monkeypatch.setattr(machine, "_BOOT_ID", boot)
    monkeypatch.delenv("IOBATCH_GUEST_ACCEL", raising=False)
    monkeypatch.setattr(machine.os, "access", lambda path, mode: True)  # a /dev/kvm that opens
    probes: list[str] = []

    class Probe:
        def __init__(self, **kwargs: object) -> None:
            probes.append(str(kwargs["accel"]))

        def __enter__(self) -> Probe:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def run(self, command: str, *, timeout: float) -> object:
            raise machine.GuestError("the console stayed silent")

    monkeypatch.setattr(machine, "Guest", Probe)
    record = tmp_path / machine.ACCELERATOR_RECORD
    record.write_text("boot-a kvm\n")
    machine.accelerator.cache_clear()
    try:
        assert machine.accelerator(record) == "tcg" and probes == ["kvm"]  # another boot's answer: probed again
        assert record.read_text() == "boot-b tcg\n"
        machine.accelerator.cache_clear()
        assert machine.accelerator(record) == "tcg" and probes == ["kvm"]  # this boot's: read, no probe
        record.write_text("boot-b kvm\n")
        machine.accelerator.cache_clear()
        assert machine.accelerator(record) == "kvm" and probes == ["kvm"]
        machine.accelerator.cache_clear()  # a record that cannot be written: probed, answered, nothing raised
        assert machine.accelerator(tmp_path / "absent" / machine.ACCELERATOR_RECORD) == "tcg"
        assert probes == ["kvm", "kvm"] and not (tmp_path / "absent").exists()
    finally:
        machine.accelerator.cache_clear()
