"""Placement policies through `MlflowService` on a real MLflow sqlite store: the promotion gate on validation plan
cost (with its evidence on the versions), loading a policy directory by alias, a store named by URI alone,
plain runs, and the errors for what is not there.

A policy here is a directory with a valid policy.json and weights.pt written with json and torch.save: the
service logs and downloads the files and never reads them (search's `load_policy_dir` does)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from shardwise.errors import ShardwiseError
from shardwise.integrations.mlflow import (
    CHALLENGER,
    CHAMPION,
    POLICY_METRIC,
    MlflowService,
    RegistryError,
    champion_uri,
    policy_name,
)
from shardwise.integrations.mlflow_registry import cache_root

pytestmark = pytest.mark.integration
KIND = "cpu-itest"
NAME = policy_name("dreamshard", KIND)


def _policy_dir(root: Path, score: float, seed: int) -> Path:
    """A saved-policy directory; `score` stands for the validation cost its planning would reach."""
    root.mkdir(parents=True)
    (root / "policy.json").write_text(json.dumps(
        {"format": "shardwise.policy/v1", "method": "dreamshard", "hardware_kind": KIND, "score": score}
    ))
    torch.save({"w": torch.randn(4, 3, generator=torch.Generator().manual_seed(seed))}, root / "weights.pt")
    return root


def _score_of(directory: Path) -> float:
    return float(json.loads((directory / "policy.json").read_text())["score"])


def _score(service: MlflowService):
    """champion_value as a job writes it: load the champion and measure it (here: read its score)."""
    return lambda uri: service.load(uri, _score_of)


def _log(service: MlflowService, directory: Path, cost: float, **kwargs):
    history = [{"reward": -1.5, "loss": 0.3}, {"reward": -1.2, "loss": float("nan")}]
    return service.log_policy(directory, method="dreamshard", hardware_kind=KIND, history=history,
                              params={"episodes": 2, "tables": "t" * 900}, validation_cost=cost, **kwargs)


@pytest.fixture
def store(tmp_path, monkeypatch, new_store):
    """An embedded sqlite store named by absolute URI; the cwd (where sqlite:///mlflow.db would go) is empty."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return new_store(tmp_path / "reg.db"), cwd


def test_policy_gate_better_cost_takes_champion_worse_gets_challenger_with_evidence(tmp_path, store):
    uri, _ = store
    service = MlflowService(uri)
    first = _log(service, _policy_dir(tmp_path / "p1", 1.10, 1), 1.10, champion_value=_score(service))
    better = _log(service, _policy_dir(tmp_path / "p2", 1.05, 2), 1.05, champion_value=_score(service))
    worse = _log(service, _policy_dir(tmp_path / "p3", 1.20, 3), 1.20, champion_value=_score(service))
    assert first.promotion is not None and better.promotion is not None and worse.promotion is not None
    assert (first.promotion.alias, better.promotion.alias, worse.promotion.alias) == (CHAMPION, CHAMPION, CHALLENGER)
    assert better.promotion.champion_version == first.promotion.version and better.promotion.champion_value == 1.10
    assert worse.promotion.champion_version == better.promotion.version and worse.promotion.champion_value == 1.05
    assert worse.promotion.metric == POLICY_METRIC and worse.promotion.name == NAME

    client = service._client()
    assert str(client.get_model_version_by_alias(NAME, CHAMPION).version) == better.promotion.version
    assert str(client.get_model_version_by_alias(NAME, CHALLENGER).version) == worse.promotion.version
    tags = client.get_model_version(NAME, worse.promotion.version).tags
    assert tags["gate.metric"] == POLICY_METRIC and tags["gate.decision"] == CHALLENGER
    assert float(tags["gate.value"]) == 1.20 and float(tags["gate.champion_value"]) == 1.05
    assert tags["gate.champion_version"] == better.promotion.version
    first_tags = client.get_model_version(NAME, first.promotion.version).tags
    assert first_tags["gate.decision"] == CHAMPION and first_tags["gate.champion_version"] == ""

    run = client.get_run(worse.run_id).data
    assert run.metrics[POLICY_METRIC] == 1.20
    assert run.metrics[f"gate_champion_{POLICY_METRIC}"] == 1.05
    assert run.tags["alias"] == CHALLENGER and run.tags["registered_version"] == worse.promotion.version
    assert len(run.params["tables"]) == 500  # stringified to MLflow's param limit
    # the training curve, step by step; the non-finite loss of step 1 is dropped, not logged as NaN
    assert [m.value for m in client.get_metric_history(worse.run_id, "reward")] == [-1.5, -1.2]
    assert [m.step for m in client.get_metric_history(worse.run_id, "loss")] == [0]


def test_policy_gate_new_version_wins_when_the_champion_cannot_be_compared(tmp_path, store):
    service = MlflowService(store[0])
    _log(service, _policy_dir(tmp_path / "p1", 1.0, 1), 1.0)
    asked = []

    def not_comparable(uri: str) -> None:
        asked.append(uri)
        return None

    second = _log(service, _policy_dir(tmp_path / "p2", 1.5, 2), 1.5, champion_value=not_comparable)
    assert asked == [f"models:/{NAME}/1"]  # the champion by version: the alias may move meanwhile
    assert second.promotion is not None and second.promotion.alias == CHAMPION
    assert second.promotion.champion_version == "1" and second.promotion.champion_value is None
    assert "not comparable" in second.promotion.reason


def test_gate_never_replaces_a_champion_without_a_finite_value(tmp_path, store):
    service = MlflowService(store[0])
    _log(service, _policy_dir(tmp_path / "p1", 1.0, 1), 1.0)
    blind = _log(service, _policy_dir(tmp_path / "p2", 1.0, 2), float("nan"), champion_value=_score(service))
    assert blind.promotion is not None and blind.promotion.alias == CHALLENGER
    assert math.isnan(blind.promotion.new_value)
    assert str(service._client().get_model_version_by_alias(NAME, CHAMPION).version) == "1"


def test_load_policy_by_alias_version_and_run_gives_the_same_files(tmp_path, store):
    uri, cwd = store
    source = _policy_dir(tmp_path / "p1", 1.0, 1)
    logged = _log(MlflowService(uri), source, 1.0)
    assert logged.promotion is not None

    def files(directory: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}

    service = MlflowService(uri)  # a fresh service on the same store
    expected = files(source)
    for ref in (f"models:/{NAME}@champion", f"models:/{NAME}/{logged.promotion.version}", logged.model_uri):
        assert service.load(ref, files) == expected, ref
    assert service.load(str(source), files) == expected  # a local directory is used as it is
    kept = service.load(logged.model_uri, lambda d: d)
    assert not kept.exists()  # a run's download lives only while load_dir runs
    cached = service.load(champion_uri(NAME), lambda d: d)  # a registered version's stays in the cache
    assert cached.is_dir() and cached.is_relative_to(cache_root()) and files(cached) == expected
    assert not (cwd / "mlflow.db").exists()


def test_named_store_reaches_the_registry_without_env_and_creates_no_default_db(tmp_path, store, monkeypatch):
    """The issue's bug: a champion in a non-default store, named only by URI, must be found; nothing may fall
    back to ./mlflow.db (neither the download of models:/ nor the logged model behind a version)."""
    import mlflow

    uri, cwd = store
    before = mlflow.get_tracking_uri()
    _log(MlflowService(uri), _policy_dir(tmp_path / "p1", 1.0, 1), 1.0)
    assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_REGISTRY_URI" not in os.environ
    assert mlflow.get_tracking_uri() == before  # the service left mlflow's process-wide state as it was
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    assert MlflowService(tracking_uri=uri).load(champion_uri(NAME), _score_of) == 1.0
    assert not (cwd / "mlflow.db").exists() and not (other / "mlflow.db").exists()


def test_registry_uri_separate_from_tracking_uri(tmp_path, store, new_store):
    tracking, cwd = store
    registry = new_store(tmp_path / "registry.db")
    service = MlflowService(tracking, registry)
    _log(service, _policy_dir(tmp_path / "p1", 1.0, 1), 1.0)
    assert service.load(champion_uri(NAME), lambda d: (d / "policy.json").is_file())
    with pytest.raises(RegistryError, match="not found"):  # the tracking store has no registered models
        MlflowService(tracking, tracking).load(champion_uri(NAME), lambda d: d)


def test_missing_alias_model_store_and_bad_uris_are_one_line_registry_errors(tmp_path, store):
    uri, cwd = store
    missing_store = f"sqlite:///{tmp_path / 'absent.db'}"
    absent = MlflowService(missing_store)
    assert not absent.store_exists()
    with pytest.raises(RegistryError) as err:
        absent.load(champion_uri(NAME), lambda d: d)
    assert champion_uri(NAME) in str(err.value) and missing_store in str(err.value)
    assert "shardwise train-policy --method dreamshard" in str(err.value)
    assert not (tmp_path / "absent.db").exists()  # looking did not create it
    with pytest.raises(RegistryError, match="make run"):
        absent.load("models:/shardwise-cost-cpu@champion", lambda d: d)

    service = MlflowService(uri)
    _log(service, _policy_dir(tmp_path / "p1", 1.0, 1), 1.0)
    assert service.store_exists()
    for ref in (f"models:/{NAME}@{CHALLENGER}", f"models:/{NAME}/7", f"models:/{policy_name('autoshard', KIND)}@champion",
                "runs:/0123456789abcdef/policy"):
        with pytest.raises(RegistryError) as err:
            service.load(ref, lambda d: d)
        message = str(err.value)
        assert ref in message and uri in message and "\n" not in message, message
    for bad in (str(tmp_path / "no-such-dir"), "models:/a/b/c@x"):
        with pytest.raises(RegistryError) as err:
            service.load(bad, lambda d: d)
        assert bad in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ShardwiseError)
    assert not (cwd / "mlflow.db").exists()


def test_register_false_logs_the_run_only(tmp_path, store):
    service = MlflowService(store[0])
    logged = _log(service, _policy_dir(tmp_path / "p1", 1.0, 1), 1.0, register=False)
    assert logged.promotion is None and logged.model_uri == f"runs:/{logged.run_id}/policy"
    assert service._client().search_registered_models() == []
    assert service.load(logged.model_uri, lambda d: (d / "weights.pt").is_file())


def test_log_policy_refuses_a_directory_without_policy_json(tmp_path, store):
    with pytest.raises(ShardwiseError, match="policy.json"):
        _log(MlflowService(store[0]), tmp_path, 1.0)


def test_log_run_drops_non_finite_metrics_and_stringifies_params(tmp_path, store):
    import mlflow

    uri, _ = store
    before = mlflow.get_tracking_uri()
    out = tmp_path / "report"
    out.mkdir()
    (out / "comparison.md").write_text("| plan | ms |\n")
    service = MlflowService(uri)
    run_id = service.log_run(
        experiment="shardwise-evaluate", run_name="evaluate-a-vs-b",
        params={"methods": "a,b", "num_devices": 4, "task_sets": [{"name": "x" * 600}]},
        metrics={"a_max_cost_ms": 1.5, "b_max_cost_ms": float("nan"), "b_imbalance": float("inf"), "n": 3},
        artifacts_dir=out, artifact_path="evaluation",
    )
    client = service._client()
    run = client.get_run(run_id)
    assert run.info.run_name == "evaluate-a-vs-b" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "shardwise-evaluate"
    assert run.data.metrics == {"a_max_cost_ms": 1.5, "n": 3.0}
    assert run.data.params["num_devices"] == "4" and len(run.data.params["task_sets"]) == 500
    assert [f.path for f in client.list_artifacts(run_id, "evaluation")] == ["evaluation/comparison.md"]
    assert mlflow.get_tracking_uri() == before and "MLFLOW_TRACKING_URI" not in os.environ


def test_uris_resolve_argument_then_environment_then_default(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    default = MlflowService()
    assert (default.tracking_uri, default.registry_uri) == ("sqlite:///mlflow.db", "sqlite:///mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert MlflowService().registry_uri == "http://tracking:5000"
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", "http://registry:5000")
    assert (MlflowService().tracking_uri, MlflowService().registry_uri) == ("http://tracking:5000",
                                                                           "http://registry:5000")
    given = MlflowService("sqlite:////x/a.db")
    assert (given.tracking_uri, given.registry_uri) == ("sqlite:////x/a.db", "http://registry:5000")
    assert MlflowService("http://tracking:5000").store_exists()  # a server is not a file to create
