"""AutoShard: trained briefly against a small analytic cost model (the cost model is not under test here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardwise.search import PlanError, RandomSearch, simulate, validate_plan
from shardwise.search.autoshard import AutoShardConfig, AutoShardPolicy, AutoShardSearch, train_autoshard
from shardwise.workload import ShardingTask, TableSpec, shard_memory_bytes

torch.set_num_threads(1)


class AnalyticCostModel:
    """Test double for the CostModel protocol: sub-additive fused compute, width-driven all-to-all."""

    hardware_kind = "test-analytic"
    batch_size = 512

    def table_embeddings(self, tables):
        return np.array([[t.pooling_factor * (t.dim + 16) / 1000.0, np.log1p(t.rows) / 10.0, 1.0] for t in tables])

    def compute_from_embeddings(self, summed):
        s = np.asarray(summed, dtype=np.float64)
        # a fixed cost shared by the fused kernel (sqrt of the table count) plus lookup work
        fwd = np.where(s[:, 2] > 0.5, 0.05 * np.sqrt(s[:, 2]) + s[:, 0] * (1 + 0.02 * s[:, 1]), 0.0)
        return np.stack([fwd, 2.0 * fwd], axis=1)

    def predict_compute(self, shards):
        summed = [self.table_embeddings(s).sum(0) if s else np.zeros(3) for s in shards]
        return self.compute_from_embeddings(np.stack(summed)) if shards else np.zeros((0, 2))

    def predict_comm(self, widths, compute_ms):
        w = np.asarray(widths, dtype=np.float64)
        fwd = 0.002 * w + 0.0005 * w.sum(axis=1, keepdims=True) + 0.01
        return np.stack([fwd, fwd], axis=2)


def make_tables(n: int, seed: int, prefix: str) -> list[TableSpec]:
    rng = np.random.default_rng(seed)
    return [
        TableSpec(name=f"{prefix}{i}", rows=int(10 ** rng.uniform(3, 5)), dim=int(rng.choice([8, 16, 32, 64, 128])),
                  pooling_factor=float(rng.uniform(1, 40)), zipf_alpha=float(rng.uniform(0.5, 1.2)))
        for i in range(n)
    ]


def make_task(tables: list[TableSpec], num_devices: int, slack: float = 1.5) -> ShardingTask:
    total = shard_memory_bytes(tables, 512)
    largest = max(shard_memory_bytes([t], 512) for t in tables)
    return ShardingTask(num_devices=num_devices, device_memory_bytes=int(max(slack * total / num_devices, largest)),
                        batch_size=512, tables=tuple(tables))


COST_MODEL = AnalyticCostModel()
CONFIG = AutoShardConfig(hidden=32, episodes=40, rollouts=8)


@pytest.fixture(scope="module")
def trained() -> AutoShardPolicy:
    pool = make_tables(120, seed=0, prefix="train")
    rng = np.random.default_rng(1)
    tasks = [make_task([pool[j] for j in rng.choice(120, size=int(rng.integers(10, 21)), replace=False)], 3)
             for _ in range(8)]
    policy, history = train_autoshard(COST_MODEL, tasks, seed=0, config=CONFIG, progress=False)
    assert len(history) == CONFIG.episodes
    return policy


def heldout_tasks(num_tasks: int, num_tables: int, num_devices: int) -> list[ShardingTask]:
    pool = make_tables(200, seed=7, prefix="holdout")  # names and draws never seen in training
    rng = np.random.default_rng(3)
    return [make_task([pool[j] for j in rng.choice(200, size=num_tables, replace=False)], num_devices)
            for _ in range(num_tasks)]


def test_plans_fit_and_beat_random_on_unseen_tasks_with_more_devices(trained):
    ours, random = [], []
    search = AutoShardSearch(trained)
    for seed, task in enumerate(heldout_tasks(4, num_tables=40, num_devices=5)):
        plan = search.search(task, COST_MODEL, seed=seed)
        validate_plan(plan, task)  # memory-feasible, every table placed once
        assert plan.method == "autoshard" and plan.num_devices == 5
        ours.append(simulate(plan, task, COST_MODEL).max_cost_ms)
        random.append(np.mean([simulate(RandomSearch().search(task, None, s), task, COST_MODEL).max_cost_ms
                               for s in range(5)]))
    assert np.mean(ours) < 0.9 * np.mean(random)


def test_tight_memory_is_respected(trained):
    tables = make_tables(16, seed=11, prefix="tight")
    task = make_task(tables, num_devices=4, slack=1.05)
    plan = AutoShardSearch(trained, samples=4).search(task, COST_MODEL, seed=0)
    validate_plan(plan, task)
    assert max(plan.extra["memory_bytes"]) <= task.device_memory_bytes


def test_impossible_task_is_refused_naming_memory(trained):
    task = make_task(make_tables(10, seed=5, prefix="big"), num_devices=2, slack=0.5)
    with pytest.raises(PlanError, match="no plan fits"):
        AutoShardSearch(trained).search(task, COST_MODEL, seed=0)


def test_needs_a_cost_model(trained):
    with pytest.raises(PlanError, match="cost model"):
        AutoShardSearch(trained).search(heldout_tasks(1, 10, 2)[0], None, seed=0)


def test_save_load_gives_identical_plans(trained, tmp_path):
    trained.save(tmp_path / "policy")
    assert (tmp_path / "policy" / "policy.json").is_file() and (tmp_path / "policy" / "weights.pt").is_file()
    loaded = AutoShardPolicy.load(tmp_path / "policy")
    for task in heldout_tasks(2, num_tables=30, num_devices=6):
        a = AutoShardSearch(trained, samples=3).search(task, COST_MODEL, seed=5)
        b = AutoShardSearch(loaded, samples=3).search(task, COST_MODEL, seed=5)
        assert a.shards == b.shards


def test_load_refuses_another_method(tmp_path):
    from shardwise.search.dreamshard import DreamShardConfig, DreamShardPolicy

    DreamShardPolicy(DreamShardConfig(hidden=8), cost_embedding_dim=3).save(tmp_path / "dream")
    with pytest.raises(ValueError, match="'method'"):
        AutoShardPolicy.load(tmp_path / "dream")


def test_trained_policy_beats_the_untrained_one(trained):
    untrained = AutoShardPolicy(CONFIG)
    tasks = heldout_tasks(4, num_tables=30, num_devices=4)
    cost = {name: np.mean([simulate(AutoShardSearch(p).search(t, COST_MODEL, 0), t, COST_MODEL).max_cost_ms
                           for t in tasks]) for name, p in (("trained", trained), ("untrained", untrained))}
    assert cost["trained"] < cost["untrained"]


def test_training_is_seeded():
    tasks = heldout_tasks(2, num_tables=8, num_devices=2)
    config = AutoShardConfig(hidden=8, episodes=3, rollouts=4)
    a, _ = train_autoshard(COST_MODEL, tasks, seed=3, config=config, progress=False)
    b, _ = train_autoshard(COST_MODEL, tasks, seed=3, config=config, progress=False)
    for x, y in zip(a.network.state_dict().values(), b.network.state_dict().values()):
        assert torch.equal(x, y)
