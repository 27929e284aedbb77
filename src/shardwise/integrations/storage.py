"""Datasets, models and plans read and written by URI: local paths (or file://) and s3:// through boto3.

The S3 endpoint comes from AWS_ENDPOINT_URL, else MLFLOW_S3_ENDPOINT_URL (MinIO, Ceph, moto), else AWS;
credentials come from the usual boto3 sources (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the pipeline,
from the `shardwise-s3` secret). Writes are atomic: a reader sees the old object or the whole new one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from shardwise.errors import ShardwiseError

# Parts of 8 MiB: above S3's 5 MiB minimum part size, small enough that memory stays flat.
MULTIPART_CHUNK_BYTES = 8 * 2**20


class StorageError(ShardwiseError):
    """A URI that cannot be read or written (malformed, missing bucket or key)."""


@dataclass(frozen=True)
class S3Location:
    """An object (or prefix) in a bucket."""

    bucket: str
    key: str

    @property
    def uri(self) -> str:
        """The s3:// URI of this location."""
        return f"s3://{self.bucket}/{self.key}"


def parse_uri(uri: str) -> S3Location | Path:
    """An S3Location for s3://bucket/key, else a local Path (plain path or file://)."""
    uri = str(uri)
    if uri.startswith("s3://"):
        bucket, _, key = uri[len("s3://") :].partition("/")
        if not bucket:
            raise StorageError(f"uri '{uri}': no bucket (expected s3://bucket/key)")
        return S3Location(bucket, key)
    if uri.startswith("file://"):
        return Path(uri[len("file://") :])
    if "://" in uri:
        raise StorageError(f"uri '{uri}': unsupported scheme (expected a local path, file:// or s3://)")
    return Path(uri)


def s3_client() -> Any:
    """A boto3 S3 client for the endpoint named by AWS_ENDPOINT_URL or MLFLOW_S3_ENDPOINT_URL."""
    import boto3

    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("MLFLOW_S3_ENDPOINT_URL") or None
    return boto3.client("s3", endpoint_url=endpoint)


def _transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=MULTIPART_CHUNK_BYTES, multipart_chunksize=MULTIPART_CHUNK_BYTES)


def _require_key(loc: S3Location) -> None:
    if not loc.key or loc.key.endswith("/"):
        raise StorageError(f"uri '{loc.uri}': no object key (expected s3://bucket/key)")


def exists(uri: str) -> bool:
    """Whether a file or object exists at the URI."""
    loc = parse_uri(uri)
    if isinstance(loc, Path):
        return loc.exists()
    from botocore.exceptions import ClientError

    try:
        s3_client().head_object(Bucket=loc.bucket, Key=loc.key)
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def read_bytes(uri: str) -> bytes:
    """The whole content at the URI."""
    loc = parse_uri(uri)
    if isinstance(loc, Path):
        return loc.read_bytes()
    _require_key(loc)
    from botocore.exceptions import ClientError

    try:
        body = s3_client().get_object(Bucket=loc.bucket, Key=loc.key)["Body"]
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
            raise FileNotFoundError(f"no object at '{uri}'") from err
        raise
    return bytes(body.read())


def read_text(uri: str, encoding: str = "utf-8") -> str:
    """The content at the URI as text."""
    return read_bytes(uri).decode(encoding)


def write_fileobj(uri: str, fileobj: IO[bytes]) -> None:
    """Stream a binary file object to the URI atomically (whole object or none)."""
    loc = parse_uri(uri)
    if isinstance(loc, Path):
        loc.parent.mkdir(parents=True, exist_ok=True)
        # temp file in the target directory, then rename: readers never see a half-written file
        fd, tmp = tempfile.mkstemp(dir=loc.parent, prefix=f".{loc.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(fileobj, out)
            os.replace(tmp, loc)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return
    _require_key(loc)
    # S3 shows an object only once PutObject or CompleteMultipartUpload succeeds; boto3's managed
    # transfer aborts the multipart upload when a part fails, so no parts are left behind either.
    s3_client().upload_fileobj(fileobj, loc.bucket, loc.key, Config=_transfer_config())


def write_bytes(uri: str, data: bytes) -> None:
    """Write bytes to the URI atomically."""
    import io

    write_fileobj(uri, io.BytesIO(data))


def write_text(uri: str, text: str, encoding: str = "utf-8") -> None:
    """Write text to the URI atomically."""
    write_bytes(uri, text.encode(encoding))


def upload_file(path: str | Path, uri: str) -> None:
    """Copy a local file to the URI atomically."""
    with open(path, "rb") as src:
        write_fileobj(uri, src)


def download_file(uri: str, path: str | Path) -> Path:
    """Copy the object at the URI to a local file (atomically replaced); returns the path."""
    loc = parse_uri(uri)
    target = Path(path)
    if isinstance(loc, Path):
        with open(loc, "rb") as src:
            write_fileobj(str(target), src)
        return target
    write_bytes(str(target), read_bytes(uri))
    return target


def _iter_s3_keys(loc: S3Location) -> Iterator[str]:
    paginator = s3_client().get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=loc.bucket, Prefix=loc.key):
        for item in page.get("Contents", []):
            yield item["Key"]


def list_uris(prefix_uri: str) -> list[str]:
    """Every file or object under a prefix (a local directory, or an s3:// key prefix), sorted."""
    loc = parse_uri(prefix_uri)
    if isinstance(loc, Path):
        if loc.is_file():
            return [str(loc)]
        if not loc.exists():
            return []
        return sorted(str(p) for p in loc.rglob("*") if p.is_file() and not p.name.endswith(".part"))
    return sorted(S3Location(loc.bucket, key).uri for key in _iter_s3_keys(loc))


def delete(uri: str) -> None:
    """Remove the file or object at the URI (no error if absent)."""
    loc = parse_uri(uri)
    if isinstance(loc, Path):
        loc.unlink(missing_ok=True)
        return
    _require_key(loc)
    s3_client().delete_object(Bucket=loc.bucket, Key=loc.key)
