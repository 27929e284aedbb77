"""NeuroShard's bound on data-parallel and row-wise roots: a root whose replicated ms alone reach a better root's cost
is not placed, and the search returns the very plan it returns placing every root."""

import numpy as np
import pytest
from search_doubles import FeatureCostModel, random_task

from shardwise.costmodel.data_parallel import AllReduceCost
from shardwise.search import NeuroShardSearch, Plan, neuroshard
from shardwise.workload import ShardingTask, TableSpec

HOT = TableSpec(name="hot", rows=400_000, dim=64, pooling_factor=100.0)
WARM = [TableSpec(name=f"w{i}", rows=20_000, dim=32, pooling_factor=5.0) for i in range(8)]
HOT_TASK = ShardingTask(num_devices=4, device_memory_bytes=2**30, batch_size=4096, tables=(HOT, *WARM))
BIG = [TableSpec(name=f"big{i}", rows=100_000, dim=64, pooling_factor=20.0) for i in range(6)]
SMALL = [TableSpec(name=f"s{i}", rows=100, dim=128, pooling_factor=1.0) for i in range(10)]
WIDE_TASK = ShardingTask(num_devices=4, device_memory_bytes=2**30, batch_size=4096, tables=(*BIG, *SMALL))


class CommHeavyPerId(FeatureCostModel):
    """The feature double with a cost per id looked up besides its columns and a 20x dearer all-to-all: wide, rarely
    looked-up tables are worth replicating, a hot table worth splitting by rows."""

    def table_embeddings(self, tables):  # noqa: ANN001, ANN201 - as FeatureCostModel's
        return np.array([[1.0, t.pooling_factor * (t.dim + 256), t.rows * t.dim] for t in tables]).reshape(
            -1, 3
        )

    def predict_comm(self, widths, compute_ms):  # noqa: ANN001, ANN201 - as FeatureCostModel's
        return 20 * super().predict_comm(widths, compute_ms)


def _model(all_reduce_ms: float | None, reduce_scatter_ms: float | None = None) -> CommHeavyPerId:
    """Collective lines of `*_ms` latency (None: not measured)."""
    model = CommHeavyPerId()
    if all_reduce_ms is not None:
        model.all_reduce = AllReduceCost(all_reduce_ms, 0.0, 0.1)  # type: ignore[attr-defined]
    if reduce_scatter_ms is not None:
        model.reduce_scatter = AllReduceCost(  # type: ignore[attr-defined]
            reduce_scatter_ms, 0.0, 0.05, collective="reduce_scatter"
        )
    return model


def _placing_every_root(placer, seen, bounded, state, best_ms):  # noqa: ANN001, ANN202, ARG001 - as the bound's
    if state not in seen:
        seen[state] = placer.evaluate([state])[0]


def _both(task: ShardingTask, model: CommHeavyPerId, monkeypatch: pytest.MonkeyPatch) -> tuple[Plan, Plan]:
    """The plan of the bounded search and of the one placing every root."""
    bounded = NeuroShardSearch().search(task, model, 0)
    with monkeypatch.context() as patch:
        patch.setattr(neuroshard, "_place_unless_bounded", _placing_every_root)
        unbounded = NeuroShardSearch().search(task, model, 0)
    return bounded, unbounded


def _assert_same(bounded: Plan, unbounded: Plan) -> None:
    assert bounded.shards == unbounded.shards
    assert (bounded.data_parallel, bounded.row_wise) == (unbounded.data_parallel, unbounded.row_wise)
    assert bounded.extra["predicted"] == unbounded.extra["predicted"]
    for tried in ("data_parallel_sets_tried", "row_wise_sets_tried"):
        assert bounded.extra["search"][tried] == unbounded.extra["search"][tried]
    skipped = (
        bounded.extra["search"]["data_parallel_sets_bounded"]
        + bounded.extra["search"]["row_wise_sets_bounded"]
    )
    assert (
        bounded.extra["search"]["states_evaluated"] == unbounded.extra["search"]["states_evaluated"] - skipped
    )


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_a_dear_all_reduce_bounds_the_data_parallel_roots_and_the_plan_stays_the_same(seed, monkeypatch):
    bounded, unbounded = _both(random_task(seed, 24, 4), _model(all_reduce_ms=1e4), monkeypatch)
    assert bounded.extra["search"]["data_parallel_sets_bounded"] == 2  # 1 and 2 tables: neither placed
    assert bounded.data_parallel == ()
    _assert_same(bounded, unbounded)


def test_a_dear_reduce_scatter_bounds_the_row_wise_roots_and_the_plan_stays_the_same(monkeypatch):
    bounded, unbounded = _both(HOT_TASK, _model(all_reduce_ms=1e4, reduce_scatter_ms=1e4), monkeypatch)
    assert bounded.extra["search"]["row_wise_sets_bounded"] >= 1 and bounded.row_wise == ()
    _assert_same(bounded, unbounded)


def test_a_cheap_all_reduce_places_the_roots_that_may_win_and_the_plan_stays_the_same(monkeypatch):
    bounded, unbounded = _both(WIDE_TASK, _model(all_reduce_ms=0.001), monkeypatch)
    # the small wide tables replicated win; replicating every table costs more on its own than they do
    assert set(bounded.data_parallel) <= {t.name for t in SMALL} and len(bounded.data_parallel) >= 2
    assert (
        0
        < bounded.extra["search"]["data_parallel_sets_bounded"]
        < bounded.extra["search"]["data_parallel_sets_tried"]
    )
    _assert_same(bounded, unbounded)


def test_where_no_root_is_bounded_the_plan_stays_the_same(monkeypatch):
    bounded, unbounded = _both(WIDE_TASK, _model(all_reduce_ms=0.5), monkeypatch)
    assert bounded.extra["search"]["data_parallel_sets_bounded"] == 0 and bounded.data_parallel == ()
    _assert_same(bounded, unbounded)
    rows_bounded, rows_unbounded = _both(
        HOT_TASK, _model(all_reduce_ms=None, reduce_scatter_ms=0.01), monkeypatch
    )
    assert rows_bounded.row_wise == ("hot",) and rows_bounded.extra["search"]["row_wise_sets_bounded"] == 0
    _assert_same(rows_bounded, rows_unbounded)


def test_a_state_with_a_shard_bigger_than_an_empty_devices_room_is_not_placed(monkeypatch):
    """A table that fills a device alone leaves no room beside any replica: every data-parallel root costs inf
    without a greedy run, and the plan is the one the greedy runs give."""
    huge = TableSpec(name="huge", rows=2_000_000, dim=64, pooling_factor=50.0)
    task = ShardingTask(num_devices=4, device_memory_bytes=1, batch_size=4096, tables=(huge, *SMALL, *BIG))
    room = neuroshard._Placer(task, _model(None), neuroshard.NeuroShardConfig()).piece_cost(0, 1)[1]
    task = task.model_copy(update={"device_memory_bytes": room})  # huge fits an empty device exactly
    placed: list[int] = []
    greedy = neuroshard._Placer._evaluate_lockstep

    def counting(self, states):  # noqa: ANN001, ANN202 - as the greedy's
        placed.append(len(states))
        return greedy(self, states)

    monkeypatch.setattr(neuroshard._Placer, "_evaluate_lockstep", counting)
    model = _model(all_reduce_ms=0.001)
    plan = NeuroShardSearch().search(task, model, 0)
    assert plan.data_parallel == () and plan.extra["search"]["data_parallel_sets_tried"] >= 2
    greedy_runs = sum(placed)
    with monkeypatch.context() as patch:
        patch.setattr(neuroshard._Placer, "_fits_empty_device", lambda self, state: True)
        every = NeuroShardSearch().search(task, model, 0)
    assert greedy_runs <= sum(placed) - greedy_runs - plan.extra["search"]["data_parallel_sets_tried"]
    assert (plan.shards, plan.extra["predicted"]) == (every.shards, every.extra["predicted"])
