"""AutoShard-specific behaviour (shared policy behaviour is in test_search_policies.py)."""

from __future__ import annotations

import pytest
import torch
from search_doubles import AnalyticCostModel, heldout_tasks

from shardwise.search.autoshard import AutoShardConfig, AutoShardPolicy, train_autoshard

torch.set_num_threads(1)


COST_MODEL = AnalyticCostModel()


def test_load_refuses_another_method(tmp_path):
    from shardwise.search.dreamshard import DreamShardConfig, DreamShardPolicy

    DreamShardPolicy(DreamShardConfig(hidden=8), cost_embedding_dim=3).save(tmp_path / "dream")
    with pytest.raises(ValueError, match="'method'"):
        AutoShardPolicy.load(tmp_path / "dream")


def test_training_is_seeded():
    tasks = heldout_tasks(2, num_tables=8, num_devices=2)
    config = AutoShardConfig(hidden=8, episodes=3, rollouts=4)
    a, _ = train_autoshard(COST_MODEL, tasks, seed=3, config=config, progress=False)
    b, _ = train_autoshard(COST_MODEL, tasks, seed=3, config=config, progress=False)
    for x, y in zip(a.network.state_dict().values(), b.network.state_dict().values()):
        assert torch.equal(x, y)
