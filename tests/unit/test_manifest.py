from __future__ import annotations

import io
import json
import re

import pytest

from pipeline.errors import ManifestError, UsageError
from pipeline.manifest import (
    OFFSET,
    FrozenManifestWriter,
    KeyRepeats,
    ManifestEntry,
    array_jobs,
    children_for,
    index_range,
    is_image_key,
    parse_index_range,
    parse_line,
    parse_manifest,
    shard_bounds,
)


def test_parse_key_and_uri_forms() -> None:
    assert parse_line('{"key": "a/b.png"}', bucket="in", where="m line 1") == ManifestEntry("a/b.png")
    assert parse_line('{"uri": "s3://in/a/c.png", "size": 7}', bucket="in", where="x") == ManifestEntry("a/c.png", 7)
    assert parse_line("   \n", bucket="in", where="x") is None


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("not json", "m line 3 is not JSON"),
        ("[1, 2]", "is not a JSON object"),
        ('{"size": 3}', "names no object"),
        ('{"key": ""}', "names no object"),
        ('{"key": "dir/"}', "names no object"),
        ('{"uri": "s3://other/a.png"}', "outside the input bucket in"),
        ('{"uri": "http://x/a.png"}', "is not an s3:// URI"),
        ('{"key": "a.png", "size": -1}', "is not a byte count"),
        ('{"key": "a.png", "size": true}', "is not a byte count"),
    ],
)
def test_bad_lines_name_the_line(line: str, fragment: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_line(line, bucket="in", where="m line 3")
    assert fragment in caught.value.headline
    assert "\n" not in caught.value.headline


def test_parse_manifest_counts_lines_from_one() -> None:
    lines = ['{"key": "a"}\n', "\n", "oops\n"]
    with pytest.raises(ManifestError, match=re.escape("s3://b/m.jsonl line 3 is not JSON")):
        list(parse_manifest(lines, bucket="b", source="s3://b/m.jsonl"))


def test_image_keys_skip_markers_and_own_files() -> None:
    assert is_image_key("img/a.png", "img/")
    assert not is_image_key("img/", "img/")
    assert not is_image_key("img/sub/", "img/")
    assert not is_image_key("img/_batch/manifest.jsonl", "img/")
    assert not is_image_key("img/_SUCCESS", "img/")


def test_sharding_covers_every_entry_once() -> None:
    total, per = 23, 5
    children = children_for(total, per)
    assert children == 5
    covered = [i for c in range(children) for i in range(*shard_bounds(c, per, total))]
    assert covered == list(range(total))
    assert shard_bounds(7, per, total) == (23, 23)
    with pytest.raises(UsageError):
        children_for(10, 0)


def test_array_jobs_respect_the_batch_limit() -> None:
    assert array_jobs(1) == [(0, 1)]
    assert array_jobs(10_000) == [(0, 10_000)]
    assert array_jobs(25_001) == [(0, 10_000), (10_000, 10_000), (20_000, 5_001)]
    assert sum(size for _, size in array_jobs(123_457)) == 123_457


def test_frozen_index_gives_each_child_its_own_lines() -> None:
    body, index = io.BytesIO(), io.BytesIO()
    writer = FrozenManifestWriter(body, index, per_child=3)
    entries = [ManifestEntry(f"k/{i}.png", i) for i in range(8)]
    for entry in entries:
        writer.add(entry)
    assert writer.close() == 3
    assert len(index.getvalue()) == 4 * OFFSET.size  # children + 1 offsets
    for child in range(3):
        start, end = index_range(child)
        lo, hi = parse_index_range(index.getvalue()[start:end], child)
        lines = body.getvalue()[lo:hi].splitlines()
        got = [parse_line(line, bucket="b", where="t") for line in lines]
        assert got == entries[child * 3:(child + 1) * 3]
    start, end = index_range(3)
    with pytest.raises(ManifestError, match="no entry for child 3"):
        parse_index_range(index.getvalue()[start:end], 3)


# ---- keys: under the input prefix, plain paths, each once ------------------------------------------


@pytest.mark.parametrize(("key", "fragment"), [
    ("raw/a.png", "key raw/a.png is outside the input prefix images/, the only keys the job may read"),
    ("images2/a.png", "is outside the input prefix images/"),
    ("images/../secrets/a.png", "has an empty, '.' or '..' path segment"),
    ("images/./a.png", "path segment"), ("images//a.png", "path segment"), ("images/..", "path segment"),
])
def test_a_key_outside_the_prefix_or_with_odd_segments_is_bad_input(key: str, fragment: str) -> None:
    lines = ['{"key": "images/ok.png"}\n', json.dumps({"key": key}) + "\n"]
    with pytest.raises(ManifestError) as caught:
        list(parse_manifest(lines, bucket="in", source="s3://in/m.jsonl", prefix="images/"))
    assert caught.value.headline.startswith("s3://in/m.jsonl line 2: ") and fragment in caught.value.headline
    assert caught.value.exit_code == 65


def test_a_uri_line_is_held_to_the_prefix_too() -> None:
    with pytest.raises(ManifestError, match=re.escape("line 1: key raw/a.png is outside the input prefix images/")):
        list(parse_manifest(['{"uri": "s3://in/raw/a.png"}'], bucket="in", source="m", prefix="images/"))


def test_a_key_listed_twice_names_both_lines_once_the_manifest_is_read() -> None:
    lines = [json.dumps({"key": f"images/{i}.png"}) for i in range(6)]
    lines[4] = lines[1]  # "images/1.png" again
    lines[5] = json.dumps({"uri": "s3://in/images/0.png"})  # the same key in the other form
    got: list[str] = []
    with pytest.raises(ManifestError) as caught:
        got.extend(entry.key for entry in parse_manifest(lines, bucket="in", source="s3://in/m.jsonl"))
    assert caught.value.headline == ("s3://in/m.jsonl line 5 lists the key of line 2 again: list each image once "
                                     "(a repeat would be processed twice)")
    assert len(got) == 6  # streamed: nothing is written before the whole manifest has been read


def test_key_repeats_finds_the_first_repeat_among_many() -> None:
    repeats = KeyRepeats()
    for number in range(1, 200_001):
        repeats.add(f"images/{number % 150_000}.png", number)
    assert repeats.first_repeat() == (1, 150_001)
    single = KeyRepeats()
    single.add("a", 1)
    assert single.first_repeat() is None and KeyRepeats().first_repeat() is None


def test_a_manifest_without_prefix_or_repeats_streams_every_key() -> None:
    lines = [json.dumps({"key": f"k/{i}"}) for i in range(1000)]
    assert [e.key for e in parse_manifest(lines, bucket="in", source="m")] == [f"k/{i}" for i in range(1000)]
