"""The guest's kernel, modules and initramfs: where `make setup` puts them and how the initramfs is built.

`make setup` unpacks Debian 12's generic kernel package (the Amazon Linux 2023 kernel line, 6.1, with 9p and
BTF; the `-cloud` flavour has no 9p) under `.tools/guest/kernel/` and runs `python -m tuning.guest.assets`,
which writes `.tools/guest/initramfs.cpio`: busybox (static), the modules a 9p root needs and their
dependencies, and `initramfs-init.sh` as /init. The archive is the kernel's "newc" cpio format
(Documentation/driver-api/early-userspace/buffer-format.rst), written here so nothing else is needed; it is
byte for byte the same for the same inputs.
"""

from __future__ import annotations

import lzma
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / ".tools" / "guest"
INIT_SCRIPT = Path(__file__).with_name("initramfs-init.sh")
STAGE2_SCRIPT = Path(__file__).with_name("stage2.sh")
BUSYBOX = Path("/bin/busybox")
# What a 9p root with an overlay, a virtio disk and a virtio NIC need before the root is mounted.
ROOT_MODULES = ("virtio_pci", "virtio_blk", "virtio_net", "virtio_rng", "9pnet_virtio", "9p", "overlay")


class GuestAssetsMissing(RuntimeError):
    """The kernel or the initramfs is not there; the message says what to run."""


@dataclass(frozen=True)
class GuestAssets:
    """The files a boot needs: the kernel image, its modules folder and the initramfs."""

    kernel: Path
    modules: Path
    initramfs: Path
    release: str

    @classmethod
    def find(cls, root: Path = TOOLS) -> GuestAssets:
        """The assets `make setup` left under `root`, or GuestAssetsMissing naming what is not there."""
        images = sorted((root / "kernel" / "boot").glob("vmlinuz-*"))
        if not images:
            raise GuestAssetsMissing(f"no guest kernel under {root}/kernel/boot: run `make setup` as root "
                                     "(it unpacks Debian's linux-image package there)")
        kernel = images[-1]
        release = kernel.name.removeprefix("vmlinuz-")
        modules = root / "kernel" / "lib" / "modules" / release
        initramfs = root / "initramfs.cpio"
        if not modules.is_dir():
            raise GuestAssetsMissing(f"the guest kernel's modules are missing ({modules}): run `make setup`")
        if not initramfs.is_file():
            raise GuestAssetsMissing(f"no guest initramfs ({initramfs}): run `make setup`")
        return cls(kernel=kernel, modules=modules, initramfs=initramfs, release=release)


def module_closure(modules_dir: Path, wanted: tuple[str, ...] = ROOT_MODULES) -> list[str]:
    """The relative paths of `wanted` and every module they depend on, dependencies first (modules.dep).

    A module built into the kernel is not in modules.builtin's way: it is simply skipped (nothing to load).
    """
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[_module_name(path)] = path
    ordered: list[str] = []

    def visit(path: str) -> None:
        if path in ordered:
            return
        for dep in deps.get(path, []):
            visit(dep)
        ordered.append(path)

    for name in wanted:
        if name.replace("-", "_") in by_name:
            visit(by_name[name.replace("-", "_")])
    return ordered


def _module_name(path: str) -> str:
    base = Path(path).name
    for suffix in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")


def _module_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith((".zst", ".gz")):
        raise GuestAssetsMissing(f"{path.name}: only plain and .xz modules are handled; unpack it first")
    return data


class Cpio:
    """A newc cpio archive in memory: directories, files, device nodes; mtime 0, so the same every time."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        fields = [self._ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
        self._ino += 1
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        self._parts.append(_pad(header + name.encode() + b"\0"))
        self._parts.append(_pad(data))

    def directory(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, *, executable: bool = False) -> None:
        self._entry(name, stat.S_IFREG | (0o755 if executable else 0o644), data)

    def char_device(self, name: str, major: int, minor: int) -> None:
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def bytes(self) -> bytes:
        trailer = Cpio()
        trailer._entry("TRAILER!!!", 0)
        return b"".join(self._parts + trailer._parts)


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def build_initramfs(kernel_root: Path, out: Path, *, busybox: Path = BUSYBOX) -> Path:
    """Write the initramfs for the kernel unpacked at `kernel_root` to `out` (atomically); returns `out`."""
    modules_dirs = sorted((kernel_root / "lib" / "modules").glob("*"))
    if not modules_dirs:
        raise GuestAssetsMissing(f"no modules under {kernel_root}/lib/modules: unpack the kernel package first")
    if not busybox.is_file():
        raise GuestAssetsMissing(f"{busybox} is missing: install Debian's busybox-static (make setup does, as root)")
    modules_dir = modules_dirs[-1]
    archive = Cpio()
    for name in ("bin", "dev", "proc", "sys", "modules", "lower", "upper", "newroot"):
        archive.directory(name)
    archive.char_device("dev/console", 5, 1)
    archive.file("bin/busybox", busybox.read_bytes(), executable=True)
    archive.file("init", INIT_SCRIPT.read_bytes(), executable=True)
    order = []
    for rel in module_closure(modules_dir):
        name = _module_name(rel) + ".ko"
        archive.file(f"modules/{name}", _module_bytes(modules_dir / rel))
        order.append(name)
    archive.file("modules/order", "".join(f"{n}\n" for n in order).encode())
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(archive.bytes())
    os.replace(tmp, out)
    return out


def main() -> int:
    """`python -m tuning.guest.assets [ROOT]`: build ROOT/initramfs.cpio from the kernel unpacked in ROOT/kernel."""
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else TOOLS
    try:
        out = build_initramfs(root / "kernel", root / "initramfs.cpio")
    except GuestAssetsMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"guest initramfs: {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
