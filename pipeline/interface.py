"""The job's interface: what the job, its launchers (AWS Batch, `iobatch submit`, the local executor) and the
stack (infra/) agree on.

Exit codes, environment variable names, container names and commands, the scratch mount and the stack's
output keys are each defined here once. This module is a leaf: it imports nothing from the project, so the
CDK app can use it without the job's dependencies, and a test can check that the synthesized job
definition speaks exactly this interface.
"""

from __future__ import annotations

from collections.abc import Iterable

# ---- exit codes (sysexits(3)): the AWS Batch retry strategy keys on them ---------------------------

EXIT_OK = 0  # the child finished (or was already complete and skipped)
EXIT_BUG = 1  # an unexpected error; a traceback is printed
EXIT_USAGE = 64  # a flag or variable is wrong; nothing was done
EXIT_PERMANENT = 65  # bad input (manifest, key, image, bucket): retrying cannot help
EXIT_RETRYABLE = 75  # throttling, network, interruption: a retry can succeed


def batch_exit_code(child_codes: Iterable[int]) -> int:
    """The exit code of a whole batch from the exit codes of its failed children.

    0 when no child failed; 65 when any child failed permanently, because a rerun cannot complete the
    batch; else 75, because a rerun can (`iobatch run`, `demo` and `submit --local` all use this).
    """
    codes = set(child_codes)
    if not codes:
        return EXIT_OK
    return EXIT_PERMANENT if EXIT_PERMANENT in codes else EXIT_RETRYABLE


# ---- environment -----------------------------------------------------------------------------------


class _Names:
    """A namespace of environment variable names."""

    @classmethod
    def names(cls) -> frozenset[str]:
        """Every variable name this class defines."""
        return frozenset(value for key, value in vars(cls).items() if key.isupper() and isinstance(value, str))


class ENV(_Names):
    """Names of the environment variables the job and its profiler read.

    AWS Batch sets them through the job definition (infra/jobs.py) and SubmitJob's overrides
    (`iobatch submit`); the local executor sets the same ones, so the job cannot tell them apart.
    """

    S3_ENDPOINT = "IOBATCH_S3_ENDPOINT"  # optional; AWS when unset
    INPUT = "IOBATCH_INPUT"  # s3://bucket/prefix/ the images live under
    MANIFEST = "IOBATCH_MANIFEST"  # s3://bucket/key.jsonl: the frozen list of keys (one JSON object a line)
    OUTPUT = "IOBATCH_OUTPUT"  # s3://bucket/prefix/ the shards go to
    SCRATCH = "IOBATCH_SCRATCH"  # root of the scratch volume; each child works in its own subdirectory
    IMAGES_PER_CHILD = "IOBATCH_IMAGES_PER_CHILD"
    ARRAY_OFFSET = "IOBATCH_ARRAY_OFFSET"  # added to the array index when a batch spans several array jobs
    TRAIN_SIZE = "IOBATCH_TRAIN_SIZE"  # WIDTHxHEIGHT of the training images
    SKIP_BAD_IMAGES = "IOBATCH_SKIP_BAD_IMAGES"
    S5CMD_WORKERS = "IOBATCH_S5CMD_WORKERS"
    S5CMD_RETRIES = "IOBATCH_S5CMD_RETRIES"  # s5cmd --retry-count (default: s5cmd's own, 10)
    PIPELINE = "IOBATCH_PIPELINE"  # the Pipeline dimension of every metric
    PROFILER_SOCKET = "IOBATCH_PROFILER_SOCKET"  # default: <child scratch>/profiler.sock; PROFILER_OFF: none
    VOLUME_TYPE = "IOBATCH_VOLUME_TYPE"  # reported as a property (st1, gp3, ...)
    FORCE = "IOBATCH_FORCE"  # 1: redo children whose _SUCCESS marker exists (`iobatch submit --force`)
    # Set by AWS Batch itself.
    ARRAY_INDEX = "AWS_BATCH_JOB_ARRAY_INDEX"
    JOB_ID = "AWS_BATCH_JOB_ID"
    QUEUE = "AWS_BATCH_JQ_NAME"


class AWS_ENV(_Names):
    """Names of the variables the job definition sets for the AWS libraries and s5cmd, beside ENV."""

    REGION = "AWS_REGION"  # boto3 and s5cmd find the buckets' region without a lookup
    EMF_ENVIRONMENT = "AWS_EMF_ENVIRONMENT"  # "Local": EMF goes to stdout, which awslogs ships
    EMF_NAMESPACE = "AWS_EMF_NAMESPACE"  # also the sidecar's default --namespace
    EMF_SERVICE_NAME = "AWS_EMF_SERVICE_NAME"


PROFILER_OFF = "off"  # the value of ENV.PROFILER_SOCKET that runs the job without a profiler

# ---- the task: containers and the scratch volume ---------------------------------------------------

#: Where the scratch volume is mounted in both containers, and the default of ENV.SCRATCH.
SCRATCH_MOUNT = "/scratch"

#: Container names of the multi-container job definition: the job and its profiler sidecar.
JOB_CONTAINER = "job"
PROFILER_CONTAINER = "profiler"
CONTAINERS: tuple[str, ...] = (JOB_CONTAINER, PROFILER_CONTAINER)

#: The command each container runs: one image, two `iobatch` commands.
CONTAINER_COMMANDS: dict[str, tuple[str, ...]] = {
    JOB_CONTAINER: ("iobatch", "job"),
    PROFILER_CONTAINER: ("iobatch", "sidecar"),
}

# ---- the stack's CloudFormation outputs: `iobatch submit --stack` reads them -----------------------

#: Outputs submission needs, by the StackOutputs field they fill.
OUTPUT_KEYS: dict[str, str] = {
    "input_bucket": "InputBucketName",
    "output_bucket": "OutputBucketName",
    "job_queue": "JobQueueArn",
    "job_definition": "JobDefinitionArn",
    "log_group": "LogGroupName",
    "pipeline": "PipelineName",
    "dashboard": "DashboardName",
    "volume_type": "VolumeType",
}
#: Outputs read when present: the only prefixes the job role may read (input) and write (output) under.
OPTIONAL_OUTPUT_KEYS: dict[str, str] = {"input_prefix": "InputPrefix", "output_prefix": "OutputPrefix"}
#: Every output the stack emits, in template order.
STACK_OUTPUT_KEYS: dict[str, str] = {**OUTPUT_KEYS, **OPTIONAL_OUTPUT_KEYS}
