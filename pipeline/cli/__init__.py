"""`iobatch`: the commands a person types, and the container entrypoints.

Each command is a thin layer: it parses flags, calls the module that does the work, and turns known
errors (pipeline.errors) into one line on stderr and a documented exit code. This module holds the app,
that error handling and `main`; the commands live one group per module and are registered below:

- local: demo, run, job (pipeline/local, pipeline/job.py);
- profiler: sidecar, profile (profiling/);
- batch: submit, status (pipeline/submit/, pipeline/local/submit.py);
- report: report (profiling/report/);
- tuning: advise, lab (tuning/).

The command modules import nothing from this one, so the imports run one way.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from functools import wraps
from types import FrameType
from typing import Any, NoReturn, TypeVar

import typer

from pipeline.cli import batch, local, profiler, report, tuning
from pipeline.errors import EXIT_CODES_HELP, EXIT_RETRYABLE, IobatchError, print_error

__all__ = ["app", "fail", "handles_errors", "main"]

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


def fail(headline: str, code: int) -> NoReturn:
    """Print one error line and exit with `code`."""
    print_error(headline)
    raise typer.Exit(code)


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def handles_errors(func: F) -> F:
    """Known errors become one line and their exit code; anything else keeps its traceback.

    SIGTERM is treated as Ctrl-C, so every `with` block (the S3 server, the children) cleans up.
    """

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        try:
            return func(*args, **kwargs)
        except IobatchError as exc:
            fail(exc.headline, exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_RETRYABLE)

    return wrapper  # type: ignore[return-value]


# The commands, in the order `iobatch --help` lists them. `job` handles its own errors: it is the container's
# entrypoint, and the job installs its own SIGTERM handler (pipeline/job.py).
app.command()(handles_errors(local.demo))
app.command()(handles_errors(local.run))
app.command(help=local.JOB_HELP)(local.job)
app.command()(handles_errors(profiler.sidecar))
app.command(context_settings={"allow_interspersed_args": False})(handles_errors(profiler.profile))
app.command()(handles_errors(batch.submit))
app.command()(handles_errors(batch.status))
app.command()(handles_errors(report.report))
app.command()(handles_errors(tuning.advise))
app.command()(handles_errors(tuning.lab))


def main() -> None:
    """The `iobatch` console script."""
    app(prog_name="iobatch")
