"""Refinement on real kernels: a plan the cost model got wrong is measured, corrected and made faster; a change is
kept only when the measured slowest device got faster, memory always holds, and every round is recorded."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from shardwise.costmodel.data_parallel import AllReduceCost
from shardwise.evaluation.refine import measure_side_by_side, refine_plan
from shardwise.profiling import MeasurementSettings, load_costs
from shardwise.search import Plan, PlanError, Shard, validate_plan
from shardwise.workload import ShardingTask, TableSpec

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from comm_doubles import FixedAllToAllSession  # noqa: E402
from search_doubles import FeatureCostModel  # noqa: E402
from timing_settings import FLUSH_MIB  # noqa: E402

pytestmark = pytest.mark.integration

# 3 timings per device shard, the fewest whose median drops one preempted timing: with 2 (a mean), one stall under a
# busy neighbour once made the final side-by-side check return the handmade plan over a 30% measured gain (CI)
MEASUREMENT = MeasurementSettings(device="cpu", warmup_iters=2, timing_iters=5, timing_rounds=3, flush_mib=FLUSH_MIB)


@pytest.fixture
def fixed_all_to_all(monkeypatch):
    """Refinement's process group at fixed figures (comm_doubles), for the tests of what it does with the kernels'
    timings; test_the_all_to_all_is_measured_not_taken_from_the_model and measure_side_by_side's keep gloo."""
    monkeypatch.setattr("shardwise.evaluation.refine.AllToAllSession", FixedAllToAllSession)


def _task() -> ShardingTask:
    heavy = [TableSpec(name=f"h{i}", rows=20_000, dim=64, pooling_factor=40.0) for i in range(2)]
    light = [TableSpec(name=f"l{i}", rows=500, dim=16, pooling_factor=1.0) for i in range(4)]
    return ShardingTask(num_devices=3, device_memory_bytes=2**30, batch_size=1024, tables=(*heavy, *light))


@pytest.mark.slow
def test_refinement_moves_work_off_the_slowest_device_and_keeps_only_measured_gains(tmp_path, fixed_all_to_all):
    """Both heavy tables on device 0: a model that thinks every table costs about the same sees balance; the
    measurements do not, and refinement takes a heavy table off device 0."""
    task = _task()
    plan = Plan(num_devices=3, method="handmade", shards=(
        Shard(table="h0", col_offset=0, dim=64, device=0), Shard(table="h1", col_offset=0, dim=64, device=0),
        Shard(table="l0", col_offset=0, dim=16, device=1), Shard(table="l1", col_offset=0, dim=16, device=1),
        Shard(table="l2", col_offset=0, dim=16, device=2), Shard(table="l3", col_offset=0, dim=16, device=2),
    ))
    refined, record = refine_plan(task, plan, FeatureCostModel(), MEASUREMENT, rounds=3, progress=False,
                                  dataset=str(tmp_path / "costs"))
    validate_plan(refined, task)
    assert refined.method == "handmade+refine" and refined.extra["refinement"]["before_ms"] == record.before_ms
    assert record.rounds and record.rounds[0].slowest_device == 0
    kept = [r for r in record.rounds if r.kept]
    assert kept, record
    assert {s.device for s in refined.shards if s.table.startswith("h")} != {0}  # the heavy tables split up
    # never slower, measured: a change stays only when the slowest device got faster
    assert record.after_ms < record.before_ms
    for r in record.rounds:
        assert r.kept == (r.after_ms is not None and r.after_ms < r.measured_max_ms)
    assert record.devices_measured >= 3 + 2  # every device once, then only the changed ones
    # every device shard it timed is in the cost dataset, once each, for the next pre-training
    stored = load_costs(tmp_path / "costs")
    assert (stored["provenance"] == "refine").all() and (stored["kind"] == "compute").all()
    assert 3 <= len(stored) <= record.devices_measured and stored["config_id"].is_unique
    assert stored["fwd_ms"].gt(0).all() and stored["tables_json"].str.contains('"h0"').any()


@pytest.mark.slow
def test_a_round_relieves_every_device_tied_for_slowest(fixed_all_to_all):
    """Two heavy tables on device 0 and two on device 1, equally slow: moving one off device 0 alone cannot lower
    the plan's slowest device (device 1 stays), so one round moves one off each, and keeps both on measurement."""
    heavy = [TableSpec(name=f"h{i}", rows=20_000, dim=64, pooling_factor=40.0) for i in range(4)]
    light = [TableSpec(name=f"l{i}", rows=500, dim=16, pooling_factor=1.0) for i in range(4)]
    task = ShardingTask(num_devices=4, device_memory_bytes=2**30, batch_size=1024, tables=(*heavy, *light))
    plan = Plan(num_devices=4, method="handmade", shards=(
        *(Shard(table=f"h{i}", col_offset=0, dim=64, device=i // 2) for i in range(4)),
        *(Shard(table=f"l{i}", col_offset=0, dim=16, device=2 + i % 2) for i in range(4)),
    ))
    refined, record = refine_plan(task, plan, FeatureCostModel(), MEASUREMENT, rounds=1, progress=False)
    validate_plan(refined, task)
    (first,) = record.rounds
    assert first.kept and first.change.count(";") >= 1, record.table()  # two changes in one round
    assert len({s.device for s in refined.shards if s.table.startswith("h")}) == 4, record.table()
    assert record.after_ms < record.before_ms


@pytest.mark.slow
def test_memory_bounds_every_change_and_a_balanced_plan_is_left_alone(fixed_all_to_all):
    task = _task().model_copy(update={"device_memory_bytes": 8 * 2**20})  # a heavy table and a bit per device
    plan = Plan(num_devices=3, method="handmade", shards=(
        Shard(table="h0", col_offset=0, dim=64, device=0), Shard(table="h1", col_offset=0, dim=64, device=1),
        Shard(table="l0", col_offset=0, dim=16, device=2), Shard(table="l1", col_offset=0, dim=16, device=2),
        Shard(table="l2", col_offset=0, dim=16, device=2), Shard(table="l3", col_offset=0, dim=16, device=2),
    ))
    validate_plan(plan, task)
    refined, record = refine_plan(task, plan, FeatureCostModel(), MEASUREMENT, rounds=2, progress=False)
    validate_plan(refined, task)  # no move put both heavy tables on one device: they do not fit together
    assert len({s.device for s in refined.shards if s.table.startswith("h")}) == 2
    assert record.after_ms <= record.before_ms
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        refine_plan(task, plan, FeatureCostModel(), MEASUREMENT, rounds=0)


def _bad_and_good() -> tuple[Plan, Plan]:
    """Plans of `_task()`: both heavy tables on device 0 ("bad"), and apart on devices 1 and 2 ("good")."""
    light = tuple(Shard(table=f"l{i}", col_offset=0, dim=16, device=i % 3) for i in range(4))
    bad = Plan(num_devices=3, method="bad", shards=(
        Shard(table="h0", col_offset=0, dim=64, device=0), Shard(table="h1", col_offset=0, dim=64, device=0), *light))
    good = Plan(num_devices=3, method="good", shards=(
        Shard(table="h0", col_offset=0, dim=64, device=1), Shard(table="h1", col_offset=0, dim=64, device=2), *light))
    return bad, good


@pytest.mark.slow
def test_refinement_goes_on_from_the_fastest_start(fixed_all_to_all):
    """A bad searched plan and a good other start (both heavy tables apart): both are measured in one session, the
    record names each start's measured figure, and refinement goes on from the faster one, never slower than it."""
    task = _task()
    bad, good = _bad_and_good()
    refined, record = refine_plan(task, bad, FeatureCostModel(), MEASUREMENT, rounds=1, starts=[good],
                                  progress=False)
    validate_plan(refined, task)
    assert set(record.starts) == {"bad", "good"} and record.starts["good"] < record.starts["bad"]
    assert record.start == "good"
    if not any(r.kept for r in record.rounds):  # else before and after come from the final paired session
        assert record.before_ms == record.starts["good"]
    assert record.after_ms <= record.before_ms
    assert "refined from good" in record.table()
    assert {s.device for s in refined.shards if s.table.startswith("h")} != {0}


def test_a_start_with_another_starts_layout_is_measured_once(fixed_all_to_all, monkeypatch):
    """The measured greedy and TorchRec's planner often give one layout (here the good start's, its devices numbered
    otherwise): measured once, the record names both at the same figure, and the time goes to the others."""
    from shardwise.evaluation.refine import Refiner

    exchanged: list[int] = []  # layouts per all-to-all session
    measure_comm = Refiner.measure_comm
    monkeypatch.setattr(Refiner, "measure_comm",
                        lambda self, layouts: (exchanged.append(len(layouts)), measure_comm(self, layouts))[1])
    task = _task()
    bad, good = _bad_and_good()
    renumbered = good.model_copy(update={"method": "same", "shards": tuple(
        s.model_copy(update={"device": (s.device + 1) % 3}) for s in good.shards)})
    _, record = refine_plan(task, bad, FeatureCostModel(), MEASUREMENT, rounds=1, starts=[good, renumbered],
                            progress=False)
    assert set(record.starts) == {"bad", "good", "same"} and record.starts["same"] == record.starts["good"]
    assert exchanged[0] == 2  # the starts' first session: two layouts, not three


class _CommWrongModel(FeatureCostModel):
    """The test double with an all-to-all prediction far off on the last device (1,000 ms)."""

    def predict_comm(self, widths, compute_ms):
        comm = super().predict_comm(widths, compute_ms)
        comm[:, -1, :] = 500.0  # forward and backward: 1,000 ms
        return comm


@pytest.mark.slow
def test_the_all_to_all_is_measured_not_taken_from_the_model():
    """A model that predicts a 1,000 ms exchange on device 2: refinement measures the exchange, so its figures
    are the measured ones and it still works on the device whose kernels are slowest (0, both heavy tables)."""
    task = _task()
    plan = Plan(num_devices=3, method="handmade", shards=(
        Shard(table="h0", col_offset=0, dim=64, device=0), Shard(table="h1", col_offset=0, dim=64, device=0),
        *(Shard(table=f"l{i}", col_offset=0, dim=16, device=1 + i % 2) for i in range(4)),
    ))
    refined, record = refine_plan(task, plan, _CommWrongModel(), MEASUREMENT, rounds=1, progress=False)
    assert record.before_ms < 100.0, record  # measured kernels + measured all-to-all, not the model's 1,000 ms
    assert record.rounds[0].slowest_device == 0
    assert record.after_ms <= record.before_ms


@pytest.mark.slow
def test_a_spent_time_budget_starts_no_round_and_says_so(fixed_all_to_all):
    """With the budget spent on measuring the start, no round is tried: the plan comes back as measured, and the
    record says why refinement stopped."""
    task = _task()
    plan = Plan(num_devices=3, method="handmade", shards=(
        Shard(table="h0", col_offset=0, dim=64, device=0), Shard(table="h1", col_offset=0, dim=64, device=0),
        *(Shard(table=f"l{i}", col_offset=0, dim=16, device=1 + i % 2) for i in range(4)),
    ))
    refined, record = refine_plan(task, plan, FeatureCostModel(), MEASUREMENT, rounds=5, time_budget_s=1e-3,
                                  progress=False)
    assert record.rounds == [] and record.after_ms == record.before_ms
    assert record.stopped == "the 0.001 s budget was spent" and "stopped: the 0.001 s budget" in record.table()
    assert sorted(refined.shards, key=lambda s: s.table) == sorted(plan.shards, key=lambda s: s.table)
    assert refined.extra["refinement"]["stopped"] == record.stopped


def test_a_budget_spent_mid_round_drops_the_round_and_returns_the_plan_measured_so_far(fixed_all_to_all,
                                                                                        monkeypatch):
    """The clock jumps past the budget two kernel timings into round 1's measurement: the round stops there, its
    change is recorded unmeasured and not kept, no final check runs, and the plan returned is the start as the first
    session measured it. Real kernels; the clock is read before every timing, not only between rounds."""
    import time
    import types

    from shardwise.evaluation import refine_measure

    task = _task()
    plan, _ = _bad_and_good()  # both heavy tables on device 0: round 1 moves one off it
    jump_s = [0.0]
    monkeypatch.setattr(refine_measure, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter()
                                                                      + jump_s[0]))
    timed = []
    first_session = task.num_devices * MEASUREMENT.timing_rounds  # the start's 3 device shards, 3 timings each
    real = refine_measure.time_shards_in_rounds

    def timing(shards, rounds, **kwargs):
        timed.append(len(shards))
        if len(timed) == first_session + 2:
            jump_s[0] = 1e6  # far past the budget, after this timing
        return real(shards, rounds, **kwargs)

    monkeypatch.setattr(refine_measure, "time_shards_in_rounds", timing)
    refined, record = refine_plan(task, plan, FeatureCostModel(), MEASUREMENT, rounds=5, time_budget_s=1e5,
                                  progress=False)
    assert len(timed) == first_session + 2  # the fault landed mid-round, and nothing was timed after it
    (dropped,) = record.rounds
    assert dropped.change and not dropped.kept and dropped.after_ms is None
    assert record.stopped == ("the 100000 s budget was spent in round 1: its change was not measured to the end, "
                              "nor kept")
    validate_plan(refined, task)
    assert sorted(refined.shards, key=lambda s: s.table) == sorted(plan.shards, key=lambda s: s.table)
    assert record.before_ms == record.after_ms == record.starts["bad"] > 0  # measured, in the first session
    assert refined.extra["refinement"]["stopped"] == record.stopped


def _row_wise_task(device_memory_bytes: int = 2**30) -> ShardingTask:
    """`_task()` with one more table, "r", to be split row-wise (3 blocks of 10,000 rows)."""
    task = _task()
    r = TableSpec(name="r", rows=30_000, dim=32, pooling_factor=10.0)
    return task.model_copy(update={"tables": (*task.tables, r), "device_memory_bytes": device_memory_bytes})


@pytest.mark.slow
def test_a_row_wise_plan_is_refined_around_its_row_blocks(fixed_all_to_all):
    """Both heavy tables on device 0 and a row-wise table on every device: refinement moves a heavy table off
    device 0 and keeps the row-wise table as the plan has it, its blocks and collectives counted on every device."""
    task = _row_wise_task()
    plan = Plan(num_devices=3, method="handmade", row_wise=("r",), shards=(
        Shard(table="h0", col_offset=0, dim=64, device=0), Shard(table="h1", col_offset=0, dim=64, device=0),
        *(Shard(table=f"l{i}", col_offset=0, dim=16, device=1 + i % 2) for i in range(4)),
    ))
    with pytest.raises(PlanError, match="no measured reduce-scatter"):  # before anything is measured
        refine_plan(task, plan, FeatureCostModel(), MEASUREMENT, rounds=2, progress=False)
    model = FeatureCostModel()
    model.reduce_scatter = AllReduceCost(0.05, 0.0, 1.0, collective="reduce_scatter")  # what search priced it by
    refined, record = refine_plan(task, plan, model, MEASUREMENT, rounds=2, progress=False)
    validate_plan(refined, task)
    assert refined.row_wise == ("r",) and all(s.table != "r" for s in refined.shards)
    assert any(r.kept for r in record.rounds), record
    assert {s.device for s in refined.shards if s.table.startswith("h")} != {0}
    assert record.after_ms < record.before_ms and not record.stopped.startswith("not refined")
    assert refined.extra["predicted"]["max_cost_ms"] > 0  # the refined plan priced as the search prices it


def test_row_blocks_are_counted_on_their_device_in_time_and_memory():
    """What a device pays for the tables on every device, beside its own shards: its row blocks' kernel (and the
    data-parallel replica's) measured per device, zero for a layout without them; a move that fits a device alone
    is refused where the device's row block leaves no room for it."""
    from shardwise.evaluation.refine import Layout, Refiner
    from shardwise.workload import shard_memory_bytes

    task = _row_wise_task()
    h1, block = task.table("h1"), task.table("r").row_block(1, 3)
    alone, beside = (shard_memory_bytes(tables, task.batch_size, task.optimizer, task.weights_precision)
                     for tables in ([h1], [h1, block]))
    task = _row_wise_task(device_memory_bytes=(alone + beside) // 2)  # h1 fits a device, not beside r's block
    refiner = Refiner(task, FeatureCostModel(), MEASUREMENT, progress=False, dataset=None, comm=None)
    moved = [Shard(table="h1", col_offset=0, dim=64, device=1)]
    assert refiner.fits(moved, 1)
    layout = Layout([], data_parallel=("l0",), row_wise=("r",))
    refiner.hold(layout)
    assert not refiner.fits(moved, 1)
    costs = refiner.beside(layout)
    assert costs.shape == (3,) and (costs > 0).all()
    assert refiner.beside(layout) is costs  # measured once per set of such tables
    assert not refiner.beside(Layout([])).any()


def test_a_refused_move_is_not_proposed_first_again_with_another_partner():
    """Refused rounds are remembered by their first move (shard and devices), so the next round tries something
    else rather than the same move with another shard swapped back."""
    from shardwise.evaluation.refine import Layout, Refiner, plan_round

    task = _task()
    refiner = Refiner(task, FeatureCostModel(), MEASUREMENT, progress=False, dataset=None, comm=None)
    layout = Layout([Shard(table="h0", col_offset=0, dim=64, device=0), Shard(table="h1", col_offset=0, dim=64, device=0),
                      *(Shard(table=f"l{i}", col_offset=0, dim=16, device=1 + i % 2) for i in range(4))])
    measured, comm = [10.0, 2.0, 2.0], np.zeros(3)  # device 0 far the slowest: a move off it is promised a gain
    _, first, _ = plan_round(refiner, layout, measured, comm, refused=set())
    _, again, _ = plan_round(refiner, layout, measured, comm, refused={first[0].move})
    assert first and again and again[0].move != first[0].move
    assert first[0].description.startswith(first[0].move)
    assert all(not c.description.startswith(first[0].move) for c in again[:1])


@pytest.mark.slow
def test_plans_measured_as_refinement_measures_its_starts():
    """`measure_side_by_side` (what the measurement_noise benchmark compares with `measure_plans`): each plan's slowest
    device with and without the all-to-all, from one session; both heavy tables on one device is the slower plan.
    A plan that does not fit is refused before anything runs."""
    task = _task()
    bad, good = _bad_and_good()
    (bad_ms, bad_kernels), (good_ms, good_kernels) = measure_side_by_side(task, [bad, good], FeatureCostModel(),
                                                                          MEASUREMENT)
    assert bad_ms > bad_kernels > 0 and good_ms > good_kernels > 0  # the all-to-all is counted on top
    assert bad_kernels > good_kernels
    small = task.model_copy(update={"device_memory_bytes": 8 * 2**20})  # one heavy table a device
    with pytest.raises(ValueError, match="over its cap"):
        measure_side_by_side(small, [bad], FeatureCostModel(), MEASUREMENT)


def _hot_task() -> ShardingTask:
    """One table far costlier than the rest (pooling 200), and light ones: wherever it goes its device is slowest."""
    hot = TableSpec(name="hot", rows=20_000, dim=64, pooling_factor=200.0)
    light = [TableSpec(name=f"l{i}", rows=500, dim=16, pooling_factor=1.0) for i in range(4)]
    return ShardingTask(num_devices=3, device_memory_bytes=2**30, batch_size=1024, tables=(hot, *light))


def _hot_alone() -> Plan:
    return Plan(num_devices=3, method="searched", shards=(
        Shard(table="hot", col_offset=0, dim=64, device=0),
        *(Shard(table=f"l{i}", col_offset=0, dim=16, device=1 + i % 2) for i in range(4)),
    ))


def _hot_split(table: str, pieces: int) -> Plan:
    """What a search would return with `table` split (the test's stand-in for search_resplit)."""
    assert (table, pieces) == ("hot", 2)
    return Plan(num_devices=3, method="searched", shards=(
        Shard(table="hot", col_offset=0, dim=32, device=0), Shard(table="hot", col_offset=32, dim=32, device=1),
        *(Shard(table=f"l{i}", col_offset=0, dim=16, device=2) for i in range(4)),
    ))


class _FlatModel(FeatureCostModel):
    """Every table costs the same: the hot table looks no costlier than a light one."""

    def table_embeddings(self, tables):
        return np.ones((len(tables), 3))


def test_the_table_holding_the_slowest_device_up_is_found_from_predictions_or_measurements():
    """A shard whose cost (the model's, scaled by its device's measured / predicted) is above the devices' mean
    kernel ms holds its device up wherever it goes: its table is to be split in twice its slices, where aligned
    slices and devices allow."""
    from shardwise.evaluation.refine import Layout, Refiner, holding_up

    task = _hot_task()
    layout = Layout(list(_hot_alone().shards))
    refiner = Refiner(task, FeatureCostModel(), MEASUREMENT, progress=False, dataset=None, comm=None)
    predicted = list(refiner.predicted([layout.on(d) for d in range(3)]))
    assert holding_up(refiner, layout, predicted, 0) == ("hot", 2)  # by the model alone
    assert holding_up(refiner, layout, predicted, 1) is None  # light tables hold no device up
    flat = Refiner(task, _FlatModel(), MEASUREMENT, progress=False, dataset=None, comm=None)
    flat_predicted = list(flat.predicted([layout.on(d) for d in range(3)]))
    assert holding_up(flat, layout, flat_predicted, 0) is None  # the model sees no hot table
    assert holding_up(flat, layout, [10.0, 2.0, 2.0], 0) == ("hot", 2)  # the measurements do
    halves = Layout(list(_hot_split("hot", 2).shards))
    assert holding_up(refiner, halves, [10.0, 10.0, 1.0], 0) is None  # 4 slices of it would need 4 devices


@pytest.mark.slow
def test_a_table_holding_the_slowest_device_up_is_tried_split(fixed_all_to_all):
    """The searched plan has the hot table alone on a device: the plan with it split (from `resplit`) is one more
    start where the model sees it, and a paired trial after the first measurements where only they do; either
    way, what is returned is the plan measured fastest, within memory."""
    task = _hot_task()
    asked = []

    def resplit(table, pieces):
        asked.append((table, pieces))
        return _hot_split(table, pieces)

    refined, record = refine_plan(task, _hot_alone(), FeatureCostModel(), MEASUREMENT, rounds=1, progress=False,
                                  resplit=resplit)
    validate_plan(refined, task)
    assert asked == [("hot", 2)] and set(record.starts) == {"searched", "searched with hot in 2"}, record.table()
    assert record.start == min(record.starts, key=record.starts.get)

    asked.clear()
    refined, record = refine_plan(task, _hot_alone(), _FlatModel(), MEASUREMENT, rounds=1, progress=False,
                                  resplit=resplit)
    validate_plan(refined, task)
    assert set(record.starts) == {"searched"} and asked == [("hot", 2)], record.table()
    trial = record.rounds[0]
    assert trial.change == "hot split into 2 column slices, the other tables searched around them"
    assert trial.kept == (trial.after_ms < trial.measured_max_ms)
    split = {s.dim for s in refined.shards if s.table == "hot"} == {32}
    if trial.kept:  # the split stays unless the final paired check measured the start faster again
        assert split or "was faster than the refined one" in record.stopped, record.table()
    else:
        assert not split


def _scripted_sessions(monkeypatch, *sessions: list[float]) -> list[int]:
    """Refinement's paired sessions at scripted slowest-device figures, in order (kernels only, no exchange), and no
    round promising a gain: what it returns is then decided by the sessions alone. The layouts each session had."""
    import shardwise.evaluation.refine as refine

    script, seen = iter(sessions), []

    def side_by_side(refiner, layouts, first_round=False):
        totals = next(script)
        assert len(totals) == len(layouts)
        seen.append(len(layouts))
        return [[ms] * refiner.task.num_devices for ms in totals], [np.zeros(refiner.task.num_devices)] * len(
            layouts), list(totals)

    monkeypatch.setattr(refine, "side_by_side", side_by_side)
    monkeypatch.setattr(refine, "plan_round", lambda refiner, layout, measured, comm, refused: (layout, [], 0.0))
    return seen


@pytest.mark.parametrize(("again", "returned"), [([10.3, 10.0], "good"), ([9.8, 10.0], "bad")])
def test_a_plan_departs_from_the_starts_given_only_where_a_second_session_agrees(
        fixed_all_to_all, monkeypatch, again, returned):
    """The searched plan measured 0.1 ms under the measured greedy's (the start given) in one session: it is measured
    again beside it, and returned only if faster there too; else the start given is. Before and after are both the
    second session's figures, so the record never says the returned plan was slower than its start."""
    task = _task()
    bad, good = _bad_and_good()
    seen = _scripted_sessions(monkeypatch, [10.0, 10.1], again)
    refined, record = refine_plan(task, bad, FeatureCostModel(), MEASUREMENT, rounds=1, starts=[good],
                                  progress=False)
    assert seen == [2, 2]
    heavy = {s.table: s.device for s in refined.shards if s.table.startswith("h")}
    assert heavy == ({"h0": 1, "h1": 2} if returned == "good" else {"h0": 0, "h1": 0})
    assert record.start == "bad" and record.before_ms == again[0] and record.after_ms == min(again)
    assert record.after_ms <= record.before_ms
    assert ("good's plan was faster" in record.stopped) == (returned == "good")
    assert ("confirmed it faster than good's" in record.stopped) == (returned == "bad")


@pytest.mark.parametrize(("again", "returned"), [([10.2, 10.0, 10.1], "good"), ([9.7, 10.0, 10.1], "refined"),
                                                 ([10.2, 10.3, 9.9], "bad")])
def test_a_refined_plan_is_measured_again_beside_the_starts_given_and_its_own_start(
        fixed_all_to_all, monkeypatch, again, returned):
    """A round kept (the searched plan "bad" with h1 moved to device 1) and confirmed at the end beside both starts:
    the second session measures it beside the start given ("good") and the start it was refined from ("bad", whose
    figure before_ms is), and the fastest of the three is returned."""
    import shardwise.evaluation.refine as refine

    task = _task()
    bad, good = _bad_and_good()
    seen = _scripted_sessions(monkeypatch, [10.0, 10.1], [9.9, 10.0, 10.1], again)
    moved = [Shard(table="h1", col_offset=0, dim=64, device=1) if s.table == "h1" else s for s in bad.shards]
    change = refine.Change("h1[0] 0->1", "h1[0] 0->1", (0, 1), [s for s in moved if s.device in (0, 1)],
                            (9.0, 9.0), 9.0, 9.0)
    monkeypatch.setattr(refine, "plan_round", lambda refiner, layout, measured, comm, refused: (
        refine.Layout(moved), [change], 9.0))
    # the round's paired figures (the two devices changed, then as they were) and no exchange: the change is kept
    monkeypatch.setattr(refine.Refiner, "measure", lambda self, groups, first_round=False: [9.0, 9.0, 11.0, 11.0])
    monkeypatch.setattr(refine.Refiner, "measure_comm", lambda self, layouts: [np.zeros(3) for _ in layouts])
    refined, record = refine_plan(task, bad, FeatureCostModel(), MEASUREMENT, rounds=1, starts=[good],
                                  progress=False)
    assert seen == [2, 3, 3] and record.rounds[0].kept and record.start == "bad"
    heavy = {s.table: s.device for s in refined.shards if s.table.startswith("h")}
    assert heavy == {"good": {"h0": 1, "h1": 2}, "refined": {"h0": 0, "h1": 1}, "bad": {"h0": 0, "h1": 0}}[returned]
    assert record.before_ms == again[2] and record.after_ms == min(again) <= record.before_ms


def test_a_start_given_measured_fastest_is_returned_without_a_second_session(fixed_all_to_all, monkeypatch):
    task = _task()
    bad, good = _bad_and_good()
    seen = _scripted_sessions(monkeypatch, [10.2, 10.0])
    refined, record = refine_plan(task, bad, FeatureCostModel(), MEASUREMENT, rounds=1, starts=[good],
                                  progress=False)
    assert seen == [2] and record.start == "good" and record.after_ms == record.before_ms == 10.0
    assert {s.table: s.device for s in refined.shards if s.table.startswith("h")} == {"h0": 1, "h1": 2}
