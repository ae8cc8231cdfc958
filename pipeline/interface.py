"""The job's interface: what the job, its launchers (AWS Batch, `iobatch submit`, the local executor) and the
stack (infra/) agree on.

Exit codes, environment variable names, container names and commands, the scratch mount and the stack's
output keys are each defined here once. This module is a leaf: it imports nothing from the project, so the
CDK app can use it without the job's dependencies, and a test can check that the synthesized job
definition speaks exactly this interface.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

# ---- exit codes (sysexits(3)): the AWS Batch retry strategy keys on them ---------------------------

EXIT_OK = 0  # the child finished (or was already complete and skipped)
EXIT_BUG = 1  # an unexpected error; a traceback is printed
EXIT_USAGE = 64  # a flag or variable is wrong; nothing was done
EXIT_PERMANENT = 65  # bad input (manifest, key, image, bucket, damaged profile/EMF/run.json/--advice file): not retried
EXIT_RETRYABLE = 75  # throttling, network, interruption: a retry can succeed


def batch_exit_code(child_codes: Iterable[int]) -> int:
    """The exit code of a whole batch from the exit codes of its failed children.

    0 when no child failed; 65 when any child failed on bad input (65) or a bad variable (64: in AWS, the
    stack's or image's settings), because a rerun cannot complete the batch; else 75, because a rerun can:
    a killed child or a bug leaves no marker and is redone (`iobatch run`, `demo`, `submit --local` and
    `status --watch` all use this).
    """
    codes = set(child_codes)
    if not codes:
        return EXIT_OK
    return EXIT_PERMANENT if codes & {EXIT_PERMANENT, EXIT_USAGE} else EXIT_RETRYABLE


def exit_code_of(returncode: int) -> int:
    """A process's exit code as a shell reports it: a child killed by signal N exits 128 + N (Python's
    subprocess gives -N), so retry rules and people read a kill the same way everywhere."""
    return 128 - returncode if returncode < 0 else returncode


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
    # The process stage's command line, with {input} and {output} (default: the built-in resizer,
    # DEFAULT_PROCESS_COMMAND). The job definition sets it (context key processCommand); submit may override.
    PROCESS_COMMAND = "IOBATCH_PROCESS_COMMAND"
    # Names this attempt's scratch directory and profiler socket, the same in the job and the sidecar.
    # Unset in AWS: both containers read the ECS task id from the task metadata endpoint instead.
    TASK_ID = "IOBATCH_TASK_ID"
    # A contract file the profiler evaluates per stage (`iobatch sidecar --contract`): the image ships the
    # project's under CONTRACTS_DIR; the job definition sets it (context key profilerContract).
    CONTRACT = "IOBATCH_CONTRACT"
    TIMEOUT_S = "IOBATCH_TIMEOUT_S"  # the job definition's attempt timeout: the job stops itself before it
    # 1: the job and every dynamically linked program it starts run with the LD_PRELOAD interposer, recording
    # into the attempt's scratch directory where the profiler reads (context key profilerInterpose).
    INTERPOSE = "IOBATCH_INTERPOSE"
    REQUIRE_PREPARED_SCRATCH = "IOBATCH_REQUIRE_PREPARED_SCRATCH"  # 1: scratch must carry the host's marker
    # Set by AWS Batch itself.
    ARRAY_INDEX = "AWS_BATCH_JOB_ARRAY_INDEX"
    JOB_ID = "AWS_BATCH_JOB_ID"
    ATTEMPT = "AWS_BATCH_JOB_ATTEMPT"
    QUEUE = "AWS_BATCH_JQ_NAME"
    # Set by the ECS agent in every container of a task (agent 1.39.0 and later on EC2): "Amazon ECS
    # task metadata endpoint version 4" in the Amazon ECS Developer Guide. GET ${it}/task answers the
    # task's metadata, whose TaskARN ends in the task id both containers of one task share.
    ECS_METADATA = "ECS_CONTAINER_METADATA_URI_V4"


class AWS_ENV(_Names):
    """Names of the variables the job definition sets for the AWS libraries and s5cmd, beside ENV."""

    REGION = "AWS_REGION"  # boto3 and s5cmd find the buckets' region without a lookup
    EMF_ENVIRONMENT = "AWS_EMF_ENVIRONMENT"  # "Local": EMF goes to stdout, which awslogs ships
    EMF_NAMESPACE = "AWS_EMF_NAMESPACE"  # also the sidecar's default --namespace
    EMF_SERVICE_NAME = "AWS_EMF_SERVICE_NAME"


#: Where the job image keeps the project's contracts (contracts/ of the repository).
CONTRACTS_DIR = "/opt/iobatch/contracts"
CONTRACT_SUFFIX = ".contract"


def contract_in_image(value: str) -> str:
    """The contract file a job definition's profiler reads (ENV.CONTRACT): a contract the image ships, by name
    (`case-study` is CONTRACTS_DIR/case-study.contract), or an absolute path in the image (a user's own)."""
    return value if value.startswith("/") else f"{CONTRACTS_DIR}/{value}{CONTRACT_SUFFIX}"

PROFILER_OFF = "off"  # the value of ENV.PROFILER_SOCKET that runs the job without a profiler

# ---- an attempt's scratch directory and its soft deadline ------------------------------------------

#: Every attempt works in SCRATCH/<TASK_DIR_PREFIX><task id>/: children of several batches (and a
#: `--force` rerun while the first run still runs) share one host's scratch volume, so the directory is
#: named by the attempt, never by the array index alone. Sweepers remove only directories with this prefix.
TASK_DIR_PREFIX = "task-"


def task_dir_name(task_id: str) -> str:
    """The scratch subdirectory of one attempt (the job's and the sidecar's rendezvous)."""
    return TASK_DIR_PREFIX + task_id


def soft_deadline_s(timeout_s: float) -> float:
    """Seconds after it starts at which a job with this attempt timeout stops itself (exit 75, retried).

    AWS Batch does not retry an attempt it terminated for its timeout ("Job timeouts", AWS Batch User
    Guide: jobs terminated for exceeding the timeout are not retried), so the job leaves first: a fifth
    of the timeout early, at most five minutes (time to stop, flush the profile, and for the clocks to
    disagree).
    """
    return timeout_s - min(300.0, timeout_s / 5)

# ---- the process stage's command ---------------------------------------------------------------------

#: The process stage runs a command line (ENV.PROCESS_COMMAND) with these two placeholders: the directory of
#: the downloaded images and an empty directory whose every file is uploaded under the child's output prefix.
PROCESS_INPUT = "{input}"
PROCESS_OUTPUT = "{output}"
#: The built-in resizer is one such command: the default, so there is one path.
DEFAULT_PROCESS_COMMAND = f"iobatch process {PROCESS_INPUT} {PROCESS_OUTPUT}"
#: The child's completion marker under its output prefix, written last: no command output may take its name.
SUCCESS_MARKER = "_SUCCESS"
MAX_PROCESS_COMMAND = 4096  # characters: a command line, not a script


class PROCESS_ENV(_Names):
    """Variables the job sets for its process command, beside its own environment (profiling.protocol names
    the one that leads to the profiler, for sub-stages)."""

    CHILD = "IOBATCH_CHILD"  # the child's name, part-NNNNN
    # A JSON Lines file, one downloaded image a line: {"file": NAME in the input directory, "key": its S3 key,
    # "size": bytes, "etag": the ETag the batch was frozen with, when known}.
    IMAGES = "IOBATCH_PROCESS_IMAGES"


def process_command_problem(text: str) -> str | None:
    """Why `text` cannot be a process command line (a sentence naming the fix), or None when it can."""
    if len(text) > MAX_PROCESS_COMMAND:
        return f"is {len(text)} characters, over {MAX_PROCESS_COMMAND}: put the work in a script and name it"
    try:
        words = shlex.split(text)
    except ValueError as exc:
        return f"is not a command line ({exc}): quote it as a shell would"
    if not words:
        return f"is empty: give a command, e.g. {DEFAULT_PROCESS_COMMAND!r}"
    for placeholder in (PROCESS_INPUT, PROCESS_OUTPUT):
        if not any(placeholder in word for word in words):
            return f"has no {placeholder}: write where the images are and where outputs go, " \
                   f"e.g. 'python3 stats.py {PROCESS_INPUT} {PROCESS_OUTPUT}'"
    if PROCESS_INPUT in words[0] or PROCESS_OUTPUT in words[0]:
        return "starts with a placeholder: the first word is the program"
    return None


def process_argv(text: str, input_dir: str, output_dir: str) -> list[str]:
    """The command line `text` (checked by process_command_problem) with its placeholders filled in."""
    return [word.replace(PROCESS_INPUT, input_dir).replace(PROCESS_OUTPUT, output_dir) for word in shlex.split(text)]


# ---- the task: containers and the scratch volume ---------------------------------------------------

#: Where the scratch volume is mounted in both containers, and the default of ENV.SCRATCH.
SCRATCH_MOUNT = "/scratch"
# Where the profiler container sees the host's cgroup v2 hierarchy, read-only (the job's own figures).
HOST_CGROUP_MOUNT = "/host/sys/fs/cgroup"

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
#: Outputs read when present: the only prefixes the job role may read (input) and write (output) under, and the CDK
#: context the stack was deployed with as one JSON object (infra.settings.StackSettings.to_context), from which
#: `iobatch advise --stack` reads the plan and writes the deploy that applies its advice (tuning.deployed).
OPTIONAL_OUTPUT_KEYS: dict[str, str] = {"input_prefix": "InputPrefix", "output_prefix": "OutputPrefix",
                                        "deploy_context": "DeployContext"}
#: Every output the stack emits, in template order.
STACK_OUTPUT_KEYS: dict[str, str] = {**OUTPUT_KEYS, **OPTIONAL_OUTPUT_KEYS}
