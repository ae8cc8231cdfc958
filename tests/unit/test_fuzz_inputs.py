"""Fuzzing the files people write: manifests and contract files.

Every input either parses or raises our own error class with a one-line headline that names where
the mistake is; nothing else escapes (no KeyError, RecursionError, OverflowError: no traceback).
"""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.errors import IobatchError, ManifestError
from pipeline.manifest import (
    MAX_KEY_BYTES,
    MAX_LINE_BYTES,
    ManifestEntry,
    parse_index_range,
    parse_line,
    parse_manifest,
)
from pipeline.manifest import manifest_lines as split_lines
from profiling.contract import CALL_TYPES, MEASUREMENTS, Contract, ContractError, parse_contract
from profiling.numbers import MAX_DIGITS, whole_number

# A hang inside a Hypothesis test is ended for good (stacks, then exit): with the signal method the
# timeout's failure is caught by Hypothesis, which shrinks by running the hanging case again.
pytestmark = pytest.mark.timeout(300, method="thread")

FUZZ = settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])


def one_line(headline: str) -> None:
    assert headline and "\n" not in headline and "\r" not in headline, repr(headline)
    assert "Traceback" not in headline


# ---- manifests ------------------------------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                         st.text(max_size=40))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=4)), max_leaves=12)
# Objects that look like manifest lines: the real field names with values of any type.
line_objects = st.fixed_dictionaries({}, optional={
    "key": st.one_of(json_values, st.text(alphabet=string.printable + "é/\u2028", max_size=30)),
    "uri": st.one_of(json_values, st.builds(lambda b, k: f"s3://{b}/{k}", st.sampled_from(["in", "other", ""]),
                                            st.text(max_size=20))),
    "size": st.one_of(json_values, st.integers(min_value=-5, max_value=2**70)),
    "etag": json_values,
})
manifest_lines = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200),
    line_objects.map(json.dumps),
    json_values.map(json.dumps),
    st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n),
    st.integers(min_value=4301, max_value=6000).map(lambda n: '{"key": "a", "size": 1' + "0" * n + "}"),
    # the second round: a byte order mark, Latin-1 bytes, keys around S3's 1,024 bytes, lines around the limit
    line_objects.map(lambda body: "\ufeff" + json.dumps(body)),
    st.text(alphabet="aé€", min_size=1, max_size=30).map(lambda k: json.dumps({"key": k}).encode("latin-1",
                                                                                                "replace")),
    st.integers(min_value=MAX_KEY_BYTES - 4, max_value=MAX_KEY_BYTES + 4).map(
        lambda n: json.dumps({"key": "é" * (n // 2) + "a" * (n % 2)})),
    st.integers(min_value=MAX_LINE_BYTES - 16, max_value=MAX_LINE_BYTES + 16).map(
        lambda n: '{"key": "' + "a" * (n - 11) + '"}'),
)


@FUZZ
@given(manifest_lines)
def test_any_manifest_line_parses_or_gives_one_line_manifest_error(line: str | bytes) -> None:
    try:
        entry = parse_line(line, bucket="in", where="m.jsonl line 7")
    except ManifestError as exc:
        one_line(exc.headline)
        assert exc.headline.startswith("m.jsonl line 7"), exc.headline
        assert exc.exit_code == 65
        return
    if entry is not None:
        assert isinstance(entry, ManifestEntry) and isinstance(entry.key, str) and entry.key
        assert len(entry.key.encode("utf-8")) <= MAX_KEY_BYTES and len(line) <= MAX_LINE_BYTES
        assert entry.size is None or (isinstance(entry.size, int) and entry.size >= 0)
        # What parses, survives the frozen manifest's round trip.
        again = parse_line(entry.to_line(), bucket="in", where="frozen")
        assert again == entry and again is not None and again.etag == entry.etag


@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=60), st.sampled_from([b"\n", b"\r\n", b"", b"a" * 70_000])),
                max_size=8), st.integers(min_value=1, max_value=100_000))
def test_manifest_lines_are_the_files_lines_or_one_error_naming_the_long_one(parts: list[bytes], size: int) -> None:
    data = b"".join(parts)
    chunks = [data[i:i + size] for i in range(0, len(data), size)]
    expected = data.splitlines(keepends=True) if b"\r" not in data else None
    try:
        lines = list(split_lines(chunks, source="m.jsonl"))
    except ManifestError as exc:
        one_line(exc.headline)
        number = int(exc.headline.split(" line ", 1)[1].split()[0])
        assert len(data.split(b"\n")[number - 1].rstrip(b"\r")) > MAX_LINE_BYTES, exc.headline
        return
    assert b"".join(lines) == data and all(len(line.rstrip(b"\r\n")) <= MAX_LINE_BYTES for line in lines)
    if expected is not None:
        assert lines == expected


@FUZZ
@given(st.one_of(st.text(max_size=30), st.from_regex(r"\s*[+-]?[0-9]{1,25}\s*", fullmatch=True),
                 st.integers(min_value=-(10**20), max_value=10**20).map(str)))
def test_one_number_parser_reads_ascii_digits_only(text: str) -> None:
    value = whole_number(text)
    if value is None:
        return
    body = text.strip(" \t\n\r\f\v")
    assert body.isascii() and body.lstrip("+-").isdigit() and len(body.lstrip("+-")) <= MAX_DIGITS
    assert value == int(body)


# Keys people write under a prefix, with the odd segment and repeats among them.
prefixed_keys = st.lists(st.sampled_from(["a", "b", "", ".", "..", "é"]), min_size=1, max_size=3).map(
    lambda parts: json.dumps({"key": "img/" + "/".join(parts)}))


@FUZZ
@given(st.lists(st.one_of(line_objects.map(json.dumps), st.just(""), st.text(max_size=30), prefixed_keys),
                max_size=12), st.sampled_from(["", "img/"]))
def test_a_manifest_error_names_its_line_number(lines: list[str], prefix: str) -> None:
    keys: list[str] = []
    try:
        for entry in parse_manifest([line + "\n" for line in lines], bucket="in", source="s3://in/m.jsonl",
                                    prefix=prefix):
            keys.append(entry.key)
    except ManifestError as exc:
        one_line(exc.headline)
        number = int(exc.headline.split(" line ", 1)[1].split()[0].rstrip(":"))
        failing = [i for i, line in enumerate(lines, 1) if _fails(line, prefix)]
        if failing:  # the named line is the first that does not parse on its own
            assert number == failing[0], (lines, exc.headline)
        else:  # or, when every line does, the first to repeat an earlier line's key
            assert number == _first_repeat(lines, prefix) and "again" in exc.headline, (lines, exc.headline)
        return
    assert len(set(keys)) == len(keys) and all(key.startswith(prefix) for key in keys)


def _first_repeat(lines: list[str], prefix: str) -> int | None:
    seen: set[str] = set()
    for number, line in enumerate(lines, 1):
        entry = parse_line(line, bucket="in", where="x", prefix=prefix)
        if entry is not None and entry.key in seen:
            return number
        if entry is not None:
            seen.add(entry.key)
    return None


def _fails(line: str, prefix: str | None = None) -> bool:
    try:
        parse_line(line, bucket="in", where="x", prefix=prefix)
        return False
    except ManifestError:
        return True


@FUZZ
@given(st.binary(max_size=40), st.integers(min_value=0, max_value=10_000))
def test_index_bytes_give_offsets_or_a_manifest_error(data: bytes, child: int) -> None:
    try:
        start, end = parse_index_range(data, child)
    except ManifestError as exc:
        one_line(exc.headline)
        assert f"child {child}" in exc.headline
        return
    assert len(data) == 16 and start >= 0 and end >= 0


# ---- contract files -------------------------------------------------------------------------------

quantities = st.builds(lambda n, u: f"{n}{u}", st.one_of(st.integers(0, 10**12), st.floats(0, 1e6).map(str),
                                                        st.text(alphabet="0123456789.-e", max_size=8)),
                       st.sampled_from(["", "us", "ms", "s", "m", "h", "B", "kB", "MB", "GB", "k", "M", "x", "µs"]))
fields = {
    "label": st.one_of(st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,10}", fullmatch=True), st.text(max_size=10),
                       st.just("StageSeconds")),
    "path": st.one_of(st.sampled_from(["/", "/scratch", "scratch", ""]), st.text(max_size=8)),
    "call": st.one_of(st.sampled_from(CALL_TYPES), st.text(max_size=6)),
    "size": st.one_of(st.just("all"), st.builds(lambda a, b: f"{a}-{b}", quantities, quantities), st.text(max_size=8)),
    "measurement": st.one_of(st.sampled_from(MEASUREMENTS), st.text(max_size=8)),
    "threshold": quantities,
}
rules = st.builds(lambda *parts: ",".join(parts), *fields.values())
headers = st.one_of(st.builds(lambda v, t: f"{v},monitortimeframe,{t}", st.sampled_from(["2", "1", "two"]), quantities),
                    st.text(max_size=30))
contract_texts = st.one_of(
    st.builds(lambda h, rs, junk: "\n".join([h, *rs, *junk]), headers, st.lists(rules, max_size=5),
              st.lists(st.sampled_from(["", "# note", "  ", ",,,,,", "a,b"]), max_size=2)),
    st.text(max_size=300),
)


@FUZZ
@given(contract_texts)
def test_any_contract_parses_or_gives_one_line_contract_error(text: str) -> None:
    try:
        contract = parse_contract(text, "rules.contract")
    except ContractError as exc:
        one_line(exc.headline)
        assert exc.headline.startswith("rules.contract:"), exc.headline
        line = int(exc.headline.split(":")[1])
        assert 1 <= line <= max(1, len(text.splitlines()))
        return
    assert isinstance(contract, Contract) and contract.timeframe_s > 0 and contract.rules
    assert len({r.label for r in contract.rules}) == len(contract.rules)


def test_contract_with_an_astronomical_size_bound_gives_contract_error() -> None:
    with pytest.raises(ContractError):
        parse_contract("2,monitortimeframe,1s\nbig,/,write,1-" + "9" * 400 + ",count,1", "rules.contract")


def test_the_shipped_contracts_and_a_manifest_line_parse() -> None:
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[2] / "contracts").glob("*.contract")):
        assert parse_contract(path.read_text(), str(path)).rules
    assert parse_line('{"key": "a.png", "size": 3, "etag": "\\"abc\\""}', bucket="in", where="x") == \
        ManifestEntry("a.png", 3)


def test_error_classes_used_for_bad_input_are_ours() -> None:
    # The CLI prints `error: <headline>` for IobatchError; ContractError carries the same headline,
    # and the CLI turns it into a UsageError (pipeline/cli/local.py, --contract).
    assert issubclass(ManifestError, IobatchError)
    exc: Any = ContractError("f", 1, "LABEL", "x", "expected y")
    assert exc.headline == "f:1: LABEL 'x': expected y"


# ---- endpoints (the third round): user info, paths, schemes -------------------------------------------------

PASSWORD = "pw9SECRET"
endpoint_urls = st.builds(
    lambda scheme, user, host, port, path: f"{scheme}{user}{host}{port}{path}",
    st.sampled_from(["http://", "https://", "HTTPS://", "ftp://", "s3://", "", "http:/", "http:///"]),
    st.sampled_from(["", f"u:{PASSWORD}@", f"{PASSWORD}@", f"u:{PASSWORD}/x@", "@", f":{PASSWORD}@"]),
    st.sampled_from(["127.0.0.1", "localhost", "s3.us-east-1.amazonaws.com", "[::1]", "a_b", "", "ho st", "é.com"]),
    st.sampled_from(["", ":9000", ":0", ":65536", ":x", ":", ":-1"]),
    st.sampled_from(["", "/", "/bucket", "/b/k", "?x=1", "#f", "/@x", "?"]) | st.text(max_size=6),
)


@FUZZ
@given(endpoint_urls)
def test_any_endpoint_is_taken_whole_or_refused_without_its_secret(url: str) -> None:
    from urllib.parse import urlsplit

    from pipeline.endpoints import checked_endpoint
    from pipeline.errors import UsageError

    try:
        taken = checked_endpoint(url, "--s3-endpoint")
    except UsageError as exc:
        one_line(exc.headline)
        assert exc.exit_code == 64 and exc.headline.startswith("--s3-endpoint ")
        assert PASSWORD not in exc.headline, exc.headline
        return
    assert taken is not None
    parts = urlsplit(taken)
    assert "@" not in taken and parts.scheme in ("http", "https") and parts.hostname
    assert parts.path in ("", "/") and not parts.query and not parts.fragment


# ---- EMF documents from any producer: the profile reader's value check, the pipeline's namespace --------------

figure_values = st.one_of(st.floats(), st.integers(min_value=-(2**70), max_value=2**70), st.text(max_size=5),
                          st.none(), st.booleans(), st.lists(st.one_of(st.floats(), st.integers(), st.text(max_size=2)),
                                                             max_size=3))


@FUZZ
@given(st.dictionaries(st.sampled_from(["StageDuration", "WriteBytes", "ReadBytes", "PeakDirtyBytes", "WriteCalls",
                                        "DeviceWriteLatency", "IoStallSome"]), figure_values, max_size=3),
       st.sampled_from(["IoBatch", "Other", "iobatch"]), figure_values)
def test_any_emf_figures_read_as_a_profiles_or_give_one_line(metrics: dict[str, Any], namespace: str,
                                                             timestamp: Any) -> None:
    import dataclasses
    import math

    from profiling import emf, runfiles
    from profiling.metrics import StageProfile
    from tests.support.profiles import full_profile

    doc = json.loads(emf.serialize(full_profile())[0])
    doc.update(metrics)
    doc["_aws"]["Timestamp"] = timestamp
    doc["_aws"]["CloudWatchMetrics"][0]["Namespace"] = namespace
    try:
        profiles = runfiles.profiles_from_emf_lines([json.dumps(doc)], where="x.emf")
    except runfiles.DamagedFileError as exc:
        one_line(str(exc))
        assert str(exc).startswith("x.emf: ") and namespace == "IoBatch", exc
        assert any(name in str(exc) for name in [*metrics, "Timestamp"]), exc
        return
    if namespace != "IoBatch":  # another producer's documents are not the pipeline's
        assert profiles == []
        return
    (profile,) = profiles
    assert isinstance(profile, StageProfile)
    for spec in dataclasses.fields(profile):
        name, value = spec.name, getattr(profile, spec.name)
        if isinstance(value, int | float) and name != "started_at":  # the end's time less the duration
            assert not isinstance(value, bool) and math.isfinite(value) and value >= 0, (name, value)


# ---- run.json and --advice (the third round's rest): read strictly, by the one owner of each -------------------

run_values = st.one_of(json_scalars, st.floats(), st.integers(min_value=-(2**70), max_value=2**70),
                       st.sampled_from(["http://127.0.0.1:9000", f"http://u:{PASSWORD}@h:1", "ftp://h", ""]),
                       st.dictionaries(st.text(max_size=4), st.one_of(st.floats(), st.integers(), st.text(max_size=3)),
                                       max_size=3))
run_objects = st.dictionaries(st.sampled_from(["workers", "memory_gib", "endpoint", "images_per_child", "slow_child",
                                               "children", "started", "child_elapsed_s", "job_id", "demo", "failed",
                                               "newer"]), run_values, max_size=5)


@FUZZ
@given(st.one_of(run_objects.map(json.dumps), st.text(max_size=60), run_objects.map(lambda o: json.dumps(o)[:20]),
                 st.binary(max_size=30)))
def test_any_run_json_is_read_whole_within_the_flags_bounds_or_is_one_line_65(text: str | bytes) -> None:
    import math
    import tempfile
    from pathlib import Path

    from pipeline.errors import PermanentError
    from pipeline.local.runjson import read_run
    from pipeline.settings import MAX_WORKERS

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.json"
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        try:
            run = read_run(Path(folder))
        except PermanentError as exc:
            one_line(exc.headline)
            assert exc.exit_code == 65 and exc.headline.startswith(str(path)) and "rerun the batch" in exc.headline
            assert f"u:{PASSWORD}@" not in exc.headline, exc.headline  # a URL's user info, in any field
            return
    workers = run.get("workers", 1)
    assert isinstance(workers, int) and not isinstance(workers, bool) and 1 <= workers <= MAX_WORKERS
    memory = run.get("memory_gib", 1.0)
    assert not isinstance(memory, bool) and math.isfinite(memory) and 0.5 <= memory <= 32768
    assert "@" not in str(run.get("endpoint") or "")


@FUZZ
@given(st.dictionaries(st.sampled_from(["plan", "workload", "candidates", "recommended", "findings", "cdk_args",
                                        "untuned_download_s", "burst", "other"]), json_values, max_size=9))
def test_any_json_object_is_an_advice_or_one_line_saying_why(body: dict[str, Any]) -> None:
    from tests.support.profiles import batch
    from tuning.advice_json import advice_problem
    from tuning.advise import advise
    from tuning.plan import Plan

    if "advice" not in _ADVICE:  # once: setdefault would run the advisor for every example
        _ADVICE["advice"] = advise(batch(2), Plan(2, 16, 100)).to_json()
    whole = _ADVICE["advice"]
    for candidate in (body, {**whole, **body}):  # a random object; a real advice with fields replaced
        problem = advice_problem(candidate)
        if problem is not None:
            one_line(problem)


_ADVICE: dict[str, Any] = {}
