"""pipeline.submit.plan: naming, validation, sharding into array jobs and the SubmitJob requests (pure)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import submit as sub
from pipeline.errors import EXIT_USAGE, PermanentError, UsageError
from pipeline.interface import CONTAINERS, ENV
from pipeline.settings import JobSettings, S3Uri

JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


# ---- naming and validation -------------------------------------------------------------------------


@pytest.mark.parametrize(("uri", "k", "name"), [
    ("s3://bkt/batches/2026-11-22.jsonl", 5, "2026-11-22-k5"),
    ("s3://bkt/images/cam0/", 10, "images-cam0-k10"),
    ("s3://bkt/", 1, "bkt-k1"),
    ("s3://bkt/weird name+x.json", 2, "weird-name-x-k2"),
])
def test_batch_name_is_stable_and_includes_k(uri: str, k: int, name: str) -> None:
    assert sub.batch_name(S3Uri.parse(uri, what="t"), k) == name


def test_request_defaults_output_to_the_stack_output_bucket() -> None:
    request = sub.SubmitRequest.build(manifest=None, prefix="s3://inb/images", images_per_child=4, output=None,
                                      input_bucket="inb", output_bucket="outb")
    assert request.input == S3Uri("inb", "images/")
    assert request.output == S3Uri("outb", "images-k4/")
    assert request.manifest is None and request.source == request.input


def test_request_with_a_manifest_reads_keys_from_the_input_bucket() -> None:
    request = sub.SubmitRequest.build(manifest="s3://anywhere/bb/x.jsonl", prefix=None, images_per_child=2,
                                      output="s3://outb/p", input_bucket="inb", output_bucket="outb")
    assert request.input == S3Uri("inb", "") and request.output == S3Uri("outb", "p/")
    assert request.manifest == S3Uri("anywhere", "bb/x.jsonl")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"prefix": "s3://inb/i/", "images_per_child": 0}, "--images-per-job is 0: give 1 or more"),
    ({"prefix": "s3://inb/i/", "manifest": "s3://inb/m.jsonl"}, "give exactly one of --manifest"),
    ({}, "give exactly one of --manifest"),
    ({"prefix": "s3://other/i/"}, "--prefix s3://other/i/ is outside the stack's input bucket inb"),
    ({"manifest": "s3://inb/folder/"}, "names a folder"),
    ({"prefix": "s3://inb/", "output": "s3://inb/out/", "input_bucket": None, "output_bucket": None},
     "is inside the input prefix"),
    ({"prefix": "not-a-uri"}, "is not an S3 URI"),
])
def test_request_rejects_bad_flags(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"manifest": None, "prefix": None, "images_per_child": 3, "output": None,
                            "input_bucket": "inb", "output_bucket": "outb", **kwargs}
    with pytest.raises(UsageError) as caught:
        sub.SubmitRequest.build(**args)
    assert message in caught.value.headline and caught.value.exit_code == EXIT_USAGE


def test_request_keeps_to_the_prefixes_the_job_role_may_use() -> None:
    stack: dict[str, Any] = {"input_bucket": "inb", "output_bucket": "outb", "input_prefix": "images/",
                             "output_prefix": "shards/"}
    request = sub.SubmitRequest.build(manifest=None, prefix="s3://inb/images/cam0/", images_per_child=2,
                                      output=None, **stack)
    assert request.output == S3Uri("outb", "shards/images-cam0-k2/")
    by_manifest = sub.SubmitRequest.build(manifest="s3://inb/m.jsonl", prefix=None, images_per_child=2,
                                          output=None, **stack)
    assert by_manifest.input == S3Uri("inb", "images/")  # its keys are checked against it when it is frozen
    with pytest.raises(UsageError, match=r"outside s3://inb/images/, the only prefix the job may read"):
        sub.SubmitRequest.build(manifest=None, prefix="s3://inb/raw/", images_per_child=2, output=None, **stack)
    with pytest.raises(UsageError, match=r"outside s3://outb/shards/, the only place the job may write"):
        sub.SubmitRequest.build(manifest=None, prefix="s3://inb/images/", images_per_child=2,
                                output="s3://outb/elsewhere/", **stack)


def test_local_default_output_inside_a_whole_bucket_input_asks_for_output() -> None:
    with pytest.raises(UsageError, match="give --output elsewhere"):
        sub.SubmitRequest.build(manifest=None, prefix="s3://inb/", images_per_child=1, output=None)


# ---- planning --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("children", "sizes"), [
    (1, [1]), (2, [2]), (10_000, [10_000]), (10_001, [10_000, 1]), (25_000, [10_000, 10_000, 5_000]),
])
def test_plan_shards_into_arrays_of_at_most_ten_thousand(children: int, sizes: list[int]) -> None:
    plans = sub.plan_array_jobs("b", children=children, images=children * 3, images_per_child=3)
    assert [p.size for p in plans] == sizes
    assert [p.offset for p in plans] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert all(JOB_NAME.match(p.name) for p in plans) and len({p.name for p in plans}) == len(plans)


@given(children=st.integers(1, 60_000), per_child=st.integers(1, 50), short=st.integers(0, 49))
def test_plan_covers_every_child_and_image_once(children: int, per_child: int, short: int) -> None:
    images = max(children * per_child - min(short, per_child - 1), (children - 1) * per_child + 1)
    plans = sub.plan_array_jobs("b", children=children, images=images, images_per_child=per_child)
    assert len(plans) == math.ceil(children / 10_000)
    assert sum(p.size for p in plans) == children and sum(p.images for p in plans) == images
    assert all(1 <= p.size <= 10_000 for p in plans)


def test_plan_of_nothing_is_an_error() -> None:
    with pytest.raises(PermanentError, match="no children"):
        sub.plan_array_jobs("b", children=0, images=0, images_per_child=1)


def _request(force: bool = False) -> sub.SubmitRequest:
    return sub.SubmitRequest.build(manifest=None, prefix="s3://inb/img/", images_per_child=5, output=None,
                                   input_bucket="inb", output_bucket="outb", force=force)


def test_requests_override_both_containers_and_read_back_as_job_settings() -> None:
    target = sub.BatchTarget("queue", "def", ("job", "profiler", "log-router"))
    planned = sub.plan_requests(_request(force=True), target, manifest=S3Uri("outb", "img-k5/_batch/manifest.jsonl"),
                                children=10_003, images=50_012)
    (first_plan, first), (second_plan, second) = planned
    assert first["arrayProperties"] == {"size": 10_000} and second["arrayProperties"] == {"size": 3}
    assert "parameters" not in first and "containerOverrides" not in first
    containers = first["ecsPropertiesOverride"]["taskProperties"][0]["containers"]
    assert [c["name"] for c in containers] == ["job", "profiler"]  # the log router reads no IOBATCH_*
    env = {e["name"]: e["value"] for e in second["ecsPropertiesOverride"]["taskProperties"][0]["containers"][1][
        "environment"]}
    assert env[ENV.ARRAY_OFFSET] == "10000" and env[ENV.FORCE] == "1"
    # What a child of the second array job (index 2) reads back: global child 10,002.
    settings = JobSettings.from_env({**env, ENV.ARRAY_INDEX: "2"})
    assert settings.array_index == 10_002 and settings.force and settings.images_per_child == 5
    assert settings.manifest == S3Uri("outb", "img-k5/_batch/manifest.jsonl")
    assert second["tags"][sub.TAG_IMAGES] == "12" and first_plan.images == 50_000 and second_plan.images == 12


def test_a_single_child_is_a_plain_job_with_container_overrides() -> None:
    (_, only), = sub.plan_requests(_request(), sub.BatchTarget("q", "d", None), manifest=S3Uri("obk", "m"),
                                   children=1, images=4)
    assert "arrayProperties" not in only
    assert {e["name"] for e in only["containerOverrides"]["environment"]} == {
        ENV.INPUT, ENV.OUTPUT, ENV.MANIFEST, ENV.IMAGES_PER_CHILD, ENV.ARRAY_OFFSET, ENV.FORCE}


def test_check_flags_needs_no_client() -> None:
    with pytest.raises(UsageError, match="give 1 or more"):
        sub.check_flags(manifest=None, prefix="s3://bkt/p/", images_per_child=-1)


def test_a_target_overrides_the_interface_containers_by_default() -> None:
    assert sub.BatchTarget("q", "d").containers == CONTAINERS == ("job", "profiler")


def _ecs_tag_value() -> Any:
    """ECS's tag value rule, from botocore's ECS model (shape TagValue), as `regex` reads \\p{...} classes."""
    regex = pytest.importorskip("regex")
    from botocore.loaders import Loader

    shape = Loader().load_service_model("ecs", "service-2")["shapes"]["TagValue"]
    pattern = regex.compile(shape["pattern"])
    return lambda value: pattern.fullmatch(value) is not None and len(value) <= shape["max"]


def test_an_output_prefix_ecs_would_refuse_as_a_tag_value_is_tagged_as_it_accepts() -> None:
    ecs_accepts = _ecs_tag_value()
    request = sub.SubmitRequest.build(manifest=None, prefix="s3://inb/img/", images_per_child=5, input_bucket="inb",
                                      output="s3://outb/run (1) it's done!/été", output_bucket="outb")
    (_, only), = sub.plan_requests(request, sub.BatchTarget("q", "d"), manifest=S3Uri("outb", "m"), children=1,
                                   images=4)
    assert not ecs_accepts(str(request.output))
    assert only["tags"][sub.TAG_OUTPUT] == "s3://outb/run _1_ it_s done_/été/"
    assert all(ecs_accepts(value) for value in only["tags"].values())


@given(st.text(max_size=400))
def test_every_tag_value_is_one_ecs_accepts(text: str) -> None:
    assert _ecs_tag_value()(sub.tag_value(text))
