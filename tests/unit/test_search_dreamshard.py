"""DreamShard-specific behaviour (shared policy behaviour is in test_search_policies.py)."""

from __future__ import annotations

import pytest
import torch
from search_doubles import AnalyticCostModel, heldout_tasks

from shardwise.search.dreamshard import DreamShardConfig, DreamShardPolicy, train_dreamshard

torch.set_num_threads(1)


COST_MODEL = AnalyticCostModel()


def test_load_refuses_another_method(tmp_path):
    from shardwise.search.autoshard import AutoShardConfig, AutoShardPolicy

    AutoShardPolicy(AutoShardConfig(hidden=8)).save(tmp_path / "auto")
    with pytest.raises(ValueError, match="'method'"):
        DreamShardPolicy.load(tmp_path / "auto")


def test_training_is_seeded():
    tasks = heldout_tasks(2, num_tables=8, num_devices=2)
    config = DreamShardConfig(hidden=8, iterations=1, episodes_per_iteration=2, rollouts=4, cost_steps=5,
                              initial_random_plans=4)
    a, _ = train_dreamshard(COST_MODEL, tasks, seed=3, config=config, progress=False)
    b, _ = train_dreamshard(COST_MODEL, tasks, seed=3, config=config, progress=False)
    for x, y in zip(a.policy_net.state_dict().values(), b.policy_net.state_dict().values()):
        assert torch.equal(x, y)
