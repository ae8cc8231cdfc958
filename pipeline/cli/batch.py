"""Batches: `iobatch submit` (to AWS Batch, or --local) and `iobatch status` (pipeline/submit/,
pipeline/local/submit.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from pipeline.cli import checks
from pipeline.errors import UsageError
from pipeline.settings import MAX_IMAGES_PER_CHILD, MAX_WORKERS


def _print_json(body: Any) -> None:
    import json

    print(json.dumps(body, separators=(",", ":")), flush=True)


def _session(region: str | None) -> Any:
    """A boto3 session in the region of --region or the usual variables (boto3 alone reads only
    AWS_DEFAULT_REGION, while Batch and most tools set AWS_REGION)."""
    import boto3

    from pipeline.aws import refuse_foreign_answers
    from pipeline.endpoints import configured_endpoint

    for client in ("sts", "cloudformation", "batch"):  # AWS_ENDPOINT_URL(_<SERVICE>), checked as a flag's URL is
        configured_endpoint(client)
    session = boto3.session.Session(region_name=checks.region(region))
    refuse_foreign_answers(session.events, service="AWS", fix="check AWS_ENDPOINT_URL and any HTTPS proxy")
    return session


def read_stack(stack: str, region: str | None) -> tuple[Any, Any]:
    """(the deployed stack's outputs, the session that read them): one DescribeStacks, the first AWS call of `report
    --stack` and `advise --stack`, which find the log group and the deployed context there."""
    from pipeline import submit as submission

    name = checks.stack_name(stack)
    session = _session(region)
    submission.require_credentials(session)
    cfn, _ = submission.aws_clients(session)
    return submission.StackOutputs.from_stack(cfn, name), session


def submit(
    manifest: str | None = typer.Option(None, "--manifest", metavar="s3://BUCKET/KEY.jsonl", help="One image a "
                                        "line; keys are in the stack's input bucket (--local: the manifest's "
                                        "bucket)."),
    prefix: str | None = typer.Option(None, "--prefix", metavar="s3://BUCKET/PREFIX/", help="Every image under "
                                      "it."),
    images_per_job: int = typer.Option(..., "--images-per-job", "-k", min=1, max=MAX_IMAGES_PER_CHILD,
                                       metavar="N", help="Images per array child."),
    stack: str | None = typer.Option(None, "--stack", metavar="NAME", help="Deployed stack: queue, job definition, "
                                     "buckets."),
    local: bool = typer.Option(False, "--local", help="Run on this machine with the local executor."),
    output: str | None = typer.Option(None, "--output", metavar="s3://BUCKET/PREFIX/", help="Where the shards go "
                                      "(default: the stack's output bucket /<batch name>/)."),
    force: bool = typer.Option(False, "--force", help="Redo children whose _SUCCESS marker exists."),
    s3_endpoint: str | None = typer.Option(None, "--s3-endpoint", metavar="URL", help="Another S3 (default: AWS, or "
                                           "the embedded server with --local)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and plan; write and submit nothing."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    run_dir: Path | None = typer.Option(None, "--run-dir", metavar="DIR", help="--local: run directory "
                                        "(default .iobatch/local/<batch name>)."),
    workers: int | None = typer.Option(None, "--workers", min=1, max=MAX_WORKERS,
                                       metavar="N", help="--local: children at once (default: one per core)."),
    region: str | None = typer.Option(None, "--region", metavar="REGION", help="--stack: the AWS region (default: "
                                      "AWS_REGION, then AWS_DEFAULT_REGION)."),
    process_command: str | None = typer.Option(None, "--process-command", metavar="COMMAND",
                                               help="The process stage's command line for this batch (default: the "
                                               "job definition's; its program must be in the job image)."),
) -> None:
    """Submit a batch: freeze its manifest once, then one array job per 10,000 children.

    Every input is checked before anything is submitted. Children whose outputs are complete are
    skipped unless --force, so submitting the same manifest twice processes nothing twice.
    """
    from pipeline import submit as submission
    from pipeline.local.submit import outcome_json, outcome_lines, submit_local

    if (stack is None) == (not local):
        raise UsageError("give exactly one of --stack NAME (AWS Batch) or --local (this machine)")
    if local:
        checks.unused_flags({"region": "--region"}, "with --stack (AWS Batch)")
    else:
        checks.unused_flags({"run_dir": "--run-dir", "workers": "--workers"}, "with --local (this machine)")
    if run_dir is not None:
        checks.output_dir(run_dir, "--run-dir")
    # --local without --s3-endpoint is the embedded server; a stack's S3 is AWS_ENDPOINT_URL_S3's, as boto3 reads it.
    endpoint = checks.endpoint_url(s3_endpoint, client=None if local else "s3")
    common: dict[str, Any] = dict(manifest=manifest, prefix=prefix, images_per_child=images_per_job,
                                  output=output, force=force, s3_endpoint=endpoint, dry_run=dry_run,
                                  process_command=process_command)
    if stack is not None:
        result = submission.submit_to_stack(stack=checks.stack_name(stack), session=_session(region), **common)
        if as_json:
            _print_json(result.to_json())
        else:
            print("\n".join(result.lines()), flush=True)
        return
    result, outcome = submit_local(run_dir=run_dir, workers=workers, progress=None if not as_json else False,
                                   **common)
    body = result.to_json()
    if outcome is not None:
        body["local"] = outcome_json(outcome)
    if as_json:
        _print_json(body)
    else:
        lines = result.lines()[:2]
        lines += outcome_lines(outcome) if outcome is not None else result.lines()[2:]
        print("\n".join(lines), flush=True)
    if outcome is not None and outcome.failed:
        raise typer.Exit(outcome.exit_code)


def status(
    job_ids: list[str] = typer.Argument(..., metavar="JOB_ID", help="The job id(s) `iobatch submit` printed."),
    watch: bool = typer.Option(False, "--watch", help="Follow until every child has finished."),
    as_json: bool = typer.Option(False, "--json", help="JSON on stdout (one line per poll with --watch)."),
    interval: float = typer.Option(10.0, "--interval", min=0.1, max=3600.0,
                                   metavar="SECONDS", help="Seconds between polls with --watch."),
    region: str | None = typer.Option(None, "--region", metavar="REGION", help="The AWS region (default: AWS_REGION, "
                                      "then AWS_DEFAULT_REGION)."),
) -> None:
    """Children pending, runnable, starting, running, succeeded and failed; images done; failed children.

    Exit 0 when the status was read; with --watch, when children failed: 65 if one exited 65 (bad input: a
    rerun cannot complete the batch), else 75 (a rerun can), as for batches run here.
    """
    from pipeline import submit as submission

    job_ids = checks.job_ids(job_ids)
    if not watch:
        checks.unused_flags({"interval": "--interval"}, "with --watch")
    session = _session(region)
    submission.require_credentials(session)
    _, batch = submission.aws_clients(session)
    logs = session.client("logs")  # the hosts' qualifications in the pipeline's log group (pipeline/submit/hosts.py)

    def show(state: submission.BatchStatus) -> None:
        if as_json:
            _print_json(state.to_json())
        else:
            print("\n".join(state.lines()), flush=True)

    if not watch:
        show(submission.poll_status(batch, job_ids, logs_client=logs))
        return
    if sys.stdout.isatty() and not as_json:
        bar, update = submission.progress_view(0)
        with bar:
            final = submission.follow(batch, job_ids, interval_s=interval, show=update, logs_client=logs)
        print("\n".join(final.lines()), flush=True)
    else:
        final = submission.follow(batch, job_ids, interval_s=interval, show=show, logs_client=logs)
    if final.count("FAILED"):
        raise typer.Exit(final.exit_code)
