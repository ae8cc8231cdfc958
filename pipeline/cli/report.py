"""`iobatch report`: the HTML report of a run, from a run directory or CloudWatch Logs (profiling/report/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pipeline.errors import UsageError


def _read_advice(path: Path | None) -> Any:
    import json

    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--advice {path}: cannot read it ({exc.strerror}): give a JSON file") from None
    except ValueError as exc:
        raise UsageError(f"--advice {path} is not JSON ({exc}): give the JSON the advisor wrote") from None


def _cloudwatch_report(log_group: str, out: Path, since: str, namespace: str, region: str | None,
                       logs_endpoint: str | None, advice: Any) -> Path:
    """The report from CloudWatch Logs: the AWS edge (client, region, errors) around profiling.report."""
    import os

    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from pipeline.aws import logs_error
    from pipeline.interface import AWS_ENV
    from profiling.report import parse_since, write_report_from_cloudwatch

    since_s = parse_since(since)
    try:
        # AWS_REGION is what Batch and most tools set; boto3 itself reads only AWS_DEFAULT_REGION.
        region = region or os.environ.get(AWS_ENV.REGION) or None
        client = boto3.client("logs", region_name=region, endpoint_url=logs_endpoint)
        return write_report_from_cloudwatch(client, log_group, out, since_s=since_s, namespace=namespace,
                                            advice=advice)
    except (BotoCoreError, ClientError) as exc:
        raise logs_error(exc, log_group=log_group) from None


def report(
    run_dir: Path | None = typer.Argument(None, help="A local run directory (default .iobatch/demo)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="The HTML file (default RUN_DIR/report.html, "
                                    "or ./report.html with --from-cloudwatch)."),
    from_cloudwatch: str | None = typer.Option(None, "--from-cloudwatch", metavar="LOG_GROUP",
                                               help="Read the EMF documents of a batch in AWS from this "
                                               "CloudWatch Logs group instead of a run directory."),
    since: str = typer.Option("1h", help="With --from-cloudwatch: how far back to read (90s, 30m, 1h, 2d)."),
    namespace: str = typer.Option("IoBatch", help="With --from-cloudwatch: the EMF namespace to keep."),
    region: str | None = typer.Option(None, help="With --from-cloudwatch: the AWS region (default: AWS_REGION, "
                                      "then AWS_DEFAULT_REGION)."),
    logs_endpoint: str | None = typer.Option(None, help="With --from-cloudwatch: a CloudWatch Logs endpoint "
                                             "other than AWS's (e.g. a local emulator)."),
    advice: Path | None = typer.Option(None, help="A JSON recommendation (from the advisor) to show in the report."),
) -> None:
    """Write the HTML report of a run: per-stage plots, a timeline per child, bad apples, contract rule
    results and the advisor's recommendation. The file opens offline (plotly.js is embedded)."""
    from pipeline.errors import PermanentError
    from profiling.report import DamagedInputError, ReportInputError, write_report

    given = _read_advice(advice)
    try:
        if from_cloudwatch is not None:
            if run_dir is not None:
                raise UsageError("give a run directory or --from-cloudwatch LOG_GROUP, not both")
            path = _cloudwatch_report(from_cloudwatch, out or Path("report.html"), since, namespace, region,
                                      logs_endpoint, given)
        else:
            path = write_report(run_dir or Path(".iobatch/demo"), out, advice=given)
    except DamagedInputError as exc:
        raise PermanentError(str(exc)) from None
    except ReportInputError as exc:
        raise UsageError(str(exc)) from None
    print(f"report: {path}")
