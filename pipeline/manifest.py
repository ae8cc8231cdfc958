"""Manifests: which images a batch holds, and which of them each array child takes. Pure, streaming.

In: a user manifest, JSON Lines, one image a line, each with an optional "size" and "etag":

    {"key": "images/cam0/000001.png"}                 a key in the input bucket
    {"uri": "s3://input-bucket/images/cam0/000001.png", "size": 26214400}

Out: the batch frozen once, before any child runs, into two objects beside the outputs:
FROZEN_MANIFEST, the normalised lines {"key", and "size" and "etag" when known} in the order given, and
FROZEN_INDEX, (children + 1) big-endian uint64 byte offsets into it. Child i reads bytes [8i, 8i+16) of the index
(`index_range`), then only its own byte range of the manifest: two small ranged GETs at any size, no key in job
parameters. Invariants: every key is under the input prefix (the only objects the job may read), a plain path (no
empty, `.` or `..` segment) and listed once (twice would process it twice); anything else is a ManifestError naming
the line.
"""

from __future__ import annotations

import functools
import re
import struct
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import BinaryIO

import orjson

from pipeline.errors import ManifestError, UsageError

MAX_ARRAY_SIZE = 10_000  # AWS Batch's limit on children of one array job
MAX_KEY_BYTES = 1024  # S3's limit on an object key, UTF-8 ("Naming Amazon S3 objects", Amazon S3 User Guide)
# A manifest line holds one key (at most 1,024 bytes, up to 6 bytes each when JSON escapes them), a uri, a size
# and an ETag: a longer line is not a manifest line, and is refused before it is parsed or even joined whole.
MAX_LINE_BYTES = 64 * 1024
_BOM = "\ufeff"
OFFSET = struct.Struct(">Q")
FROZEN_MANIFEST = "_batch/manifest.jsonl"
FROZEN_INDEX = "_batch/manifest.idx"


@dataclass(frozen=True)
class ManifestEntry:
    key: str
    size: int | None = None
    # The object's ETag (unquoted) when the batch was frozen from a listing: a download is checked
    # against it (MD5 for single-part objects). Not part of equality: it describes the bytes, not the entry.
    etag: str | None = field(default=None, compare=False)

    def to_line(self) -> bytes:
        body: dict[str, object] = {"key": self.key}
        if self.size is not None:
            body["size"] = self.size
        if self.etag is not None:
            body["etag"] = self.etag
        return orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE)


def _shown(text: str) -> str:
    """Text as it can stand in a one-line error: as is when printable, else its repr."""
    return text if text.isprintable() else repr(text)


def key_problem(key: str, prefix: str) -> str | None:
    """Why `key` cannot be an image of a batch whose input prefix is `prefix`, or None when it can.

    Outside the prefix, the job has no right to read it (the stack grants s3:GetObject on the prefix alone).
    An empty, `.` or `..` segment names another object than it seems once a tool or a file system
    normalises the path, and a local file named after it could land outside the scratch directory.
    """
    if not key.startswith(prefix):
        return f"key {_shown(key)} is outside the input prefix {_shown(prefix)}, the only keys the job may read: " \
               "list only keys under it"
    padded = f"/{key}/"  # a segment is empty, `.` or `..` exactly when one of these is in it
    if "//" in padded or "/./" in padded or "/../" in padded:
        return f"key {_shown(key)} has an empty, '.' or '..' path segment: give the object's plain key"
    return None


def _key_bytes_problem(key: str) -> str | None:
    """Why S3 cannot hold `key` as a name (over 1,024 bytes of UTF-8, or not UTF-8 at all), or None."""
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, from a JSON escape such as \ud800
        return f"key {key[:40]!r} is not valid Unicode (a lone surrogate): give the object's key"
    if size > MAX_KEY_BYTES:
        return f"key {_shown(key[:40])}... is {size:,} bytes of UTF-8: S3 keys are at most {MAX_KEY_BYTES:,}"
    return None


def manifest_blocks(chunks: Iterable[bytes], *, source: str) -> Iterator[bytes]:
    """A manifest read as `chunks` of bytes, in blocks of whole lines (each block ends with a line end, but the
    file's last when it has none). A line still unended after MAX_LINE_BYTES raises ManifestError naming it as soon
    as that many bytes of it have arrived; a complete line's own length is its reader's to check (_line_too_long)."""
    pending = bytearray()
    number = 0  # lines in the blocks handed out so far
    for chunk in chunks:
        pending += chunk
        end = pending.rfind(b"\n") + 1
        if end:
            block = bytes(pending[:end])
            del pending[:end]
            yield block
            number += block.count(b"\n")
        if len(pending) > MAX_LINE_BYTES + 2:  # the line end (\r\n) is not part of the line
            raise _too_long(source, number + 1)
    if pending:
        yield bytes(pending)


def _lines_of(block: bytes) -> Iterator[bytes]:
    """The lines of a block, each with its line end."""
    parts = block.split(b"\n")
    for part in parts[:-1]:
        yield part + b"\n"
    if parts[-1]:
        yield parts[-1]


def _line_too_long(line: bytes, source: str, number: int) -> None:
    if len(line) > MAX_LINE_BYTES + 2:  # the line end (\r\n) is not part of the line
        raise _too_long(source, number)


def manifest_lines(chunks: Iterable[bytes], *, source: str) -> Iterator[bytes]:
    """The lines (with their ends) of a manifest read as `chunks` of bytes, each at most MAX_LINE_BYTES: a longer
    one raises ManifestError naming its line once that many bytes of it have arrived, so a file that is not a
    manifest (one 10 MB line) costs a read of its first 64 KiB, not a quadratic join of its chunks."""
    number = 0
    for block in manifest_blocks(chunks, source=source):
        for line in _lines_of(block):
            number += 1
            _line_too_long(line, source, number)
            yield line


def _too_long(source: str, number: int) -> ManifestError:
    return ManifestError(f"{source} line {number} is longer than {MAX_LINE_BYTES:,} bytes: a manifest line holds "
                         f"one key of at most {MAX_KEY_BYTES:,} bytes; is this file a manifest?")


def parse_line(line: str | bytes, *, bucket: str, where: str, prefix: str | None = None) -> ManifestEntry | None:
    """One manifest line -> entry (None for a blank line). `where` names the file and line for errors.

    `prefix` is the input prefix a user's line must lie under (`key_problem`); None for a frozen manifest's
    line, checked when the batch was frozen. Its cost is linear in the line and bounded: a line over
    MAX_LINE_BYTES is refused before it is decoded."""
    if len(line) > MAX_LINE_BYTES:  # characters are at least a byte each: a str this long is too long too
        raise ManifestError(f"{where} is {len(line):,} {'bytes' if isinstance(line, bytes) else 'characters'} "
                            f"long: a manifest line is at most {MAX_LINE_BYTES:,} bytes (one key of at most "
                            f"{MAX_KEY_BYTES:,}); is this file a manifest?")
    if isinstance(line, bytes):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ManifestError(f"{where} is not UTF-8 text (byte {exc.start + 1} is {line[exc.start]:#04x}): save "
                                "the manifest as UTF-8") from None
    else:
        text = line
    text = text.strip()
    if text.startswith(_BOM):
        raise ManifestError(f"{where} starts with a byte order mark (BOM): save the manifest as UTF-8 without BOM")
    if not text:
        return None
    try:
        # orjson: a sixth of json's time a line, most of a 1,000,000-key freeze (bench/submit_bench.py).
        body = orjson.loads(text)
    except (ValueError, RecursionError):  # also: nesting too deep, an integer of over 4300 digits
        raise ManifestError(f"{where} is not JSON: write one object a line, e.g. {{\"key\": \"images/a.png\"}}") \
            from None
    if not isinstance(body, dict):
        raise ManifestError(f"{where} is not a JSON object: write {{\"key\": \"images/a.png\"}}")
    key = body.get("key")
    uri = body.get("uri")
    if isinstance(uri, str) and key is None:
        if not uri.startswith("s3://"):
            raise ManifestError(f"{where}: uri {uri!r} is not an s3:// URI")
        uri_bucket, _, key = uri[len("s3://"):].partition("/")
        if uri_bucket != bucket:
            raise ManifestError(
                f"{where}: {_shown(uri)} is outside the input bucket {bucket}: copy it there or submit it separately"
            )
    if not isinstance(key, str) or not key or key.endswith("/"):
        raise ManifestError(f"{where} names no object: give \"key\" (in bucket {bucket}) or \"uri\"")
    if problem := _key_bytes_problem(key):
        raise ManifestError(f"{where}: {problem}")
    if prefix is not None and (problem := key_problem(key, prefix)):
        raise ManifestError(f"{where}: {problem}")
    size = body.get("size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise ManifestError(f"{where}: size {size!r} is not a byte count")
    etag = body.get("etag")
    if etag is not None and (not isinstance(etag, str) or not etag.strip('"')):
        raise ManifestError(f"{where}: etag {etag!r} is not an ETag: give the object's ETag as a string "
                            "or leave it out")
    return ManifestEntry(key, size, etag.strip('"') if isinstance(etag, str) else None)


class KeyRepeats:
    """Finds a key listed twice among millions of lines in 24 bytes a key (a 128-bit digest of the key and its
    line number) rather than a set of the keys themselves, which would take several times the memory. The digest is
    two of Python's own hashes of bytes (SipHash under a key this process draws at random), of the key and of the
    key after a line end: a tenth of blake2b's cost a key, alike within the one process that reads a manifest."""

    def __init__(self) -> None:
        self._first = array("q")
        self._second = array("q")
        self._lines = array("Q")

    def add(self, key: str, line: int) -> None:
        data = key.encode()
        self._first.append(hash(data))
        self._second.append(hash(b"\n" + data))
        self._lines.append(line)

    def add_keys(self, keys: Sequence[bytes], first: int) -> None:
        """Keys (UTF-8, as add encodes them) of the consecutive lines `first`, `first` + 1, ..."""
        import numpy as np

        count = len(keys)
        self._first.frombytes(np.fromiter(map(hash, keys), dtype=np.int64, count=count).tobytes())
        self._second.frombytes(np.fromiter(map(hash, map(b"\n".__add__, keys)), dtype=np.int64, count=count)
                               .tobytes())
        self._lines.frombytes(np.arange(first, first + count, dtype=np.uint64).tobytes())

    def first_repeat(self) -> tuple[int, int] | None:
        """(an earlier line, the line) of the first line whose key an earlier line lists, or None."""
        import numpy as np

        if len(self._lines) < 2:
            return None
        first, second = np.frombuffer(self._first, dtype=np.int64), np.frombuffer(self._second, dtype=np.int64)
        ranked = np.sort(first)
        if not (ranked[1:] == ranked[:-1]).any():  # no two keys share even the first half: no repeat
            return None
        order = np.lexsort((second, first))  # stable: equal digests stay in line order
        one, two = first[order], second[order]
        same = np.flatnonzero((one[1:] == one[:-1]) & (two[1:] == two[:-1]))
        if same.size == 0:
            return None
        # Two different keys share a 128-bit digest with a chance of about n^2 / 2^129: none, in practice.
        later = same[np.argmin(order[same + 1])]
        return int(self._lines[int(order[later])]), int(self._lines[int(order[later + 1])])


def parse_manifest(lines: Iterable[str | bytes], *, bucket: str, source: str,
                   prefix: str = "") -> Iterator[ManifestEntry]:
    """Stream entries from manifest lines, naming `source:line` in any error; every key must lie under
    `prefix` and be listed once (a repeat is found when the last line has been read)."""
    repeats = KeyRepeats()
    for number, line in enumerate(lines, 1):
        entry = parse_line(line, bucket=bucket, where=f"{source} line {number}", prefix=prefix)
        if entry is not None:
            repeats.add(entry.key, number)
            yield entry
    _refuse_repeats(repeats, source)


def _refuse_repeats(repeats: KeyRepeats, source: str) -> None:
    if repeat := repeats.first_repeat():
        raise ManifestError(f"{source} line {repeat[1]} lists the key of line {repeat[0]} again: list each image "
                            "once (a repeat would be processed twice)")


# ---- freezing a user manifest: whole blocks of lines at a time --------------------------------------------------

# What a JSON string holds as it is (no control character, no '"' or '\\'; bytes over 0x7f are UTF-8, checked per
# block), JSON's form of an integer below 2**63, and JSON whitespace within a line, bounded so a matched line is short.
_RAW = rb"[ !#-\[\]-\xff]"
_SIZE = rb"(0|[1-9][0-9]{0,17})"
_WS = rb"[ \t]{0,16}"


@functools.lru_cache(maxsize=8)
def _line_forms(bucket: str, prefix: str) -> tuple[re.Pattern[bytes], ...]:
    """The forms of line freeze_manifest checks a block at a time, each matching one whole line and capturing its key
    and size: the frozen form itself first ({"key":...,"size":...} as to_line writes it: such lines are copied as
    they are), then {"key": ...} and {"uri": "s3://bucket/..."} with an optional "size" and whitespace between."""
    head = prefix.encode("utf-8", "surrogatepass")
    if len(head) > MAX_KEY_BYTES:
        return ()
    # Under the prefix and at most MAX_KEY_BYTES: what parse_line checks of a key but its segments and its UTF-8.
    key = b"(" + re.escape(head) + _RAW + b"{0,%d})" % (MAX_KEY_BYTES - len(head))
    tail = _WS + b"(?:," + _WS + b'"size"' + _WS + b":" + _WS + _SIZE + _WS + rb")?\}" + _WS + rb"\r?$"
    by_uri = b'"uri"' + _WS + b":" + _WS + b'"s3://' + re.escape(bucket.encode("utf-8", "surrogatepass")) + b"/"
    forms = (rb'^\{"key":"' + key + rb'"(?:,"size":' + _SIZE + rb")?\}$",
             b"^" + _WS + rb"\{" + _WS + b'"key"' + _WS + b":" + _WS + b'"' + key + b'"' + tail,
             b"^" + _WS + rb"\{" + _WS + by_uri + key + b'"' + tail)
    return tuple(re.compile(form, re.MULTILINE) for form in forms)


def _fast_block(block: bytes, forms: Sequence[re.Pattern[bytes]]) -> tuple[bytes, list[bytes], int] | None:
    """(the frozen lines, their keys, the sum of their sizes) of a block whose every line takes one of `forms`
    (all the same) and passes every check parse_line makes; None sends the block line by line to parse_line."""
    lines = block.count(b"\n") + (not block.endswith(b"\n"))
    form = next((form for form in forms if form.match(block)), None)
    if form is None:
        return None
    found: list[tuple[bytes, bytes]] = form.findall(block)
    if len(found) != lines:  # a line of another form, or blank: each match is one whole line
        return None
    keys = list(map(itemgetter(0), found))
    # key_problem's segments and parse_line's "names no object" (empty, or ending with '/'), every key at once.
    padded = b"/" + b"/\n/".join(keys) + b"/"
    if b"//" in padded or b"/./" in padded or b"/../" in padded:
        return None
    if not block.isascii():
        try:
            block.decode("utf-8")
        except UnicodeDecodeError:
            return None
    total = sum(map(int, filter(None, map(itemgetter(1), found))))
    if form is forms[0]:  # the frozen form: copied as it is
        return (block if block.endswith(b"\n") else block + b"\n"), keys, total
    frozen = b"".join([b'{"key":"%s","size":%s}\n' % pair if pair[1] else b'{"key":"%s"}\n' % pair[0]
                       for pair in found])
    return frozen, keys, total


def freeze_manifest(chunks: Iterable[bytes], writer: FrozenManifestWriter, *, bucket: str, source: str,
                    prefix: str = "") -> None:
    """Validate a user manifest read as `chunks` of bytes and write its frozen form to `writer`, as parse_manifest
    and FrozenManifestWriter.add do line by line, with the same errors naming the same lines: a block whose every
    line has one of the usual forms (_line_forms) is checked and written whole, without decoding a line; any other
    block goes line by line through parse_line. Raises on a repeated key once the last line has been read."""
    forms = _line_forms(bucket, prefix)
    repeats = KeyRepeats()
    number = 0
    for block in manifest_blocks(chunks, source=source):
        fast = _fast_block(block, forms)
        if fast is not None:
            frozen, keys, total = fast
            repeats.add_keys(keys, number + 1)
            writer.add_frozen(frozen, len(keys), total)
            number += len(keys)
            continue
        for line in _lines_of(block):
            number += 1
            _line_too_long(line, source, number)
            entry = parse_line(line, bucket=bucket, where=f"{source} line {number}", prefix=prefix)
            if entry is not None:
                repeats.add(entry.key, number)
                writer.add(entry)
    _refuse_repeats(repeats, source)


def is_image_key(key: str, prefix: str) -> bool:
    """Keys a prefix listing takes: not folder markers, not our own `_` files."""
    name = key[len(prefix):] if key.startswith(prefix) else key
    return bool(name) and not key.endswith("/") and not any(part.startswith("_") for part in name.split("/"))


def children_for(total: int, per_child: int) -> int:
    if per_child < 1:
        raise UsageError(f"images per job is {per_child}: give 1 or more")
    return -(-total // per_child)


def shard_bounds(index: int, per_child: int, total: int) -> tuple[int, int]:
    """[start, stop) of the entries child `index` takes."""
    start = index * per_child
    return min(start, total), min(start + per_child, total)


def array_jobs(children: int, max_size: int = MAX_ARRAY_SIZE) -> list[tuple[int, int]]:
    """Split `children` into array jobs: (offset, size) each, size <= max_size.

    An array job of size 1 is not allowed by Batch (arrays are 2..10,000); a single child is submitted
    as a plain job, which the caller sees as size 1.
    """
    return [(offset, min(max_size, children - offset)) for offset in range(0, children, max_size)]


class FrozenManifestWriter:
    """Writes the normalised manifest and its child offset index, streaming, in constant memory."""

    def __init__(self, manifest: BinaryIO, index: BinaryIO, per_child: int) -> None:
        if per_child < 1:
            raise UsageError(f"images per job is {per_child}: give 1 or more")
        self._manifest = manifest
        self._index = index
        self._per_child = per_child
        self.entries = 0
        self.bytes = 0
        self.total_size = 0

    def add(self, entry: ManifestEntry) -> None:
        if self.entries % self._per_child == 0:
            self._index.write(OFFSET.pack(self.bytes))
        line = entry.to_line()
        self._manifest.write(line)
        self.entries += 1
        self.bytes += len(line)
        self.total_size += entry.size or 0

    def add_frozen(self, lines: bytes, count: int, total_size: int) -> None:
        """`count` entries at once, as their frozen lines (each ending with a line end) and the sum of their sizes."""
        import numpy as np

        first = -self.entries % self._per_child  # the first of these lines that starts a child
        if first < count:
            ends = np.flatnonzero(np.frombuffer(lines, dtype=np.uint8) == ord("\n")) + 1
            if len(ends) != count:
                raise ValueError(f"{count} entries given as {len(ends)} lines")
            starts = np.concatenate(([0], ends[:-1]))[first::self._per_child] + self.bytes
            self._index.write(starts.astype(">u8").tobytes())
        self._manifest.write(lines)
        self.entries += count
        self.bytes += len(lines)
        self.total_size += total_size

    def close(self) -> int:
        """Write the end offset; return the number of children."""
        self._index.write(OFFSET.pack(self.bytes))
        return children_for(self.entries, self._per_child)


def index_range(child: int) -> tuple[int, int]:
    """Byte range [start, end) of the index that holds child's start and end offsets."""
    return child * OFFSET.size, (child + 2) * OFFSET.size


def parse_index_range(data: bytes, child: int) -> tuple[int, int]:
    if len(data) != 2 * OFFSET.size:
        raise ManifestError(
            f"the batch index has no entry for child {child}: the array is larger than the batch"
        )
    return OFFSET.unpack_from(data, 0)[0], OFFSET.unpack_from(data, OFFSET.size)[0]
