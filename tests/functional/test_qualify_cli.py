"""`iobatch qualify` on a directory of this machine: the figures, the expectation of the chosen volume and instance
type from the one model, the ratio, the cost; and bad flags as one line and exit 64, nothing left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import app
from pipeline.errors import EXIT_USAGE
from tests.support.cli import CliRunner
from tuning.ebs import Volume
from tuning.instances import lookup
from tuning.qualify import expect


def test_qualify_a_directory_against_a_volume_on_an_instance(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["qualify", str(tmp_path), "--volume-type", "gp3", "--volume-size-gib", "100",
                                      "--instance-type", "m6i.large", "--seconds", "1", "--max-gib", "0.1", "--json"])
    if "refuses O_DIRECT" in result.stderr:
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    record, expected = out["record"], out["expected"]
    assert expected["write_mibps"] == round(expect(Volume("gp3", 100), lookup("m6i.large")).write_mibps, 2) == 125
    assert record["bytes"] <= 0.1 * 2**30 and record["write"]["ios"] > 0 and record["read"]["ios"] > 0
    assert record["ratio"] == pytest.approx(min(record["write"]["mibps"], record["read"]["mibps"]) / 125, abs=1e-3)
    assert record["random_read"] is None  # EBS: no small random reads unless --small
    assert list(tmp_path.iterdir()) == []  # the probe file is removed


def test_an_instance_store_adds_small_random_reads_and_the_text_says_the_ratio(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["qualify", str(tmp_path), "--volume", "nvme:m6id.large", "--seconds", "1",
                                      "--max-gib", "0.1"])
    if "refuses O_DIRECT" in result.stderr:
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"qualify {tmp_path} (file, 1024 KiB I/O")
    assert [line.split()[0] for line in lines[1:4]] == ["sequential", "sequential", "4"]
    assert any(line.startswith("ratio ") and line.endswith("(a host below 0.5x is slow)") for line in lines)


@pytest.mark.parametrize(("args", "message"), [
    (["--volume", "st1:50"], "--volume 'st1:50': size (GiB) 50 is outside 125-16384 for st1"),
    (["--volume-type", "st1"], "--volume-type and --volume-size-gib go together"),
    (["--volume", "st1:500", "--volume-type", "st1", "--volume-size-gib", "500"], "not both"),
    (["--instance-type", "m9z.large"], "--instance-type 'm9z.large' is not in the instance table"),
    (["--io-size-kib", "6"], "--io-size-kib 6 is not a multiple of 4"),
    (["NOWHERE"], "no such directory or device"),
])
def test_bad_flags_are_one_line_and_exit_64(tmp_path: Path, args: list[str], message: str) -> None:
    given = [str(tmp_path / a) if a == "NOWHERE" else a for a in args]
    result = CliRunner().invoke(app, ["qualify", *([] if "NOWHERE" in args else [str(tmp_path)]), *given])
    assert result.exit_code == EXIT_USAGE, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert list(tmp_path.iterdir()) == []
