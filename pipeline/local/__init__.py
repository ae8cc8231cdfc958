"""Batches on this machine, exactly as AWS Batch runs them: the same job, the same environment, a profiler
beside every child.

- runner: `run_local`, a frozen batch (prefix or manifest) run against any S3 endpoint (`iobatch run`);
- executor: the local array executor (each child is `iobatch job` plus `iobatch sidecar`);
- demo: the demo's synthetic batch on the embedded S3 server (`iobatch demo`), its advice, the lab's batch;
- submit: `iobatch submit --local` (the AWS side, pipeline.submit, never imports this package);
- dataset, s3server, proxy: synthetic images, the embedded S3 server (versitygw), the slow child's proxy.
"""

from __future__ import annotations

from pipeline.local.demo import DemoOptions, DemoResult, demo_advice, lab_batch, run_demo
from pipeline.local.executor import BatchResult, ChildOutcome, LocalBatch, run_batch
from pipeline.local.runner import LocalRun, prepare_run_dir, prepared_run_dir, run_local
from pipeline.local.submit import outcome_json, outcome_lines, submit_local

__all__ = [
    "BatchResult",
    "ChildOutcome",
    "DemoOptions",
    "DemoResult",
    "LocalBatch",
    "LocalRun",
    "demo_advice",
    "lab_batch",
    "outcome_json",
    "outcome_lines",
    "prepare_run_dir",
    "prepared_run_dir",
    "run_batch",
    "run_demo",
    "run_local",
    "submit_local",
]
