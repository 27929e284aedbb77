import numpy as np
import pytest
from search_doubles import FeatureCostModel

from shardwise.search import Plan, Shard, ShardCostCache, device_specs, simulate
from shardwise.search.simulator import balance_bound
from shardwise.workload import ShardingTask, TableSpec

TASK = ShardingTask(
    num_devices=3,
    device_memory_bytes=2**30,
    batch_size=256,
    tables=(
        TableSpec(name="a", rows=1000, dim=16, pooling_factor=2.0),
        TableSpec(name="b", rows=200000, dim=64, pooling_factor=30.0),
        TableSpec(name="c", rows=500, dim=8, pooling_factor=1.0),
    ),
)
PLAN = Plan(
    num_devices=3,
    shards=(
        Shard(table="a", col_offset=0, dim=16, device=0),
        Shard(table="b", col_offset=0, dim=32, device=0),
        Shard(table="b", col_offset=32, dim=32, device=1),
        Shard(table="c", col_offset=0, dim=8, device=1),
    ),
)


class CountingModel(FeatureCostModel):
    def __init__(self):
        self.compute_calls: list[int] = []

    def predict_compute(self, shards):
        self.compute_calls.append(len(shards))
        return super().predict_compute(shards)


def test_simulate_is_the_model_on_each_device_and_the_plan_waits_for_the_slowest():
    model = FeatureCostModel()
    cost = simulate(PLAN, TASK, model)
    devices = device_specs(PLAN, TASK)
    np.testing.assert_allclose(np.stack([cost.fwd_ms, cost.bwd_ms], 1), model.predict_compute(devices))
    widths = np.array([[48, 40, 0]])
    comm = model.predict_comm(widths, (cost.fwd_ms + cost.bwd_ms)[None])[0]
    np.testing.assert_allclose(cost.comm_fwd_ms, comm[:, 0])
    assert cost.fwd_ms[2] == 0 and cost.bwd_ms[2] == 0  # an idle device computes nothing
    assert cost.max_cost_ms == pytest.approx(cost.total_ms.max())
    assert cost.imbalance == pytest.approx(cost.total_ms.max() / cost.total_ms.mean())
    assert cost.to_json()["max_cost_ms"] == pytest.approx(cost.max_cost_ms, abs=1e-3)


def test_shard_predictions_are_batched_and_cached():
    model = CountingModel()
    cache = ShardCostCache(model)
    first = simulate(PLAN, TASK, model, cache)
    second = simulate(PLAN, TASK, model, cache)
    assert model.compute_calls == [2]  # one call for both non-empty devices, none the second time
    np.testing.assert_array_equal(first.total_ms, second.total_ms)
    assert cache.hits == 3 and cache.misses == 3


def test_a_model_without_communication_data_predicts_no_comm():
    model = FeatureCostModel()
    model.has_comm = False  # like a NeuralCostModel trained on compute rows only
    cost = simulate(PLAN, TASK, model)
    assert not cost.comm_fwd_ms.any() and not cost.comm_bwd_ms.any()


def test_the_balance_bound_is_below_every_placement_and_reached_only_when_balanced():
    """With an additive cost model the bound (the shards dealt evenly, or the largest shard) is at most the slowest
    device's compute in any placement of the same shards; a plan with everything on one device is far above it."""
    model = FeatureCostModel()
    bound = balance_bound(PLAN, TASK, model, simulate(PLAN, TASK, model))
    assert bound.bound_ms == max(bound.fused_per_device_ms, bound.largest_shard_ms) > 0
    rng = np.random.default_rng(0)
    for _ in range(20):
        moved = Plan(num_devices=3, shards=tuple(s.model_copy(update={"device": int(rng.integers(3))})
                                                  for s in PLAN.shards))
        slowest = simulate(moved, TASK, model).compute_ms.max()
        assert slowest >= bound.bound_ms * (1 - 1e-9)
    piled = Plan(num_devices=3, shards=tuple(s.model_copy(update={"device": 0}) for s in PLAN.shards))
    piled_bound = balance_bound(piled, TASK, model, simulate(piled, TASK, model)).to_json()
    assert piled_bound["compute_over_bound"] > 1.5
