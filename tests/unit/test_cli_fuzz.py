"""The CLI's flags fuzzed with hypothesis: whatever a person types, the answer is a documented exit code and
at most one error line, never a traceback.

The commands' actions (starting the S3 server, running a batch, a command, the profiler, AWS calls, the
report, the advisor) are replaced by a stub that records they were reached: input that passes every check
reaches the action, input that does not is refused with one line, and nothing runs for real.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.cli import app
from pipeline.errors import EXIT_OK, EXIT_PERMANENT, EXIT_RETRYABLE, EXIT_USAGE
from pipeline.interface import AWS_ENV, ENV, PROCESS_ENV
from tests.support import cli
from tests.support.cli import CliRunner

# A hang inside a Hypothesis test is ended for good (stacks, then exit): with the signal method the
# timeout's failure is caught by Hypothesis, which shrinks by running the hanging case again.
pytestmark = pytest.mark.timeout(300, method="thread")

DOCUMENTED = {EXIT_OK, EXIT_USAGE, EXIT_PERMANENT, EXIT_RETRYABLE}
SECRET = "FUZZSECRET"  # a password inside an endpoint URL: no output may hold it


# What each command would do once its flags are checked.
ACTIONS = ["pipeline.local.demo.run_demo", "pipeline.local.runner.run_local", "pipeline.local.runner.prepare_run_dir",
           "pipeline.local.submit.submit_local", "pipeline.submit.submit_to_stack",
           "pipeline.submit.require_credentials", "profiling.command.profile_command", "profiling.sidecar.Sidecar.bind",
           "profiling.report.write_report", "profiling.report.write_report_from_cloudwatch", "tuning.advise.advise",
           "tuning.lab.run_comparison", "tuning.lab.recover",
           "tuning.lab.loop.run_advise_loop", "pipeline.job.main",
           # the built-in process command lists and stats its inputs (a FIFO or device among them is refused), then
           # writes the shard: that is its action
           "pipeline.imaging._write_samples",
           # `lab` runs in the cgroup v2 guest by default where it can boot: the boot is its action.
           "pipeline.cli.tuning._lab_in_guest",
           # `profile` starts its per-call probe on this process first (as root, carving it a cgroup): an action,
           # and one that would be left running, the command that stops it being stubbed
           "profiling.probes.start_command_probe",
           # `qualify` writes and reads a file on the volume it is given: the measurement is its action
           "profiling.qualifyio.measure"]

ODD_VALUES = ["0", "-1", "1", "3", "nan", "inf", "-inf", "1e309", "99999999999999999999", "", " ", "abc",
              "1.5", "0x10", "s3://", "s3://bkt/i/", "s3://B_AD/x", "http://", "http://127.0.0.1:0",
              "ftp://x", "99999x99999", "512x384", "\x00", "é", "--", "-", "/", "/dev/null", "/proc/1/mem",
              "/nonexistent/x", ".",
              # the second round: Unicode digits, digit separators, a number past int()'s 4,300-digit limit,
              # a FIFO and a directory where a file is expected (made in each example's folder), a newline
              "²", "١٢", "1_000", "9" * 5000, "fifo", "folder", "a\nb", "s3://bkt/i/\n",
              # the third round: endpoints with user info (never to be echoed), a path, another scheme
              f"http://user:{SECRET}@127.0.0.1:9000", f"ftp://{SECRET}@h", f"https://u:{SECRET}/x@h:1",
              "http://127.0.0.1:9000/bucket", "https://h:1/p?q=1", "s3://127.0.0.1:9000", "https://h:1",
              # the third round's rest: a run directory whose run.json is cut short, an advice of another shape
              "badrun", "advice.json"]
COMMAND_FLAGS: dict[str, list[str]] = {
    "demo": ["--images", "--image-mib", "--images-per-child", "--workers", "--run-dir", "--scratch",
             "--s3-endpoint", "--slow-child", "--seed", "--contract"],
    "run": ["--input", "--output", "--manifest", "--images-per-child", "--workers", "--s3-endpoint",
            "--run-dir", "--scratch", "--train-size", "--contract"],
    "profile": ["--interval", "--json", "--emf", "--device", "--contract"],
    "submit": ["--manifest", "--prefix", "-k", "--stack", "--output", "--s3-endpoint", "--run-dir", "--workers",
               "--region"],
    "status": ["--interval", "--region"],
    "sidecar": ["--socket", "--emf", "--profile-out", "--interval", "--device", "--scratch-dir", "--namespace",
                "--contract"],
    "process": ["--train-size"],
    "report": ["--out", "--from-cloudwatch", "--since", "--namespace", "--region", "--logs-endpoint", "--advice",
               "--stack"],
    "advise": ["--jobs-per-instance", "--memory-gib", "--jobs-per-day", "--instance-ebs-mibps", "--kernel",
               "--candidate", "--cache-budget-pct", "--io-size-kib", "--instance-type", "--vcpus-per-job",
               "--job-memory-gib", "--volume", "--since", "--region", "--logs-endpoint"],
    "qualify": ["--volume", "--volume-type", "--volume-size-gib", "--instance-type", "--io-size-kib", "--seconds",
                "--max-gib", "--min-ratio"],
    # the lab's runs boot the guest or, on this machine, change kernel settings: stubbed above, so only its checks
    # run
    "lab": ["--volume", "--memory-gib", "--workload", "--workers", "--images", "--image-mib", "--images-per-child",
            "--rounds", "--dirty-ratio", "--dirty-background-ratio", "--time-scale", "--credits-gib",
            "--loop-size-mib", "--throttle", "--where"],
}
# The metadata endpoint is left out: an odd URL there costs seconds of retries, and its use has its own tests.
JOB_VARIABLES = sorted(ENV.names() - {ENV.ECS_METADATA})
SWITCHES = ["--force", "--local", "--dry-run", "--json", "--watch", "--no-report", "--bogus", "-h"]


@st.composite
def argv(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(sorted(COMMAND_FLAGS)))
    words: list[str] = [command]
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            words += [draw(st.sampled_from(COMMAND_FLAGS[command])),
                      draw(st.sampled_from(ODD_VALUES) | st.text(max_size=12))]
        else:
            words.append(draw(st.sampled_from(SWITCHES + ODD_VALUES)))
    return words


@pytest.fixture(scope="module")
def stubbed() -> Any:
    patch = pytest.MonkeyPatch()
    cli.stub_actions(patch, ACTIONS)
    yield
    patch.undo()


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=argv())
def test_any_flags_give_a_documented_code_and_no_traceback(stubbed: Any, words: list[str]) -> None:
    # In a folder of its own: a relative path the fuzzer gives (`--scratch-dir abc`) lands there.
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        _odd_files(Path(folder))
        env = {"IOBATCH_CACHE": str(Path(folder) / "cache"), "AWS_REGION": "us-east-1"}
        result = CliRunner().invoke(app, words, env=env)
        # '-' is stdout where a flag says so, refused elsewhere: never a file of that name (issue 44)
        assert not (Path(folder) / "-").exists(), words
    _check(words, result)


def _odd_files(folder: Path) -> None:
    """A FIFO (which blocks whoever opens it to read, until a writer comes: none will) and a directory, named
    by ODD_VALUES as files; in the directory, a FIFO and a link to a device where a command lists its inputs; a run
    directory whose run.json is cut short (badrun) and an advice file of another shape (advice.json)."""
    os.mkfifo(folder / "fifo")
    (folder / "folder").mkdir()
    os.mkfifo(folder / "folder" / "a.png")
    (folder / "folder" / "b.png").symlink_to("/dev/null")
    (folder / "badrun" / "profiles").mkdir(parents=True)
    (folder / "badrun" / "run.json").write_text('{"workers": 4, "memory')
    (folder / "advice.json").write_text('{"volume": "gp3", "why": "any object"}')


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=st.dictionaries(st.sampled_from(JOB_VARIABLES), st.sampled_from(ODD_VALUES) | st.text(max_size=12),
                           max_size=6))
def test_any_job_variables_give_a_documented_code_and_no_traceback(stubbed: Any, env: dict[str, str]) -> None:
    """`iobatch job` reads the environment, not flags: its variables fuzzed the same way (values with a NUL
    byte left out: no environment can hold one)."""
    base = {ENV.INPUT: "s3://bkt/i/", ENV.OUTPUT: "s3://bkt/o/", ENV.IMAGES_PER_CHILD: "1"}
    given_env = {name: value.replace("\x00", "") for name, value in env.items()}
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        _odd_files(Path(folder))
        result = CliRunner().invoke(app, ["job"], env={ENV.SCRATCH: str(Path(folder) / "scratch"), **base, **given_env})
    _check(["job", *(f"{name}={value}" for name, value in given_env.items())], result)


# The variables every other command reads, beside its flags: the profiler's (the job's identity, its namespace
# and contract), the built-in process command's, the demo's tools and cache.
COMMAND_VARIABLES = {
    "sidecar": (["sidecar", "--socket", "s.sock"], [*JOB_VARIABLES, AWS_ENV.EMF_NAMESPACE]),
    "profile": (["profile", "--", "true"], [*JOB_VARIABLES, AWS_ENV.EMF_NAMESPACE]),
    "process": (["process", "folder", "out"], [ENV.TRAIN_SIZE, ENV.SKIP_BAD_IMAGES, ENV.INPUT, PROCESS_ENV.IMAGES,
                                              PROCESS_ENV.CHILD]),
    "demo": (["demo", "--run-dir", "run"], ["IOBATCH_CACHE", "IOBATCH_VERSITYGW"]),
    # the AWS libraries' endpoint variables, checked as the flags are where a command makes a client (issue 44)
    "run": (["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/", "--run-dir", "run"],
            ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"]),
    "report": (["report", "--from-cloudwatch", "/aws/batch/iobatch", "--out", "r.html"],
               ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", "AWS_ENDPOINT_URL_LOGS"]),
}


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), command=st.sampled_from(sorted(COMMAND_VARIABLES)))
def test_any_variables_of_any_command_give_a_documented_code(stubbed: Any, data: st.DataObject,
                                                              command: str) -> None:
    words, names = COMMAND_VARIABLES[command]
    env = data.draw(st.dictionaries(st.sampled_from(names), st.sampled_from(ODD_VALUES) | st.text(max_size=12),
                                    max_size=4))
    given_env = {name: value.replace("\x00", "") for name, value in env.items()}
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        _odd_files(Path(folder))
        result = CliRunner().invoke(app, words, env={"AWS_REGION": "us-east-1", **given_env})
    _check([*words, *(f"{name}={value[:40]}" for name, value in given_env.items())], result)


ENDPOINT_FLAGS = {"--s3-endpoint", "--logs-endpoint"}


def _secret_only_in_endpoints(words: list[str]) -> bool:
    """Whether SECRET was given, and only as an endpoint: a flag's value or the job's variable (NAME=value)."""
    given = [i for i, word in enumerate(words) if SECRET in word]
    return bool(given) and all((i > 0 and words[i - 1] in ENDPOINT_FLAGS)
                               or words[i].startswith((f"{ENV.S3_ENDPOINT}=", "AWS_ENDPOINT_URL")) for i in given)


def _bad_endpoint(words: list[str]) -> str | None:
    """An endpoint given with user info, a path or a scheme other than http(s), which no command may act on: the
    value of an endpoint flag the command has (not itself another flag's value), or the job's variable."""
    flags = COMMAND_FLAGS.get(words[0], [])
    given = [words[i + 1] for i in range(1, len(words) - 1) if words[i] in ENDPOINT_FLAGS and words[i] in flags
             and words[i - 1] not in flags and "--" not in words[:i]]
    if words[0] == "job":
        given += [word.split("=", 1)[1] for word in words if word.startswith(f"{ENV.S3_ENDPOINT}=")]
    # the AWS libraries' variables, where the command reads them (COMMAND_VARIABLES), unless a flag overrides them
    given += [word.split("=", 1)[1] for word in words if word.startswith("AWS_ENDPOINT_URL")
              and "=" in word and not ENDPOINT_FLAGS & set(words)]
    for url in given:
        parts = urlsplit(url.strip())
        if url.strip() and ("@" in url or parts.path.strip("/") or parts.scheme not in ("http", "https")):
            return url
    return None


# The folders _odd_files makes that hold entries no shard can be made of (a FIFO, a link to a device, a folder), and
# those entries: `process` given one as IN refuses it (65) naming the entry, never writes a shard without it.
ODD_ENTRIES = {Path("folder"): ("a.png", "b.png"), Path("."): ("badrun", "fifo", "folder")}
PROCESS = typer.main.get_command(app).commands["process"]  # type: ignore[attr-defined]


def _odd_input(words: list[str]) -> tuple[str, ...] | None:
    """For `process` given one of ODD_ENTRIES' folders as IN (as click parses the words), its odd entries."""
    if words[0] != "process":
        return None
    try:
        ctx = PROCESS.make_context("process", words[1:], resilient_parsing=True)
    except Exception:  # no command line click can parse: refused before anything is read
        return None
    given = ctx.params.get("input_dir")
    return None if given is None else ODD_ENTRIES.get(Path(given))


def _check(words: list[str], result: Any) -> None:
    odd = _odd_input(words)
    if isinstance(result.exception, cli.Reached):
        assert _bad_endpoint(words) is None, ("acted on a bad endpoint", words)
        assert odd is None, ("process reached its write step with a FIFO or device among its inputs", words)
        return  # every check passed: the command would act now
    assert result.exception is None or isinstance(result.exception, SystemExit), (words, result.exception)
    assert result.exit_code in DOCUMENTED, (words, result.exit_code, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    if _secret_only_in_endpoints(words):  # elsewhere (--workers URL) it is no endpoint, and echoed as given
        assert SECRET not in result.stdout + result.stderr, (words, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    if result.exit_code != EXIT_OK:
        assert len(errors) == 1, (words, result.stderr)
    if "--json" in words and result.exit_code == EXIT_OK and result.stdout.startswith("{"):
        json.loads(result.stdout)
    if odd is not None and not result.stdout.startswith("Usage:"):  # past the flags' checks: 65 naming the entry
        assert result.exit_code in (EXIT_USAGE, EXIT_PERMANENT), ("process wrote a shard without its odd inputs",
                                                                 words, result.exit_code, result.stderr)
        assert result.exit_code == EXIT_USAGE or any(name in errors[0] for name in odd), (words, result.stderr)


@pytest.mark.parametrize("words", [["profile", "--device", "\x00", "--interval", "0", "0"],
                                   ["report", "a\x00b"], ["advise", "--memory-gib", "1\x00"]])
def test_a_nul_byte_in_any_argument_is_a_usage_error(words: list[str]) -> None:
    # Found by the fuzz test above: `--device` with a NUL byte reached os.stat, which raises ValueError.
    result = CliRunner().invoke(app, words)
    assert result.exit_code == EXIT_USAGE and "NUL byte" in result.output, (words, result.output)


@pytest.mark.parametrize(("words", "entry"), [(["process", "folder", "out"], "a.png"),
                                             (["process", ".", "out", "--train-size", "64x64"], "badrun")])
def test_a_process_run_past_a_fifo_or_device_among_its_inputs_fails_the_check(words: list[str], entry: str) -> None:
    """What the fuzz tests hold `process` to: a shard written of a folder holding a FIFO and a link to /dev/null (its
    write step reached, or exit 0) is a failure; 65 naming the entry is the answer."""
    reached = mock.Mock(exception=cli.Reached(), exit_code=1, stdout="", stderr="")
    wrote = mock.Mock(exception=None, exit_code=EXIT_OK, stdout='{"event": "processed"}\n', stderr="")
    for result in (reached, wrote):
        with pytest.raises(AssertionError, match="process"):
            _check(words, result)
    refused = f"error: image {entry} ({words[1]}/{entry}) is a FIFO (named pipe), not a regular file\n"
    _check(words, mock.Mock(exception=SystemExit(65), exit_code=EXIT_PERMANENT, stdout="", stderr=refused))
