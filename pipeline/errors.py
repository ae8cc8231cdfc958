"""Errors the pipeline knows, each with a one-line headline and an exit code; print_error.

Each IobatchError carries a headline naming the thing and the fix, and the exit code of its kind: UsageError 64
(nothing was done), PermanentError 65 (bad input: retrying cannot help), RetryableError 75 (a retry can succeed).
The codes follow sysexits(3) so that the AWS Batch retry strategy can key on them; they belong to the job's
interface (pipeline/interface.py, with `batch_exit_code`, the one rule for a whole batch's code; the table:
docs/reference/exit-codes.md) and are re-exported here beside the errors that carry them. Every command prints
``error: <headline>`` for these (`print_error`) and exits with the code; only unknown exceptions get a traceback
(exit 1).
"""

from __future__ import annotations

import sys

from pipeline.interface import EXIT_BUG, EXIT_OK, EXIT_PERMANENT, EXIT_RETRYABLE, EXIT_USAGE

__all__ = [
    "EXIT_BUG", "EXIT_CODES_HELP", "EXIT_OK", "EXIT_PERMANENT", "EXIT_RETRYABLE", "EXIT_USAGE", "BadImageError",
    "EndpointUnreachable", "IntegrityError", "Interrupted", "IobatchError", "ManifestError", "MissingObjectError",
    "PermanentError", "RetryableError", "ScratchError", "ScratchUnavailable", "ToolMissing", "TransferError",
    "UsageError", "print_error",
]

#: The exit codes in one sentence, for every command's --help.
EXIT_CODES_HELP = (
    f"Exit codes: 0 ok; {EXIT_USAGE} bad flag or variable; {EXIT_PERMANENT} bad input (permanent, not "
    f"retried); {EXIT_RETRYABLE} transient fault (throttling, network, interrupted: retried); 1 a bug."
)


def print_error(headline: str) -> None:
    """The one line a known error prints, on stderr: ``error: <headline>``."""
    print(f"error: {headline}", file=sys.stderr, flush=True)


class IobatchError(Exception):
    """Base class: a headline that names the thing and the fix, and an exit code."""

    exit_code = EXIT_PERMANENT
    retryable = False

    def __init__(self, headline: str) -> None:
        super().__init__(headline)
        self.headline = headline


class UsageError(IobatchError):
    """A flag, variable or file given by the user is wrong; nothing was done."""

    exit_code = EXIT_USAGE


class PermanentError(IobatchError):
    """Bad input: retrying the same child cannot succeed."""

    exit_code = EXIT_PERMANENT


class RetryableError(IobatchError):
    """A transient fault: the same child can succeed when run again."""

    exit_code = EXIT_RETRYABLE
    retryable = True


class ManifestError(PermanentError):
    """A manifest line or listing is unusable."""


class MissingObjectError(PermanentError):
    """A bucket or key named by the batch does not exist."""


class BadImageError(PermanentError):
    """An input image does not decode."""


class ScratchError(PermanentError):
    """The scratch directory is missing, not writable or full."""


class ScratchUnavailable(RetryableError):
    """This host's scratch cannot take the child now (not the prepared volume, or full of other children's
    files): the same child can succeed on another host or later."""


class IntegrityError(PermanentError):
    """An object's bytes do not match what was listed or checksummed."""


class TransferError(RetryableError):
    """s5cmd failed for a reason a retry can fix (network, throttling, 5xx)."""


class EndpointUnreachable(RetryableError):
    """The S3 endpoint does not answer."""


class Interrupted(RetryableError):
    """The child was told to stop (SIGTERM: Batch timeout or Spot reclaim)."""

    # Read by profiling.protocol.StageReporter: the stage's outcome when this exception ends it.
    stage_outcome = "interrupted"


class ToolMissing(UsageError):
    """A binary the pipeline needs (s5cmd, versitygw) is not installed."""
