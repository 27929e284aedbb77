"""A cost dataset at an object-store prefix (moto's S3 server on loopback): profiling workers splitting one run
write it together with nothing lost or measured twice, scheduled runs add to the same history, and pre-training's
loader reads it whole; a wrong bucket is one line without the credentials."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from shardwise.cli import main
from shardwise.profiling.dataset import count_rows, load_costs
from shardwise.workload import TableSpec

pytestmark = pytest.mark.integration

BUCKET = "shardwise-costs"
SECRET = "s3cr3t-key-value"
CLI = [sys.executable, "-c", "import sys; from shardwise.cli import main; sys.exit(main(sys.argv[1:]))"]
TABLES = [TableSpec(name=f"t{i}", rows=200 + 50 * i, dim=8 * (1 + i % 3), pooling_factor=2.0) for i in range(6)]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on loopback with one bucket; the AWS variables a profiling pod would have."""
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    host, port = moto.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                 aws_secret_access_key=SECRET, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    yield env
    moto.stop()


def _tables(tmp_path: Path) -> Path:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"format": "shardwise.tables/v1", "batch_size": 64,
                                "tables": [t.model_dump(mode="json") for t in TABLES]}))
    return path


def _argv(tables: Path, out: str, seed: int, *extra: str) -> list[str]:
    # the lightest run with every kind of row: collectives of 4 and 16 KiB only (the split is the same at any size;
    # the default's 7 sizes up to 16 MiB cost each worker seconds)
    return ["profile", "--tables", str(tables), "--out", out, "--num-shards", "8", "--comm-layouts", "2",
            "--max-devices", "2", "--max-tables", "3", "--timing-iters", "3", "--warmup-iters", "1",
            "--all-reduce-max-bytes", "16384", "--seed", str(seed), "--device", "cpu", *extra]


# two profiling processes at once (12-26 s on a busy 2-core machine): make test-all; the slicing's fast twin is
# tests/integration/test_profiling_runner.py::test_workers_split_one_run_each_shard_once
@pytest.mark.slow
def test_workers_split_one_run_into_one_prefix_and_runs_accumulate(s3, tmp_path, monkeypatch, capsys):
    tables = _tables(tmp_path)
    prefix = f"s3://{BUCKET}/costs/cpu"
    env = {**os.environ, **s3}
    # two profiling "pods" at once, each its slice of the same run
    procs = [subprocess.Popen([*CLI, *_argv(tables, prefix, 0, "--workers", "2", "--worker", str(k))],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for k in (0, 1)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    measured = [int(re.search(r": (\d+) measured, ", out)[1]) for out in outputs]
    assert min(measured) > 0 and sum(measured) == 17, outputs  # each its slice of the run's 17 configs
    for name, value in s3.items():
        monkeypatch.setenv(name, value)
    df = load_costs(prefix)
    # 8 sampled shards of which two are one config (6 small tables; measured once), 2 all-to-all layouts of 2 devices
    # (a row a device), and the all-reduces, reduce-scatters, all-gathers and all-to-alls of 2 devices at 2 sizes each
    rows = {"compute": 7, "comm": 4, "all_reduce": 2, "reduce_scatter": 2, "all_gather": 2, "all_to_all": 2}
    assert df["kind"].value_counts().to_dict() == rows and len(df) == 19
    assert df.value_counts(["kind", "config_id", "repeat", "device"], dropna=False).max() == 1  # none twice
    assert (df["provenance"] == "profile").all()
    # every shard of the run once: the whole run with one worker on the prefix (what one worker alone measures)
    # finds nothing left to measure, so the slices covered it exactly (17 configs: the layouts' 2 hold 4 rows)
    capsys.readouterr()
    assert main(_argv(tables, prefix, 0)) == 0
    assert "0 measured, 17 already stored, 19 rows" in capsys.readouterr().out

    # next week's run (another seed) adds to the same history, which pre-training reads whole
    assert main(_argv(tables, prefix, 1)) == 0
    assert f"{prefix}: 8 measured" in capsys.readouterr().out  # (layouts it shares with the first run are kept)
    total = count_rows(prefix)
    assert total >= len(df) + 8 and len(load_costs([prefix])) == total
    assert load_costs(prefix)["hardware_kind"].nunique() == 1


def test_a_wrong_bucket_is_one_line_without_the_credentials(s3, tmp_path, monkeypatch, capsys):
    for name, value in s3.items():
        monkeypatch.setenv(name, value)
    assert main(_argv(_tables(tmp_path), "s3://no-such-bucket/costs", 0)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shardwise profile: error: s3://no-such-bucket/costs: bucket") and "\n" not in err, err
    assert SECRET not in err and "Traceback" not in err
    assert main(["pretrain", "--data", f"s3://{BUCKET}/nothing-here", "--out", str(tmp_path / "model")]) == 2
    assert "holds no .parquet part files" in capsys.readouterr().err
