"""A compiled eBPF object loaded with libbpf (Debian's libbpf1, through ctypes): open, load, attach, read.

The few libbpf 1.x calls used are those of libbpf.h (the library's own header, the reference for each):
bpf_object__open_file, bpf_object__find_program_by_name, bpf_program__set_autoload, bpf_object__load,
bpf_program__attach, bpf_program__attach_iter, bpf_link__fd, bpf_link__destroy, bpf_object__close,
bpf_object__find_map_fd_by_name, bpf_object__find_map_by_name, bpf_map__max_entries, bpf_map__value_size,
bpf_map__inner_map, bpf_object__next_program, bpf_program__section_name, bpf_program__fd, bpf_link__pin,
bpf_link__disconnect, and from bpf.h
bpf_iter_create, bpf_map_get_next_key, bpf_map_lookup_elem, bpf_map_update_elem, bpf_map_delete_elem,
bpf_map_create, bpf_obj_pin, bpf_obj_get, bpf_link_create.
In libbpf 1.x every call that fails returns NULL or a negative error and sets errno.

Everything the object holds (programs, links, maps) is a file descriptor of this process: when the process
ends, however it ends (SIGKILL included), the kernel frees what no pin in bpffs holds. The host's shared
copy (profiling/probes/ebpf_host.py) pins its links and maps, so they outlive the profiler that loaded them
until the last profiler removes the pins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

_LIB: ctypes.CDLL | None = None


class BpfError(RuntimeError):
    """A libbpf call failed; the message names the call and the kernel's reason (`errno`, 0 when not the kernel's)."""

    def __init__(self, message: str, errno: int = 0) -> None:
        super().__init__(message)
        self.errno = errno


def _lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        try:  # libbpf 1.x's soname first: find_library runs ldconfig, a process of its own (~4 ms)
            lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
        except OSError:
            lib = ctypes.CDLL(ctypes.util.find_library("bpf") or "libbpf.so.1", use_errno=True)
        vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        for fn, res, args in (
            ("bpf_object__open_file", vp, [cp, vp]),
            ("bpf_object__find_program_by_name", vp, [vp, cp]),
            ("bpf_program__set_autoload", i, [vp, ctypes.c_bool]),
            ("bpf_object__load", i, [vp]),
            ("bpf_program__attach", vp, [vp]),
            ("bpf_program__attach_iter", vp, [vp, vp]),
            ("bpf_link__destroy", i, [vp]),
            ("bpf_object__close", None, [vp]),
            ("bpf_object__find_map_fd_by_name", i, [vp, cp]),
            ("bpf_object__find_map_by_name", vp, [vp, cp]),
            ("bpf_map__max_entries", ctypes.c_uint32, [vp]),
            ("bpf_map__value_size", ctypes.c_uint32, [vp]),
            ("bpf_iter_create", i, [i]),
            ("bpf_map_get_next_key", i, [i, vp, vp]),
            ("bpf_map_lookup_elem", i, [i, vp, vp]),
            ("libbpf_set_print", vp, [vp]),
            ("bpf_map__inner_map", vp, [vp]),
            ("bpf_object__next_map", vp, [vp, vp]),
            ("bpf_map__name", cp, [vp]),
            ("bpf_object__next_program", vp, [vp, vp]),
            ("bpf_program__section_name", cp, [vp]),
            ("bpf_program__name", cp, [vp]),
            ("bpf_program__fd", i, [vp]),
            ("bpf_link__pin", i, [vp, cp]),
            ("bpf_link__disconnect", None, [vp]),
            ("bpf_link__fd", i, [vp]),
            ("bpf_map_update_elem", i, [i, vp, vp, ctypes.c_uint64]),
            ("bpf_map_delete_elem", i, [i, vp]),
            ("bpf_map_create", i, [i, cp, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, vp]),
            ("bpf_obj_pin", i, [i, cp]),
            ("bpf_obj_get", i, [cp]),
            ("bpf_link_create", i, [i, i, i, vp]),
        ):
            func = getattr(lib, fn)
            func.restype, func.argtypes = res, args
        lib.libbpf_set_print(None)  # libbpf's own chatter on stderr; failures are raised with errno here
        _LIB = lib
    return _LIB


def library_missing() -> str | None:
    """None when libbpf can be loaded, else why not."""
    try:
        _lib()
    except OSError as exc:
        return f"libbpf is missing ({exc})"
    return None


def _fail(call: str) -> BpfError:
    err = ctypes.get_errno()
    return BpfError(f"{call}: {os.strerror(err) if err else 'failed'}", err)


BPF_MAP_TYPE_HASH = 1  # include/uapi/linux/bpf.h, enum bpf_map_type
BPF_MAP_TYPE_ARRAY = 2
BPF_F_NO_PREALLOC = 1 << 0
BPF_F_MMAPABLE = 1 << 10
BPF_TRACE_ITER = 28  # enum bpf_attach_type
BPF_NOEXIST = 1


class _CreateOpts(ctypes.Structure):
    """struct bpf_map_create_opts (bpf.h, libbpf 1.x)."""

    _fields_ = [("sz", ctypes.c_size_t), ("btf_fd", ctypes.c_uint32), ("btf_key_type_id", ctypes.c_uint32),
                ("btf_value_type_id", ctypes.c_uint32), ("btf_vmlinux_value_type_id", ctypes.c_uint32),
                ("inner_map_fd", ctypes.c_uint32), ("map_flags", ctypes.c_uint32), ("map_extra", ctypes.c_uint64),
                ("numa_node", ctypes.c_uint32), ("map_ifindex", ctypes.c_uint32)]


def map_create(kind: int, name: str, key_size: int, value_size: int, max_entries: int, flags: int) -> int:
    """A new map's descriptor (this process's; the map lives while a descriptor, a pin or a map holds it)."""
    opts = _CreateOpts(sz=ctypes.sizeof(_CreateOpts), map_flags=flags)
    fd = int(_lib().bpf_map_create(kind, name.encode(), key_size, value_size, max_entries, ctypes.byref(opts)))
    if fd < 0:
        raise _fail(f"creating map {name}")
    return fd


def map_update(fd: int, key: bytes, value: bytes, flags: int = 0) -> None:
    if _lib().bpf_map_update_elem(fd, key, value, flags) < 0:
        raise _fail("updating a map")


def map_delete(fd: int, key: bytes) -> bool:
    """Whether the key was there."""
    return bool(_lib().bpf_map_delete_elem(fd, key) == 0)


def map_lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    value = ctypes.create_string_buffer(value_size)
    return value.raw if _lib().bpf_map_lookup_elem(fd, key, value) == 0 else None


def map_items(fd: int, key_size: int, value_size: int, limit: int) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of hash map `fd`, at most `limit` of them."""
    lib = _lib()
    key, nxt, value = (ctypes.create_string_buffer(n) for n in (key_size, key_size, value_size))
    out: list[tuple[bytes, bytes]] = []
    previous = None
    while len(out) < limit and lib.bpf_map_get_next_key(fd, previous, nxt) == 0:
        ctypes.memmove(key, nxt, key_size)
        previous = key
        if lib.bpf_map_lookup_elem(fd, key, value) == 0:
            out.append((key.raw, value.raw))
    return out


def obj_get(path: Path) -> int:
    """A descriptor of the object pinned at `path` (bpffs)."""
    fd = int(_lib().bpf_obj_get(str(path).encode()))
    if fd < 0:
        raise _fail(f"opening pinned {path}")
    return fd


def obj_pin(fd: int, path: Path) -> None:
    if _lib().bpf_obj_pin(fd, str(path).encode()) < 0:
        raise _fail(f"pinning {path}")


def mmap_fd(fd: int, size: int) -> mmap.mmap:
    """The memory of BPF_F_MMAPABLE array map `fd` (`size` bytes: entries x value size), shared with the kernel."""
    length = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
    return mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def run_iterator_fd(prog_fd: int) -> bytes:
    """Run the iter/ program `prog_fd` once over everything it iterates; what it printed."""
    lib = _lib()
    link = int(lib.bpf_link_create(prog_fd, 0, BPF_TRACE_ITER, None))
    if link < 0:
        raise _fail("attaching the task iterator")
    try:
        fd = int(lib.bpf_iter_create(link))
        if fd < 0:
            raise _fail("running the task iterator")
        return _read_all(fd)
    finally:
        os.close(link)


def _read_all(fd: int) -> bytes:
    """Everything an iterator's file descriptor gives, then the descriptor closed."""
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class BpfObject:
    """One eBPF object file: its programs loaded and attached, its maps readable. Close it (idempotent)."""

    def __init__(self, path: Path, *, skip: tuple[str, ...] = (), skip_sections: tuple[str, ...] = ()) -> None:
        """Open and load `path`; the programs named in `skip`, and those whose section starts with one of
        `skip_sections`, are not loaded (their hook is missing or refused here)."""
        lib = _lib()
        self._lib = lib
        self._links: dict[str, int] = {}  # program name -> its link (libbpf's struct bpf_link)
        self._maps: list[mmap.mmap] = []
        obj = lib.bpf_object__open_file(str(path).encode(), None)
        if not obj:
            raise _fail(f"opening {path}")
        self._obj: int | None = obj
        for name in skip:
            prog = lib.bpf_object__find_program_by_name(obj, name.encode())
            if prog:
                lib.bpf_program__set_autoload(prog, False)
        # libbpf frees an inner map's template when it creates the map of maps: its shape is read before load
        self._inner: dict[str, tuple[int, int]] = {}
        found = None
        while found := lib.bpf_object__next_map(obj, found):
            inner = lib.bpf_map__inner_map(found)
            if inner:
                self._inner[lib.bpf_map__name(found).decode()] = (
                    int(lib.bpf_map__value_size(inner)), int(lib.bpf_map__max_entries(inner)))
        prog = None
        while skip_sections and (prog := lib.bpf_object__next_program(obj, prog)):
            if (lib.bpf_program__section_name(prog) or b"").decode().startswith(skip_sections):
                lib.bpf_program__set_autoload(prog, False)
        if lib.bpf_object__load(obj) < 0:
            error = _fail(f"loading {path.name} (kernel too old, or no BTF?)")
            self.close()
            raise error

    def _program(self, name: str) -> int:
        prog = self._lib.bpf_object__find_program_by_name(self._obj, name.encode())
        if not prog:
            raise BpfError(f"no program {name} in the object")
        return int(prog)

    def programs(self, section_prefix: str) -> list[str]:
        """The names of the programs whose section starts with `section_prefix`."""
        names, prog = [], None
        while prog := self._lib.bpf_object__next_program(self._obj, prog):
            if (self._lib.bpf_program__section_name(prog) or b"").decode().startswith(section_prefix):
                names.append(self._lib.bpf_program__name(prog).decode())
        return names

    def attach(self, name: str) -> None:
        """Attach program `name` to the hook its section names; detached by close() unless pinned (pin_link)."""
        link = self._lib.bpf_program__attach(self._program(name))
        if not link:
            raise _fail(f"attaching {name}")
        self._links[name] = int(link)

    @property
    def attached(self) -> list[str]:
        """The names of the programs attached, in the order they were."""
        return list(self._links)

    def pin_link(self, name: str, path: Path) -> None:
        """Pin attached program `name`'s link at `path` (bpffs): it stays attached until the pin is removed."""
        if self._lib.bpf_link__pin(self._links[name], str(path).encode()) < 0:
            raise _fail(f"pinning {name}")

    def program_fd(self, name: str) -> int:
        return int(self._lib.bpf_program__fd(self._program(name)))

    def let_pins_hold(self) -> None:
        """Give up this object's links without detaching them (their pins hold them): libbpf's own detach
        would disable a perf-event link's event, which the pin still uses."""
        for link in self._links.values():
            fd = int(self._lib.bpf_link__fd(link))
            self._lib.bpf_link__disconnect(link)
            self._lib.bpf_link__destroy(link)
            if fd >= 0:
                os.close(fd)
        self._links = {}

    def pin_program(self, name: str, path: Path) -> None:
        obj_pin(self.program_fd(name), path)

    def pin_map(self, name: str, path: Path) -> None:
        obj_pin(self.map_fd(name), path)

    def inner_map(self, name: str) -> tuple[int, int]:
        """(value size, max entries) of the inner map template of map of maps `name`."""
        if name not in self._inner:
            raise BpfError(f"map {name} has no inner map")
        return self._inner[name]

    def run_iterator(self, name: str) -> bytes:
        """Run an iter/ program once over everything it iterates; what it printed."""
        link = self._lib.bpf_program__attach_iter(self._program(name), None)
        if not link:
            raise _fail(f"attaching iterator {name}")
        try:
            fd = self._lib.bpf_iter_create(self._lib.bpf_link__fd(link))
            if fd < 0:
                raise _fail(f"running iterator {name}")
            return _read_all(fd)
        finally:
            self._lib.bpf_link__destroy(link)

    def map_fd(self, name: str) -> int:
        fd = int(self._lib.bpf_object__find_map_fd_by_name(self._obj, name.encode()))
        if fd < 0:
            raise BpfError(f"no map {name} in the object")
        return fd

    def _map(self, name: str) -> int:
        found = self._lib.bpf_object__find_map_by_name(self._obj, name.encode())
        if not found:
            raise BpfError(f"no map {name} in the object")
        return int(found)

    def max_entries(self, name: str) -> int:
        """The size of map `name` as the object declares it (how the loader learns the program's caps)."""
        return int(self._lib.bpf_map__max_entries(self._map(name)))

    def value_size(self, name: str) -> int:
        """The bytes of one value of map `name`, from the object's BTF (what the program writes)."""
        return int(self._lib.bpf_map__value_size(self._map(name)))

    def mmap_array(self, name: str, size: int) -> mmap.mmap:
        """The memory of BPF_F_MMAPABLE array `name` (`size` bytes: entries x value size), shared with the kernel."""
        length = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        memory = mmap.mmap(self.map_fd(name), length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._maps.append(memory)
        return memory

    def hash_items(self, name: str, key_size: int, value_size: int, limit: int) -> list[tuple[bytes, bytes]]:
        """Every (key, value) of hash map `name`, at most `limit` of them."""
        return map_items(self.map_fd(name), key_size, value_size, limit)

    def close(self) -> None:
        """Detach every program and free the object; idempotent, never raises."""
        for memory in self._maps:
            memory.close()
        self._maps = []
        for link in self._links.values():
            self._lib.bpf_link__destroy(link)
        self._links = {}
        if self._obj:
            self._lib.bpf_object__close(self._obj)
            self._obj = None
