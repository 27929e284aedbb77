import json

import pandas as pd
import pytest
import torch
from search_doubles import random_task

from shardwise.cli import main
from shardwise.search import load_plan, validate_plan
from shardwise.workload import save_task

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables

    from shardwise.costmodel import TrainConfig, train_cost_model

    df = pd.concat([cost_frame({"a": synthetic_tables("a", 12, 0)}, {"a": 60}, 0), comm_rows(10, 0)], ignore_index=True)
    model, _ = train_cost_model(df, 0, TrainConfig(epochs=5, comm_epochs=5, progress=False))
    return model.save(tmp_path_factory.mktemp("model"))


@pytest.fixture()
def task_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/none.db")
    return str(save_task(random_task(0, 20, 4), tmp_path / "task.json"))


def test_plan_with_a_model_writes_a_valid_plan_and_prints_the_device_table(task_file, model_dir, capsys):
    assert main(["plan", "--task", task_file, "--model", str(model_dir), "--out", "plan.json"]) == 0
    out, err = capsys.readouterr()
    assert "fwd ms" in out and "imbalance" in out and "wrote plan.json" in out
    plan = load_plan("plan.json")
    from shardwise.workload import load_task

    validate_plan(plan, load_task(task_file))
    with open("plan.json") as f:
        doc = json.load(f)
    assert doc["method"] == "neuroshard" and doc["provenance"]["cost_model_uri"] == str(model_dir)
    assert len(doc["predicted"]["total_ms"]) == 4 and len(doc["memory_bytes"]) == 4
    # random tables the model was not trained on: the note names them, in one line, and the plan file keeps it
    note = next(line for line in err.splitlines() if "outside what the cost model" in line)
    assert note == f"shardwise plan: note: {doc['outside_training']}" and "largest seen" in note


def test_without_a_model_neuroshard_says_how_to_get_one_and_baselines_still_plan(task_file, capsys):
    assert main(["plan", "--task", task_file, "--out", "plan.json"]) == 2
    err = capsys.readouterr().err
    assert "make run" in err and "shardwise pretrain" in err
    assert main(["plan", "--task", task_file, "--method", "lookup_greedy", "--out", "plan.json"]) == 0
    assert load_plan("plan.json").method == "lookup_greedy"


def test_a_task_that_cannot_fit_is_refused_with_the_missing_memory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    task = random_task(0, 20, 4, memory_slack=0.5)
    save_task(task, "task.json")
    assert main(["plan", "--task", "task.json", "--method", "size_greedy", "--out", "plan.json"]) == 2
    assert "GiB missing" in capsys.readouterr().err
