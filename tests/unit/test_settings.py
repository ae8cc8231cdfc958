from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import UsageError
from pipeline.interface import ENV
from pipeline.settings import JobSettings, S3Uri, parse_train_size

BASE = {ENV.INPUT: "s3://in-bucket/images", ENV.OUTPUT: "s3://out-bucket/train/", ENV.IMAGES_PER_CHILD: "4"}


def test_from_env_reads_the_batch_contract() -> None:
    env = {**BASE, ENV.ARRAY_INDEX: "3", ENV.ARRAY_OFFSET: "10000", ENV.JOB_ID: "abc:3",
           ENV.SCRATCH: "/mnt/s", ENV.TRAIN_SIZE: "64x48", ENV.FORCE: "1"}
    s = JobSettings.from_env(env)
    assert s.input == S3Uri("in-bucket", "images/")
    assert s.array_index == 10003
    assert s.child == "part-10003"
    # Scratch is the attempt's (job id and attempt when no launcher or ECS names the task), not the index's.
    assert s.work_dir == Path("/mnt/s/task-abc-3-1")
    assert s.socket_path == Path("/mnt/s/task-abc-3-1/profiler.sock")
    assert s.train_size == (64, 48)
    assert s.force and not s.skip_bad_images
    assert str(s.child_output) == "s3://out-bucket/train/part-10003/"


def test_profiler_can_be_switched_off() -> None:
    off = JobSettings.from_env({**BASE, ENV.PROFILER_SOCKET: "off"})
    assert off.socket_path is None
    assert JobSettings.from_env(off.to_env()).socket_path is None
    assert JobSettings.from_env({**BASE, ENV.PROFILER_SOCKET: "/run/p.sock"}).socket_path == Path("/run/p.sock")


def test_to_env_round_trips() -> None:
    s = JobSettings.from_env({**BASE, ENV.ARRAY_INDEX: "2", ENV.S3_ENDPOINT: "http://127.0.0.1:9"})
    assert JobSettings.from_env(s.to_env()) == s


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({ENV.INPUT: ""}, "IOBATCH_INPUT is not set"),
        ({ENV.INPUT: "bucket/prefix"}, "is not an S3 URI"),
        ({ENV.INPUT: "s3://B_ad/prefix"}, "bucket name 'B_ad' is not valid"),
        ({ENV.IMAGES_PER_CHILD: "zero"}, "is not a whole number"),
        ({ENV.IMAGES_PER_CHILD: "0"}, "is out of range: give 1 to"),
        ({ENV.ARRAY_INDEX: "-1"}, "is out of range: give 0 to"),
        ({ENV.TRAIN_SIZE: "big"}, "is not a size"),
    ],
)
def test_bad_variables_name_the_variable(change: dict[str, str], fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        JobSettings.from_env({**BASE, **change})


def test_an_index_past_any_batch_is_bad_input_after_every_variable_is_checked() -> None:
    from pipeline.errors import ManifestError
    from pipeline.settings import MAX_CHILD_INDEX

    for change in ({ENV.ARRAY_INDEX: "99999999999"}, {ENV.ARRAY_INDEX: "9" * 30},
                   {ENV.ARRAY_INDEX: str(MAX_CHILD_INDEX), ENV.ARRAY_OFFSET: "1"}):
        with pytest.raises(ManifestError, match="is beyond any batch"):
            JobSettings.from_env({**BASE, **change})
    # Text or a negative number is a bad variable (64) with the real range; so is another bad variable beside.
    with pytest.raises(UsageError, match=f"give 0 to {MAX_CHILD_INDEX}$"):
        JobSettings.from_env({**BASE, ENV.ARRAY_INDEX: "-1"})
    with pytest.raises(UsageError, match="IOBATCH_TRAIN_SIZE"):
        JobSettings.from_env({**BASE, ENV.ARRAY_INDEX: "99999999999", ENV.TRAIN_SIZE: "big"})


def test_train_size_parses() -> None:
    assert parse_train_size(" 640 x 480 ") == (640, 480)
    with pytest.raises(UsageError):
        parse_train_size("4x4")
