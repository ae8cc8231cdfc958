"""`iobatch report`: the HTML report of a run, from a run directory or CloudWatch Logs (profiling/report/)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import typer

from pipeline.cli import checks
from pipeline.errors import PermanentError, UsageError

# How far back `--since` reads when it is not given (report and advise alike).
DEFAULT_SINCE = "1h"


def _read_advice(path: Path | None) -> Any:
    """The advisor's JSON, of the shape `advise --json` writes (tuning.advice_json owns it): any other JSON object
    is bad input (65) naming the file, never shown as a recommendation. Fields the page does not know still
    render."""
    from tuning.advice_json import advice_problem

    if path is None:
        return None
    what = "the JSON object `iobatch advise --json` printed"
    body = checks.json_object(path, "--advice", what, bad=PermanentError)
    if problem := advice_problem(body):
        raise PermanentError(f"--advice {path} is not what `iobatch advise --json` writes ({problem}): give {what}")
    return body


def _all_profiles(run_dir: Path, data: Any, namespace: str) -> list[Any]:
    """Every stage profile of a local run: a large run keeps no whole profiles (profiling.report.fleet), so the
    advisor reads them without timelines."""
    from profiling import runfiles

    if data.complete:
        return [x.profile for x in data.entries]
    return [p for p, _ in runfiles.read_run_profiles(run_dir, timeline=False, namespace=namespace).profiles]


def _run_dir_advice(run_dir: Path, given: Any, namespace: str) -> Any:
    """The advice the demo gave for a local run directory, computed the same way (pipeline.local.demo.run_advice),
    from its profiles without timelines (its EMF files' of `namespace` when it kept none) and its run.json; None when
    run.json does not say the children at once.
    `given` (--advice) when there is one; run.json is checked strictly either way (pipeline.local.runjson: 65)."""
    from pipeline.local.demo import run_advice
    from pipeline.local.runjson import read_run
    from profiling import runfiles

    run = read_run(run_dir) if runfiles.is_run_dir(run_dir) else None
    if given is not None:
        return given
    if run is None or not isinstance(run.get("workers"), int):
        return None
    try:  # a missing or damaged profile is named by the report's own reading, with its exit code
        profiles = [p for p, _ in runfiles.read_run_profiles(run_dir, timeline=False, namespace=namespace).profiles]
    except (OSError, ValueError):
        return None
    return run_advice(profiles, run)


def _logs_client(region: str | None, logs_endpoint: str | None) -> Any:
    """A CloudWatch Logs client that refuses answers from anything but CloudWatch Logs."""
    import os

    import boto3

    from pipeline.aws import refuse_foreign_answers
    from pipeline.endpoints import configured_endpoint
    from pipeline.interface import AWS_ENV

    # No --logs-endpoint: AWS_ENDPOINT_URL_CLOUDWATCH_LOGS or AWS_ENDPOINT_URL, as boto3 reads them, checked alike.
    endpoint, named = (logs_endpoint, "--logs-endpoint") if logs_endpoint else \
        configured_endpoint("logs") or (None, "--logs-endpoint")
    # AWS_REGION is what Batch and most tools set; boto3 itself reads only AWS_DEFAULT_REGION.
    client = boto3.client("logs", region_name=region or os.environ.get(AWS_ENV.REGION) or None,
                          endpoint_url=endpoint)
    refuse_foreign_answers(client.meta.events, service="CloudWatch Logs",
                           fix=f"point {named} at CloudWatch Logs (or leave it out for AWS's)")
    return client


class Progress:
    """One line on stderr every PROGRESS_EVERY_S seconds once a read has taken that long: a small run's
    report prints nothing but its path; a fleet's says how far it is."""

    PROGRESS_EVERY_S = 5.0

    def __init__(self, line: Callable[[int, int], str], command: str = "report") -> None:
        self._line = line
        self._command = command
        self._last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last >= self.PROGRESS_EVERY_S:
            self._last = now
            print(f"{self._command}: {self._line(done, total)}", file=sys.stderr, flush=True)


def _from_logs(log_group: str, read: Callable[[], Any]) -> Any:
    """`read()` with CloudWatch Logs' errors as the pipeline's (pipeline.aws.logs_error)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from pipeline.aws import logs_error

    try:
        return read()
    except (BotoCoreError, ClientError) as exc:
        raise logs_error(exc, log_group=log_group) from None


def _cloudwatch_report(log_group: str, out: Path, since: str, namespace: str, region: str | None,
                       logs_endpoint: str | None, advice: Any) -> Path:
    """The report from CloudWatch Logs: the AWS edge (client, region, errors) around profiling.report."""
    from profiling.report import parse_since, write_report_from_cloudwatch

    since_s = parse_since(since)
    progress = Progress(lambda pages, events: f"read {pages:,} pages of {log_group}, {events:,} log events")
    return _from_logs(log_group, lambda: write_report_from_cloudwatch(
        _logs_client(region, logs_endpoint), log_group, out, since_s=since_s, namespace=namespace, advice=advice,
        progress=progress))


def _compare_report(sides: tuple[str, str], out: Path, namespace: str, region: str | None,
                    logs_endpoint: str | None) -> None:
    """Two runs side by side, each a run directory (with the advisor's findings for this machine, as the
    demo gives them) or a CloudWatch Logs range (profiling.report.parse_run_side: no findings)."""
    from pipeline.local.demo import run_advice
    from pipeline.local.runjson import checked_run
    from profiling import runfiles
    from profiling.report import (
        CloudWatchRange,
        DamagedInputError,
        ReportInputError,
        load_cloudwatch_range,
        load_run_dir,
        parse_run_side,
        write_comparison,
    )

    try:
        # Both sides are checked before anything is read; a DURATION side ends now, the same now for both.
        now = time.time()
        parsed = [parse_run_side(side, now=now) for side in sides]
        checks.output_file(out, "--out")
        checks.not_an_input(out, "--out", [path for side in parsed if isinstance(side, Path)
                                           for path in runfiles.read_paths(side)])
        if any(isinstance(side, CloudWatchRange) for side in parsed):
            region = checks.region(region)
        client = None
        runs: list[Any] = []
        advice: list[Any] = []
        for side in parsed:
            if isinstance(side, CloudWatchRange):
                client = client or _from_logs(side.log_group, partial(_logs_client, region, logs_endpoint))
                runs.append(_from_logs(side.log_group, partial(load_cloudwatch_range, client, side,
                                                               namespace=namespace)))
                advice.append(None)
                continue
            data = load_run_dir(side, namespace=namespace)
            advice.append(run_advice(_all_profiles(side, data, namespace), checked_run(data.run, side)))
            runs.append(data)
        names = [p.text if isinstance(p, CloudWatchRange) else (p.name or str(p)) for p in parsed]
        path = write_comparison(runs[0], runs[1], out, names=names, advice=advice)
    except DamagedInputError as exc:
        raise PermanentError(str(exc)) from None
    except ReportInputError as exc:
        raise UsageError(str(exc)) from None
    print(f"comparison: {path}")


def report(
    run_dir: Path | None = typer.Argument(None, metavar="RUN_DIR", help="A local run directory (default "
                                          ".iobatch/demo)."),
    out: Path | None = typer.Option(None, "--out", "-o", metavar="FILE", help="The HTML file (default "
                                    "RUN_DIR/report.html, or ./report.html with --from-cloudwatch)."),
    from_cloudwatch: str | None = typer.Option(None, "--from-cloudwatch", metavar="LOG_GROUP",
                                               help="Read the EMF documents of a batch in AWS from this "
                                               "CloudWatch Logs group instead of a run directory."),
    stack: str | None = typer.Option(None, "--stack", metavar="NAME", help="Read the EMF documents of a batch in AWS "
                                     "from this deployed stack's log group (its LogGroupName output), as "
                                     "--from-cloudwatch does."),
    since: str = typer.Option(DEFAULT_SINCE, metavar="DURATION", help="With --from-cloudwatch or --stack: how far "
                              "back to read (90s, 30m, 1h, 2d)."),
    namespace: str = typer.Option("IoBatch", metavar="NAME", help="The EMF namespace to keep, of a run directory's EMF "
                                  "files (read when it kept no profiles) or CloudWatch Logs: the one the sidecar "
                                  "wrote (its --namespace, else AWS_EMF_NAMESPACE)."),
    region: str | None = typer.Option(None, metavar="REGION", help="With CloudWatch Logs: the AWS region (default: "
                                      "AWS_REGION, then AWS_DEFAULT_REGION)."),
    logs_endpoint: str | None = typer.Option(None, metavar="URL", help="With CloudWatch Logs: a CloudWatch Logs "
                                             "endpoint other than AWS's (e.g. a local emulator)."),
    advice: Path | None = typer.Option(None, metavar="FILE", help="A JSON recommendation (`iobatch advise --json`) to "
                                       "show in the report (default for a local run: the advice the demo gives, "
                                       "from its run.json)."),
    compare: tuple[str, str] | None = typer.Option(None, "--compare", metavar="RUN_A RUN_B",
                                                   help="Compare two runs side by side, per stage (default --out "
                                                   "./compare.html). Each is a local run directory, with the "
                                                   "advisor's findings for this machine, or a CloudWatch Logs "
                                                   "range: cw:LOG_GROUP@START..END, ISO 8601 times, UTC "
                                                   "unless a zone is given (cw:G@2026-11-20T10:00..2026-11-20T"
                                                   "11:30+01:00; no END: until now), or cw:LOG_GROUP@DURATION "
                                                   "(the last 90s, 30m, 1h, 2d). Name a directory that starts "
                                                   "with cw: as ./cw:..."),
) -> None:
    """Write the HTML report of a run: per-stage plots, a timeline per child, bad apples, contract rule
    results and the advisor's recommendation. The file opens offline (plotly.js is embedded)."""
    from pipeline.errors import PermanentError
    from profiling import runfiles
    from profiling.report import DamagedInputError, ReportInputError, check_log_group, write_report

    logs_endpoint = checks.endpoint_url(logs_endpoint, "--logs-endpoint")  # given, it is checked, used or not
    try:  # before the network: the one check `--compare cw:` makes too
        from_cloudwatch = None if from_cloudwatch is None else check_log_group(from_cloudwatch)
    except ReportInputError as exc:
        raise UsageError(str(exc)) from None
    if stack is not None:
        if from_cloudwatch is not None or run_dir is not None or compare is not None:
            raise UsageError("give --stack NAME alone, without a run directory, --from-cloudwatch or --compare: it "
                             "reads the stack's own log group")
        checks.stack_name(stack)
    # The CloudWatch Logs flags, given where nothing is read from CloudWatch Logs, would be silently ignored
    # (--namespace is also a local run's: its EMF files').
    cloud_flags = {"since": "--since", "region": "--region", "logs_endpoint": "--logs-endpoint"}
    if compare is not None:
        if run_dir is not None or from_cloudwatch is not None or advice is not None:
            raise UsageError("give --compare RUN_A RUN_B alone, without a run directory, --from-cloudwatch or "
                             "--advice (it runs the advisor on each local run itself)")
        checks.unused_flags({"since": "--since"}, "with --from-cloudwatch or --stack (a cw: side of --compare "
                            "names its own range)")
        if not any(side.startswith("cw:") for side in compare):
            checks.unused_flags(cloud_flags, "with CloudWatch Logs (a cw: side of --compare)")
        _compare_report(compare, out or Path("compare.html"), checks.emf_namespace(namespace), region, logs_endpoint)
        return
    checks.emf_namespace(namespace)
    if from_cloudwatch is None and stack is None:
        checks.unused_flags(cloud_flags, "with --from-cloudwatch or --stack, not with a local run directory")
    given = _read_advice(advice)
    if from_cloudwatch is not None and run_dir is not None:
        raise UsageError("give a run directory or --from-cloudwatch LOG_GROUP, not both")
    # The output is checked before anything is read, and written whole or not at all (runfiles).
    in_aws = from_cloudwatch is not None or stack is not None
    target = out or (Path("report.html") if in_aws else None)
    if target is not None:
        checks.output_file(target, "--out")
        reads = [] if in_aws else runfiles.read_paths(run_dir or Path(".iobatch/demo"))
        checks.not_an_input(target, "--out", [*reads, *([advice] if advice else [])])
    if stack is not None:  # its log group: the stack's LogGroupName output (one DescribeStacks)
        from pipeline.cli.batch import read_stack

        region = checks.region(region)
        from_cloudwatch = read_stack(stack, region)[0].log_group
    try:
        if from_cloudwatch is not None:
            path = _cloudwatch_report(from_cloudwatch, target or Path("report.html"), since, namespace,
                                      checks.region(region), logs_endpoint, given)
        else:
            local = run_dir or Path(".iobatch/demo")
            path = write_report(local, out, advice=_run_dir_advice(local, given, namespace), namespace=namespace,
                                progress=Progress(lambda done, files: f"read {done:,} of {files:,} profile files"))
    except DamagedInputError as exc:
        raise PermanentError(str(exc)) from None
    except ReportInputError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # the default RUN_DIR/report.html, when the run directory is read-only
        raise UsageError(f"cannot write the report ({exc.strerror}): give --out FILE") from None
    print(f"report: {path}")
