"""Cost models through MLflow: a real `mlflow server` with S3 artifacts on moto's S3 server, and the embedded
sqlite default: train, log, register, promotion gate, load (also from a fresh process).

The cost data follows a known sub-additive law (tests/unit/costmodel_synthetic.py) so that a trained model is
reliably better than a barely trained one and the file runs in well under a minute; accuracy on real fbgemm
measurements is what benchmarks/bench_costmodel_accuracy.py reports."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import numpy as np
import pytest
import torch
from moto.server import ThreadedMotoServer

from shardwise.costmodel import TrainConfig, train_cost_model
from shardwise.integrations.mlflow import (
    default_model_uri,
    load_cost_model,
    log_training_run,
    registered_model_name,
)

_spec = importlib.util.spec_from_file_location("costmodel_synthetic", Path(__file__).parents[1] / "unit" / "costmodel_synthetic.py")
assert _spec is not None and _spec.loader is not None
synthetic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synthetic)

pytestmark = pytest.mark.integration
torch.set_num_threads(1)
BUCKET = "shardwise-artifacts"
GOOD = TrainConfig(epochs=40, hidden=32, progress=False)
WORSE = TrainConfig(epochs=1, progress=False)  # same seed -> same split, barely trained


@pytest.fixture(scope="module")
def costs():
    """Train tables and, profiled separately, held-out tables (the way `shardwise profile` is run)."""
    tables = {"a": synthetic.synthetic_tables("a", 24, 0), "h": synthetic.synthetic_tables("h", 8, 1)}
    return synthetic.cost_frame(tables, {"a": 150, "h": 50}, seed=0, hardware_kind="cpu-itest")


@pytest.fixture(scope="module")
def good(costs):
    return train_cost_model(costs, 0, GOOD)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_tracking_server(tmp_path_factory):
    """`mlflow server` on loopback, sqlite backend, artifacts proxied to a bucket on moto's S3 server."""
    tmp = tmp_path_factory.mktemp("mlflow-server")
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    host, port = moto.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    s3 = boto3.client("s3", endpoint_url=endpoint, **{k.lower(): v for k, v in creds.items() if k != "AWS_DEFAULT_REGION"},
                      region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    server_port = _free_port()
    env = {**os.environ, **creds, "MLFLOW_S3_ENDPOINT_URL": endpoint}
    env.pop("MLFLOW_TRACKING_URI", None)
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(server_port),
         "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db", "--artifacts-destination", f"s3://{BUCKET}/mlartifacts",
         "--serve-artifacts", "--workers", "1"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{server_port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            moto.stop()
            pytest.fail(f"mlflow server did not start: {(tmp / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield url, s3
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    moto.stop()


def _predict_in_fresh_process(uri: str, shards, tracking_uri: str, tmp_path: Path) -> np.ndarray:
    """Load `uri` and predict in a new interpreter (no state shared with this one)."""
    shards_file = tmp_path / "shards.json"
    shards_file.write_text(json.dumps([[t.model_dump(mode="json") for t in s] for s in shards]))
    out = tmp_path / "pred.npy"
    code = (
        "import json, sys, numpy as np\n"
        "from shardwise.integrations.mlflow import load_cost_model\n"
        "from shardwise.workload import TableSpec\n"
        "shards = [[TableSpec.model_validate(t) for t in s] for s in json.load(open(sys.argv[2]))]\n"
        "np.save(sys.argv[3], load_cost_model(sys.argv[1]).predict_compute(shards))\n"
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri}
    done = subprocess.run([sys.executable, "-c", code, uri, str(shards_file), str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out)


def test_remote_server_with_s3_gate_keeps_champion_and_fresh_process_loads_it(costs, good, s3_tracking_server, tmp_path):
    url, s3 = s3_tracking_server
    good, report = good
    worse, worse_report = train_cost_model(costs, 0, WORSE)
    assert worse_report.test.config_ids == report.test.config_ids  # the gate compares on the same shards
    name = registered_model_name(report.hardware_kind)

    first = log_training_run(good, report, config=GOOD, tracking_uri=url)
    assert first.promotion is not None and first.promotion.alias == "champion"
    second = log_training_run(worse, worse_report, config=WORSE, tracking_uri=url)
    assert second.promotion is not None and second.promotion.alias == "challenger"
    assert second.promotion.champion_version == first.promotion.version
    assert second.promotion.new_mape_pct > second.promotion.champion_mape_pct

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=url, registry_uri=url)
    assert client.get_model_version_by_alias(name, "champion").version == first.promotion.version
    assert client.get_model_version_by_alias(name, "challenger").version == second.promotion.version

    # the artifacts live in the bucket, not on the server's disk
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="mlartifacts/").get("Contents", [])]
    assert any(k.endswith("weights.pt") for k in keys) and any(k.endswith("evaluation.csv") for k in keys)

    shards = [list(s) for s in report.test.shards]
    fresh = _predict_in_fresh_process(default_model_uri(report.hardware_kind), shards, url, tmp_path)
    np.testing.assert_array_equal(fresh, good.predict_compute(shards))


def test_embedded_sqlite_register_and_load_by_every_uri_form(costs, good, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the embedded default writes mlflow.db and mlruns/ here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model, report = good
    run = log_training_run(model, report, config=GOOD)
    assert (tmp_path / "mlflow.db").is_file()
    assert run.promotion is not None and run.promotion.alias == "champion"
    shards = [list(s) for s in report.test.shards]
    expected = model.predict_compute(shards)
    name = registered_model_name(report.hardware_kind)
    for uri in (f"models:/{name}@champion", f"models:/{name}/{run.promotion.version}",
                f"runs:/{run.run_id}/cost_model", run.model_uri):
        np.testing.assert_array_equal(load_cost_model(uri).predict_compute(shards), expected, err_msg=uri)
    model.save(tmp_path / "local")
    np.testing.assert_array_equal(load_cost_model(str(tmp_path / "local")).predict_compute(shards), expected)

    import mlflow

    # the registered pyfunc works for MLflow's own tooling too (models-from-code, no pickled module)
    pyfunc = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    frame = costs.drop_duplicates("config_id").head(5)
    out = pyfunc.predict(frame[["tables_json"]])
    assert list(out.columns) == ["fwd_ms", "bwd_ms"] and len(out) == 5 and (out > 0).all().all()


def test_load_cost_model_names_a_missing_source(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        load_cost_model(str(tmp_path / "nope"))
