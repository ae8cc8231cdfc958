"""freeze_manifest, the freeze's block-at-a-time path, against the line-by-line reference it replaces.

The reference is what `iobatch submit` did before: every line through manifest_lines and parse_manifest (parse_line,
the key checks, KeyRepeats) into FrozenManifestWriter.add. For any manifest, cut into any chunks, both give the same
frozen bytes, the same index and the same totals, or the same error naming the same line.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import manifest as manifest_module
from pipeline.errors import ManifestError
from pipeline.manifest import (
    MAX_KEY_BYTES,
    FrozenManifestWriter,
    KeyRepeats,
    freeze_manifest,
    index_range,
    manifest_lines,
    parse_index_range,
    parse_line,
    parse_manifest,
)

pytestmark = pytest.mark.timeout(300, method="thread")

BUCKET = "in"
SOURCE = "s3://in/m.jsonl"
Frozen = tuple[bytes, bytes, int, int] | str  # (manifest, index, entries, total size), or the error's headline


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


def reference(data: bytes, *, prefix: str, per_child: int, chunk: int) -> Frozen:
    body, index = io.BytesIO(), io.BytesIO()
    writer = FrozenManifestWriter(body, index, per_child)
    try:
        for entry in parse_manifest(manifest_lines(_chunks(data, chunk), source=SOURCE), bucket=BUCKET,
                                    source=SOURCE, prefix=prefix):
            writer.add(entry)
    except ManifestError as exc:
        return exc.headline
    writer.close()
    return body.getvalue(), index.getvalue(), writer.entries, writer.total_size


def frozen(data: bytes, *, prefix: str, per_child: int, chunk: int) -> Frozen:
    body, index = io.BytesIO(), io.BytesIO()
    writer = FrozenManifestWriter(body, index, per_child)
    try:
        freeze_manifest(_chunks(data, chunk), writer, bucket=BUCKET, source=SOURCE, prefix=prefix)
    except ManifestError as exc:
        return exc.headline
    writer.close()
    return body.getvalue(), index.getvalue(), writer.entries, writer.total_size


# Keys near every edge the fast path decides on: segments, the prefix, characters JSON escapes, UTF-8, the length.
key_text = st.one_of(
    st.text(alphabet="ab./ é\u2028\x7f", max_size=12).map(lambda k: "images/" + k),
    st.text(alphabet='ab./"\\\t\x00\x85', max_size=8).map(lambda k: "images/" + k),
    st.sampled_from(["images/", "images", "raw/a", "images//a", "images/./a", "images/../a", "images/a/",
                     "images/.a", "images/..a", "images/a.", "/images/a", "images/a b"]),
    st.integers(min_value=MAX_KEY_BYTES - 9, max_value=MAX_KEY_BYTES - 5).map(lambda n: "images/" + "é" * (n // 2)),
    st.integers(min_value=MAX_KEY_BYTES - 8, max_value=MAX_KEY_BYTES + 2).map(lambda n: "images/" + "a" * (n - 7)),
)
sizes = st.one_of(st.none(), st.integers(min_value=0, max_value=10**6), st.sampled_from(
    [-1, 0, 10**17, 10**18 - 1, 10**18, 2**63, 2**64, 10**19, True, 1.5, "7"]))


@st.composite
def manifest_line(draw: st.DrawFn) -> bytes:
    key = draw(key_text)
    body: dict[str, object] = {"uri": f"s3://{draw(st.sampled_from([BUCKET, 'other']))}/{key}"} \
        if draw(st.integers(0, 4)) == 0 else {"key": key}
    size = draw(sizes)
    if size is not None or draw(st.booleans()):
        body["size"] = size
    if draw(st.integers(0, 9)) == 0:
        body["etag"] = draw(st.sampled_from(['"abc"', "", 7]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\t", " :  ")]))
    text = json.dumps(body, separators=separators, ensure_ascii=draw(st.booleans()))
    text = draw(st.sampled_from(["", " ", "\t", "\ufeff"])) + text + draw(st.sampled_from(["", " ", "\r"]))
    return text.encode("latin-1", "replace") if draw(st.integers(0, 9)) == 0 else text.encode()


manifest_text = st.lists(st.one_of(manifest_line(), manifest_line(), manifest_line(),
                                   st.sampled_from([b"", b"  ", b"{}", b"[1]", b"not json", b"\xff\xfe",
                                                    b'{"key": "images/a", "key": "images/b"}'])),
                         min_size=0, max_size=24)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(manifest_text, st.booleans(), st.sampled_from(["", "images/", "images/a"]), st.integers(1, 4),
       st.integers(1, 200))
def test_the_block_path_freezes_any_manifest_as_the_line_by_line_path_does(
        lines: list[bytes], final_newline: bool, prefix: str, per_child: int, chunk: int) -> None:
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    assert frozen(data, prefix=prefix, per_child=per_child, chunk=chunk) == \
        reference(data, prefix=prefix, per_child=per_child, chunk=chunk)


@settings(max_examples=100)
@given(st.lists(st.tuples(st.text(alphabet="abc/.é", min_size=1, max_size=6), st.none() | st.integers(0, 99)),
                min_size=1, max_size=40), st.integers(1, 5), st.integers(1, 300))
def test_good_manifests_of_the_usual_forms_freeze_alike(entries: list[tuple[str, int | None]], per_child: int,
                                                        chunk: int) -> None:
    """Mostly valid lines (where the random case above is mostly errors): the index and totals are compared too."""
    lines = [json.dumps({"key": f"images/{i}/{k}", **({} if s is None else {"size": s})}, ensure_ascii=False)
             for i, (k, s) in enumerate(entries)]
    data = "\n".join(lines).encode()
    assert frozen(data, prefix="images/", per_child=per_child, chunk=chunk) == \
        reference(data, prefix="images/", per_child=per_child, chunk=chunk)


@pytest.mark.parametrize("form", [
    '{{"key":"images/{i}.png","size":{i}}}', '{{"key": "images/{i}.png", "size": {i}}}\r',
    '{{"uri": "s3://in/images/{i}.png"}}', ' {{ "key" : "images/caf\u00e9/{i}" }} '])
def test_the_usual_forms_never_reach_parse_line(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The block path is taken (else the comparisons above would compare the reference with itself)."""
    data = "".join(form.format(i=i) + "\n" for i in range(5000)).encode()
    expected = reference(data, prefix="images/", per_child=7, chunk=1 << 20)

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("a line of the usual form went line by line")

    monkeypatch.setattr(manifest_module, "parse_line", refused)
    assert frozen(data, prefix="images/", per_child=7, chunk=1 << 20) == expected
    assert isinstance(expected, tuple) and expected[2] == 5000


def test_errors_deep_in_a_large_manifest_name_their_lines() -> None:
    lines = [b'{"key":"images/%d.png","size":1}' % i for i in range(120_000)]
    good = b"\n".join(lines) + b"\n"
    body = frozen(good, prefix="images/", per_child=50, chunk=1 << 20)
    assert isinstance(body, tuple) and body[2] == 120_000 and body[3] == 120_000
    for child in (0, 1234, 2399):  # the index still gives each child its own lines
        start, end = parse_index_range(body[1][slice(*index_range(child))], child)
        got = [parse_line(line, bucket=BUCKET, where="t") for line in body[0][start:end].splitlines()]
        assert [e.key for e in got if e] == [f"images/{i}.png" for i in range(child * 50, child * 50 + 50)]
    bad = lines.copy()
    bad[77_776] = b'{"key":"images/../77776.png","size":1}'
    assert frozen(b"\n".join(bad), prefix="images/", per_child=50, chunk=1 << 20) == (
        "s3://in/m.jsonl line 77777: key images/../77776.png has an empty, '.' or '..' path segment: give the "
        "object's plain key")
    twice = lines.copy()
    twice[100_000] = lines[33]
    assert frozen(b"\n".join(twice), prefix="images/", per_child=50, chunk=1 << 20) == (
        "s3://in/m.jsonl line 100001 lists the key of line 34 again: list each image once (a repeat would be "
        "processed twice)")


def test_key_repeats_are_found_alike_among_keys_added_one_by_one_and_by_blocks() -> None:
    repeats = KeyRepeats()
    repeats.add_keys([b"images/a", b"images/b", "images/\u00e9".encode()], 1)
    repeats.add("images/c", 5)
    assert repeats.first_repeat() is None
    repeats.add("images/\u00e9", 6)
    repeats.add_keys([b"images/c"], 7)
    assert repeats.first_repeat() == (3, 6)
