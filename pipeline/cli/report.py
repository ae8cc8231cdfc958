"""`iobatch report`: the HTML report of a run, from a run directory or CloudWatch Logs (profiling/report/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pipeline.cli import checks
from pipeline.errors import PermanentError, UsageError


def _read_advice(path: Path | None) -> Any:
    if path is None:
        return None
    return checks.json_object(path, "--advice", "the JSON object `iobatch advise --json` printed")


def _cloudwatch_report(log_group: str, out: Path, since: str, namespace: str, region: str | None,
                       logs_endpoint: str | None, advice: Any) -> Path:
    """The report from CloudWatch Logs: the AWS edge (client, region, errors) around profiling.report."""
    import os

    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from pipeline.aws import logs_error, refuse_foreign_answers
    from pipeline.interface import AWS_ENV
    from profiling.report import parse_since, write_report_from_cloudwatch

    since_s = parse_since(since)
    try:
        # AWS_REGION is what Batch and most tools set; boto3 itself reads only AWS_DEFAULT_REGION.
        region = region or os.environ.get(AWS_ENV.REGION) or None
        client = boto3.client("logs", region_name=region, endpoint_url=logs_endpoint)
        refuse_foreign_answers(client.meta.events, service="CloudWatch Logs",
                               fix="point --logs-endpoint at CloudWatch Logs (or leave it out for AWS's)")
        return write_report_from_cloudwatch(client, log_group, out, since_s=since_s, namespace=namespace,
                                            advice=advice)
    except (BotoCoreError, ClientError) as exc:
        raise logs_error(exc, log_group=log_group) from None


def _compare_report(runs: tuple[Path, Path], out: Path) -> None:
    """Two run directories side by side, each with the advisor's findings for this machine (local/demo)."""
    from pipeline.local.demo import demo_advice
    from profiling import runfiles
    from profiling.report import DamagedInputError, ReportInputError, write_comparison

    checks.output_file(out, "--out")
    try:
        advice = []
        for run in runs:
            profiles = list(runfiles.read_profiles(run)) if run.is_dir() else []
            workers = int((runfiles.read_run(run) if runfiles.is_run_dir(run) else {}).get("workers") or 2)
            advice.append(demo_advice(profiles, workers, say=lambda _: None) if profiles else None)
        path = write_comparison(runs[0], runs[1], out, advice=advice)
    except (DamagedInputError, runfiles.DamagedFileError) as exc:
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
    since: str = typer.Option("1h", metavar="DURATION", help="With --from-cloudwatch: how far back to read (90s, 30m, "
                              "1h, 2d)."),
    namespace: str = typer.Option("IoBatch", metavar="NAME", help="With --from-cloudwatch: the EMF namespace to keep."),
    region: str | None = typer.Option(None, metavar="REGION", help="With --from-cloudwatch: the AWS region (default: "
                                      "AWS_REGION, then AWS_DEFAULT_REGION)."),
    logs_endpoint: str | None = typer.Option(None, metavar="URL", help="With --from-cloudwatch: a CloudWatch Logs "
                                             "endpoint other than AWS's (e.g. a local emulator)."),
    advice: Path | None = typer.Option(None, metavar="FILE", help="A JSON recommendation (from the advisor) to show in "
                                       "the report."),
    compare: tuple[Path, Path] | None = typer.Option(None, "--compare", metavar="RUN_A RUN_B",
                                                     help="Compare two local run directories side by side, per "
                                                     "stage, with the advisor's findings of each (default --out "
                                                     "./compare.html)."),
) -> None:
    """Write the HTML report of a run: per-stage plots, a timeline per child, bad apples, contract rule
    results and the advisor's recommendation. The file opens offline (plotly.js is embedded)."""
    from pipeline.errors import PermanentError
    from profiling.report import DamagedInputError, ReportInputError, write_report

    if compare and all(compare):
        if run_dir is not None or from_cloudwatch is not None:
            raise UsageError("give --compare RUN_A RUN_B alone, without a run directory or --from-cloudwatch")
        _compare_report(compare, out or Path("compare.html"))
        return
    given = _read_advice(advice)
    if from_cloudwatch is not None and run_dir is not None:
        raise UsageError("give a run directory or --from-cloudwatch LOG_GROUP, not both")
    # The output is checked before anything is read, and written whole or not at all (runfiles).
    target = out or (Path("report.html") if from_cloudwatch is not None else None)
    if target is not None:
        checks.output_file(target, "--out")
    try:
        if from_cloudwatch is not None:
            path = _cloudwatch_report(from_cloudwatch, target or Path("report.html"), since, namespace,
                                      checks.region(region), checks.endpoint_url(logs_endpoint, "--logs-endpoint"),
                                      given)
        else:
            path = write_report(run_dir or Path(".iobatch/demo"), out, advice=given)
    except DamagedInputError as exc:
        raise PermanentError(str(exc)) from None
    except ReportInputError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # the default RUN_DIR/report.html, when the run directory is read-only
        raise UsageError(f"cannot write the report ({exc.strerror}): give --out FILE") from None
    print(f"report: {path}")
