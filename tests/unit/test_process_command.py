"""The process command's agreement: the command line (pipeline.interface), its settings, its outputs
(pipeline/process.py), sub-stage names (profiling.protocol) and the stack's keys (infra/settings.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.settings import ECR_IMAGE, SettingsError, StackSettings
from pipeline.errors import PermanentError, UsageError
from pipeline.interface import (
    DEFAULT_PROCESS_COMMAND,
    ENV,
    EXIT_BUG,
    EXIT_PERMANENT,
    EXIT_RETRYABLE,
    process_argv,
    process_command_problem,
)
from pipeline.process import Command, collect_outputs, failure, find_command
from pipeline.settings import JobSettings
from profiling.metrics import stage_order
from profiling.protocol import MAX_SUBSTAGES, substage, substage_problem

BASE_ENV = {ENV.INPUT: "s3://in-bucket/images/", ENV.OUTPUT: "s3://out-bucket/shards/", ENV.IMAGES_PER_CHILD: "5",
            ENV.TASK_ID: "t-1"}


@pytest.mark.parametrize(("text", "problem"), [
    ("", "is empty"),
    ("python stats.py {input}", "has no {output}"),
    ("python 'stats.py {input} {output}", "is not a command line"),
    ("{input} {output}", "starts with a placeholder"),
    ("x" * 5000 + " {input} {output}", "over 4096"),
])
def test_a_command_line_names_what_is_wrong(text: str, problem: str) -> None:
    found = process_command_problem(text)
    assert found is not None and problem in found


def test_placeholders_fill_whole_words_and_parts_of_words() -> None:
    assert process_command_problem(DEFAULT_PROCESS_COMMAND) is None
    assert process_argv("tool --in={input} '{output}/my dir'", "/s/in", "/s/out") == \
        ["tool", "--in=/s/in", "/s/out/my dir"]


def test_settings_carry_the_command_both_ways() -> None:
    default = JobSettings.from_env(BASE_ENV)
    assert default.process_command == DEFAULT_PROCESS_COMMAND and ENV.PROCESS_COMMAND not in default.to_env()
    own = JobSettings.from_env({**BASE_ENV, ENV.PROCESS_COMMAND: "python s.py {input} {output}"})
    assert own.to_env()[ENV.PROCESS_COMMAND] == "python s.py {input} {output}"
    assert JobSettings.from_env(own.to_env()) == own
    with pytest.raises(UsageError, match=rf"{ENV.PROCESS_COMMAND} 'python s\.py' has no \{{input\}}"):
        JobSettings.from_env({**BASE_ENV, ENV.PROCESS_COMMAND: "python s.py"})


def test_the_program_is_found_or_named(tmp_path: Path) -> None:
    assert find_command(DEFAULT_PROCESS_COMMAND, "part-00001").program.endswith("/iobatch")
    with pytest.raises(UsageError, match=r"child part-00001: process command 'nope-x \{input\} \{output\}': "
                                         "nope-x is not on PATH"):
        find_command("nope-x {input} {output}", "part-00001", path="")
    script = tmp_path / "s.sh"
    script.write_text("exit 0\n")
    with pytest.raises(UsageError, match="is not executable"):
        find_command(f"{script} {{input}} {{output}}", "part-00001")
    with pytest.raises(UsageError, match="does not exist"):
        find_command(f"{tmp_path}/none {{input}} {{output}}", "part-00001")


def test_exit_codes_map_to_the_projects() -> None:
    command = Command("s {input} {output}", "part-00002", "/bin/s")
    assert failure(command, 65, "x").exit_code == EXIT_PERMANENT
    assert failure(command, 75, "x").exit_code == EXIT_RETRYABLE
    bug = failure(command, -9, "")  # the raw return code of a kill by SIGKILL
    assert bug.exit_code == EXIT_BUG and "killed by signal 9" in bug.headline and "printed nothing" in bug.headline


def test_a_command_that_exits_255_was_not_killed() -> None:
    # 255 - 128 is no signal: a command's own exit 255 (ssh's, a shell's `exit -1`) is said as it was.
    bug = failure(Command("s {input} {output}", "part-00002", "/bin/s"), 255, "")
    assert "exited 255" in bug.headline and "signal" not in bug.headline


def test_outputs_are_regular_files_sorted_by_key(tmp_path: Path) -> None:
    command = Command("s {input} {output}", "part-00002", "/bin/s")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.bin").write_bytes(b"12")
    (tmp_path / "a.txt").write_bytes(b"1")
    (tmp_path / "empty-dir").mkdir()
    found = collect_outputs(command, tmp_path, prefix="shards/part-00002/")
    assert [(o.name, o.size) for o in found] == [("a.txt", 1), ("b/z.bin", 2)]
    os.mkfifo(tmp_path / "b" / "pipe")
    with pytest.raises(PermanentError, match="b/pipe in its output, which is not a regular file"):
        collect_outputs(command, tmp_path, prefix="")
    (tmp_path / "b" / "pipe").unlink()
    with pytest.raises(PermanentError, match="over S3's 1024"):
        collect_outputs(command, tmp_path, prefix="p" * 1020)


def test_substage_names_and_their_order() -> None:
    assert substage_problem("features-2") is None
    assert substage_problem("Features") and substage_problem("") and substage_problem("a/b") and substage_problem(3)
    assert MAX_SUBSTAGES == 8
    assert stage_order(["upload", "process/write", "download", "process", "process/stats", "other"]) == \
        ["download", "process", "process/stats", "process/write", "upload", "other"]
    with pytest.raises(ValueError, match="is not 1-32 lowercase"), substage("No Good"):
        pass
    with substage("fine", socket_path="") as stage:  # no profiler: the body just runs
        stage.items = 1


def test_the_stack_sets_the_command_and_the_image() -> None:
    settings = StackSettings.from_context({"processCommand": "python /opt/s.py {input} {output}",
                                           "jobImage": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/my-iob:v2"})
    assert settings.process_command == "python /opt/s.py {input} {output}"
    assert StackSettings.from_context(settings.to_context()) == settings
    match = ECR_IMAGE.match(settings.job_image or "")
    assert match and (match["account"], match["region"], match["repository"]) == \
        ("123456789012", "eu-west-1", "team/my-iob")
    with pytest.raises(SettingsError, match=r"processCommand 'python s\.py' has no \{input\}"):
        StackSettings.from_context({"processCommand": "python s.py"})
    with pytest.raises(SettingsError, match="jobImage 'not an image' is not an image reference"):
        StackSettings.from_context({"jobImage": "not an image"})
