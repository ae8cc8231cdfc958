"""Bad input, second round: each class fixed at its root (one parser, one check, one opener), each with a
case that the code before the fix got wrong (a traceback, a hang, a wrong code, a misleading line, or an
action reached with a value that should have been refused).

The commands' actions are replaced by a stub that records they were reached, as in test_cli_fuzz: a value
that must be refused and is not reaches the stub, and the case fails without running anything for real.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import app
from pipeline.errors import EXIT_PERMANENT, EXIT_USAGE, ManifestError, ScratchError, UsageError
from pipeline.interface import ENV
from profiling import runfiles
from tests.support import cli
from tests.support.cli import CliRunner
from tests.support.profiles import full_profile

JOB_ID = "876da822-4198-45f2-a252-6cea32512ea8"
FIVE_THOUSAND_DIGITS = "9" * 5000
ACTIONS = ["pipeline.local.demo.run_demo", "pipeline.local.runner.run_local", "pipeline.local.submit.submit_local",
           "pipeline.submit.submit_to_stack", "pipeline.submit.require_credentials", "pipeline.cli.batch._session",
           "pipeline.cli.report._logs_client", "profiling.sidecar.Sidecar.bind", "profiling.report.write_report",
           "tuning.advise.advise", "pipeline.imaging.process_directory", "pipeline.job.main"]
BASE_ENV = {ENV.INPUT: "s3://bkt/i/", ENV.OUTPUT: "s3://bkt/o/", ENV.IMAGES_PER_CHILD: "1",
            "AWS_REGION": "us-east-1"}


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    cli.stub_actions(monkeypatch, ACTIONS)


def refused(args: list[str], code: int, fragment: str, env: dict[str, str] | None = None) -> str:
    """The command refuses with one short line holding `fragment` and exits `code`, before acting; that line."""
    error = cli.refused(args, code, fragment, {**BASE_ENV, **(env or {})})[1]
    assert len(error) < 400
    return error


# ---- one parser for numbers: variables and flags ----------------------------------------------------


@pytest.mark.parametrize(("name", "value", "code"), [
    (ENV.ARRAY_OFFSET, "²", EXIT_USAGE),  # isdigit() is true for it, int() is not
    (ENV.ARRAY_INDEX, "١٢", EXIT_USAGE),  # Arabic-Indic digits: int() reads 12
    (ENV.ARRAY_INDEX, FIVE_THOUSAND_DIGITS, EXIT_PERMANENT),  # past int()'s 4,300-digit limit: beyond any batch
    (ENV.S5CMD_WORKERS, "1_6", EXIT_USAGE),
    (ENV.S5CMD_RETRIES, "-1", EXIT_USAGE),  # was ignored silently
    (ENV.S5CMD_RETRIES, "abc", EXIT_USAGE),
    (ENV.S5CMD_RETRIES, "99999999999", EXIT_USAGE),  # s5cmd would refuse it, reported as 75 (retried)
])
def test_job_variables_are_read_by_one_parser(stubbed: None, name: str, value: str, code: int) -> None:
    refused(["job"], code, name, {name: value})


def test_s5cmd_retries_within_bounds_reach_s5cmd() -> None:
    from pipeline.settings import JobSettings

    env = {ENV.INPUT: "s3://bkt/i/", ENV.OUTPUT: "s3://bkt/o/", ENV.IMAGES_PER_CHILD: "1"}
    assert JobSettings.from_env({**env, ENV.S5CMD_RETRIES: " 3 "}).s5cmd_retries == 3
    settings = JobSettings.from_env(env)
    assert settings.s5cmd_retries is None and ENV.S5CMD_RETRIES not in settings.to_env()
    again = JobSettings.from_env({**env, ENV.S5CMD_RETRIES: "0"})
    assert JobSettings.from_env(again.to_env()) == again


@pytest.mark.parametrize("value", ["1_000", "١٢", FIVE_THOUSAND_DIGITS])
def test_number_flags_take_ascii_digits_only(stubbed: None, value: str) -> None:
    # '1_000' reached the demo as 1,000 images; a 5,000-digit value was quoted whole in the error line.
    refused(["demo", "--images", value], EXIT_USAGE, "'--images'")
    refused(["advise", ".", "--memory-gib", value], EXIT_USAGE, "'--memory-gib'")


def test_whole_number_is_strict_and_bounded() -> None:
    from profiling.numbers import MAX_DIGITS, number, whole_number

    assert whole_number(" 42 ") == 42 and whole_number("+7") == 7 and whole_number("-3") == -3
    for text in ("²", "١٢", "1_0", "1e3", "", " ", "0x10", "9" * (MAX_DIGITS + 1)):
        assert whole_number(text) is None, text
    assert number("2.5") == 2.5 and number("1e3") == 1000.0
    assert number("\u0661.\u0665") is None and number("1_0") is None


# ---- one check: output inside or equal to the input -----------------------------------------------


@pytest.mark.parametrize("output", ["s3://bkt/images/", "s3://bkt/images/train/", "s3://bkt/images"])
def test_run_refuses_an_output_inside_its_input(stubbed: None, output: str) -> None:
    refused(["run", "--input", "s3://bkt/images/", "--output", output], EXIT_USAGE, "is inside the input prefix")


def test_the_job_refuses_an_output_inside_the_input_it_lists(stubbed: None) -> None:
    refused(["job"], EXIT_USAGE, "is inside the input prefix", {ENV.OUTPUT: "s3://bkt/i/out/"})


def test_a_manifest_batch_of_a_whole_bucket_may_write_elsewhere_in_it() -> None:
    from pipeline.settings import S3Uri, check_output_outside_input

    check_output_outside_input(S3Uri("b", ""), S3Uri("b", "out/"), listed=False)  # submit --local --manifest
    with pytest.raises(UsageError):
        check_output_outside_input(S3Uri("b", ""), S3Uri("b", "out/"), listed=True)
    check_output_outside_input(S3Uri("b", "images/"), S3Uri("b", "images-out/"), listed=True)


# ---- an output that is one of the inputs ------------------------------------------------------------


def test_report_out_over_the_runs_own_profile_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / runfiles.PROFILES).mkdir(parents=True)
    runfiles.write_run(run, {"job_id": "t"})
    profile = run / runfiles.PROFILES / "part-00000.jsonl"
    line = json.dumps(full_profile().to_dict()) + "\n"
    profile.write_text(line)
    refused(["report", str(run), "--out", str(profile)], EXIT_USAGE, "which this command reads")
    assert profile.read_text() == line  # the measurements are still there


def test_process_out_must_not_be_in_or_be_a_file(tmp_path: Path) -> None:
    images = tmp_path / "in"
    images.mkdir()
    (images / "a.png").write_bytes(b"x")
    (tmp_path / "file").write_text("mine")
    refused(["process", str(images), str(tmp_path / "file")], EXIT_USAGE, "is a file")
    refused(["process", str(images), str(images)], EXIT_USAGE, "which this command reads")
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(["process", str(empty), str(tmp_path / "out")], EXIT_USAGE, "holds no files")
    assert (tmp_path / "file").read_text() == "mine" and not (tmp_path / "out").exists()


# ---- values AWS would refuse, checked before any request ------------------------------------------


def test_values_botocore_would_refuse_are_64_before_any_request(stubbed: None) -> None:
    refused(["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/", "--manifest", "s3://bkt"], EXIT_USAGE,
            "names a folder")
    refused(["status", "not a job id!"], EXIT_USAGE, "is not an AWS Batch job id")
    refused(["submit", "--stack", "bad stack!", "--prefix", "s3://bkt/i/", "-k", "1"], EXIT_USAGE,
            "is not a stack name")
    refused(["report", "--from-cloudwatch", "group", "--since", "99999d"], EXIT_USAGE, "longest CloudWatch Logs")
    refused(["sidecar", "--socket", "/tmp/x.sock", "--namespace", "N" * 2000], EXIT_USAGE,
            "is not a CloudWatch namespace")
    refused(["job"], EXIT_USAGE, ENV.PIPELINE, {ENV.PIPELINE: "iobatch\nprod"})
    refused(["run", "--input", "s3://bkt/" + "k" * 1100 + "/", "--output", "s3://bkt/o/"], EXIT_USAGE, "S3's limit")


def test_a_job_id_of_an_array_child_is_a_job_id(stubbed: None) -> None:
    from pipeline.cli.checks import job_ids

    assert job_ids([JOB_ID, f"{JOB_ID}:17"]) == [JOB_ID, f"{JOB_ID}:17"]


def test_a_repeated_volume_key_is_refused(stubbed: None) -> None:
    refused(["advise", ".", "--volume", "gp3:100:iops=3000:iops=4000", "--jobs-per-instance", "1",
             "--memory-gib", "4", "--jobs-per-day", "1"], EXIT_USAGE, "iops twice")


# ---- files: regular files only, without blocking ------------------------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    yield path


def test_a_fifo_is_refused_at_once_where_a_file_is_read(stubbed: None, fifo: Path, tmp_path: Path) -> None:
    # Each of these blocked forever in open(2) before: no writer ever comes to the FIFO.
    started = time.monotonic()
    refused(["demo", "--run-dir", str(tmp_path / "r"), "--contract", str(fifo)], EXIT_USAGE, "FIFO")
    refused(["report", str(tmp_path), "--advice", str(fifo)], EXIT_USAGE, "FIFO")  # "does not exist" before
    from profiling.finish import load_rules

    with pytest.raises(ValueError, match="FIFO"):  # the sidecar's reader too
        load_rules(fifo)
    assert time.monotonic() - started < 10


def test_open_regular_names_the_kind_of_file(fifo: Path, tmp_path: Path) -> None:
    from profiling.files import NotRegularFile, open_regular

    for path, kind in ((fifo, "FIFO"), (tmp_path, "directory")):
        with pytest.raises(NotRegularFile, match=kind):
            open_regular(path)
    (tmp_path / "f").write_bytes(b"ok")
    with open_regular(tmp_path / "f") as file:
        assert file.read() == b"ok"


def test_append_line_leaves_no_line_cut_in_the_middle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from profiling import files

    path = tmp_path / "part-00000.jsonl"
    files.append_line(path, '{"stage":"download"}')
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        if len(data) > 10:
            return real_write(fd, data[:10])  # a short write, as on a nearly full disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        files.append_line(path, '{"stage":"process","items":5}')
    assert path.read_text() == '{"stage":"download"}\n'


def test_a_full_run_directory_is_one_line_and_65(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device", ".iobatch/run/run.json.partial")

    monkeypatch.setattr("pipeline.local.runner.run_local", full)
    monkeypatch.setattr("pipeline.local.runner.prepare_run_dir", lambda _d: None)
    refused(["run", "--input", "s3://bkt/i/", "--output", "s3://bkt/o/", "--run-dir", "/tmp"], EXIT_PERMANENT,
            "no space left")


# ---- programs the kernel cannot run -------------------------------------------------------------


def test_a_script_without_its_hash_bang_is_64_before_anything_runs(tmp_path: Path) -> None:
    from pipeline.process import find_command

    script = tmp_path / "tool"
    script.write_text("echo hi\n")
    script.chmod(0o755)
    refused(["profile", "--", str(script)], EXIT_USAGE, "#!")  # OSError ENOEXEC: a traceback before
    with pytest.raises(UsageError, match="exec format error"):
        find_command(f"{script} {{input}} {{output}}", "part-00000")  # the job: 64 before the download
    refused(["profile", "--", str(tmp_path)], EXIT_USAGE, "is a directory")  # "check its permissions" before
    with pytest.raises(UsageError, match="is a directory"):
        find_command(f"{tmp_path} {{input}} {{output}}", "part-00000")  # "does not exist" before


# ---- manifests: fast, bounded, and named at the check -----------------------------------------


def test_a_10_mb_manifest_line_is_refused_in_well_under_a_second() -> None:
    from pipeline.manifest import manifest_lines, parse_line

    line = json.dumps({"key": "img/" + "a" * 10_000_000}).encode() + b"\n"
    chunks = [b'{"key": "img/a"}\n', *(line[i:i + (1 << 20)] for i in range(0, len(line), 1 << 20))]
    started = time.process_time()
    with pytest.raises(ManifestError, match="line 2 is longer than"):
        list(manifest_lines(iter(chunks), source="m.jsonl"))
    with pytest.raises(ManifestError, match="long"):
        parse_line(line, bucket="b", where="m.jsonl line 2")
    assert time.process_time() - started < 0.5


def test_manifest_keys_and_bytes_are_checked_where_they_are_read() -> None:
    from pipeline.manifest import parse_line

    with pytest.raises(ManifestError, match="1,024"):  # frozen, then the child failed 75 and printed it
        parse_line(json.dumps({"key": "img/" + "é" * 600}), bucket="b", where="m line 1", prefix="img/")
    with pytest.raises(ManifestError, match="byte order mark"):  # "is not JSON" before
        parse_line(b'\xef\xbb\xbf{"key": "img/a"}', bucket="b", where="m line 1")
    with pytest.raises(ManifestError, match="not UTF-8"):  # passed the check, failed later
        parse_line('{"key": "img/caf\xe9"}'.encode("latin-1"), bucket="b", where="m line 1")
    assert parse_line('{"key": "img/' + "é" * 500 + '"}', bucket="b", where="m", prefix="img/") is not None


def test_manifest_lines_keep_every_line_and_its_end() -> None:
    from pipeline.manifest import manifest_lines

    text = b'{"key":"a"}\n\n{"key":"b"}\r\n{"key":"c"}'
    for size in (1, 3, 1 << 20):
        chunks = [text[i:i + size] for i in range(0, len(text), size)]
        assert b"".join(manifest_lines(chunks, source="m")) == text
        assert len(list(manifest_lines(chunks, source="m"))) == 4


# ---- damaged or newer files: one rule -----------------------------------------------------------


def _run_with_line(root: Path, line: str) -> Path:
    run = root / "run"
    (run / runfiles.PROFILES).mkdir(parents=True)
    runfiles.write_run(run, {"job_id": "t"})
    (run / runfiles.PROFILES / "part-00000.jsonl").write_text(line + "\n")
    return run


def test_advise_and_report_agree_on_65_and_a_newer_schema_says_so(tmp_path: Path) -> None:
    body = full_profile().to_dict()
    body["schema"] = 2
    run = _run_with_line(tmp_path, json.dumps(body))
    advise = ["advise", str(run), "--jobs-per-instance", "1", "--memory-gib", "4", "--jobs-per-day", "1"]
    line = refused(advise, EXIT_PERMANENT, "newer iobatch")
    assert "delete" not in line
    refused(["report", str(run), "--out", str(tmp_path / "r.html")], EXIT_PERMANENT, "newer iobatch")
    damaged = _run_with_line(tmp_path / "d", "{not json")
    refused([*advise[:1], str(damaged), *advise[2:]], EXIT_PERMANENT, "part-00000.jsonl:1")


# ---- words that named the wrong thing ---------------------------------------------------------------


def test_scratch_that_is_a_file_or_cannot_hold_files_says_so(tmp_path: Path) -> None:
    from pipeline.scratch import Scratch

    (tmp_path / "file").write_text("")
    with pytest.raises(ScratchError, match="is a file"):  # "does not exist" before
        Scratch(tmp_path / "file", tmp_path / "file" / "task-x", require_prepared=False).check_volume()


@pytest.mark.skipif(not os.access("/proc", os.W_OK), reason="only root's mode bits say /proc is writable")
def test_proc_as_scratch_is_refused_before_the_demo(stubbed: None, tmp_path: Path) -> None:
    # Root passes access(2) on /proc; the demo then failed with a traceback making its scratch directory.
    refused(["demo", "--run-dir", str(tmp_path / "r"), "--scratch", "/proc"], EXIT_USAGE, "no files can be made")


def test_a_newline_in_a_path_is_named(stubbed: None, tmp_path: Path) -> None:
    refused(["demo", "--run-dir", str(tmp_path / "a\nb")], EXIT_USAGE, "control character")


def test_a_second_run_into_a_busy_run_directory_is_told_it_is_busy(tmp_path: Path) -> None:
    import fcntl

    from pipeline.local.runner import prepare_run_dir

    run = tmp_path / "run"
    run.mkdir()
    runfiles.write_run(run, {"demo": True})
    (run / "profiles").mkdir()
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)  # another run's hold on it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(UsageError, match="is busy"):
            prepare_run_dir(run)
        assert (run / "profiles").is_dir()  # nothing of the other run's was removed
    finally:
        os.close(fd)


def test_demo_tools_and_cache_given_as_the_wrong_kind(stubbed: None, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    refused(["demo", "--run-dir", str(tmp_path / "r")], EXIT_USAGE, "IOBATCH_VERSITYGW",
            {"IOBATCH_VERSITYGW": str(tmp_path)})
    refused(["demo", "--run-dir", str(tmp_path / "r")], EXIT_USAGE, "IOBATCH_CACHE",
            {"IOBATCH_CACHE": str(tmp_path / "file")})


def test_advice_findings_of_the_wrong_shape_are_refused(stubbed: None, tmp_path: Path) -> None:
    advice = tmp_path / "advice.json"
    advice.write_text(json.dumps({"findings": {"code": "X"}}))
    # The advice's shape is checked whole (tuning.advice_json), as bad input: 65 (issue 44).
    refused(["report", str(tmp_path), "--advice", str(advice)], EXIT_PERMANENT, "findings is dict, not a list")


def test_a_path_too_long_for_the_file_system_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by the fuzz (IOBATCH_CACHE of 5,000 digits): stat fails with ENAMETOOLONG, which Path.exists() raises.
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["demo", "--run-dir", "run"], env={"IOBATCH_CACHE": "9" * 5000})
    assert result.exit_code == EXIT_USAGE, result.output
    assert "File name too long" in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error: ")]) == 1


def test_process_refuses_a_fifo_for_its_images_file_or_an_image(fifo: Path, tmp_path: Path) -> None:
    # Both blocked forever in open(2) before (the fuzz's derandomized run met the first).
    from pipeline.interface import PROCESS_ENV

    started = time.monotonic()
    images, out = tmp_path / "in", tmp_path / "out"
    images.mkdir()
    refused(["process", str(images), str(out)], EXIT_USAGE, "FIFO", env={PROCESS_ENV.IMAGES: str(fifo)})
    os.mkfifo(images / "a.jpg")
    listing = tmp_path / "images.jsonl"
    listing.write_text(json.dumps({"file": "a.jpg", "key": "i/a.jpg", "size": 1, "etag": None}) + "\n")
    # An input that is not a regular file is bad input (65, issue 44), found by stat, never opened.
    refused(["process", str(images), str(out)], EXIT_PERMANENT, "a.jpg", env={PROCESS_ENV.IMAGES: str(listing)})
    assert not out.exists() or not any(out.iterdir())  # nothing half-written
    assert time.monotonic() - started < 10
