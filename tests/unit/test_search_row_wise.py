"""Row-wise tables in plans and in NeuroShard's search: validity, a block of rows and its outputs on every device,
predicted costs, JSON, and the search choosing them where a table alone sets the slowest device."""

import numpy as np
import pytest
from search_doubles import FeatureCostModel

from shardwise.costmodel.data_parallel import AllReduceCost
from shardwise.costmodel.row_wise import row_wise_cost
from shardwise.search import NeuroShardSearch, Plan, Shard
from shardwise.search.neuroshard import NeuroShardConfig
from shardwise.search.plan import (
    PlanError,
    check_memory_bounds,
    plan_from_json,
    plan_memory_bytes,
    row_block_specs,
    validate_plan,
)
from shardwise.search.report import finish_plan, format_plan
from shardwise.search.simulator import simulate
from shardwise.workload import ShardingTask, TableSpec, shard_memory_bytes

HOT = TableSpec(name="hot", rows=400_000, dim=64, pooling_factor=100.0)
REST = [TableSpec(name=f"t{i}", rows=20_000, dim=32, pooling_factor=5.0) for i in range(8)]
TASK = ShardingTask(num_devices=4, device_memory_bytes=2**30, batch_size=4096, tables=(HOT, *REST))
LINE = AllReduceCost(latency_ms=0.01, hop_ms=0.0, ms_per_mib=0.05, collective="reduce_scatter")


class PerIdCost(FeatureCostModel):
    """The feature double with a cost per id looked up besides its columns (fbgemm's kernel: a row's address and
    its load per id): splitting a table by columns leaves each piece every id, by rows 1 / devices of them."""

    def table_embeddings(self, tables):  # noqa: ANN001, ANN201 - as FeatureCostModel's
        return np.array([[1.0, t.pooling_factor * (t.dim + 256), t.rows * t.dim] for t in tables]).reshape(-1, 3)


def _model(reduce_scatter: AllReduceCost | None = LINE) -> FeatureCostModel:
    model = PerIdCost()
    model.reduce_scatter = reduce_scatter  # type: ignore[attr-defined]
    return model


def _plan(task: ShardingTask = TASK, row_wise: tuple[str, ...] = ("hot",)) -> Plan:
    rest = [t for t in task.tables if t.name not in row_wise]
    return Plan(num_devices=task.num_devices, row_wise=row_wise,
                shards=tuple(Shard(table=t.name, col_offset=0, dim=t.dim, device=i % task.num_devices)
                             for i, t in enumerate(rest)))


def test_a_row_wise_table_is_valid_without_shards_and_puts_a_block_and_its_outputs_on_every_device():
    plan = _plan()
    validate_plan(plan, TASK)
    blocks = row_block_specs(plan, TASK)
    assert [b[0].rows for b in blocks] == [100_000] * 4
    alone = TASK.model_copy(update={"tables": tuple(REST)})
    extra = np.array(plan_memory_bytes(plan, TASK)) - np.array(plan_memory_bytes(_plan(alone, ()), alone))
    # each device: its block's weights and optimizer state, and the block's partial outputs for the whole batch
    assert list(extra) == [shard_memory_bytes(b, TASK.batch_size) for b in blocks]
    assert extra[0] < shard_memory_bytes([HOT], TASK.batch_size)
    assert extra[0] > 2 * 4 * TASK.batch_size * HOT.dim
    assert plan.sharding_types() == {"hot": "row_wise", **{t.name: "table_wise" for t in REST}}


@pytest.mark.parametrize(("row_wise", "data_parallel", "shards", "message"), [
    (("hot",), (), (Shard(table="hot", col_offset=0, dim=64, device=0),), "row-wise and also has a shard"),
    (("nope",), (), (), "row_wise table 'nope': no such table"),
    (("hot", "hot"), (), (), "listed twice"),
    (("hot",), ("hot",), (), "row_wise table 'hot' is also data_parallel"),
])
def test_invalid_row_wise_entries_are_refused(row_wise, data_parallel, shards, message):
    plan = _plan()
    bad = plan.model_copy(update={"row_wise": row_wise, "data_parallel": data_parallel, "shards": plan.shards + shards})
    with pytest.raises(PlanError, match=message):
        validate_plan(bad, TASK)


def test_row_blocks_count_against_every_devices_memory():
    tight = TASK.model_copy(update={"device_memory_bytes": max(plan_memory_bytes(_plan(), TASK)) - 1})
    with pytest.raises(PlanError, match="over its cap"):
        validate_plan(_plan(), tight)


def test_row_wise_tables_round_trip_through_json_and_a_table_wise_plan_has_no_key():
    plan = _plan()
    doc = plan.to_json()
    assert doc["row_wise"] == ["hot"]
    assert plan_from_json(doc) == plan
    assert "row_wise" not in _plan(TASK.model_copy(update={"tables": tuple(REST)}), ()).to_json()


def test_simulate_adds_each_devices_block_kernel_and_the_collectives():
    plan, model = _plan(), _model()
    alone = TASK.model_copy(update={"tables": tuple(REST)})
    base = simulate(_plan(alone, ()), alone, model)
    cost = simulate(plan, TASK, model)
    rows = row_wise_cost(model, [HOT], 4, TASK.batch_size)
    np.testing.assert_allclose(cost.fwd_ms, base.fwd_ms + rows.fwd_ms)
    np.testing.assert_allclose(cost.row_wise_comm_ms, np.full(4, rows.comm_ms))
    np.testing.assert_allclose(cost.total_ms, base.total_ms + rows.total_ms)
    assert cost.to_json()["row_wise_comm_ms"] == [round(rows.comm_ms, 3)] * 4
    with pytest.raises(PlanError, match="no measured reduce-scatter"):
        simulate(plan, TASK, _model(None))


def test_the_plan_report_names_the_row_wise_tables():
    finished = finish_plan(_plan(), TASK, _model(), planning_time_s=0.0, seed=0)
    assert finished.extra["sharding_types"]["hot"] == "row_wise"
    text = format_plan(finished)
    assert "1 row_wise (hot)" in text and "row-wise over every device" in text


def test_neuroshard_splits_a_table_that_alone_sets_the_slowest_device_by_rows():
    model = _model()
    plan = NeuroShardSearch().search(TASK, model, seed=0)
    assert plan.row_wise == ("hot",) and plan.extra["search"]["row_wise_sets_tried"] >= 1
    validate_plan(plan, TASK)
    table_wise = NeuroShardSearch(NeuroShardConfig(row_wise=False)).search(TASK, model, seed=0)
    assert not table_wise.row_wise
    assert simulate(plan, TASK, model).max_cost_ms < simulate(table_wise, TASK, model).max_cost_ms
    assert plan.extra["predicted"]["max_cost_ms"] == pytest.approx(simulate(plan, TASK, model).max_cost_ms, abs=1e-3)


def test_neuroshard_keeps_tables_whole_where_the_collectives_are_dear_or_unmeasured():
    for model in (_model(AllReduceCost(50.0, 0.0, 1e3, collective="reduce_scatter")), _model(None)):
        assert not NeuroShardSearch().search(TASK, model, seed=0).row_wise


def test_row_blocks_take_memory_on_every_device_in_the_search():
    from shardwise.search.neuroshard import ROW_WISE, _Placer

    block_bytes = shard_memory_bytes(row_block_specs(_plan(), TASK)[0], TASK.batch_size)
    state = (ROW_WISE,) + (1,) * len(REST)
    assert _Placer(TASK, _model(), NeuroShardConfig()).replicated(state)[1] == block_bytes
    # room beside the block for one more table a device: the other 8 tables on 4 devices do not fit
    tight = TASK.model_copy(update={"device_memory_bytes": block_bytes + shard_memory_bytes(REST[:1], 4096)})
    assert _Placer(tight, _model(), NeuroShardConfig()).evaluate([state])[0].cost_ms == float("inf")


def test_only_a_table_with_a_large_share_of_the_work_is_tried_row_wise():
    even = TASK.model_copy(update={"tables": tuple(REST)})  # no table stands out
    plan = NeuroShardSearch().search(even, _model(), seed=0)
    assert not plan.row_wise and plan.extra["search"]["row_wise_sets_tried"] == 0


def test_a_table_too_big_for_a_device_even_split_by_columns_is_planned_row_wise():
    huge = TableSpec(name="huge", rows=4_000_000, dim=4, pooling_factor=2.0)  # 4 columns: no column split
    probe = TASK.model_copy(update={"tables": (huge, *REST)})
    block = huge.row_block(0, 4)
    cap = shard_memory_bytes([block, *REST[:3]], probe.batch_size)  # a block and 3 of the 8 others a device
    task = probe.model_copy(update={"device_memory_bytes": cap})
    assert shard_memory_bytes([huge], task.batch_size) > cap
    plan = NeuroShardSearch().search(task, _model(), seed=0)
    assert "huge" in plan.row_wise
    validate_plan(plan, task)
    with pytest.raises(PlanError, match="table 'huge': the table alone needs"):
        NeuroShardSearch().search(task, _model(None), seed=0)
    check_memory_bounds(task, column_split=True, row_wise=True)  # the bound knows its blocks fit


def test_refinements_resplit_plans_split_the_table_into_column_slices_and_search_the_rest_as_before():
    """Refinement moves shards around row-wise tables, so its re-searched plans may keep them; the table asked
    split is in column slices, never row-wise, even the one the search had made row-wise."""
    from shardwise.evaluation.refine import search_resplit

    resplit = search_resplit(NeuroShardSearch(), TASK, _model(), seed=0)
    searched = NeuroShardSearch().search(TASK, _model(), seed=0)
    assert resplit is not None and searched.row_wise == ("hot",)
    for table in ("t0", "hot"):
        plan = resplit(table, 2)
        assert plan is not None
        validate_plan(plan, TASK)
        half = next(t.dim for t in TASK.tables if t.name == table) // 2
        assert table not in plan.row_wise and [s.dim for s in plan.shards if s.table == table] == [half, half]
    assert resplit("t0", 2).row_wise == ("hot",)
