"""Measured plan cost on real fbgemm CPU kernels and a real gloo all-to-all."""

from __future__ import annotations

import json

import pytest
from timing_settings import FLUSH_MIB

from shardwise.evaluation import evaluate_plans, measure_plans, save_measured, write_plan_report
from shardwise.profiling import MeasurementSettings
from shardwise.search.plan import Plan, Shard
from shardwise.workload import ShardingTask, TableSpec

pytestmark = pytest.mark.integration

FAST = MeasurementSettings(device="cpu", warmup_iters=2, timing_iters=5, timing_rounds=3, flush_mib=FLUSH_MIB)


def _task(num_tables: int = 4, pooling_factor: float = 10.0, batch_size: int = 1024) -> ShardingTask:
    tables = tuple(
        TableSpec(name=f"t{i}", rows=20_000, dim=32, pooling_factor=pooling_factor, zipf_alpha=1.05)
        for i in range(num_tables)
    )
    return ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=batch_size, tables=tables)


def _plan(devices: list[int], method: str) -> Plan:  # t0, t1, ... onto these devices
    shards = tuple(Shard(table=f"t{i}", col_offset=0, dim=32, device=d) for i, d in enumerate(devices))
    return Plan(num_devices=2, shards=shards, method=method)


def test_all_tables_on_one_device_cost_more_than_balanced(tmp_path) -> None:
    # compute-heavy enough that the all-to-all's noise on a loaded 2-core machine cannot flip the order (at pooling
    # 20 it did: with a CPU-bound process beside it, the balanced plan's exchange took 7.5 ms, the stacked one's 1.5)
    task = _task(num_tables=8, pooling_factor=80.0, batch_size=2048)
    stacked, balanced = measure_plans(
        [(task, _plan([0] * 8, "stacked")), (task, _plan([0, 1] * 4, "balanced"))],
        FAST.model_copy(update={"comm_iters": 3}), progress=False,
    )
    assert stacked.devices[1].fwd_ms == 0.0 and stacked.devices[1].shards == ()
    assert balanced.devices[0].fwd_ms > 0 and balanced.devices[1].fwd_ms > 0
    assert all(d.comm_fwd_ms > 0 and d.comm_bwd_ms > 0 for d in balanced.devices)
    # the same reference scaled both plans, so their costs compare
    assert stacked.reference_ms == balanced.reference_ms
    assert stacked.max_compute_ms > 1.3 * balanced.max_compute_ms
    assert stacked.max_cost_ms > balanced.max_cost_ms, (stacked.table(), balanced.table())
    assert stacked.imbalance > balanced.imbalance >= 1.0
    assert stacked.devices[0].width == 256 and balanced.devices[0].width == 128


@pytest.fixture(scope="module")
def sliced_row_wise_and_whole():
    """A column-split plan, one with a row-wise table, and a table-wise one of the same 4 tables, measured in one
    session (each session starts its ranks: seconds on a busy 2-core machine)."""
    task = _task()
    sliced = (
        Shard(table="t0", col_offset=0, dim=16, device=0),
        Shard(table="t0", col_offset=16, dim=16, device=1),
        Shard(table="t1", col_offset=0, dim=32, device=0),
        Shard(table="t2", col_offset=0, dim=32, device=1),
        Shard(table="t3", col_offset=0, dim=32, device=1),
    )
    beside = tuple(Shard(table=f"t{i}", col_offset=0, dim=32, device=i % 2) for i in (1, 2, 3))
    plans = [Plan(num_devices=2, shards=sliced, method="cw"),
             Plan(num_devices=2, shards=beside, row_wise=("t0",), method="rw"), _plan([0, 1, 1, 0], "tw")]
    settings = FAST.model_copy(update={"reference_ms": 1.0, "comm_iters": 2})
    return measure_plans([(task, plan) for plan in plans], settings, progress=False)


def test_column_slices_are_measured_and_reported(tmp_path, sliced_row_wise_and_whole) -> None:
    cost = sliced_row_wise_and_whole[0]
    assert cost.reference_ms == 1.0
    assert "t0[16:32]" in cost.devices[1].shards
    assert [d.width for d in cost.devices] == [48, 80]
    saved = json.loads(save_measured(cost, tmp_path / "measured.json").read_text())
    assert saved["max_cost_ms"] == pytest.approx(cost.max_cost_ms)
    paths = write_plan_report(cost, tmp_path / "report", name="cw", predicted_total_ms=[1.0, 2.0])
    page = paths[0].read_text()
    assert "a2a fwd ms" in page and f"{cost.devices[1].total_ms:.3f}" in page
    assert all(p.exists() and p.stat().st_size > 1000 for p in paths[1:])


def test_row_wise_tables_are_measured_as_blocks_on_every_device_and_their_collectives(
        sliced_row_wise_and_whole) -> None:
    _, cost, whole = sliced_row_wise_and_whole
    assert cost.row_wise == ("t0",) and whole.row_wise == ()
    # each device runs the kernel on its half of t0's rows beside its own shards; t0 leaves the all-to-all
    assert cost.devices[0].shards == ("t2", "t0[rows 0:10000]")
    assert cost.devices[1].shards == ("t1", "t3", "t0[rows 10000:20000]")
    assert [d.width for d in cost.devices] == [32, 64]
    # the reduce-scatter, all-gather and ids' all-to-all: measured, the same on every device, in the total
    assert cost.devices[0].row_wise_comm_ms > 0 and len({d.row_wise_comm_ms for d in cost.devices}) == 1
    assert all(d.row_wise_comm_ms == 0 for d in whole.devices)
    device = cost.devices[1]
    assert device.total_ms == pytest.approx(device.compute_ms + device.comm_ms + device.row_wise_comm_ms)
    assert "row-wise over every device: t0" in cost.table()


def test_evaluate_plans_measures_several_plans_in_one_session(tmp_path) -> None:
    task = _task()
    plans = [("balanced", _plan([0, 1, 0, 1], "balanced")), ("same", _plan([0, 1, 0, 1], "balanced")),
             ("stacked", _plan([0, 0, 0, 1], "stacked"))]
    settings = FAST.model_copy(update={"timing_rounds": 2, "comm_iters": 4, "comm_rounds": 2})
    costs, comparison, paths = evaluate_plans(task, plans, tmp_path, measurement=settings, progress=False)
    assert [r.name for r in comparison.plans] == ["balanced", "same", "stacked"]
    assert len({c.reference_ms for c in costs}) == 1 and costs[0].reference_ms is not None
    assert comparison.row("stacked").ratio_to_first == pytest.approx(costs[2].max_cost_ms / costs[0].max_cost_ms)
    for name in ("balanced", "same", "stacked"):
        doc = json.loads((tmp_path / f"{name}.measured.json").read_text())
        assert doc["format"] == "shardwise.measured/v2" and (tmp_path / f"{name}.html").is_file()
    saved = json.loads((tmp_path / "comparison.json").read_text())
    assert saved["format"] == "shardwise.comparison/v1" and saved["comm_rounds"] == 2
    assert saved["compute_rounds"] == 2 and saved["comm_iters"] == 4
    page = (tmp_path / "comparison.html").read_text()
    assert "stacked_cost.png" in page and "balanced.html" in page
    assert {tmp_path / "comparison.json", tmp_path / "comparison.html", tmp_path / "comparison.png"} <= set(paths)


def test_data_parallel_tables_add_their_dense_kernel_on_the_local_batch_to_every_device(monkeypatch) -> None:
    """A replicated table is timed as TorchRec runs it: the dense kernel (its gradient over every row, SGD's step)
    at the local batch, beside its gradient's all-reduce; both added to every device."""
    from shardwise.evaluation import measured

    task = _task(num_tables=3)
    timed: list[tuple[tuple[str, ...], int, str]] = []
    real = measured.measure_shard

    def recording(tables, batch_size, **kwargs):  # type: ignore[no-untyped-def]
        timed.append((tuple(t.name for t in tables), batch_size, kwargs["compute_kernel"]))
        return real(tables, batch_size, **kwargs)

    monkeypatch.setattr(measured, "measure_shard", recording)
    shards = tuple(Shard(table=f"t{i}", col_offset=0, dim=32, device=i) for i in range(2))
    (cost,) = measure_plans([(task, Plan(num_devices=2, shards=shards, data_parallel=("t2",), method="dp"))],
                            FAST.model_copy(update={"reference_ms": 1.0, "comm_iters": 3}), progress=False)
    assert {(names, batch, kernel) for names, batch, kernel in timed} == {
        (("t0",), 1024, "fused"), (("t1",), 1024, "fused"), (("t2",), 512, "dense")}
    assert cost.data_parallel == ("t2",) and all(d.fwd_ms > 0 and d.bwd_ms > 0 for d in cost.devices)
