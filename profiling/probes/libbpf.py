"""A compiled eBPF object loaded with libbpf (Debian's libbpf1, through ctypes): open, load, attach, read.

The few libbpf 1.x calls used are those of libbpf.h (the library's own header, the reference for each):
bpf_object__open_file, bpf_object__find_program_by_name, bpf_program__set_autoload, bpf_object__load,
bpf_program__attach, bpf_program__attach_iter, bpf_link__fd, bpf_link__destroy, bpf_object__close,
bpf_object__find_map_fd_by_name, bpf_object__find_map_by_name, bpf_map__max_entries, bpf_map__value_size,
and from bpf.h
bpf_iter_create, bpf_map_get_next_key, bpf_map_lookup_elem.
In libbpf 1.x every call that fails returns NULL or a negative error and sets errno.

Everything the object holds (programs, links, maps) is a file descriptor of this process: when the process
ends, however it ends (SIGKILL included), the kernel detaches the programs and frees the maps. Nothing
outlives the profiler.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

_LIB: ctypes.CDLL | None = None


class BpfError(RuntimeError):
    """A libbpf call failed; the message names the call and the kernel's reason."""


def _lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        name = ctypes.util.find_library("bpf") or "libbpf.so.1"
        lib = ctypes.CDLL(name, use_errno=True)
        vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        for fn, res, args in (
            ("bpf_object__open_file", vp, [cp, vp]),
            ("bpf_object__find_program_by_name", vp, [vp, cp]),
            ("bpf_program__set_autoload", i, [vp, ctypes.c_bool]),
            ("bpf_object__load", i, [vp]),
            ("bpf_program__attach", vp, [vp]),
            ("bpf_program__attach_iter", vp, [vp, vp]),
            ("bpf_link__fd", i, [vp]),
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
    return BpfError(f"{call}: {os.strerror(err) if err else 'failed'}")


class BpfObject:
    """One eBPF object file: its programs loaded and attached, its maps readable. Close it (idempotent)."""

    def __init__(self, path: Path, *, skip: tuple[str, ...] = ()) -> None:
        """Open and load `path`; the programs named in `skip` are not loaded (their hook is missing here)."""
        lib = _lib()
        self._lib = lib
        self._links: list[int] = []
        self._maps: list[mmap.mmap] = []
        obj = lib.bpf_object__open_file(str(path).encode(), None)
        if not obj:
            raise _fail(f"opening {path}")
        self._obj: int | None = obj
        for name in skip:
            prog = lib.bpf_object__find_program_by_name(obj, name.encode())
            if prog:
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

    def attach(self, name: str) -> None:
        """Attach program `name` to the hook its section names; detached by close()."""
        link = self._lib.bpf_program__attach(self._program(name))
        if not link:
            raise _fail(f"attaching {name}")
        self._links.append(int(link))

    def run_iterator(self, name: str) -> bytes:
        """Run an iter/ program once over everything it iterates; what it printed."""
        link = self._lib.bpf_program__attach_iter(self._program(name), None)
        if not link:
            raise _fail(f"attaching iterator {name}")
        try:
            fd = self._lib.bpf_iter_create(self._lib.bpf_link__fd(link))
            if fd < 0:
                raise _fail(f"running iterator {name}")
            try:
                chunks = []
                while chunk := os.read(fd, 65536):
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)
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
        fd = self.map_fd(name)
        key, nxt, value = (ctypes.create_string_buffer(n) for n in (key_size, key_size, value_size))
        out: list[tuple[bytes, bytes]] = []
        previous = None
        while len(out) < limit and self._lib.bpf_map_get_next_key(fd, previous, nxt) == 0:
            ctypes.memmove(key, nxt, key_size)
            previous = key
            if self._lib.bpf_map_lookup_elem(fd, key, value) == 0:
                out.append((key.raw, value.raw))
        return out

    def close(self) -> None:
        """Detach every program and free the object; idempotent, never raises."""
        for memory in self._maps:
            memory.close()
        self._maps = []
        for link in self._links:
            self._lib.bpf_link__destroy(link)
        self._links = []
        if self._obj:
            self._lib.bpf_object__close(self._obj)
            self._obj = None
