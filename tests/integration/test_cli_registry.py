"""`--tracking-uri` reaches the model registry: a champion registered in a non-default store is found by `plan`,
and nothing is created in the working directory."""

from __future__ import annotations

import json

import pytest
from search_doubles import random_task

from shardwise.cli import main
from shardwise.integrations.mlflow import MlflowService
from shardwise.workload import save_task

pytestmark = pytest.mark.integration


def test_plan_finds_the_champion_in_the_store_named_by_tracking_uri(tmp_path, monkeypatch, capsys, tiny_cost_model,
                                                                    new_store):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    store = tmp_path / "registry"
    uri = new_store(store / "reg.db")
    model, report = tiny_cost_model  # this machine's kind: the champion `plan` looks up by default
    monkeypatch.chdir(store)  # MLflow's default artifact root is relative to the working directory
    logged = MlflowService(uri).log_cost_model(model, report)
    assert logged.promotion is not None and logged.promotion.alias == "champion"

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    save_task(random_task(0, 12, 4), "task.json")
    # the champion is looked up for the hardware the model was trained on
    assert main(["plan", "--task", "task.json", "--method", "neuroshard", "--tracking-uri", uri,
                 "--out", "plan.json"]) == 0, capsys.readouterr().err
    doc = json.loads((work / "plan.json").read_text())
    assert doc["provenance"]["cost_model_uri"] == f"models:/shardwise-cost-{model.hardware_kind}@champion"
    assert sorted(p.name for p in work.iterdir()) == ["plan.json", "task.json"]  # no ./mlflow.db
    capsys.readouterr()

    # a store without the champion: one line saying how to get one, and still nothing created
    assert main(["plan", "--task", "task.json", "--tracking-uri", f"sqlite:///{tmp_path / 'empty.db'}",
                 "--out", "plan2.json"]) == 2
    err = capsys.readouterr().err
    assert "make run" in err and err.count("\n") == 1
    assert not (tmp_path / "empty.db").exists()


def test_a_model_directory_holding_two_models_is_refused_not_guessed(tmp_path, monkeypatch, capsys, tiny_cost_model):
    monkeypatch.chdir(tmp_path)
    model, _ = tiny_cost_model
    model.save(tmp_path / "models" / "one")
    model.save(tmp_path / "models" / "two")
    save_task(random_task(0, 6, 2), "task.json")
    assert main(["plan", "--task", "task.json", "--model", str(tmp_path / "models"), "--out", "p.json"]) == 2
    assert "2 cost models inside (one, two)" in capsys.readouterr().err
    assert main(["plan", "--task", "task.json", "--model", str(tmp_path / "models" / "one"), "--out", "p.json"]) == 0
