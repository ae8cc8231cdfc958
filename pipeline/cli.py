"""`iobatch`: the commands a person types, and the container entrypoints.

Each command is a thin layer: it parses flags, calls the module that does the work, and turns known
errors (pipeline.errors) into one line on stderr and a documented exit code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer

from pipeline.errors import EXIT_PERMANENT, EXIT_RETRYABLE, EXIT_USAGE, IobatchError

EXIT_CODES_HELP = (
    f"Exit codes: 0 ok; {EXIT_USAGE} bad flag or variable; {EXIT_PERMANENT} bad input (permanent, not "
    f"retried); {EXIT_RETRYABLE} transient fault (throttling, network, interrupted: retried); 1 a bug."
)

app = typer.Typer(
    name="iobatch",
    help="Run data-heavy ML preprocessing on AWS Batch (or this machine) and see its I/O, stage by stage.\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

F = TypeVar("F", bound=Callable[..., Any])


def fail(headline: str, code: int) -> None:
    """Print one error line and exit with `code`."""
    print(f"error: {headline}", file=sys.stderr, flush=True)
    raise typer.Exit(code)


def handles_errors(func: F) -> F:
    """Known errors become one line and their exit code; anything else keeps its traceback."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except IobatchError as exc:
            fail(exc.headline, exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_RETRYABLE)

    return wrapper  # type: ignore[return-value]


# ---- the pipeline: demo, run, job (pipeline/local, pipeline/job.py) --------------------------------

# ---- profiling: profile, sidecar (profiling/) -------------------------------------------------------

# ---- submission: submit, status (pipeline/submit.py) ------------------------------------------------

# ---- report (profiling/report.py) -------------------------------------------------------------------

# ---- tuning: advise, lab (tuning/) ------------------------------------------------------------------


def main() -> None:
    app()


if __name__ == "__main__":
    main()
