"""Data-parallel tables in plans and in NeuroShard's search: validity, memory on every device, predicted costs,
JSON, and the search choosing them only where they lower the slowest device."""

import numpy as np
import pytest
from search_doubles import FeatureCostModel

from shardwise.costmodel.data_parallel import AllReduceCost, data_parallel_cost
from shardwise.search import NeuroShardSearch, Plan, Shard
from shardwise.search.plan import PlanError, plan_from_json, plan_memory_bytes, validate_plan
from shardwise.search.report import format_plan
from shardwise.search.simulator import simulate
from shardwise.workload import ShardingTask, TableSpec, shard_memory_bytes

BIG = [TableSpec(name=f"big{i}", rows=100_000, dim=64, pooling_factor=20.0) for i in range(6)]
SMALL = [TableSpec(name=f"s{i}", rows=100, dim=128, pooling_factor=1.0) for i in range(10)]
TASK = ShardingTask(num_devices=4, device_memory_bytes=2**30, batch_size=4096, tables=(*BIG, *SMALL))


class CommHeavy(FeatureCostModel):
    """The feature double with an all-to-all 20x dearer: wide, rarely looked-up tables are worth replicating."""

    def predict_comm(self, widths, compute_ms):  # noqa: ANN001, ANN201 - as FeatureCostModel's
        return 20 * super().predict_comm(widths, compute_ms)


def _model(all_reduce: AllReduceCost | None) -> CommHeavy:
    model = CommHeavy()
    model.all_reduce = all_reduce  # type: ignore[attr-defined]
    return model


def _table_wise(task: ShardingTask, replicated: tuple[str, ...] = ()) -> Plan:
    rest = [t for t in task.tables if t.name not in replicated]
    return Plan(num_devices=task.num_devices, data_parallel=replicated,
                shards=tuple(Shard(table=t.name, col_offset=0, dim=t.dim, device=i % task.num_devices)
                             for i, t in enumerate(rest)))


def test_a_data_parallel_table_is_valid_without_shards_and_sits_on_every_device():
    plan = _table_wise(TASK, ("s0", "s1"))
    validate_plan(plan, TASK)
    without = plan_memory_bytes(_table_wise(TASK.model_copy(update={"tables": (*BIG, *SMALL[2:])})),
                                TASK.model_copy(update={"tables": (*BIG, *SMALL[2:])}))
    with_replicas = plan_memory_bytes(plan, TASK)
    extra = np.array(with_replicas) - np.array(without)
    assert (extra > 0).all() and len(set(extra)) == 1  # the same replicas on every device
    # a replica holds its weights, optimizer state and dense gradient: more than the table placed once
    assert extra[0] > shard_memory_bytes(SMALL[:2], 0)
    assert plan.sharding_types()["s0"] == "data_parallel" and plan.sharding_types()["big0"] == "table_wise"


@pytest.mark.parametrize(("replicated", "shards", "message"), [
    (("s0",), (Shard(table="s0", col_offset=0, dim=128, device=0),), "data-parallel and also has a shard"),
    (("nope",), (), "no such table"),
    (("s0", "s0"), (), "listed twice"),
])
def test_invalid_data_parallel_entries_are_refused(replicated, shards, message):
    plan = _table_wise(TASK, ("s0",))
    bad = plan.model_copy(update={"data_parallel": replicated, "shards": plan.shards + shards})
    with pytest.raises(PlanError, match=message):
        validate_plan(bad, TASK)


def test_replicas_over_a_device_memory_are_refused():
    tight = TASK.model_copy(update={"device_memory_bytes": max(plan_memory_bytes(_table_wise(TASK), TASK)) + 1})
    validate_plan(_table_wise(tight), tight)
    with pytest.raises(PlanError, match="over its cap"):
        validate_plan(_table_wise(tight, tuple(t.name for t in BIG[:2])), tight)


def test_json_round_trip_keeps_data_parallel_and_a_table_wise_plan_reads_as_before():
    plan = _table_wise(TASK, ("s3",))
    assert plan_from_json(plan.to_json()).data_parallel == ("s3",)
    assert "data_parallel" not in _table_wise(TASK).to_json()


def test_predicted_cost_adds_the_local_kernel_and_all_reduce_to_every_device():
    model = _model(AllReduceCost(0.01, 0.0, 0.5))
    plan = _table_wise(TASK, ("s0", "s1"))
    base = simulate(_table_wise(TASK.model_copy(update={"tables": (*BIG, *SMALL[2:])})),
                    TASK.model_copy(update={"tables": (*BIG, *SMALL[2:])}), model)
    cost = simulate(plan, TASK, model)
    replicated = data_parallel_cost(model, SMALL[:2], 4)
    np.testing.assert_allclose(cost.fwd_ms - base.fwd_ms, replicated.fwd_ms)
    np.testing.assert_allclose(cost.all_reduce_ms, replicated.all_reduce_ms)
    assert "all_reduce_ms" in cost.to_json()
    with pytest.raises(PlanError, match="no measured all-reduce"):
        simulate(plan, TASK, _model(None))


def test_neuroshard_replicates_the_small_wide_tables_when_that_lowers_the_slowest_device():
    model = _model(AllReduceCost(0.001, 0.0, 0.1))
    without = NeuroShardSearch(data_parallel=False).search(TASK, model, 0)
    plan = NeuroShardSearch().search(TASK, model, 0)
    assert without.data_parallel == ()
    assert plan.data_parallel and set(plan.data_parallel) <= {t.name for t in SMALL}
    assert plan.extra["predicted"]["max_cost_ms"] < 0.8 * without.extra["predicted"]["max_cost_ms"]
    validate_plan(plan, TASK)
    report = format_plan(plan)
    assert f"{len(plan.data_parallel)} data_parallel" in report and "data-parallel on every device" in report


def test_neuroshard_keeps_every_table_sharded_where_the_all_reduce_is_dear_or_unmeasured():
    for model in (_model(AllReduceCost(50.0, 0.0, 1e3)), _model(None)):
        plan = NeuroShardSearch().search(TASK, model, 0)
        assert plan.data_parallel == ()
        assert plan.extra["predicted"]["max_cost_ms"] == NeuroShardSearch(data_parallel=False).search(
            TASK, model, 0).extra["predicted"]["max_cost_ms"]


def test_a_dear_all_reduce_stops_the_doubling_of_replicated_sets_early():
    """Where replicating the one or two tables with the fewest gradient bytes does not pay, longer prefixes of
    the 16 tables (4, 8, 16) are not priced; where it does, the doubling goes on past them."""
    dear = NeuroShardSearch().search(TASK, _model(AllReduceCost(50.0, 0.0, 1e3)), 0)
    cheap = NeuroShardSearch().search(TASK, _model(AllReduceCost(0.001, 0.0, 0.1)), 0)
    assert dear.extra["search"]["data_parallel_sets_tried"] == 2
    assert cheap.extra["search"]["data_parallel_sets_tried"] > 2 and cheap.data_parallel


def test_neuroshard_never_replicates_more_than_a_device_holds():
    model = _model(AllReduceCost(0.001, 0.0, 0.1))
    # room for the big tables spread out, but not for every small table's replica beside them
    spread = max(plan_memory_bytes(_table_wise(TASK), TASK))
    tight = TASK.model_copy(update={"device_memory_bytes": int(spread * 1.02)})
    plan = NeuroShardSearch().search(tight, model, 0)
    validate_plan(plan, tight)
    assert max(plan_memory_bytes(plan, tight)) <= tight.device_memory_bytes
