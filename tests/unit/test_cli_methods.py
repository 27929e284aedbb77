"""A method registered once (`round_robin`, tests/conftest.py) is planned from the CLI (choices, its own option flags) and benchmarked: nothing else
lists the methods."""

from __future__ import annotations

import json

import pytest
from search_doubles import random_task

from shardwise.cli import main
from shardwise.jobs.benchmark import default_methods
from shardwise.search import GreedySearch
from shardwise.workload import save_task


def test_a_registered_method_is_a_plan_choice_with_its_own_flags(round_robin, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/absent.db")
    save_task(random_task(0, 8, 4, memory_slack=4.0), "task.json")
    assert main(["plan", "--task", "task.json", "--method", "round_robin", "--offset", "1", "--out", "p.json"]) == 0
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["method"] == "round_robin" and doc["shards"][0]["device"] == 1
    assert doc["provenance"]["options"] == {"offset": 1}
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    help_text = capsys.readouterr().out
    assert "round_robin" in help_text and "--offset" in help_text
    # its option is refused for other methods, and bad values are refused naming the flag
    assert main(["plan", "--task", "task.json", "--method", "size_greedy", "--offset", "1", "--out", "q.json"]) == 2
    assert main(["plan", "--task", "task.json", "--method", "round_robin", "--offset", "-1", "--out", "q.json"]) == 2
    assert "offset" in capsys.readouterr().err
    assert not (tmp_path / "absent.db").exists()  # looking for a champion never creates a store


def test_a_registered_method_is_in_the_benchmark_by_default(round_robin):
    assert "round_robin" in default_methods()
    assert isinstance(GreedySearch("size"), GreedySearch)
