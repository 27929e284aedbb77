"""The user's tables from the object store (moto's S3 server on loopback): `shardwise workload from --tables
s3://bucket/key` takes a tables file or a DLRM dataset file as it takes a local one, and a missing object, a prefix
a wrong bucket or a file that cannot be a workload is one line naming the URI, without the credentials."""

from __future__ import annotations

import json

import boto3
import pytest
from moto.server import ThreadedMotoServer

from shardwise.cli import main
from shardwise.workload import TableSpec, load_tables, read_dlrm_dataset, sample_batch, write_dlrm_dataset

pytestmark = pytest.mark.integration

BUCKET = "shardwise-tables"
SECRET = "s3cr3t-key-value"
TABLES = [TableSpec(name=f"t{i}", rows=300 + 50 * i, dim=8, pooling_factor=2.0, zipf_alpha=0.5) for i in range(4)]


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on loopback with one bucket; the AWS variables a pipeline step would have."""
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    host, port = moto.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                          aws_secret_access_key=SECRET, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    yield env, client
    moto.stop()


def test_a_tables_file_and_a_dataset_file_from_the_object_store(s3, tmp_path, monkeypatch, capsys):
    env, client = s3
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    doc = {"format": "shardwise.tables/v1", "batch_size": 64, "tables": [t.model_dump(mode="json") for t in TABLES]}
    client.put_object(Bucket=BUCKET, Key="mine/tables.json", Body=json.dumps(doc).encode())
    dataset = write_dlrm_dataset(tmp_path / "day0.pt", [sample_batch(t, 64, i) for i, t in enumerate(TABLES)],
                                 compress=True)
    client.put_object(Bucket=BUCKET, Key="mine/day0.pt.gz", Body=dataset.read_bytes())

    assert main(["workload", "from", "--tables", f"s3://{BUCKET}/mine/tables.json", "--out", str(tmp_path / "a")]) == 0
    assert load_tables(tmp_path / "a" / "tables.json").tables == tuple(TABLES)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["tables.json"]  # no copy left behind

    assert main(["workload", "from", "--tables", f"s3://{BUCKET}/mine/day0.pt.gz", "--dims", "16",
                 "--out", str(tmp_path / "b")]) == 0
    assert f"from the DLRM dataset s3://{BUCKET}/mine/day0.pt.gz" in capsys.readouterr().out
    tables = load_tables(tmp_path / "b" / "tables.json")
    assert [t.name for t in tables.tables] == [t.name for t in TABLES] and {t.dim for t in tables.tables} == {16}
    assert (tmp_path / "b" / "indices.pt").read_bytes() == dataset.read_bytes()  # the index data, kept
    assert set(read_dlrm_dataset(tmp_path / "b" / "indices.pt").index_data) == {t.name for t in TABLES}


@pytest.mark.parametrize("uri, expected", [
    (f"s3://{BUCKET}/absent.json", f"s3://{BUCKET}/absent.json: no such object in the object store"),
    (f"s3://{BUCKET}/mine", "(it is a prefix: name one file under it)"),
    ("s3://no-such-bucket/t.json", "s3://no-such-bucket/t.json: no such object"),
    (f"s3://{BUCKET}/mine/one.json", f"s3://{BUCKET}/mine/one.json: field 'tables' holds 1 source table(s)"),
])
def test_what_is_not_an_object_is_one_line(s3, tmp_path, monkeypatch, capsys, uri, expected):
    env, client = s3
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    one = {"format": "shardwise.tables/v1", "batch_size": 64, "tables": [TABLES[0].model_dump(mode="json")]}
    client.put_object(Bucket=BUCKET, Key="mine/one.json", Body=json.dumps(one).encode())
    assert main(["workload", "from", "--tables", uri, "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1 and SECRET not in err
    assert not list(tmp_path.rglob("*.part"))  # the fetched copy is not left behind
