"""`iobatch`: the commands a person types, and the container entrypoints.

Each command is a thin layer: it parses flags, calls the module that does the work, and turns known
errors (pipeline.errors) into one line on stderr and a documented exit code. This module holds the app,
that error handling and `main`; the commands live one group per module and are registered below:

- local: demo, run, job (pipeline/local, pipeline/job.py);
- profiler: sidecar, profile (profiling/);
- batch: submit, status (pipeline/submit/, pipeline/local/submit.py);
- report: report (profiling/report/);
- tuning: advise, lab (tuning/).

The command modules import nothing from this one, so the imports run one way. At their top they import only what
their flags need (typer, checks, the limits and defaults the flags name); what a command does is imported when it
runs, so that `iobatch profile` starts without AWS's, the report's or the advisor's modules (issue 43:
tests/unit/test_cli_startup.py).
"""

from __future__ import annotations

# ruff: noqa: E402 (the start-up signal handler is installed before the imports below: typer's alone takes 0.05 s)
import signal

from pipeline.errors import EXIT_RETRYABLE, print_error


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM before a command line is parsed: the one line and code of any interrupted command, not a
    traceback of whatever was being imported (Ctrl-C) nor a bare 143 (SIGTERM's default action)."""
    print_error("interrupted")
    raise SystemExit(EXIT_RETRYABLE)


# Until IobatchGroup.main hands them on (Ctrl-C to KeyboardInterrupt, SIGTERM to the same, as handles_errors does): a
# signal ignored (a background job's SIGINT, a SIGTERM a parent set to SIG_IGN) or handled by an embedding program
# stays as it was.
_BEFORE = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
for _sig, _default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
    if _BEFORE[_sig] is _default:
        signal.signal(_sig, _interrupted_while_starting)
del _sig, _default


def end_start_up_handling() -> None:
    """Give Ctrl-C and SIGTERM back to what they were before this module was imported: for a program (a test runner)
    that imports the CLI without running it. Running a command does it itself."""
    for sig, before in _BEFORE.items():
        if signal.getsignal(sig) is _interrupted_while_starting:
            signal.signal(sig, before)

import errno
import math
import sys
from collections.abc import Callable, Sequence
from functools import wraps
from types import FrameType
from typing import Any, NoReturn, TypeVar

import typer
from typer._click.core import Context, HelpFormatter
from typer._click.exceptions import BadParameter, ClickException, NoArgsIsHelpError
from typer._click.types import FloatParamType, IntParamType
from typer.core import TyperArgument, TyperCommand, TyperGroup

from pipeline.cli import batch, local, profiler, qualify, report, tuning
from pipeline.errors import EXIT_CODES_HELP, EXIT_PERMANENT, EXIT_USAGE, IobatchError
from profiling.numbers import number, shown, whole_number

__all__ = ["app", "end_start_up_handling", "fail", "handles_errors", "main", "usage_headline"]


def usage_headline(exc: typer.TyperException) -> str:
    """The one line a parse error prints: click's message (one line, no trailing period) and where help is."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "iobatch"
    if isinstance(exc, NoArgsIsHelpError):
        return f"no command given: run `{command} --help` for the commands"
    message = " ".join(exc.format_message().split()).rstrip(".")
    return f"{message}: see `{command} --help`"


class IobatchGroup(TyperGroup):
    """The app's group: every parse error (unknown option, missing argument, a number out of its range, no
    command at all) is one line and EXIT_USAGE, where click would print usage and exit 2. Here, in one
    place, so the console script, `python -m pipeline.cli` and typer.testing.CliRunner all agree."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, windows_expand_args: bool = True,
             **extra: Any) -> Any:
        given = list(sys.argv[1:] if args is None else args)
        if any("\x00" in arg for arg in given):  # no path, name or number can hold one; os calls refuse it
            print_error("an argument contains a NUL byte: no path or value can; see `iobatch --help`")
            if standalone_mode:
                sys.exit(EXIT_USAGE)
            return EXIT_USAGE
        found = {sig: signal.getsignal(sig) for sig in _BEFORE}
        after = {sig: _BEFORE[sig] if handler is _interrupted_while_starting else handler  # what the caller had
                 for sig, handler in found.items()}
        try:
            # From here Ctrl-C (and SIGTERM, as handles_errors makes it) is a KeyboardInterrupt, after which every
            # `with` block cleans up.
            for sig, during in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, _sigterm_as_interrupt)):
                if found[sig] is _interrupted_while_starting:
                    signal.signal(sig, during)
            code = super().main(args, prog_name, complete_var, standalone_mode=False,
                                windows_expand_args=windows_expand_args, **extra)
        except ClickException as exc:
            print_error(usage_headline(exc))
            code = EXIT_USAGE
        except (typer.Abort, KeyboardInterrupt):  # end of input at a prompt, or Ctrl-C before a command ran
            print_error("interrupted")
            code = EXIT_RETRYABLE
        finally:  # a caller in the same process (a test, an embedding program) gets its handlers back
            for sig, handler in after.items():
                signal.signal(sig, handler)
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


class IobatchCommand(TyperCommand):
    """A command whose help names an argument by its metavar alone, as it does an option: `COMMAND...`, where
    typer would print `{COMMAND}...` in the usage line and `COMMAND <list[str]>` under Arguments. Its number
    options read their text with the one number parser of the project (profiling.numbers), as environment
    variables are read: ASCII digits of a bounded length, so '1_000' or '١٢' is refused, not read as a number."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            parse = _number_parser(param)
            if parse is not None:
                param.process_value = _checked_number(param, parse)  # type: ignore[method-assign,assignment]

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        return [piece.replace("{", "").replace("}", "") for piece in super().collect_usage_pieces(ctx)]

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        arguments, options = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if isinstance(param, TyperArgument):
                name = param.metavar or param.name or ""
                arguments.append((name + ("..." if param.nargs != 1 else ""), record[1]))
            else:
                options.append(record)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _number_parser(param: Any) -> Callable[[str], Any] | None:
    """The parser for `param`'s text when it takes a number (int or float, in a range or not), else None: from the
    click type typer gave it (an int annotation is click's INT or an IntRange, a bool flag neither)."""
    kind = getattr(param, "type", None)
    if isinstance(kind, IntParamType):
        return whole_number
    return number if isinstance(kind, FloatParamType) else None


def _checked_number(param: Any, parse: Callable[[str], Any]) -> Callable[[Context, Any], Any]:
    original = param.process_value
    what = "a whole number" if parse is whole_number else "a number"

    def process_value(ctx: Context, value: Any) -> Any:
        if isinstance(value, str):
            parsed = parse(value)
            if parsed is None:
                raise BadParameter(f"{shown(value)} is not {what} (ASCII digits)", ctx=ctx, param=param)
            if not math.isfinite(parsed):  # before the range check: it would call nan "more than" its maximum
                raise BadParameter(f"{shown(value)} is not a finite number", ctx=ctx, param=param)
        return original(ctx, value)

    return process_value


app = typer.Typer(
    cls=IobatchGroup,
    name="iobatch",
    help="Run data-heavy ML preprocessing on AWS Batch (or this machine) and see its I/O, stage by stage.\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click help: usage lines without rich's boxes and "<bool>" metavars on plain flags.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from pipeline.version import version

        print(f"iobatch {version()}")
        raise typer.Exit()


@app.callback()
def _options(_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                           help="Print the version (the package's, and git's description in a "
                                                "checkout) and exit.")) -> None:
    pass

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
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        try:
            return func(*args, **kwargs)
        except IobatchError as exc:
            fail(exc.headline, exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_RETRYABLE)
        except OSError as exc:
            # A path given with a name longer than the file system takes (255 bytes a name): stat itself fails,
            # wherever the command first looks at it. One line naming the path; nothing was written under it.
            if exc.errno == errno.ENAMETOOLONG:
                name = str(exc.filename or "a path given")
                fail(f"{name[:80] + '...' if len(name) > 80 else name}: a name in it is longer than the file "
                     f"system takes ({exc.strerror}): give a shorter path", EXIT_USAGE)
            # A full volume under a file the command writes (a run directory, a report): one line naming the
            # file. Every file is written whole or not at all (profiling.files, runfiles.write_text_atomic).
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            fail(f"{exc.filename or 'a file it writes'}: no space left on its volume ({exc.strerror}); nothing "
                 "half-written was left: free space there or write elsewhere", EXIT_PERMANENT)
        finally:  # a caller in the same process gets its handler back
            signal.signal(signal.SIGTERM, previous)

    return wrapper  # type: ignore[return-value]


# The commands, in the order `iobatch --help` lists them. `job` handles its own errors: it is the container's
# entrypoint, and the job installs its own SIGTERM handler (pipeline/job.py).
app.command(cls=IobatchCommand)(handles_errors(local.demo))
app.command(cls=IobatchCommand)(handles_errors(local.run))
app.command(cls=IobatchCommand, help=local.JOB_HELP)(local.job)
app.command(cls=IobatchCommand, help=local.PROCESS_HELP)(handles_errors(local.process))
app.command(cls=IobatchCommand)(handles_errors(profiler.sidecar))
app.command(cls=IobatchCommand, context_settings={"allow_interspersed_args": False})(handles_errors(profiler.profile))
app.command(cls=IobatchCommand)(handles_errors(batch.submit))
app.command(cls=IobatchCommand)(handles_errors(batch.status))
app.command(cls=IobatchCommand)(handles_errors(report.report))
app.command(cls=IobatchCommand)(handles_errors(tuning.advise))
app.command(cls=IobatchCommand)(handles_errors(tuning.lab))
app.command(cls=IobatchCommand)(handles_errors(qualify.qualify))


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The `iobatch` console script (argv: sys.argv[1:] when None); exits with the command's code."""
    app(args=argv, prog_name="iobatch")
    raise AssertionError("IobatchGroup.main exits")
