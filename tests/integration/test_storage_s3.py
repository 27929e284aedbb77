"""shardwise.integrations.storage against moto's S3 server on loopback, and on local paths."""

from __future__ import annotations

import io

import boto3
import pytest

from shardwise.integrations import storage

pytestmark = pytest.mark.integration

BUCKET = "shardwise-test"


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    for upload in client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []):
        client.abort_multipart_upload(Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"])
    client.delete_bucket(Bucket=BUCKET)


class FailingReader(io.RawIOBase):
    """A stream that serves `fail_after_bytes` bytes, then fails like a dropped connection."""

    def __init__(self, fail_after_bytes: int) -> None:
        self.remaining = fail_after_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self.remaining <= 0:
            raise OSError("connection reset while reading the source")
        n = min(len(buffer), self.remaining)
        buffer[:n] = b"x" * n
        self.remaining -= n
        return n


def test_round_trip_exists_list_delete(s3):
    uri = f"s3://{BUCKET}/plans/run1/plan.json"
    assert not storage.exists(uri)
    storage.write_text(uri, '{"format": "shardwise.plan/v1"}')
    assert storage.exists(uri)
    assert storage.read_text(uri) == '{"format": "shardwise.plan/v1"}'
    storage.write_bytes(f"s3://{BUCKET}/plans/run1/report.html", b"<html/>")
    storage.write_bytes(f"s3://{BUCKET}/other/x", b"1")
    assert storage.list_uris(f"s3://{BUCKET}/plans/") == [
        f"s3://{BUCKET}/plans/run1/plan.json",
        f"s3://{BUCKET}/plans/run1/report.html",
    ]
    storage.delete(uri)
    assert not storage.exists(uri)


def test_read_missing_object_is_file_not_found(s3):
    with pytest.raises(FileNotFoundError, match="no object at"):
        storage.read_bytes(f"s3://{BUCKET}/absent.json")


def test_multipart_upload_and_download(s3, tmp_path):
    # above the multipart threshold: exercises CreateMultipartUpload / UploadPart / Complete
    payload = bytes(range(256)) * (storage.MULTIPART_CHUNK_BYTES // 256 * 2 + 3)
    src = tmp_path / "costs.parquet"
    src.write_bytes(payload)
    uri = f"s3://{BUCKET}/datasets/costs.parquet"
    storage.upload_file(src, uri)
    assert s3.head_object(Bucket=BUCKET, Key="datasets/costs.parquet")["ContentLength"] == len(payload)
    out = storage.download_file(uri, tmp_path / "copy" / "costs.parquet")
    assert out.read_bytes() == payload


def test_failed_upload_leaves_no_partial_object(s3):
    uri = f"s3://{BUCKET}/models/model.bin"
    # fails after the first part has been uploaded
    source = io.BufferedReader(FailingReader(storage.MULTIPART_CHUNK_BYTES + 1024))
    with pytest.raises(OSError, match="connection reset"):
        storage.write_fileobj(uri, source)
    assert not storage.exists(uri)
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == 0
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_failed_overwrite_keeps_previous_object(s3):
    uri = f"s3://{BUCKET}/models/model.bin"
    storage.write_bytes(uri, b"champion weights")
    with pytest.raises(OSError):
        storage.write_fileobj(uri, io.BufferedReader(FailingReader(100)))
    assert storage.read_bytes(uri) == b"champion weights"


def test_local_paths_are_atomic_too(tmp_path):
    target = tmp_path / "plans" / "plan.json"
    storage.write_text(str(target), "old")
    with pytest.raises(OSError):
        storage.write_fileobj(f"file://{target}", io.BufferedReader(FailingReader(10)))
    assert target.read_text() == "old"
    assert storage.list_uris(str(tmp_path)) == [str(target)]
    assert storage.exists(str(target))


def test_bad_uris_are_refused():
    with pytest.raises(storage.StorageError, match="no bucket"):
        storage.parse_uri("s3:///key")
    with pytest.raises(storage.StorageError, match="unsupported scheme"):
        storage.parse_uri("gs://bucket/key")
    with pytest.raises(storage.StorageError, match="no object key"):
        storage.read_bytes("s3://bucket/")
