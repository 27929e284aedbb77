"""Cost models through `MlflowService`: a real `mlflow server` with S3 artifacts on moto's S3 server, the embedded
sqlite default and a sqlite store named by URI alone: train, log, register, promotion gate, load (also from a
fresh process).

The cost data follows a known sub-additive law (tests/unit/costmodel_synthetic.py) so that a trained model is
reliably better than a barely trained one and the file runs in well under a minute; accuracy on real fbgemm
measurements is what the costmodel_seeds experiment (python -m benchmarks costmodel_seeds) reports."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import boto3
import numpy as np
import pytest
import torch
import yaml
from moto.server import ThreadedMotoServer
from service_processes import mlflow_server

from shardwise.costmodel import TrainConfig, train_cost_model
from shardwise.integrations.mlflow import (
    CHALLENGER,
    CHAMPION,
    COST_MODEL_GUARD_METRIC,
    COST_MODEL_METRIC,
    MlflowService,
    RegistryError,
    champion_uri,
    cost_model_name,
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


def _manifest_allowed_hosts() -> str:
    manifest = Path(__file__).resolve().parents[2] / "manifests" / "mlflow.yaml"
    deployment = next(d for d in yaml.safe_load_all(manifest.read_text()) if d and d["kind"] == "Deployment")
    (server,) = deployment["spec"]["template"]["spec"]["containers"]
    return next(v["value"] for v in server["env"] if v["name"] == "MLFLOW_SERVER_ALLOWED_HOSTS")


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
    # the Host names the deployed server accepts, as manifests/mlflow.yaml sets them
    env = {**creds, "MLFLOW_S3_ENDPOINT_URL": endpoint, "MLFLOW_SERVER_ALLOWED_HOSTS": _manifest_allowed_hosts()}
    try:
        with mlflow_server(tmp, artifacts=f"s3://{BUCKET}/mlartifacts", env=env) as url:
            yield url, s3
    finally:
        moto.stop()


def _predict_in_fresh_process(uri: str, shards, tracking_uri: str, tmp_path: Path) -> np.ndarray:
    """Load `uri` and predict in a new interpreter (no state shared with this one)."""
    shards_file = tmp_path / "shards.json"
    shards_file.write_text(json.dumps([[t.model_dump(mode="json") for t in s] for s in shards]))
    out = tmp_path / "pred.npy"
    code = (
        "import json, sys, numpy as np\n"
        "from shardwise.integrations.mlflow import MlflowService\n"
        "from shardwise.workload import TableSpec\n"
        "shards = [[TableSpec.model_validate(t) for t in s] for s in json.load(open(sys.argv[2]))]\n"
        "np.save(sys.argv[3], MlflowService().load_cost_model(sys.argv[1]).predict_compute(shards))\n"
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
    name = cost_model_name(report.hardware_kind)
    service = MlflowService(url)

    first = service.log_cost_model(good, report, config=GOOD)
    assert first.promotion is not None and first.promotion.alias == CHAMPION
    second = service.log_cost_model(worse, worse_report, config=WORSE)
    assert second.promotion is not None and second.promotion.alias == CHALLENGER
    assert second.promotion.champion_version == first.promotion.version
    assert second.promotion.champion_value is not None
    assert second.promotion.new_value > second.promotion.champion_value
    assert second.promotion.metric == COST_MODEL_METRIC

    client = service._client()
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == first.promotion.version
    assert str(client.get_model_version_by_alias(name, CHALLENGER).version) == second.promotion.version
    evidence = client.get_model_version(name, second.promotion.version).tags
    assert evidence["gate.decision"] == CHALLENGER and evidence["gate.champion_version"] == first.promotion.version
    assert float(evidence["gate.champion_value"]) == pytest.approx(second.promotion.champion_value)

    # the artifacts live in the bucket, not on the server's disk
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="mlartifacts/").get("Contents", [])]
    assert any(k.endswith("weights.pt") for k in keys) and any(k.endswith("evaluation.csv") for k in keys)

    shards = [list(s) for s in report.test.shards]
    fresh = _predict_in_fresh_process(champion_uri(name), shards, url, tmp_path)
    np.testing.assert_array_equal(fresh, good.predict_compute(shards))


def test_embedded_sqlite_register_and_load_by_every_uri_form(costs, good, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the embedded default writes mlflow.db and mlruns/ here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model, report = good
    service = MlflowService()
    assert not service.store_exists()
    run = service.log_cost_model(model, report, config=GOOD)
    assert (tmp_path / "mlflow.db").is_file() and service.store_exists()
    assert run.promotion is not None and run.promotion.alias == CHAMPION
    shards = [list(s) for s in report.test.shards]
    expected = model.predict_compute(shards)
    name = cost_model_name(report.hardware_kind)
    for uri in (f"models:/{name}@champion", f"models:/{name}/{run.promotion.version}",
                f"runs:/{run.run_id}/cost_model", run.model_uri):
        np.testing.assert_array_equal(service.load_cost_model(uri).predict_compute(shards), expected, err_msg=uri)
    model.save(tmp_path / "local")
    np.testing.assert_array_equal(service.load_cost_model(tmp_path / "local").predict_compute(shards), expected)

    import mlflow

    # the registered pyfunc works for MLflow's own tooling too (models-from-code, no pickled module)
    pyfunc = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    frame = costs.drop_duplicates("config_id").head(5)
    out = pyfunc.predict(frame[["tables_json"]])
    assert list(out.columns) == ["fwd_ms", "bwd_ms"] and len(out) == 5 and (out > 0).all().all()


@pytest.fixture
def named_store(tmp_path, monkeypatch):
    """A sqlite store named only by its absolute URI: no $MLFLOW_TRACKING_URI, an empty cwd."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return f"sqlite:///{tmp_path / 'reg.db'}", cwd


def test_champion_in_a_named_store_is_found_without_env_and_no_default_db_appears(good, named_store, tmp_path,
                                                                                  monkeypatch, new_store):
    """The issue's bug: `--tracking-uri sqlite:////path/reg.db` did not reach the registry (and created
    ./mlflow.db). A registered cost model's version points at a logged model (models:/m-...), which MLflow
    alone would resolve through the process-wide default store."""
    import mlflow

    uri, cwd = named_store
    new_store(tmp_path / "reg.db")
    model, report = good
    before = mlflow.get_tracking_uri()
    MlflowService(uri).log_cost_model(model, report, config=GOOD)
    assert mlflow.get_tracking_uri() == before and "MLFLOW_TRACKING_URI" not in os.environ
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = MlflowService(tracking_uri=uri).load_cost_model(champion_uri(cost_model_name(report.hardware_kind)))
    shards = [list(s) for s in report.test.shards]
    np.testing.assert_array_equal(loaded.predict_compute(shards), model.predict_compute(shards))
    assert not (cwd / "mlflow.db").exists() and not (elsewhere / "mlflow.db").exists()


def test_gate_batch_size_mismatch_new_model_wins_and_empty_heldout_never_replaces(costs, good, named_store, tmp_path,
                                                                                 new_store):
    uri, _ = named_store
    new_store(tmp_path / "reg.db")
    service = MlflowService(uri)
    model, report = good
    name = cost_model_name(report.hardware_kind)
    first = service.log_cost_model(model, report, config=GOOD)
    assert first.promotion is not None and first.promotion.alias == CHAMPION

    # nothing to compare on: the new model has no held-out MAPE, so the champion stays
    empty = dataclasses.replace(report, test=report.test.subset([]))
    blind = service.log_cost_model(model, empty, config=GOOD)
    assert blind.promotion is not None and blind.promotion.alias == CHALLENGER
    assert math.isnan(blind.promotion.new_value) and blind.promotion.champion_version == first.promotion.version

    # profiled at another batch size: the champion's MAPE is not comparable; the newer model wins, even barely trained
    other = costs.assign(batch_size=4 * int(costs["batch_size"].iloc[0]))
    barely, barely_report = train_cost_model(other, 0, WORSE)
    assert barely.batch_size != model.batch_size
    newer = service.log_cost_model(barely, barely_report, config=WORSE)
    assert newer.promotion is not None and newer.promotion.alias == CHAMPION
    assert newer.promotion.champion_version == first.promotion.version and newer.promotion.champion_value is None
    tags = service._client().get_model_version(name, newer.promotion.version).tags
    assert tags["gate.decision"] == CHAMPION and "not comparable" in tags["gate.reason"]


def test_gate_compares_a_champion_calibrated_at_another_reference_time_in_the_new_units(costs, good, tmp_path,
                                                                                          new_store):
    """The same shards profiled on a day the reference kernel ran 2x slower: every reference-normalised figure is
    2x. A less trained model on that profile must not replace a better champion just because the champion
    predicts in the old units (in them its MAPE is about 51%, the newcomer's 36%; in the new units 27%)."""
    service = MlflowService(new_store(tmp_path / "mlflow.db"))
    model, report = good
    first = service.log_cost_model(model, report, config=GOOD)
    assert first.promotion is not None and first.promotion.alias == CHAMPION and model.reference_ms == 1.0
    slower = costs.assign(fwd_ms=costs["fwd_ms"] * 2, bwd_ms=costs["bwd_ms"] * 2, reference_ms=2.0)
    less = TrainConfig(epochs=30, hidden=32, progress=False)
    newcomer, newcomer_report = train_cost_model(slower, 0, less)
    assert newcomer.reference_ms == pytest.approx(2.0)
    newer = service.log_cost_model(newcomer, newcomer_report, config=less)
    assert newer.promotion is not None and newer.promotion.alias == CHALLENGER, newer.promotion
    # compared in the new units the champion is exactly as accurate as on its own profile
    assert newer.promotion.champion_value == pytest.approx(first.promotion.new_value)
    assert newer.promotion.champion_value < newer.promotion.new_value
    # and so is the guard's figure, its MAPE over the costliest tenth of the same shards
    ours, theirs = newer.promotion.guard_values[COST_MODEL_GUARD_METRIC]
    assert theirs == pytest.approx(first.promotion.guard_values[COST_MODEL_GUARD_METRIC][0]) and ours > 0


def test_load_cost_model_names_a_missing_source_and_store(tmp_path, named_store):
    uri, cwd = named_store
    service = MlflowService(uri)
    with pytest.raises(RegistryError, match="no such directory"):
        service.load_cost_model(tmp_path / "nope")
    with pytest.raises(RegistryError) as err:
        service.load_cost_model(champion_uri(cost_model_name("cpu")))
    message = str(err.value)
    assert uri in message and "models:/shardwise-cost-cpu@champion" in message and "make run" in message
    assert "shardwise pretrain" in message and "\n" not in message
    assert not (tmp_path / "reg.db").exists() and not (cwd / "mlflow.db").exists()


@pytest.mark.parametrize("host, status", [("shardwise-mlflow:5000", 200), ("shardwise-mlflow.kubeflow:5000", 200),
                                          ("localhost", 200),  # the probes' Host header
                                          ("attacker.example:5000", 403)])
def test_the_server_answers_the_host_names_the_pipeline_uses_and_refuses_others(s3_tracking_server, host, status):
    """MLflow 3.17 answers 403 "Invalid Host header" outside localhost unless the manifest's allowed hosts list it."""
    url, _ = s3_tracking_server
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search?max_results=1", headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            answered = resp.status
    except urllib.error.HTTPError as err:
        answered = err.code
    assert answered == status
