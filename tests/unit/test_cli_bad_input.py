"""Bad input as a new user meets it, command by command: one line naming the thing and the fix, the
documented exit code, no traceback, no file of the user's touched and nothing half-written left behind.

Every case runs in-process (typer's CliRunner on the app): each fails before the command touches S3, starts
a server or runs anything, which is what these checks promise.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.cli import app
from pipeline.errors import EXIT_PERMANENT, EXIT_USAGE
from pipeline.interface import ENV
from profiling import runfiles
from profiling.contract import MAX_RULES
from profiling.metrics import TimelinePoint
from tests.support.cli import CliRunner
from tests.support.profiles import full_profile

HEADER = "2,monitortimeframe,1s\n"
JOB_ID = "876da822-4198-45f2-a252-6cea32512ea8"  # the shape of an AWS Batch job id
RULE = "n{},/,write,all,count,1\n"
PLAN = ["--jobs-per-instance", "4", "--memory-gib", "32", "--jobs-per-day", "8"]  # advise's plan, given in full


@dataclass
class Case:
    args: list[str]
    code: int
    fragment: str
    env: dict[str, str | None] = field(default_factory=dict)


def _profile_line(**changes: object) -> str:
    """A profile line as the sidecar writes it (StageProfile.to_dict), with fields replaced."""
    point = TimelinePoint(t=1.0, read_bps=1.0, write_bps=2.0, device_write_bps=None, device_queue_depth=None,
                          dirty_bytes=0, writeback_bytes=0, io_stall_some_ms=None)
    body = full_profile(timeline=[point]).to_dict()
    body.update(changes)
    return json.dumps(body)


def _run_dir(root: Path, line: str) -> Path:
    run = root / "run"
    (run / runfiles.PROFILES).mkdir(parents=True)
    runfiles.write_run(run, {"job_id": "t"})
    (run / runfiles.PROFILES / "part-00000.jsonl").write_text(_profile_line() + "\n" + line + "\n")
    return run


# Each builder gets a folder holding the user's files (precious.txt, a non-run folder `mine/`, a binary
# file) and returns the case; the folder is checked untouched afterwards.
CASES: dict[str, Callable[[Path], Case]] = {
    # the app itself
    "bare": lambda d: Case([], EXIT_USAGE, "no command given"),
    "unknown-command": lambda d: Case(["nosuch"], EXIT_USAGE, "No such command"),
    # demo: every parse error, then the checks made before the server starts
    "demo-negative": lambda d: Case(["demo", "--images", "-1"], EXIT_USAGE, "'--images'"),
    "demo-zero-workers": lambda d: Case(["demo", "--workers", "0"], EXIT_USAGE, "'--workers'"),
    "demo-nan": lambda d: Case(["demo", "--image-mib", "nan"], EXIT_USAGE, "'--image-mib'"),
    "demo-inf": lambda d: Case(["demo", "--image-mib", "inf"], EXIT_USAGE, "'--image-mib'"),
    "demo-huge": lambda d: Case(["demo", "--images", "10000000000"], EXIT_USAGE, "'--images'"),
    "demo-unknown-option": lambda d: Case(["demo", "--bogus"], EXIT_USAGE, "No such option: --bogus"),
    "demo-missing-value": lambda d: Case(["demo", "--images"], EXIT_USAGE, "requires an argument"),
    "demo-run-dir-file": lambda d: Case(["demo", "--run-dir", str(d / "precious.txt")], EXIT_USAGE, "is a file"),
    "demo-run-dir-foreign": lambda d: Case(["demo", "--run-dir", str(d / "mine"), "--no-report"], EXIT_USAGE,
                                           "holds no run.json"),
    "demo-endpoint-malformed": lambda d: Case(["demo", "--s3-endpoint", "localhost:9000"], EXIT_USAGE,
                                              "is not an endpoint URL"),
    "demo-endpoint-bad-port": lambda d: Case(["demo", "--s3-endpoint", "http://127.0.0.1:99999"], EXIT_USAGE,
                                             "is not an endpoint URL"),
    "demo-contract-binary": lambda d: Case(["demo", "--run-dir", str(d / "new"), "--contract", str(d / "blob")],
                                           EXIT_USAGE, "expected UTF-8 text"),
    "demo-slow-child-absent": lambda d: Case(["demo", "--run-dir", str(d / "new"), "--images", "4",
                                              "--slow-child", "9"], EXIT_USAGE, "--slow-child 9 is not a child"),
    # run
    "run-missing-input": lambda d: Case(["run", "--output", "s3://bkt/o/"], EXIT_USAGE, "Missing option '--input'"),
    "run-not-a-uri": lambda d: Case(["run", "--input", "bucket/images", "--output", "s3://bkt/o/"], EXIT_USAGE,
                                    "is not an S3 URI"),
    "run-train-size-huge": lambda d: Case(["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/",
                                           "--train-size", "100000x100000"], EXIT_USAGE, "--train-size"),
    "run-train-size-text": lambda d: Case(["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/",
                                           "--train-size", "big"], EXIT_USAGE, "WIDTHxHEIGHT"),
    "run-endpoint-ftp": lambda d: Case(["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/",
                                        "--s3-endpoint", "ftp://h"], EXIT_USAGE, "is not an endpoint URL"),
    "run-scratch-file": lambda d: Case(["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/", "--run-dir",
                                        str(d / "new"), "--scratch", str(d / "precious.txt")], EXIT_USAGE,
                                       "--scratch"),
    "run-contract-too-many-rules": lambda d: Case(["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/",
                                                   "--run-dir", str(d / "new"), "--contract", str(d / "many")],
                                                  EXIT_USAGE, f"at most {MAX_RULES} rules"),
    "run-contract-empty-range": lambda d: Case(["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/",
                                                "--run-dir", str(d / "new"), "--contract", str(d / "range")],
                                               EXIT_USAGE, "SIZERANGE"),
    # job: its variables
    "job-force-maybe": lambda d: Case(["job"], EXIT_USAGE, "IOBATCH_FORCE='maybe' is not yes or no",
                                      {ENV.FORCE: "maybe"}),
    "job-images-zero": lambda d: Case(["job"], EXIT_USAGE, "IOBATCH_IMAGES_PER_CHILD=0 is out of range",
                                      {ENV.IMAGES_PER_CHILD: "0"}),
    "job-train-size-huge": lambda d: Case(["job"], EXIT_USAGE, "out of range", {ENV.TRAIN_SIZE: "99999x99999"}),
    "job-index-text": lambda d: Case(["job"], EXIT_USAGE, "is not a whole number", {ENV.ARRAY_INDEX: "one"}),
    "job-index-past-any-batch": lambda d: Case(["job"], EXIT_PERMANENT, "AWS_BATCH_JOB_ARRAY_INDEX=99999999999 is "
                                               "beyond any batch", {ENV.ARRAY_INDEX: "99999999999"}),
    "job-process-command-no-output": lambda d: Case(["job"], EXIT_USAGE, "has no {output}",
                                                    {ENV.PROCESS_COMMAND: "python s.py {input}"}),
    "run-process-command-missing": lambda d: Case(["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/",
                                                   "--run-dir", str(d / "new"), "--process-command",
                                                   "no-such-tool-x {input} {output}"], EXIT_USAGE, "is not on PATH"),
    # process: the built-in command
    "process-input-missing": lambda d: Case(["process", str(d / "none"), str(d / "new")], EXIT_USAGE,
                                            "is not a folder"),
    # a name past the file system's 255 bytes, where the command first looks at it (found by the fuzz test)
    "process-input-name-too-long": lambda d: Case(["process", "9" * 5000, str(d / "new")], EXIT_USAGE,
                                                  "give a shorter path"),
    "process-train-size-text": lambda d: Case(["process", str(d), str(d / "new"), "--train-size", "big"],
                                              EXIT_USAGE, "WIDTHxHEIGHT"),
    # qualify: the place and the expectation checked before anything is written
    "qualify-no-such-dir": lambda d: Case(["qualify", str(d / "nowhere")], EXIT_USAGE, "no such directory"),
    "qualify-volume-too-small": lambda d: Case(["qualify", str(d), "--volume", "st1:5"], EXIT_USAGE, "125-16384"),
    "qualify-io-size": lambda d: Case(["qualify", str(d), "--io-size-kib", "5"], EXIT_USAGE, "multiple of 4"),
    "qualify-type-alone": lambda d: Case(["qualify", str(d), "--volume-type", "st1"], EXIT_USAGE, "go together"),
    # sidecar: a socket path that is a file is a start-up failure the child survives (exit 0, the file kept):
    # tests/functional/test_sidecar_exit.py
    "sidecar-profile-out-missing-dir": lambda d: Case(["sidecar", "--socket", str(d / "s.sock"), "--profile-out",
                                                       str(d / "no" / "p.jsonl")], EXIT_USAGE, "does not exist"),
    # profile: outputs checked before the command runs
    "profile-no-command": lambda d: Case(["profile"], EXIT_USAGE, "Missing argument"),
    "profile-json-missing-dir": lambda d: Case(["profile", "--json", str(d / "no" / "p.json"), "--", "true"],
                                               EXIT_USAGE, "does not exist"),
    "profile-json-is-dir": lambda d: Case(["profile", "--json", str(d / "mine"), "--", "true"], EXIT_USAGE,
                                          "is a directory"),
    "profile-contract-binary": lambda d: Case(["profile", "--contract", str(d / "blob"), "--", "true"],
                                              EXIT_USAGE, "expected UTF-8 text"),
    "profile-interval-nan": lambda d: Case(["profile", "--interval", "nan", "--", "true"], EXIT_USAGE,
                                           "--interval"),
    # submit and status
    "submit-neither": lambda d: Case(["submit", "--prefix", "s3://bkt/i/", "-k", "2"], EXIT_USAGE,
                                     "exactly one of --stack"),
    "submit-workers-zero": lambda d: Case(["submit", "--prefix", "s3://bkt/i/", "-k", "2", "--local", "--workers",
                                           "0"], EXIT_USAGE, "'--workers'"),
    "submit-k-missing": lambda d: Case(["submit", "--prefix", "s3://bkt/i/", "--local"], EXIT_USAGE,
                                       "Missing option '--images-per-job'"),
    "status-no-region": lambda d: Case(["status", JOB_ID], EXIT_USAGE, "no AWS region",
                                       {"AWS_REGION": None, "AWS_DEFAULT_REGION": None,
                                        "AWS_CONFIG_FILE": str(d / "none")}),
    "status-bad-region": lambda d: Case(["status", JOB_ID, "--region", "moon-base"], EXIT_USAGE,
                                        "is not an AWS region name"),
    "status-interval-zero": lambda d: Case(["status", "job-1", "--interval", "0"], EXIT_USAGE, "'--interval'"),
    "status-interval-nan": lambda d: Case(["status", "job-1", "--interval=nan"], EXIT_USAGE,
                                          "'--interval': 'nan' is not a finite number"),
    "submit-zero-images-per-job": lambda d: Case(["submit", "--local", "--prefix", "s3://bkt/i/", "-k", "0"],
                                                 EXIT_USAGE, "'--images-per-job' / '-k'"),
    "lab-dirty-ratio": lambda d: Case(["lab", "--dirty-ratio", "101"], EXIT_USAGE, "'--dirty-ratio'"),
    # report: outputs, advice, damaged profiles
    "report-missing-run-dir": lambda d: Case(["report", str(d / "absent")], EXIT_USAGE, "absent"),
    "report-out-is-dir": lambda d: Case(["report", str(_run_dir(d, "")), "--out", str(d / "mine")], EXIT_USAGE,
                                        "is a directory"),
    # a name past the file system's 255 bytes: stat itself fails (found by the fuzz test)
    "report-out-name-too-long": lambda d: Case(["report", str(_run_dir(d, "")), "--out", str(d / ("a" * 300))],
                                               EXIT_USAGE, "give a shorter, plain path"),
    "report-out-missing-dir": lambda d: Case(["report", str(_run_dir(d, "")), "--out", str(d / "no" / "r.html")],
                                             EXIT_USAGE, "does not exist"),
    # an --advice file that is not what `advise --json` writes: bad input (issue 44), as a damaged profile is
    "report-advice-array": lambda d: Case(["report", str(_run_dir(d, "")), "--advice", str(d / "array.json")],
                                          EXIT_PERMANENT, "not an object"),
    "report-advice-binary": lambda d: Case(["report", str(_run_dir(d, "")), "--advice", str(d / "blob")],
                                           EXIT_PERMANENT, "is not JSON"),
    "report-profile-nan": lambda d: Case(["report", str(_run_dir(d, _profile_line(duration_s=float("nan"))))],
                                         EXIT_PERMANENT, "part-00000.jsonl:2"),
    "report-profile-negative": lambda d: Case(["report", str(_run_dir(d, _profile_line(read_bytes=-5)))],
                                              EXIT_PERMANENT, "read_bytes is -5"),
    "report-profile-wrong-type": lambda d: Case(["report", str(_run_dir(d, _profile_line(write_calls="many")))],
                                                EXIT_PERMANENT, "write_calls"),
    "report-profile-array": lambda d: Case(["report", str(_run_dir(d, "[1, 2]"))], EXIT_PERMANENT,
                                           "not an object"),
    "report-profile-bad-point": lambda d: Case(["report", str(_run_dir(d, _profile_line(timeline=[{"t": "x"}])))],
                                               EXIT_PERMANENT, "timeline point"),
    # advise
    "advise-profile-nan": lambda d: Case(["advise", str(_run_dir(d, _profile_line(duration_s=float("nan")))),
                                          "--jobs-per-instance", "4", "--memory-gib", "16", "--jobs-per-day", "500"],
                                         EXIT_PERMANENT, "part-00000.jsonl:2"),
    "advise-jobs-per-day-huge": lambda d: Case(["advise", str(d), "--jobs-per-day", "100000000000"], EXIT_USAGE,
                                               "'--jobs-per-day'"),
    "advise-random-pct-nan": lambda d: Case(["advise", str(d), "--random-pct", "nan"], EXIT_USAGE, "'--random-pct'"),
    "advise-memory-zero": lambda d: Case(["advise", str(d), "--memory-gib", "0"], EXIT_USAGE, "'--memory-gib'"),
    "advise-instance-type-unknown": lambda d: Case(["advise", str(d), "--instance-type", "m7i.large"], EXIT_USAGE,
                                                   "--instance-type 'm7i.large' is not in the instance table: use "
                                                   "one of m6i.{large..32xlarge,metal}"),
    "advise-instance-type-too-small": lambda d: Case(["advise", str(d), "--instance-type", "c6i.large"], EXIT_USAGE,
                                                     "--instance-type c6i.large (2 vCPUs, 4 GiB) cannot hold one job"),
    "advise-vcpus-per-job-zero": lambda d: Case(["advise", str(d), "--vcpus-per-job", "0"], EXIT_USAGE,
                                                "'--vcpus-per-job'"),
    "advise-job-memory-over-host": lambda d: Case(["advise", str(_run_dir(d, _profile_line())), "--jobs-per-instance",
                                                   "1", "--memory-gib", "4", "--jobs-per-day", "1", "--job-memory-gib",
                                                   "8"], EXIT_USAGE, "job memory 8 GiB is not within the instance's 4"),
    "advise-candidate-nvme-no-store": lambda d: Case(["advise", str(d), "--candidate", "nvme:m6i.2xlarge", *PLAN],
                                                     EXIT_USAGE, "'m6i.2xlarge' is not an instance type with instance "
                                                     "store"),
    "advise-candidate-nvme-price": lambda d: Case(["advise", str(d), "-C", "nvme:m6id.2xlarge:usd_per_hour=-1", *PLAN],
                                                  EXIT_USAGE, "usd_per_hour -1.0 must be a price of 0 or more"),
    "advise-candidate-nvme-iops": lambda d: Case(["advise", str(d), "-C", "nvme:m6id.2xlarge:iops=3000", *PLAN],
                                                 EXIT_USAGE, "'iops=3000' is not usd_per_hour=USD"),
    "advise-input-name-too-long": lambda d: Case(["advise", "9" * 300], EXIT_USAGE, "--memory-gib, --jobs-per-day"
                                                 " are missing"),
    "advise-volume-nvme": lambda d: Case(["advise", str(d), "--volume", "nvme:m6id.2xlarge", *PLAN], EXIT_USAGE,
                                         "instance store is a candidate to compare (advise --candidate), not a volume"),
    "advise-candidate-nvme-other-size": lambda d: Case(
        ["advise", str(_run_dir(d, _profile_line())), "--instance-type", "m6i.2xlarge", "--jobs-per-day", "8", "-C",
         "st1:500", "-C", "nvme:m6id.4xlarge"], EXIT_USAGE, "is not the plan's size (m6i.2xlarge: 8 vCPUs, 32 GiB)"),
    "advise-candidate-nvme-only": lambda d: Case(
        ["advise", str(_run_dir(d, _profile_line())), "--instance-type", "m6id.2xlarge", "--jobs-per-day", "8", "-C",
         "nvme:m6id.2xlarge"], EXIT_USAGE, "no EBS candidate to recommend"),
    # lab: its flags are checked before it asks for root or touches a kernel setting
    "lab-rounds-huge": lambda d: Case(["lab", "--rounds", "1000"], EXIT_USAGE, "'--rounds'"),
    "lab-workers-huge": lambda d: Case(["lab", "--workers", "100000"], EXIT_USAGE, "'--workers'"),
    "lab-image-mib-huge": lambda d: Case(["lab", "--image-mib", "1e6"], EXIT_USAGE, "'--image-mib'"),
    "lab-time-scale-huge": lambda d: Case(["lab", "--time-scale", "1e300"], EXIT_USAGE, "'--time-scale'"),
    "lab-loop-huge": lambda d: Case(["lab", "--loop-size-mib", "99999999999"], EXIT_USAGE, "'--loop-size-mib'"),
    "lab-credits-negative": lambda d: Case(["lab", "--credits-gib", "-1"], EXIT_USAGE, "'--credits-gib'"),
    "lab-process-command-missing": lambda d: Case(["lab", "--process-command", "no-such-tool-x {input} {output}"],
                                                   EXIT_USAGE, "is not on PATH"),
    "lab-process-command-no-input": lambda d: Case(["lab", "--process-command", "sh -c true {output}"], EXIT_USAGE,
                                                    "has no {input}"),
    "lab-memory-beyond-this-machine": lambda d: Case(["lab", "--memory-gib", "4000"], EXIT_USAGE,
                                                     "--memory-gib 4000 is more than this machine's"),
}


def _user_files(folder: Path) -> None:
    (folder / "precious.txt").write_text("mine")
    (folder / "mine").mkdir()
    (folder / "mine" / "notes.txt").write_text("mine too")
    (folder / "blob").write_bytes(bytes(range(256)) * 4)
    (folder / "array.json").write_text("[1, 2]")
    (folder / "many").write_text(HEADER + "".join(RULE.format(i) for i in range(MAX_RULES + 1)))
    (folder / "range").write_text(HEADER + "r,/,write,5B-7B,count,1\n")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_its_code(name: str, tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    _user_files(user)
    case = CASES[name](user)
    before = _snapshot(user)
    env = {ENV.INPUT: "s3://bkt/i/", ENV.OUTPUT: "s3://bkt/o/", ENV.IMAGES_PER_CHILD: "1",
           ENV.SCRATCH: str(tmp_path / "scratch"), "IOBATCH_CACHE": str(tmp_path / "cache"), **case.env}

    result = CliRunner().invoke(app, case.args, env=env)

    assert result.exit_code == case.code, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.splitlines()
    assert 1 <= len(lines) <= 2 and lines[0].startswith("error: ") and case.fragment in lines[0], result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stdout + result.stderr
    assert _snapshot(user) == before  # nothing the user had was changed or removed
    # nothing half-written anywhere, and nothing created beside the user's files
    assert not [p for p in tmp_path.rglob("*.partial")]
    assert not (user / "new").exists() and not (tmp_path / "scratch").exists()
    assert not (tmp_path / "cache").exists()


def test_every_command_has_cases() -> None:
    commands = {command.name or command.callback.__name__ for command in app.registered_commands  # type: ignore[union-attr]
                } | {None}
    covered = {case(Path("/nonexistent")).args[0] if not name.startswith(("bare", "unknown")) else None
               for name, case in CASES.items() if not name.startswith(("report", "advise"))}
    # report and advise cases build run directories, so they are counted by name
    covered |= {"report", "advise"}
    assert commands - covered == set()  # lab's runs need root: tests/functional; its flags are checked here


def test_rerun_removes_only_what_a_run_wrote(tmp_path: Path) -> None:
    from pipeline.local.runner import RUN_ENTRIES, prepare_run_dir

    run = tmp_path / "run"
    for name in RUN_ENTRIES:
        (run / name).mkdir(parents=True) if "." not in name else None
    runfiles.write_run(run, {"job_id": "earlier"})
    (run / runfiles.REPORT).write_text("old report")
    (run / "my-notes.txt").write_text("mine")
    (run / "analysis").mkdir()
    prepare_run_dir(run)
    assert sorted(p.name for p in run.iterdir()) == ["analysis", "my-notes.txt"]


def test_profile_line_from_the_sidecar_reads_back() -> None:
    assert runfiles.profile_from_line(_profile_line()) == full_profile(timeline=[TimelinePoint(
        t=1.0, read_bps=1.0, write_bps=2.0, device_write_bps=None, device_queue_depth=None, dirty_bytes=0,
        writeback_bytes=0, io_stall_some_ms=None)])


def test_usage_errors_exit_64_from_the_console_script(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["demo", "--images", "0"])
    assert exited.value.code == EXIT_USAGE
    assert capsys.readouterr().err.count("\n") == 1
    assert os.environ.get("IOBATCH_UNUSED") is None
