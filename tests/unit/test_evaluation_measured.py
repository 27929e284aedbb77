"""Measured plan cost: invalid plans are refused before anything runs; the derived numbers are right."""

from __future__ import annotations

import json

import pytest

from shardwise.cli import main
from shardwise.evaluation.measured import DeviceCost, MeasuredPlanCost, measure_plan
from shardwise.search.plan import Plan, PlanError, Shard, save_plan
from shardwise.workload import ShardingTask, TableSpec, save_task

TABLES = tuple(TableSpec(name=f"t{i}", rows=1000, dim=16, pooling_factor=4.0) for i in range(3))
TASK = ShardingTask(num_devices=2, device_memory_bytes=2**26, batch_size=256, tables=TABLES)


def _plan(*shards: tuple[str, int, int, int]) -> Plan:
    return Plan(num_devices=2, shards=tuple(Shard(table=t, col_offset=o, dim=d, device=v) for t, o, d, v in shards))


COLUMN_TWICE = _plan(("t0", 0, 16, 0), ("t0", 8, 8, 1), ("t1", 0, 16, 1), ("t2", 0, 16, 0))
DEVICE_OUT_OF_RANGE = _plan(("t0", 0, 16, 0), ("t1", 0, 16, 2), ("t2", 0, 16, 1))
VALID = _plan(("t0", 0, 16, 0), ("t1", 0, 16, 1), ("t2", 0, 16, 1))


@pytest.mark.parametrize(
    ("plan", "task", "message"),
    [
        (COLUMN_TWICE, TASK, "covered more than once"),
        (DEVICE_OUT_OF_RANGE, TASK, "device"),
        (VALID, TASK.model_copy(update={"device_memory_bytes": 100_000}), "over its cap"),
    ],
    ids=["column-twice", "device-out-of-range", "over-memory"],
)
def test_measure_plan_refuses_invalid_plans(plan: Plan, task: ShardingTask, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        measure_plan(task, plan, device="cpu", progress=False)


@pytest.mark.parametrize(
    ("plan", "task", "message"),
    [
        (COLUMN_TWICE, TASK, "columns 8..15 are covered more than once"),
        (DEVICE_OUT_OF_RANGE, TASK, "device 2"),
        (VALID, TASK.model_copy(update={"device_memory_bytes": 100_000}), "over its cap"),
    ],
    ids=["column-twice", "device-out-of-range", "over-memory"],
)
def test_cli_evaluate_refuses_invalid_plans(tmp_path, capsys, plan: Plan, task: ShardingTask, message: str) -> None:
    task_path = save_task(task, tmp_path / "task.json")
    plan_path = save_plan(plan, tmp_path / "plan.json")
    status = main(["evaluate", "--task", str(task_path), "--plan", str(plan_path), "--device", "cpu"])
    err = capsys.readouterr().err
    assert status == 2
    assert "invalid plan" in err and message in err
    assert not (tmp_path / "plan_eval").exists()  # nothing measured, nothing written


def test_cli_evaluate_refuses_a_file_that_is_not_a_plan(tmp_path, capsys) -> None:
    task_path = save_task(TASK, tmp_path / "task.json")
    (tmp_path / "plan.json").write_text(json.dumps({"format": "something/v9", "shards": []}))
    assert main(["evaluate", "--task", str(task_path), "--plan", str(tmp_path / "plan.json")]) == 2
    assert "field 'format'" in capsys.readouterr().err


def _cost(totals: list[tuple[float, float, float, float]], memory: list[int]) -> MeasuredPlanCost:
    devices = tuple(
        DeviceCost(device=d, shards=(f"t{d}",), width=16, fwd_ms=f, bwd_ms=b, comm_fwd_ms=cf, comm_bwd_ms=cb,
                   memory_bytes=m)
        for d, ((f, b, cf, cb), m) in enumerate(zip(totals, memory))
    )
    return MeasuredPlanCost(method="m", batch_size=256, device_kind="cpu", hardware_kind="cpu-test",
                            device_memory_bytes=1000, devices=devices)


def test_plan_cost_is_the_slowest_device_and_imbalance_is_max_over_mean() -> None:
    cost = _cost([(1.0, 2.0, 0.5, 0.5), (3.0, 4.0, 0.5, 0.5)], [250, 600])
    assert cost.devices[1].total_ms == pytest.approx(8.0)
    assert cost.max_cost_ms == pytest.approx(8.0)
    assert cost.mean_cost_ms == pytest.approx(6.0)
    assert cost.imbalance == pytest.approx(8.0 / 6.0)
    assert cost.memory_headroom == pytest.approx(0.4)
    doc = cost.to_json()
    assert doc["format"] == "shardwise.measured/v1" and doc["devices"][1]["total_ms"] == pytest.approx(8.0)
    table = cost.table()
    assert "8.000" in table and "imbalance 1.333" in table


def test_comparison_ratios_are_to_the_first_plan_and_rows_are_found_by_name() -> None:
    from shardwise.evaluation.measured import compare_measured

    cheap = _cost([(1.0, 1.0, 0.5, 0.5), (1.0, 1.0, 0.5, 0.5)], [100, 100])  # 3 ms
    dear = _cost([(2.0, 2.0, 1.0, 1.0), (1.0, 1.0, 0.5, 0.5)], [100, 100])  # 6 ms
    comparison = compare_measured([("a", dear), ("b", cheap)], predicted_max_ms=[5.0, None])
    assert comparison.row("a").ratio_to_first == pytest.approx(1.0)
    assert comparison.row("b").ratio_to_first == pytest.approx(0.5)
    assert comparison.row("a").max_comm_ms == pytest.approx(2.0)
    assert comparison.row("a").predicted_max_cost_ms == 5.0 and comparison.row("b").predicted_max_cost_ms is None
    assert "0.500" in comparison.table() and comparison.format == "shardwise.comparison/v1"
    with pytest.raises(KeyError, match="no plan named 'c'"):
        comparison.row("c")
    with pytest.raises(ValueError, match="nothing to compare"):
        compare_measured([])


def test_cli_evaluate_needs_one_name_per_plan(tmp_path, capsys) -> None:
    task_path = save_task(TASK, tmp_path / "task.json")
    plan_path = save_plan(VALID, tmp_path / "plan.json")
    argv = ["evaluate", "--task", str(task_path), "--plan", str(plan_path), "--plan", str(plan_path),
            "--name", "only-one", "--device", "cpu"]
    assert main(argv) == 2
    assert "--name given 1 times for 2 --plan" in capsys.readouterr().err
    assert not (tmp_path / "plan_eval").exists()


def test_cli_plan_names_are_stems_else_methods_else_numbered() -> None:
    from shardwise.cli import _plan_names

    a, b = VALID.model_copy(update={"method": "x"}), VALID.model_copy(update={"method": "y"})
    assert _plan_names(["d/p1.json", "d/p2.json"], [a, a]) == ["p1", "p2"]
    assert _plan_names(["d1/plan", "d2/plan"], [a, b]) == ["x", "y"]
    assert _plan_names(["d1/plan", "d2/plan"], [a, a]) == ["plan-0", "plan-1"]
