"""The few S3 calls that are not bulk transfer: markers, listings, the frozen batch manifest.

Bulk bytes go through s5cmd (pipeline/s5cmd.py). Everything here maps botocore failures onto
pipeline.errors with pipeline.aws.s3_error, so that callers see one line that names the
bucket or key.
"""

from __future__ import annotations

import base64
import io
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import boto3
from awscrt import checksums
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    IncompleteReadError,
    ResponseStreamingError,
)

from pipeline.aws import Backoff, refuse_foreign_answers, s3_error
from pipeline.errors import ManifestError, MissingObjectError, TransferError
from pipeline.interface import ENV
from pipeline.interface import SUCCESS_MARKER as SUCCESS_MARKER  # re-exported: callers read s3io.SUCCESS_MARKER
from pipeline.manifest import (
    FROZEN_INDEX,
    FROZEN_MANIFEST,
    OFFSET,
    FrozenManifestWriter,
    ManifestEntry,
    freeze_manifest,
    index_range,
    is_image_key,
    key_problem,
    manifest_lines,
    parse_index_range,
    parse_line,
    parse_manifest,
)
from pipeline.settings import S3Uri

_BODY_ATTEMPTS = 4


def client(endpoint: str | None, credentials: Mapping[str, str] | None = None) -> Any:
    """A boto3 S3 client. Credentials and region come from `credentials` (AWS_* names) when given,
    else from the environment as usual."""
    config = Config(
        retries={"mode": "standard", "max_attempts": 5},
        connect_timeout=5,
        read_timeout=60,
        s3={"addressing_style": "path"} if endpoint else {},
    )
    creds = credentials or {}
    session = boto3.session.Session(
        aws_access_key_id=creds.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=creds.get("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=creds.get("AWS_SESSION_TOKEN"),
        region_name=creds.get("AWS_REGION") or creds.get("AWS_DEFAULT_REGION"),
    )
    s3 = session.client("s3", endpoint_url=endpoint, config=config)
    # Any web server's 404 page would otherwise read as a missing key, and its 200 page as an empty listing.
    refuse_foreign_answers(s3.meta.events, service="an S3 server",
                           fix=f"point --s3-endpoint (a job: {ENV.S3_ENDPOINT}) at S3")
    return s3


def _listed(s3: Any, uri: S3Uri) -> dict[str, Any] | None:
    """The listing entry of exactly this key, or None when it does not exist.

    A listing rather than HeadObject: for a missing key, HeadObject answers 404 only to a caller allowed
    s3:ListBucket on the bucket, else 403 ("HeadObject", Amazon S3 API Reference: "If you don't have the
    s3:ListBucket permission, Amazon S3 returns an HTTP status code 403"), and whether a ListBucket grant
    scoped by an s3:prefix condition counts for a request that carries no prefix is not what the job
    should rest on. ListObjectsV2 with the key as its prefix is exactly what the job role is granted
    (s3:ListBucket with s3:prefix under its input and output prefixes; tests/synth checks the policy).
    The first key listed under a prefix equal to the key is the key itself when it exists (keys list in
    UTF-8 binary order, and a key sorts before every longer key it begins).
    """
    try:
        page = s3.list_objects_v2(Bucket=uri.bucket, Prefix=uri.key, MaxKeys=1)
    except (ClientError, BotoCoreError) as exc:
        raise s3_error(exc, what=str(uri)) from None
    for item in page.get("Contents") or []:
        if item.get("Key") == uri.key:
            return dict(item)
    return None


def exists(s3: Any, uri: S3Uri) -> bool:
    """Whether the object exists (a marker, the frozen index): see `_listed` for why it is a listing."""
    return _listed(s3, uri) is not None


def _size(s3: Any, uri: S3Uri) -> int | None:
    """The object's size, or None when it does not exist."""
    item = _listed(s3, uri)
    return None if item is None else int(item["Size"])


def put_bytes(s3: Any, uri: S3Uri, body: bytes) -> None:
    try:
        s3.put_object(Bucket=uri.bucket, Key=uri.key, Body=body)
    except (ClientError, BotoCoreError) as exc:
        raise s3_error(exc, what=str(uri)) from None


def get_range(s3: Any, uri: S3Uri, start: int, end: int) -> bytes:
    """Bytes [start, end) of an object."""
    if end <= start:
        return b""
    # botocore retries a request that fails, but not a body cut off half-way: that is retried here.
    backoff = Backoff(attempts=_BODY_ATTEMPTS, base_s=0.1)
    for attempt in range(_BODY_ATTEMPTS):
        try:
            response = s3.get_object(Bucket=uri.bucket, Key=uri.key, Range=f"bytes={start}-{end - 1}")
            data = bytes(response["Body"].read())
            if len(data) == end - start or attempt == _BODY_ATTEMPTS - 1:
                return data
        except (ResponseStreamingError, IncompleteReadError) as exc:
            if attempt == _BODY_ATTEMPTS - 1:
                raise s3_error(exc, what=str(uri)) from None
        except (ClientError, BotoCoreError) as exc:
            raise s3_error(exc, what=str(uri)) from None
        backoff.pause(attempt)
    raise AssertionError("unreachable")


def list_images(s3: Any, prefix: S3Uri) -> Iterator[ManifestEntry]:
    """Stream the images under a prefix (sorted by key, as S3 lists), in constant memory."""
    paginator = s3.get_paginator("list_objects_v2")
    try:
        for page in paginator.paginate(Bucket=prefix.bucket, Prefix=prefix.key):
            for item in page.get("Contents", []):
                if is_image_key(item["Key"], prefix.key):
                    if problem := key_problem(item["Key"], prefix.key):
                        raise ManifestError(f"the listing of {prefix}: {problem}")
                    etag = str(item.get("ETag") or "").strip('"') or None
                    yield ManifestEntry(item["Key"], int(item["Size"]), etag)
    except (ClientError, BotoCoreError) as exc:
        raise s3_error(exc, what=str(prefix)) from None


def _manifest_chunks(s3: Any, uri: S3Uri) -> Iterator[bytes]:
    """A user manifest's bytes from S3, in chunks of 1 MiB."""
    try:
        body = s3.get_object(Bucket=uri.bucket, Key=uri.key)["Body"]
    except (ClientError, BotoCoreError) as exc:
        raise s3_error(exc, what=str(uri)) from None
    # Not botocore's iter_lines: it joins its 1 KiB chunks anew for every chunk of a line (quadratic in a long one).
    return iter(body.iter_chunks(1 << 20))


def read_manifest(s3: Any, uri: S3Uri, *, bucket: str, prefix: str = "") -> Iterator[ManifestEntry]:
    """Stream a user manifest from S3 line by line; its keys must be in `bucket` under `prefix`, once each."""
    lines = manifest_lines(_manifest_chunks(s3, uri), source=str(uri))
    yield from parse_manifest(lines, bucket=bucket, source=str(uri), prefix=prefix)


# The frozen copy's upload from its temporary file: s3transfer reads a file object's parts (8 MiB) into memory, by
# default up to 10 at once; 4 keep `submit` of 1,000,000 keys within 200 MB (bench/submit_bench.py).
FROZEN_UPLOAD_CONFIG = TransferConfig(max_concurrency=4)
FROZEN_UPLOAD_CONFIG.max_in_memory_upload_chunks = 4


@dataclass(frozen=True)
class FrozenBatch:
    manifest: S3Uri
    children: int
    images: int
    bytes: int


def frozen_paths(output: S3Uri) -> tuple[S3Uri, S3Uri]:
    return output.join(FROZEN_MANIFEST), output.join(FROZEN_INDEX)


def freeze_batch(s3: Any, *, input: S3Uri, manifest: S3Uri | None, output: S3Uri, per_child: int) -> FrozenBatch:
    """Validate the whole source and write the frozen manifest and its index beside the outputs.

    Streams to spooled temporary files (memory up to 8 MiB, then disk), so a manifest of millions of
    lines is read once in constant memory. Nothing is written to S3 unless every line is valid. A manifest is
    checked and frozen a block of lines at a time (pipeline.manifest.freeze_manifest), a listing key by key.
    """
    with tempfile.SpooledTemporaryFile(8 << 20) as body, tempfile.SpooledTemporaryFile(1 << 20) as index:
        writer = FrozenManifestWriter(body, index, per_child)  # type: ignore[arg-type]
        if manifest:
            freeze_manifest(_manifest_chunks(s3, manifest), writer, bucket=input.bucket, source=str(manifest),
                            prefix=input.key)
        else:
            for entry in list_images(s3, input):
                writer.add(entry)
        children = writer.close()
        if writer.entries == 0:
            source = manifest or input
            raise ManifestError(f"{source} holds no images: check the prefix or manifest")
        manifest_uri, index_uri = frozen_paths(output)
        for uri, stream in ((manifest_uri, body), (index_uri, index)):
            stream.seek(0)
            try:
                s3.upload_fileobj(stream, uri.bucket, uri.key, Config=FROZEN_UPLOAD_CONFIG)
            except (ClientError, BotoCoreError) as exc:
                raise s3_error(exc, what=str(uri)) from None
    return FrozenBatch(manifest_uri, children, writer.entries, writer.total_size)


def read_child_entries(s3: Any, manifest: S3Uri, child: int, *, bucket: str) -> list[ManifestEntry]:
    """This child's entries: two ranged GETs when the frozen index exists, else a streamed scan."""
    index_uri = S3Uri(manifest.bucket, manifest.key.removesuffix(".jsonl") + ".idx")
    index_size = _size(s3, index_uri)
    if index_size is not None:
        # The index holds children + 1 offsets: a child past them does not exist and must write nothing.
        children = max(0, index_size // OFFSET.size - 1)
        if child >= children:
            raise ManifestError(f"array index {child} is beyond the batch: {manifest} has {children} children; "
                                "submit with an array size of at most that")
        start, end = parse_index_range(get_range(s3, index_uri, *index_range(child)), child)
        data = get_range(s3, manifest, start, end)
        found = (parse_line(line, bucket=bucket, where=f"{manifest} byte {start}")
                 for line in io.BytesIO(data))
        return [entry for entry in found if entry is not None]
    raise MissingObjectError(f"{index_uri} does not exist: submit the batch with `iobatch submit`/`run`, "
                             "which freezes the manifest and its index")


UPLOAD_CONFIG = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4)


def file_crc32c(path: str) -> str:
    """The base64 CRC32C of a file, as S3 reports it in ChecksumCRC32C."""
    crc = 0
    with open(path, "rb") as stream:
        while block := stream.read(1 << 20):
            crc = checksums.crc32c(block, crc)
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


def upload_verified(s3: Any, path: str, uri: S3Uri, *, config: TransferConfig = UPLOAD_CONFIG) -> str:
    """Upload a file with a CRC32C additional checksum; return the checksum.

    S3 verifies the checksum of every request body (BadDigest when bytes change in transit). Afterwards
    the stored whole-object CRC32C is compared with the local one; a multipart object carries a
    composite checksum of its parts instead (each part already verified by S3), so it is not compared.
    """
    local = file_crc32c(path)
    try:
        s3.upload_file(path, uri.bucket, uri.key, ExtraArgs={"ChecksumAlgorithm": "CRC32C"}, Config=config)
        head = s3.head_object(Bucket=uri.bucket, Key=uri.key, ChecksumMode="ENABLED")
    except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
        raise s3_error(exc, what=str(uri)) from None
    stored = str(head.get("ChecksumCRC32C") or "")
    if stored and "-" not in stored and stored != local:
        raise TransferError(f"{uri} was stored with CRC32C {stored}, the file has {local}: it will be uploaded again")
    # An endpoint that keeps no additional checksums (some S3 look-alikes) still verified the body in transit.
    return local


def abort_multipart_uploads(s3: Any, prefix: S3Uri) -> list[str]:
    """Abort every unfinished multipart upload under `prefix` (left by a killed run); return their keys."""
    aborted: list[str] = []
    try:
        for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=prefix.bucket, Prefix=prefix.key):
            for upload in page.get("Uploads", []) or []:
                s3.abort_multipart_upload(Bucket=prefix.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                aborted.append(str(upload["Key"]))
    except (ClientError, BotoCoreError) as exc:
        raise s3_error(exc, what=str(prefix)) from None
    return aborted
