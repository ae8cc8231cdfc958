"""Qualification's expectation from the one model (tuning/qualify.py) per volume type and instance type, what it
costs, its policy's context keys, and the verdict and properties the measurement's record gives (profiling)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from profiling import qualifyio
from profiling.qualification import host_properties, read_qualification
from profiling.qualifyio import QUALIFIED, SLOW, UNJUDGED, judge, properties
from tuning.ebs import MIB, Volume
from tuning.host import HostReport, HostTuning, HostTuningError, strip_comments
from tuning.instances import lookup
from tuning.instancestore import InstanceStore
from tuning.qualify import QualifyPolicy, QualifyPolicyError, cost, expect, expected_table


def test_st1_and_sc1_expect_their_burst_while_a_new_bucket_lasts_and_say_their_baseline() -> None:
    st1 = expect(Volume("st1", 500), lookup("m6i.2xlarge"))
    assert st1.write_mibps == st1.read_mibps == pytest.approx(500 / 1024 * 250)  # 122.07: 250 MiB/s per TiB
    assert st1.baseline_mibps == pytest.approx(500 / 1024 * 40)
    assert expect(Volume("st1", 4096)).write_mibps == 500  # the st1 cap
    sc1 = expect(Volume("sc1", 2048))
    assert (sc1.write_mibps, sc1.baseline_mibps) == (pytest.approx(160), pytest.approx(24))


def test_gp2_and_gp3_expect_their_ceiling_at_1_mib_io() -> None:
    assert expect(Volume("gp2", 100)).write_mibps == 128
    assert expect(Volume("gp2", 200)).write_mibps == 250  # bursting, 170-334 GiB
    assert expect(Volume("gp2", 200)).baseline_mibps == 128
    assert expect(Volume("gp3", 100)).write_mibps == 125
    gp3 = Volume("gp3", 100, iops=8000, throughput_mibps=1000)
    assert expect(gp3).write_mibps == expect(gp3).baseline_mibps == 1000


def test_the_instances_ebs_bandwidth_caps_a_fast_volume_at_its_burst_then_its_baseline() -> None:
    io2 = Volume("io2", 4096, iops=256_000)
    assert expect(io2).write_mibps == 4000
    large, big = lookup("m6i.large"), lookup("m6i.12xlarge")
    assert large is not None and big is not None
    small = expect(io2, large)
    assert small.write_mibps == pytest.approx(10_000e6 / 8 / MIB)  # 1,192: m6i.large bursts to 10 Gbps
    assert small.baseline_mibps == pytest.approx(650e6 / 8 / MIB)
    assert "capped by m6i.large's EBS bandwidth" in small.basis
    assert expect(io2, big).write_mibps == expect(io2, big).baseline_mibps == pytest.approx(15_000e6 / 8 / MIB)
    # st1's 122 MiB/s is below every instance's cap: the instance does not change it.
    assert expect(Volume(), large).write_mibps == expect(Volume()).write_mibps


@pytest.mark.parametrize(("name", "write_iops", "read_iops"), [("m6id.large", 16_771, 33_542),
                                                                 ("i4i.xlarge", 55_000, 100_000)])
def test_an_instance_store_expects_its_rated_iops_by_4_kib(name: str, write_iops: int, read_iops: int) -> None:
    kind = lookup(name)
    assert kind is not None
    store = expect(InstanceStore.of(kind))
    assert store.write_mibps == pytest.approx(write_iops * 4096 / MIB)
    assert store.read_mibps == pytest.approx(read_iops * 4096 / MIB)
    assert store.random_read_iops == read_iops


def test_the_user_datas_table_lists_only_the_types_that_change_the_figure() -> None:
    assert expected_table(Volume(), ["m6i", "c6i.large"], MIB) == {"*": [122.07, 122.07]}
    table = expected_table(Volume("gp3", 100, iops=16000, throughput_mibps=2000), ["m6i"], MIB)
    assert table["*"] == [2000.0, 2000.0] and table["m6i.large"] == [1192.09, 1192.09]
    assert "m6i.16xlarge" not in table  # 20 Gbps: above 2,000 MiB/s
    assert expected_table(Volume(), ["m6id.large"], MIB, store=True) == {"*": [0.0, 0.0],
                                                                         "m6id.large": [65.51, 131.02]}


def test_what_a_qualification_costs_a_new_st1_and_a_gp2() -> None:
    st1 = Volume("st1", 500)
    spent = cost(st1, expect(st1))
    assert spent.seconds == pytest.approx(10, rel=0.01)
    assert spent.bytes == pytest.approx(10 * 122.07 * MIB, rel=0.01)  # 5.5 s of writes, 4.5 s reading them back
    assert spent.credits == pytest.approx(spent.bytes / MIB) and spent.bucket_share == pytest.approx(
        spent.credits / (500 * 1024))
    assert spent.bytes <= qualifyio.MAX_BYTES
    gp2 = Volume("gp2", 200)
    fast = cost(gp2, expect(gp2))
    assert fast.bytes == qualifyio.MAX_BYTES and fast.seconds < 10
    assert fast.credits == pytest.approx(fast.bytes / MIB * 4)  # one I/O credit per 256 KiB
    assert cost(Volume("gp3", 100), expect(Volume("gp3", 100))).credits == 0


def test_the_policys_context_keys_round_trip_and_bad_values_name_the_key() -> None:
    policy = QualifyPolicy.from_context({"hostQualification": "Fence", "qualifyMinRatio": "0.3",
                                         "fencesPerHour": "5", "qualifyIoSizeKiB": "256"})
    assert policy == QualifyPolicy("fence", 0.3, 5, 256)
    assert QualifyPolicy.from_context(policy.to_context()) == policy
    assert QualifyPolicy().to_context() == {}
    tuning = HostTuning.from_context({"hostQualification": "fence"})
    assert tuning.qualification.mode == "fence" and HostTuning.from_context(tuning.to_context()) == tuning
    for ctx, message in [({"hostQualification": "kill"}, "hostQualification 'kill' is not one of flag, fence, off"),
                         ({"qualifyMinRatio": "1.5"}, "qualifyMinRatio 1.5 is not between 0 and 1"),
                         ({"qualifyMinRatio": "half"}, "qualifyMinRatio='half' is not a number"),
                         ({"fencesPerHour": "0"}, "fencesPerHour 0 is outside 1-50"),
                         ({"qualifyIoSizeKiB": "6"}, "qualifyIoSizeKiB 6 is not a multiple of 4")]:
        with pytest.raises(QualifyPolicyError, match=message):
            QualifyPolicy.from_context(ctx)
        with pytest.raises(HostTuningError, match=message):
            HostTuning.from_context(ctx)


def record(write: float, read: float) -> dict[str, object]:
    return {"write": {"mibps": write}, "read": {"mibps": read}}


def test_the_verdict_is_the_lower_of_write_and_read_against_its_own_expectation() -> None:
    slow = judge(record(100.0, 4.0), 122.0, 122.0, 0.5)
    assert slow["verdict"] == SLOW and slow["ratio"] == pytest.approx(4 / 122, abs=1e-3)
    assert judge(record(65.0, 200.0), 65.5, 131.0, 0.5)["verdict"] == QUALIFIED
    assert judge(record(65.0, 200.0), 0.0, 0.0, 0.5)["verdict"] == UNJUDGED
    props = properties(slow)
    assert props == {"HostQualification": "slow", "QualifiedMiBps": "4.0", "QualifiedExpectedMiBps": "122.0",
                     "QualifiedRatio": "0.033"}
    quality = read_qualification(props)
    assert quality is not None and quality.slow and quality.ratio == 0.033
    assert quality.describe() == "qualified at 0.03x of 122.0 MiB/s, 4.0 MiB/s (slow)"


@pytest.mark.parametrize("content", ["", "{", "[]", '{"verdict": "slow"}', '{"write": {"mibps": "x"}}',
                                     json.dumps({**record(-1.0, 1.0), "verdict": "qualified"}),
                                     json.dumps({**record(10.0, 1.0), "verdict": "great"})])
def test_a_damaged_qualification_file_gives_no_properties(tmp_path: Path, content: str) -> None:
    path = tmp_path / "qualification.json"
    path.write_text(content)
    assert host_properties(path) == {}
    assert host_properties(tmp_path / "none.json") == {}


def test_the_measurement_is_python_3_9_code_and_the_user_data_qualifies_before_the_ready_marker() -> None:
    ast.parse(Path(qualifyio.__file__).read_text(), feature_version=(3, 9))
    script = HostTuning(scratch="instance-store").render_script(report=HostReport("g", "p"),
                                                                instance_types=["m6id.large"])
    qualify, ready = script.index('hostpy qualify "$QUALIFY_CONF"'), script.index('> "$MOUNT_POINT/$READY_MARKER.tmp"')
    assert script.index('mount -t "$FILESYSTEM"') < qualify < ready
    conf = json.loads(script.split("\nQUALIFY_CONF=", 1)[1].split("\n", 1)[0].strip("'"))
    assert conf["small"] is True and conf["expected"]["m6id.large"] == [65.51, 131.02]
    # No comments: the one line that starts with # is the sysctl file's, in its heredoc.
    assert [line for line in script.splitlines()[1:] if line.startswith("#")] == [
        "# iobatch page-cache tuning (tuning/host.py)"]


def test_strip_comments_keeps_the_shebang_heredocs_and_a_space_where_a_line_continued() -> None:
    text = "#!/bin/bash\n# a comment\n  x=1 \\\n    && y\ncat <<'E'\n  # kept\nE\n\n  z # not whole\n"
    assert strip_comments(text) == "#!/bin/bash\nx=1 \\\n && y\ncat <<'E'\n  # kept\nE\nz # not whole\n"
