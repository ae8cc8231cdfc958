"""Files a person names, opened so that a wrong kind of file costs one line, never a hang or half a file.

- `open_regular`: a file to read must be a regular file. It is opened with O_NONBLOCK first and checked with
  fstat on the descriptor, so a FIFO (whose open(2) would block until a writer comes) or a directory is
  refused at once, and a file swapped between a check and the open cannot slip through. O_NONBLOCK means
  nothing for a regular file's reads ("open(2)", Linux man-pages: "O_NONBLOCK ... has no effect for regular
  files and block devices"); it is cleared anyway before the descriptor is handed back.
- `append_line`: one line appended whole or not at all. A short write (ENOSPC on a full run directory) is cut
  back to the file's size before it, so a reader never meets a line cut in the middle.

The run directory's whole files (run.json, the report) go through a temporary name and a rename
(profiling.runfiles.write_text_atomic).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

__all__ = ["NotRegularFile", "append_line", "kind_of", "open_regular", "program_problem", "read_regular"]


class NotRegularFile(OSError):
    """The path exists but is not a regular file (a directory, a FIFO, a device, a socket)."""


def kind_of(mode: int) -> str:
    """A file's kind in words, for an error line."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def open_regular(path: Path | str) -> BinaryIO:
    """`path` opened for binary reading, which must be a regular file: NotRegularFile otherwise (at once,
    whatever it is), FileNotFoundError / PermissionError as open(2) gives them."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, f"{kind_of(mode)}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path | str, limit: int | None = None) -> bytes:
    """The bytes of the regular file `path` (at most `limit` + 1 when a limit is given, so a caller can tell
    a file over its limit); see open_regular."""
    with open_regular(path) as file:
        return file.read() if limit is None else file.read(limit + 1)


def append_line(path: Path, line: str) -> None:
    """Append `line` (a newline is added) to `path` whole, or raise with the file as it was: one write(2)
    with O_APPEND, and on a failure or a short write the file is truncated back to its size before it."""
    data = (line + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        before = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            while written < len(data):
                written += os.write(fd, data[written:])
        except BaseException:
            os.ftruncate(fd, before)
            raise
    finally:
        os.close(fd)


# e_machine of the ELF header for the machines a Batch host runs ("ELF-64 Object File Format"; elf.h EM_X86_64
# 62, EM_AARCH64 183): another machine's binary fails in execve(2) with ENOEXEC.
_ELF_MACHINES = {"x86_64": 62, "aarch64": 183}


def program_problem(path: Path | str) -> str | None:
    """Why the kernel would refuse to run the file `path` (execve(2) fails with ENOEXEC), or None: a program is
    a script starting with '#!' or an ELF binary for this machine. Reads its first 20 bytes, without blocking."""
    import platform

    try:
        with open_regular(path) as file:
            head = file.read(20)
    except NotRegularFile as exc:
        return f"is {(exc.strerror or 'not a regular file').split(',')[0]}, not a program"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if head.startswith(b"#!"):
        return None
    if head.startswith(b"\x7fELF"):
        machine = _ELF_MACHINES.get(platform.machine())
        if machine is not None and len(head) >= 20 and int.from_bytes(head[18:20], "little") != machine:
            return f"is a program for another machine than this {platform.machine()} (exec format error)"
        return None
    return "is neither a script starting with #! nor a program this machine runs (exec format error): give a " \
           "script its #! line (e.g. #!/usr/bin/env python3), or run it with its interpreter"
