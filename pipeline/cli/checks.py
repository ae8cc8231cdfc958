"""Checks every command makes on its flags before it runs anything: output paths, directories, endpoints,
regions, JSON files. Each failure is a UsageError (exit 64) naming the flag, the value and the fix.

Checking first is the point: a command that found out after an hour that it cannot write its result would
have lost the hour, and one that failed half-way would have left half of its output behind.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pipeline.endpoints import checked_endpoint, chosen_endpoint
from pipeline.errors import IobatchError, UsageError
from pipeline.interface import DEFAULT_PROCESS_COMMAND, PROCESS_INPUT, PROCESS_OUTPUT
from pipeline.settings import parse_process_command
from profiling.files import kind_of, read_regular

__all__ = ["STDOUT", "emf_namespace", "endpoint_url", "job_ids", "json_object", "not_an_input", "output_dir",
           "output_file", "output_or_stdout", "process_command", "read_file", "readable_file", "region", "stack_name",
           "unused_flags"]


def _nearest_existing(path: Path) -> Path:
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _unusable(path: Path, flag: str, exc: OSError) -> UsageError:
    """A path stat itself fails on: a name too long for the file system, a loop of links."""
    shown = str(path) if len(str(path)) <= 80 else str(path)[:80] + "..."
    return UsageError(f"{flag} {shown} cannot be used ({exc.strerror}): give a shorter, plain path")


#: An output flag's value for standard output, where the flag takes it (sidecar's and profile's --emf, profile's
#: --json: output_or_stdout); every other file flag refuses it rather than write a file named '-'.
STDOUT = "-"


def output_file(path: Path, flag: str) -> Path:
    """A file the command will write: not a directory, in an existing folder it may write to; not '-', which would
    be a file of that name where a person means standard output."""
    if str(path) == STDOUT:
        raise UsageError(f"{flag} - is not standard output here: {flag} writes a file; give its path (./- for a file "
                         "named '-')")
    try:
        is_dir, exists = path.is_dir(), path.exists()
        folder = path.absolute().parent
        folder_ok = folder.is_dir()
    except OSError as exc:
        raise _unusable(path, flag, exc) from None
    if is_dir:
        raise UsageError(f"{flag} {path} is a directory: give a file path")
    if not folder_ok:
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist: create it or give another path")
    if not _writable(folder) or (exists and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path} is not writable: give a path you may write to")
    return path


def output_or_stdout(value: str, flag: str) -> str:
    """A flag that writes a file or, given '-', standard output (STDOUT): the file is checked as output_file does."""
    if value != STDOUT:
        output_file(Path(value), flag)
    return value


def not_an_input(path: Path, flag: str, inputs: Iterable[Path]) -> Path:
    """An output path that is none of the files the command reads, nor inside a folder it reads: writing it
    would replace the input (a run's profile overwritten by its own report)."""
    target = path.resolve()
    for item in inputs:
        source = item.resolve()
        if target == source or source in target.parents:
            raise UsageError(f"{flag} {path} is {'inside ' if target != source else ''}{item}, which this command "
                             "reads: writing it would replace its input; give another path")
    return path


def output_dir(path: Path, flag: str) -> Path:
    """A directory the command will create or fill: not a file, under a folder where files can be made. That is
    tried (a directory made and removed at once): mode bits say nothing of root, of a read-only mount or of a
    kernel file system such as /proc."""
    if not str(path).isprintable():
        raise UsageError(f"{flag} {str(path)!r} has a control character (a newline?): give the plain path")
    try:
        is_file = path.exists() and not path.is_dir()
        existing = _nearest_existing(path)
    except OSError as exc:
        raise _unusable(path, flag, exc) from None
    if is_file:
        raise UsageError(f"{flag} {path} is a file: give a directory")
    if not existing.is_dir():
        raise UsageError(f"{flag} {path}: {existing} is a file, not a directory: give another path")
    if not _writable(existing):
        raise UsageError(f"{flag} {path} is not writable: give a directory you may write to")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".iobatch-probe-", dir=existing))
    except OSError as exc:
        why = "fix its owner or mode, or give" if exc.errno in (errno.EACCES, errno.EPERM) else "give"
        raise UsageError(f"{flag} {path}: no files can be made in {existing} ({exc.strerror}): {why} a directory "
                         "on a writable disk") from None
    return path


def readable_file(path: Path, flag: str) -> Path:
    """A regular file the command will read (a FIFO, which would block its reader, or a device is refused)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UsageError(f"{flag} {path} does not exist: give an existing file") from None
    except OSError as exc:
        raise UsageError(f"{flag} {path} cannot be read ({exc.strerror}): give a readable file") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"{flag} {path} is {kind_of(mode)}, not a regular file: give a file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{flag} {path} is not readable: fix its mode or give another file")
    return path


def read_file(path: Path, flag: str, limit: int | None = None) -> bytes:
    """The bytes of a regular file the command reads, opened without blocking (profiling.files.open_regular):
    a FIFO or a directory, even one put there after a check, is one line."""
    readable_file(path, flag)
    try:
        return read_regular(path, limit)
    except OSError as exc:  # readable by its mode, yet not to read (/proc/1/mem, swapped for a FIFO, EIO)
        raise UsageError(f"{flag} {path} cannot be read ({exc.strerror}): give a readable file") from None


def json_object(path: Path, flag: str, what: str, bad: type[IobatchError] = UsageError) -> dict[str, Any]:
    """A JSON file holding one object (the only shape the commands read). A file that is missing or cannot be read
    is a UsageError; one whose content is not a JSON object is `bad` (a PermanentError, 65, for a file a command
    wrote, such as `advise --json`'s)."""
    data = read_file(path, flag)
    if data.startswith(b"\xef\xbb\xbf"):
        raise bad(f"{flag} {path} starts with a byte order mark (BOM): save it as UTF-8 without BOM")
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as exc:  # also bytes that are not UTF-8
        raise bad(f"{flag} {path} is not JSON ({str(exc)[:80]}): give {what}") from None
    if not isinstance(body, dict):
        raise bad(f"{flag} {path} holds a JSON {type(body).__name__}, not an object: give {what}")
    return body


def unused_flags(flags: Mapping[str, str], when: str) -> None:
    """Refuse (64) the flags of `flags` (parameter name: its option, as --help shows it) the command line gave, when
    this run would not use them: a flag silently ignored leaves a person believing it took effect. `when` says
    when they apply ("with --from-cloudwatch or --stack"). Outside a command (a test calling the function), none is
    given."""
    from typer._click.core import ParameterSource
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None:
        return
    given = [option for name, option in flags.items() if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]
    if given:
        one = len(given) == 1
        raise UsageError(f"{', '.join(given)} {'applies' if one else 'apply'} only {when}: leave "
                         f"{'it' if one else 'them'} out")


def endpoint_url(url: str | None, flag: str = "--s3-endpoint", client: str | None = None) -> str | None:
    """An endpoint URL: scheme://HOST[:PORT] (pipeline.endpoints owns the rule, the job's variable's too). With
    `client` (s3, logs), no flag is the AWS libraries' variable for it (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL),
    checked alike and named by its name (pipeline.endpoints.chosen_endpoint)."""
    return checked_endpoint(url, flag) if client is None else chosen_endpoint(url, flag, client)


def region(name: str | None, flag: str = "--region") -> str:
    """The AWS region from the flag, else AWS_REGION, else where boto3 looks (AWS_DEFAULT_REGION, the
    profile's config file): boto3 alone never reads AWS_REGION, which Batch and most tools set."""
    import boto3

    from pipeline.aws import region_shaped
    from pipeline.interface import AWS_ENV

    chosen = name or os.environ.get(AWS_ENV.REGION) or boto3.session.Session().region_name
    if not chosen:
        raise UsageError(f"no AWS region: pass {flag} or set {AWS_ENV.REGION} (e.g. us-east-1)")
    # A name no partition forms regions like is a typo, not a region to retry against (pipeline.aws owns which).
    if not region_shaped(chosen):
        raise UsageError(f"{chosen!r} is not an AWS region name: pass {flag} like us-east-1")
    return chosen


# CloudFormation's stack names: a letter, then letters, digits and hyphens, at most 128 (CloudFormation API
# Reference, CreateStack, StackName). Anything else reaches the API as a request it refuses as malformed.
_STACK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,127}")
# An AWS Batch job id is a UUID; an array child's is the parent's with ":INDEX" (SubmitJob response, jobId;
# "Array jobs", AWS Batch User Guide).
_JOB_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(:[0-9]{1,5})?")


def stack_name(name: str, flag: str = "--stack") -> str:
    """A CloudFormation stack name, checked before any request."""
    if not _STACK_NAME.fullmatch(name):
        raise UsageError(f"{flag} {name[:60]!r} is not a stack name: a letter, then letters, digits and hyphens "
                         "(at most 128); give the name `cdk deploy` printed (the pipelineName, default iobatch)")
    return name


def job_ids(ids: Iterable[str]) -> list[str]:
    """AWS Batch job ids, checked before any request."""
    checked = list(ids)
    for job_id in checked:
        if not _JOB_ID.fullmatch(job_id.strip()):
            raise UsageError(f"JOB_ID {job_id[:60]!r} is not an AWS Batch job id (a UUID, with :N for one child): "
                             "give the id `iobatch submit` printed")
    return [job_id.strip() for job_id in checked]


def emf_namespace(namespace: str, flag: str = "--namespace") -> str:
    """A CloudWatch namespace, checked before anything runs (profiling.emf owns the rule)."""
    from profiling.emf import namespace_problem

    if problem := namespace_problem(namespace):
        raise UsageError(f"{flag} {namespace[:40]!r} {problem}")
    return namespace


PROCESS_COMMAND_HELP = (f"The process stage's command line, with {PROCESS_INPUT} (the downloaded images) and "
                        f"{PROCESS_OUTPUT} (an empty directory: every file written there is uploaded); its exit "
                        "code: 0 ok, 65 bad input, 75 transient. Default: the built-in resizer, "
                        f"'{DEFAULT_PROCESS_COMMAND}'.")


def process_command(text: str) -> str:
    """--process-command, checked before anything runs: its placeholders, and its program found here."""
    from pipeline.process import find_command

    command = parse_process_command(text, what="--process-command")
    find_command(command, "", what="--process-command")
    return command
