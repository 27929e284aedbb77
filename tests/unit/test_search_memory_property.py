"""A sample of the memory property (tests/unit/memory_property.py) in the suite: random tasks from tiny to huge
tables through every method (NeuroShard, the trained policies and TorchRec's planner included), each plan checked
by the helper's own arithmetic, not by `validate_plan`. The full 10,000-task run is the benchmark
(`python -m benchmarks memory_property`)."""

from __future__ import annotations

import memory_property as check
import numpy as np
import pytest

from shardwise.search import Plan, Shard
from shardwise.workload import ShardingTask, TableSpec

# of the 30-task sample, tasks 0-1 are planned by every method and 4-5 refused by most (each with a reason), which
# reaches every method's plans and refusals in make test; the other 26 (tasks 2-3 alone, 33 and 13 tables on 1 and 2
# devices, took 2.5 s each on a busy 2-core machine) run with the slow tests (make test-all). The searches use the
# session's tiny cost model (the property holds for any model): no training of one more.
FAST = (0, 1, 4, 5)


@pytest.mark.parametrize("indices", [FAST, pytest.param((2, 3, *range(6, 30)), marks=pytest.mark.slow)],
                         ids=["fast", "rest"])
def test_no_method_emits_a_plan_over_memory_or_mis_tiled_and_every_refusal_says_why(indices, tiny_cost_model):
    tallies = check.run(len(indices), seed=3, indices=indices, max_tables=40, max_devices=16, progress=False,
                        cost_model=tiny_cost_model[0])
    assert {"neuroshard", "size_greedy", "torchrec", "dreamshard", "autoshard"} <= set(tallies)
    for name, tally in tallies.items():
        assert tally.ok(), (name, tally)
        assert tally.plans > 0, f"{name} planned nothing: the sample does not exercise it"
    # the sample spans feasible and infeasible tasks, so both branches of the property are exercised
    assert any(t.refused for t in tallies.values()) and all(t.refused_without_reason == 0 for t in tallies.values())


def test_the_independent_check_catches_a_plan_over_memory_and_a_mis_tiled_plan():
    table = TableSpec(name="t", rows=1000, dim=16, pooling_factor=2.0)
    need = check.device_bytes([(1000, 16)], 512, "rowwise_adagrad", "fp32")
    task = ShardingTask(tables=[table], num_devices=2, batch_size=512, device_memory_bytes=need)
    whole = Plan(num_devices=2, shards=(Shard(table="t", col_offset=0, dim=16, device=0),))
    assert check.check_plan(whole, task) == (False, False)
    tight = task.model_copy(update={"device_memory_bytes": need - 1})
    assert check.check_plan(whole, tight) == (True, False)
    gap = Plan(num_devices=2, shards=(Shard(table="t", col_offset=0, dim=8, device=0),
                                      Shard(table="t", col_offset=12, dim=4, device=1)))
    assert check.check_plan(gap, task)[1] is True
    overlap = Plan(num_devices=2, shards=(Shard(table="t", col_offset=0, dim=16, device=0),
                                          Shard(table="t", col_offset=0, dim=16, device=1)))
    assert check.check_plan(overlap, task)[1] is True
    # a data-parallel table: whole on every device with its dense gradient and its device's share of the batch
    replicated = Plan(num_devices=2, shards=(), data_parallel=("t",))
    dp_need = check.device_bytes([(1000, 16)], 256, "rowwise_adagrad", "fp32") + 4 * 1000 * 16
    assert check.check_plan(replicated, task.model_copy(update={"device_memory_bytes": dp_need})) == (False, False)
    assert check.check_plan(replicated, task.model_copy(update={"device_memory_bytes": dp_need - 1}))[0] is True
    also_sharded = Plan(num_devices=2, shards=whole.shards, data_parallel=("t",))
    assert check.check_plan(also_sharded, task)[1] is True
    # a row-wise table: a block of ceil(1000 / 2) rows on each device, with its outputs for the whole batch
    by_rows = Plan(num_devices=2, shards=(), row_wise=("t",))
    rw_need = check.device_bytes([(500, 16)], 512, "rowwise_adagrad", "fp32")
    assert check.check_plan(by_rows, task.model_copy(update={"device_memory_bytes": rw_need})) == (False, False)
    assert check.check_plan(by_rows, task.model_copy(update={"device_memory_bytes": rw_need - 1}))[0] is True
    assert check.check_plan(Plan(num_devices=2, shards=(), row_wise=("t",), data_parallel=("t",)), task)[1] is True
    assert check.check_plan(Plan(num_devices=2, shards=whole.shards, row_wise=("t",)), task)[1] is True


def test_the_task_space_reaches_tiny_and_huge_tables():
    rng = np.random.default_rng(0)
    tasks = [check.random_task(rng, i) for i in range(40)]
    rows = [t.rows for task in tasks for t in task.tables]
    assert min(rows) < 100 and max(rows) > 10**7
    assert min(t.num_devices for t in tasks) < 8 and max(t.num_devices for t in tasks) > 100
