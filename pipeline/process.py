"""The process stage's contract: a command line, run with the downloaded images and an empty output directory.

- The command is ENV.PROCESS_COMMAND with `{input}` and `{output}` (pipeline.interface); the default is the
  built-in resizer, `iobatch process {input} {output}` (pipeline/imaging.py), so every command takes one path.
- Beside the job's own environment it gets PROCESS_ENV.CHILD, PROCESS_ENV.IMAGES (the images with their S3
  keys, `write_images_file`) and, when the child is profiled, the profiler's socket for sub-stages
  (profiling.protocol.SUBSTAGE_SOCKET_ENV). Its stdout and stderr go to the child's log.
- Its exit code follows the project's: 0 ok, 65 bad input, 75 transient (Batch retries), anything else (a
  signal included) a bug in the command: the child exits 1, with one line, not retried. A command that fails
  on a full scratch volume is judged as the job's own full volume (pipeline/scratch.py: 65 or 75).
- Everything it leaves in the output directory is the child's output: regular files only (a symbolic link
  could make the job upload what lies outside it), at least one, none named `_SUCCESS` at the top.
- A stage that is interrupted (SIGTERM, the soft deadline) stops the command's whole process group first.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import EXIT_BUG, IntegrityError, IobatchError, PermanentError, RetryableError, UsageError
from pipeline.interface import (
    DEFAULT_PROCESS_COMMAND,
    EXIT_PERMANENT,
    EXIT_RETRYABLE,
    PROCESS_ENV,
    SUCCESS_MARKER,
    process_argv,
)
from pipeline.manifest import MAX_KEY_BYTES, ManifestEntry
from profiling.files import open_regular, program_problem
from profiling.protocol import MAX_SOCKET_PATH, SUBSTAGE_SOCKET_ENV

STOP_WAIT_S = 5.0  # after SIGTERM, the command's group has this long before SIGKILL
# A command that failed while the scratch volume had less than this free is taken to have filled it.
FULL_FREE_BYTES = 16 << 20
MAX_QUOTED = 400  # characters of the command's last line in a headline


class ProcessCommandBug(IobatchError):
    """The process command failed in a way its exit code calls a bug (not 65 or 75): not retried."""

    exit_code = EXIT_BUG


@dataclass(frozen=True)
class Command:
    """One child's process command, its program found."""

    text: str
    child: str
    program: str  # the path of argv[0]

    @property
    def is_builtin(self) -> bool:
        return self.text == DEFAULT_PROCESS_COMMAND

    def where(self) -> str:
        return f"child {self.child}: process command {self.text[:120]!r}"

    def argv(self, input_dir: Path, output_dir: Path) -> list[str]:
        return [self.program, *process_argv(self.text, str(input_dir), str(output_dir))[1:]]


def find_command(text: str, child: str, *, path: str | None = None, what: str = "") -> Command:
    """The command with its program found beside this interpreter (where `iobatch` and `python` live in a
    virtual environment) or on PATH, or a usage error naming `what` (default: the child's process command):
    nothing has run yet (exit 64)."""
    program = process_argv(text, "", "")[0]
    # The job's own interpreter's directory first: `python` and `iobatch` there are the ones the job runs with.
    search = os.pathsep.join(p for p in (str(Path(sys.executable).parent),
                                         (os.environ.get("PATH") if path is None else path)) if p)
    where = f"{what or f'child {child}: process command'} {text[:120]!r}"
    if os.sep in program:
        if Path(program).is_dir():
            raise UsageError(f"{where}: {program} is a directory: give the program in it")
        if not Path(program).exists():
            raise UsageError(f"{where}: {program} does not exist: add it to the image (FROM the project's image) "
                             "or fix the path")
        if not os.access(program, os.X_OK):
            raise UsageError(f"{where}: {program} is not executable: chmod +x it in the image, or run it with its "
                             "interpreter (python3 SCRIPT {input} {output})")
        found: str | None = str(Path(program).absolute())
    else:
        found = shutil.which(program, path=search)
    if found is None:
        raise UsageError(f"{where}: {program} is not on PATH: install it in the image (FROM the project's image) "
                         "or give its full path")
    # Checked here, before anything runs (exit 64), not by execve after the download.
    if problem := program_problem(found):
        raise UsageError(f"{where}: {program} {problem}")
    return Command(text, child, found)


# ---- the images the command gets ---------------------------------------------------------------------


def write_images_file(path: Path, files: Sequence[tuple[str, ManifestEntry]]) -> None:
    """The PROCESS_ENV.IMAGES file: (file name in the input directory, its manifest entry), one a line."""
    with path.open("w", encoding="utf-8") as out:
        for name, entry in files:
            out.write(json.dumps({"file": name, "key": entry.key, "size": entry.size, "etag": entry.etag},
                                 sort_keys=True) + "\n")


def read_images_file(path: Path) -> list[dict[str, str | int | None]]:
    """The lines of a PROCESS_ENV.IMAGES file (a regular file: a FIFO there is refused at once, not waited on), each
    of write_images_file's shape: a ValueError naming the first line that is not (JSON of another shape included)."""
    rows = []
    with open_regular(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not (isinstance(row, dict) and all(isinstance(row.get(k), str) and row[k] for k in ("file", "key"))
                    and Path(row["file"]).name == row["file"] and isinstance(row.get("etag"), str | None)):
                raise ValueError(f"line {number} is not {{\"file\": NAME, \"key\": KEY, \"etag\": ETAG}} as the job "
                                 "writes it")
            rows.append(row)
    return rows


# The end of every message of a file that is not what the batch was frozen with (its size or its bytes).
CHANGED_AFTER_FREEZE = ("the object changed after the batch was frozen: restore it, or submit the batch again to "
                        "refreeze it")


def md5_of(data: bytes | io.BufferedReader) -> str:
    """The MD5 (hex) of `data` itself, or of all an open binary file gives (read in blocks, never whole)."""
    if isinstance(data, bytes):
        return hashlib.md5(data, usedforsecurity=False).hexdigest()
    return hashlib.file_digest(data, lambda: hashlib.md5(usedforsecurity=False)).hexdigest()


def check_md5(key: str, data: bytes | io.BufferedReader, etag: str | None, *, bucket: str) -> None:
    """For a single-part object (an ETag without '-'), the bytes have the MD5 the batch was frozen with (`md5_of`)."""
    if etag and "-" not in etag and len(etag) == 32:
        md5 = md5_of(data)
        if md5 != etag.lower():
            raise IntegrityError(f"s3://{bucket}/{key} has MD5 {md5}, the batch listed ETag {etag}: "
                                 f"{CHANGED_AFTER_FREEZE}")


# ---- running it --------------------------------------------------------------------------------------


def run_command(command: Command, input_dir: Path, output_dir: Path, *, images_file: Path,
                socket_path: Path | None, cwd: Path, environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Run the command to its end; return its raw return code (-N for a kill by signal N: `failure` says
    which, and pipeline.interface.exit_code_of gives the shell's 128 + N) and its
    last line on stderr (without an `error: ` prefix), which a failure's headline quotes.

    Its stdout and stderr go on to the job's stderr (the child's log; the job's stdout carries its own JSON
    event lines). Its own process group, so an interruption stops all of it (pipeline/job.py raises
    Interrupted from a signal handler while this waits)."""
    # The command runs in `cwd`: every path it is handed is absolute, so a relative scratch root (a demo's
    # default run directory) means the same there.
    input_dir, output_dir, images_file = input_dir.absolute(), output_dir.absolute(), images_file.absolute()
    output_dir.mkdir(parents=True, exist_ok=True)
    env = {**(os.environ if environ is None else environ), PROCESS_ENV.CHILD: command.child,
           PROCESS_ENV.IMAGES: str(images_file)}
    env.pop(SUBSTAGE_SOCKET_ENV, None)
    if socket_path is not None:
        # A Unix socket's path has room for MAX_SOCKET_PATH bytes (unix(7)): past that, the path from the
        # command's directory, where it starts.
        absolute = str(socket_path.absolute())
        env[SUBSTAGE_SOCKET_ENV] = (absolute if len(absolute.encode()) <= MAX_SOCKET_PATH
                                    else os.path.relpath(absolute, cwd))
    sys.stdout.flush()
    try:
        proc = subprocess.Popen(command.argv(input_dir, output_dir), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0)
    except OSError as exc:  # what find_command's check could not foresee (a damaged ELF: ENOEXEC)
        raise UsageError(f"{command.where()} cannot be run ({exc.strerror}): give a program for this machine, or a "
                         "script with its #! line") from None
    last = ""
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            sys.stderr.buffer.write(raw)
            sys.stderr.flush()
            if text := raw.decode("utf-8", errors="replace").strip():
                last = text
        code = proc.wait()
    except BaseException:
        stop_group(proc)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    return code, last.removeprefix("error: ")[:MAX_QUOTED]


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the command's process group, SIGKILL after STOP_WAIT_S."""
    for sig, wait_s in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what the command left running in its group


def failure(command: Command, code: int, last_line: str) -> IobatchError:
    """The error for a command that exited `code` (not 0), by the project's exit codes, quoting its last line."""
    said = f": {last_line}" if last_line else " (it printed nothing: see the child's log)"
    where = command.where()
    if code == EXIT_PERMANENT:
        return PermanentError(f"{where} exited {code}, bad input, not retried{said}")
    if code == EXIT_RETRYABLE:
        return RetryableError(f"{where} exited {code}, a transient fault: the child is retried{said}")
    # `code` is the raw return code: Python gives -N for a kill by signal N, where a shell says 128 + N; a
    # command that exited 255 itself was not killed.
    how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
    return ProcessCommandBug(f"{where} {how}, a bug in the command (it should exit 65 for bad input, 75 for a "
                             f"transient fault): fix it; not retried{said}")


def scratch_filled(scratch_root: Path) -> bool:
    """Whether the scratch volume is (all but) full: a failed command most likely ran out of space."""
    try:
        usage = shutil.disk_usage(scratch_root)
    except OSError:
        return False
    return usage.free < min(FULL_FREE_BYTES, usage.total // 100 or 1)


# ---- what it wrote -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """One file the command wrote: `name` is its path under the output directory, '/'-separated, and the
    key under the child's output prefix."""

    name: str
    path: Path
    size: int


def collect_outputs(command: Command, output_dir: Path, *, prefix: str) -> list[Output]:
    """Every file in `output_dir`, sorted by name; PermanentError naming the first that cannot be an output."""
    found: list[Output] = []
    where = command.where()
    for top, dirs, files in os.walk(output_dir):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = Path(top, name)
            rel = path.relative_to(output_dir).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise PermanentError(f"{where} left a symbolic link in its output, {rel} -> {os.readlink(path)}: "
                                     "write regular files into the output directory (copy, do not link); "
                                     "nothing was uploaded")
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise PermanentError(f"{where} left {rel} in its output, which is not a regular file: write "
                                     "regular files only; nothing was uploaded")
            try:
                key_bytes = len((prefix + rel).encode("utf-8"))
            except UnicodeEncodeError:
                raise PermanentError(f"{where} wrote {rel!r}, whose name is not UTF-8: S3 keys are UTF-8; "
                                     "nothing was uploaded") from None
            if key_bytes > MAX_KEY_BYTES:
                raise PermanentError(f"{where} wrote {rel[:80]}..., a key of {key_bytes} bytes, over S3's "
                                     f"{MAX_KEY_BYTES}: use shorter names; nothing was uploaded")
            if rel == SUCCESS_MARKER:
                raise PermanentError(f"{where} wrote {SUCCESS_MARKER}, the name of the child's completion marker: "
                                     "use another name; nothing was uploaded")
            found.append(Output(rel, path, path.stat().st_size))
    if not found:
        raise PermanentError(f"{where} wrote nothing to its output directory: write the outputs under "
                             "the {output} directory it is given; nothing was uploaded")
    return sorted(found, key=lambda output: output.name)
