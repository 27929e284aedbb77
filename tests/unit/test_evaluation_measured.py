"""Measured plan cost: invalid plans are refused before anything runs; the derived numbers are right."""

from __future__ import annotations

import json

import pytest
from search_doubles import FeatureCostModel

from shardwise.cli import main
from shardwise.evaluation import evaluate_plans, measured
from shardwise.evaluation.measured import (
    DeviceCost,
    MeasuredPlanCost,
    compare_measured,
    measure_plan,
    measure_plans,
    price_comm,
)
from shardwise.profiling import MeasurementSettings, kernel
from shardwise.profiling.comm import CommTiming
from shardwise.profiling.kernel import ShardTiming
from shardwise.search.plan import Plan, PlanError, Shard, save_plan
from shardwise.workload import ShardingTask, TableSpec, save_task

TABLES = tuple(TableSpec(name=f"t{i}", rows=1000, dim=16, pooling_factor=4.0) for i in range(3))
TASK = ShardingTask(num_devices=2, device_memory_bytes=2**26, batch_size=256, tables=TABLES)


def _plan(*shards: tuple[str, int, int, int]) -> Plan:
    return Plan(num_devices=2, shards=tuple(Shard(table=t, col_offset=o, dim=d, device=v) for t, o, d, v in shards))


COLUMN_TWICE = _plan(("t0", 0, 16, 0), ("t0", 8, 8, 1), ("t1", 0, 16, 1), ("t2", 0, 16, 0))
DEVICE_OUT_OF_RANGE = _plan(("t0", 0, 16, 0), ("t1", 0, 16, 2), ("t2", 0, 16, 1))
VALID = _plan(("t0", 0, 16, 0), ("t1", 0, 16, 1), ("t2", 0, 16, 1))
OTHER = _plan(("t0", 0, 16, 0), ("t1", 0, 16, 0), ("t2", 0, 16, 1))  # no device laid out as VALID's


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
        measure_plan(task, plan, MeasurementSettings(device="cpu"), progress=False)


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
                   memory_bytes=m, comm_fwd_measured_ms=cf, comm_bwd_measured_ms=cb)
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
    assert doc["format"] == "shardwise.measured/v2" and doc["devices"][1]["total_ms"] == pytest.approx(8.0)
    assert MeasuredPlanCost.model_validate(doc) == cost  # its derived totals are read past
    with pytest.raises(ValueError, match=r"field 'format' must be 'shardwise.measured/v2', got "
                                         r"'shardwise.measured/v1' \(a measurement by another shardwise version"):
        MeasuredPlanCost.model_validate({**doc, "format": "shardwise.measured/v1"})
    older = {**doc, "devices": [{k: v for k, v in row.items() if "measured" not in k} for row in doc["devices"]]}
    with pytest.raises(ValueError, match="comm_fwd_measured_ms"):
        MeasuredPlanCost.model_validate(older)
    table = cost.table()
    assert "8.000" in table and "imbalance 1.333" in table


def test_comparison_ratios_are_to_the_first_plan_and_rows_are_found_by_name() -> None:
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


def test_evaluate_report_names_are_stems_else_methods_else_numbered() -> None:
    from shardwise.jobs.evaluate import report_names

    a, b = VALID.model_copy(update={"method": "x"}), VALID.model_copy(update={"method": "y"})
    assert report_names(("d/p1.json", "d/p2.json"), [a, a]) == ["p1", "p2"]
    assert report_names(("d1/plan", "d2/plan"), [a, b]) == ["x", "y"]
    assert report_names(("d1/plan", "d2/plan"), [a, a]) == ["plan-0", "plan-1"]


class _Kernels:
    """Stands in for the kernel and all-to-all timers: records what it was asked to time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.shards: list[tuple[tuple[str, ...], int, float | None]] = []  # (tables, batch, reference_ms)
        self.exchanges: list[tuple[int, int, int]] = []  # (layouts, batch, iters)
        self.calibrations = 0
        self.kernels: list[str] = []  # the compute kernel of each timing
        monkeypatch.setattr(measured, "measure_shard", self.measure_shard)
        monkeypatch.setattr(measured, "measure_all_to_all_many", self.measure_all_to_all_many)
        monkeypatch.setattr(kernel, "calibrate_reference", self.calibrate_reference)  # what resolve_timing calls

    def measure_shard(self, tables, batch_size, *, device, protocol, optimizer, weights_precision,
                      compute_kernel="fused") -> ShardTiming:
        self.shards.append((tuple(t.name for t in tables), batch_size, protocol.reference_ms))
        self.kernels.append(compute_kernel)
        ms = float(len(self.shards))  # every timing differs: the median must pick the middle one
        return ShardTiming(fwd_ms=ms, bwd_ms=2 * ms, raw_fwd_ms=ms, raw_bwd_ms=2 * ms, reference_ms=1.0)

    def measure_all_to_all_many(self, layouts, batch_size, *, backend, iters) -> list[list[CommTiming]]:
        self.exchanges.append((len(layouts), batch_size, iters))
        return [[CommTiming(0.1, 0.2, 0, None, (0.1,) * iters, (0.2,) * iters) for _ in widths] for widths in layouts]

    def calibrate_reference(self, device, protocol) -> float:
        self.calibrations += 1
        return 0.25


def test_measure_plans_times_as_the_measurement_settings_say(monkeypatch) -> None:
    kernels = _Kernels(monkeypatch)
    settings = MeasurementSettings(device="cpu", batch_size=128, warmup_iters=1, timing_iters=4, timing_rounds=3,
                                   comm_iters=7, comm_rounds=2, reference_ms=0.5)
    first, second = measure_plans([(TASK, VALID), (TASK, OTHER)], settings, progress=False)
    # 2 plans x 2 devices x 3 rounds, at the settings' batch, scaled by the pinned reference (no calibration)
    assert len(kernels.shards) == 12 and kernels.calibrations == 0
    assert set(kernels.kernels) == {"fused"}  # no data-parallel tables: no dense kernel
    assert {batch for _, batch, _ in kernels.shards} == {128}
    assert {ref for _, _, ref in kernels.shards} == {0.5}
    # rounds interleaved over all shards: device 0 of the first plan was timed 1st, 5th and 9th, median 5th
    assert first.devices[0].fwd_ms == 5.0 and first.devices[0].bwd_ms == 10.0
    # both plans' layouts in one all-to-all session, taking turns for comm_rounds x comm_iters exchanges each
    assert kernels.exchanges == [(2, 128, 2 * 7)]
    assert first.devices[1].comm_fwd_ms == pytest.approx(0.1) and second.devices[1].comm_bwd_ms == pytest.approx(0.2)
    assert first.batch_size == 128 and first.reference_ms == 0.5
    assert first.timing["compute_rounds"] == 3 and first.timing["comm_iters"] == 7
    assert first.timing["comm_rounds"] == 2
    assert first.timing["warmup_iters"] == 1 and first.timing["iters"] == 4
    assert "reference_ms" not in first.timing  # stored on its own
    comparison = compare_measured([("a", first), ("b", second)])
    assert (comparison.compute_rounds, comparison.comm_iters, comparison.comm_rounds) == (3, 7, 2)


def test_measure_plans_calibrates_one_reference_for_all_plans_at_the_tasks_batch(monkeypatch) -> None:
    kernels = _Kernels(monkeypatch)
    costs = measure_plans([(TASK, VALID), (TASK, OTHER)], MeasurementSettings(device="cpu"), progress=False)
    assert kernels.calibrations == 1
    assert {ref for _, _, ref in kernels.shards} == {0.25} and {c.reference_ms for c in costs} == {0.25}
    assert {batch for _, batch, _ in kernels.shards} == {TASK.batch_size}
    defaults = MeasurementSettings()
    assert costs[0].timing["compute_rounds"] == defaults.timing_rounds
    assert kernels.exchanges == [(2, TASK.batch_size, defaults.comm_rounds * defaults.comm_iters)]


def test_a_device_two_plans_lay_out_alike_is_timed_once_and_gets_one_figure(monkeypatch) -> None:
    """Identical device shards (and identical all-to-all widths) are measured once and shared: plans that agree on
    a device get the same figure there, and a plan measured twice is measured once."""
    kernels = _Kernels(monkeypatch)
    # VALID's devices the other way round, the tables listed in another order
    swapped = _plan(("t2", 0, 16, 0), ("t0", 0, 16, 1), ("t1", 0, 16, 0))
    settings = MeasurementSettings(device="cpu", timing_rounds=3, comm_rounds=2, reference_ms=0.5)
    first, again, other = measure_plans([(TASK, VALID), (TASK, VALID), (TASK, swapped)], settings, progress=False)
    # 2 distinct shards ({t0}, {t1, t2}) x 3 rounds, not 6 x 3
    assert len(kernels.shards) == 6 and {names for names, _, _ in kernels.shards} == {("t0",), ("t1", "t2")}
    assert first.devices == again.devices
    assert (other.devices[1].fwd_ms, other.devices[0].fwd_ms) == (first.devices[0].fwd_ms, first.devices[1].fwd_ms)
    # widths (16, 32) and (32, 16): two layouts exchanged, not three
    assert kernels.exchanges == [(2, TASK.batch_size, 2 * settings.comm_iters)]


class _ModelWithReference(FeatureCostModel):
    reference_ms = 0.75
    batch_size = 64


@pytest.mark.parametrize(
    ("settings", "batch", "reference"),
    [(MeasurementSettings(device="cpu"), 64, 0.75),
     (MeasurementSettings(device="cpu", batch_size=32, reference_ms=2.0), 32, 2.0)],
    ids=["model's", "settings'"],
)
def test_evaluate_plans_times_as_the_cost_model_was_trained_unless_the_settings_say(
    monkeypatch, tmp_path, settings: MeasurementSettings, batch: int, reference: float
) -> None:
    kernels = _Kernels(monkeypatch)
    costs, comparison, _ = evaluate_plans(TASK, [("a", VALID), ("b", VALID)], tmp_path,
                                          cost_model=_ModelWithReference(), measurement=settings, progress=False)
    assert kernels.calibrations == 0
    assert {b for _, b, _ in kernels.shards} == {batch} and {r for _, _, r in kernels.shards} == {reference}
    assert costs[0].batch_size == batch and comparison.reference_ms == reference
    assert comparison.row("a").predicted_max_cost_ms is not None  # the model's prediction next to the measurement
    assert json.loads((tmp_path / "a.measured.json").read_text())["batch_size"] == batch


def test_price_comm_by_width_fits_one_line_per_direction_over_the_distinct_layouts() -> None:
    layouts = [[16, 48], [32, 32], [16, 48]]  # the third is the first again: timed once, fitted once
    # forward 0.1 + 0.01 x width, backward twice that, each device off its line by noise that the fit cancels
    measured_ms = [[(0.28, 0.54), (0.60, 1.18)], [(0.37, 0.79), (0.43, 0.85)], [(0.28, 0.54), (0.60, 1.18)]]
    priced = price_comm(layouts, measured_ms, "width")
    by_width = dict(zip((w for layout in layouts for w in layout), (ms for ds in priced for ms in ds)))
    # least squares over 4 devices (widths 16, 48, 32, 32), not 6: counted twice, the first layout would tilt it
    assert by_width[16] == pytest.approx((0.26, 0.52))
    assert by_width[48] == pytest.approx((0.58, 1.16))
    assert by_width[32] == pytest.approx((0.42, 0.84))
    assert priced[0] == priced[2]
    # the line keeps the fitted devices' mean
    fwd = [ms[0] for ds in measured_ms[:2] for ms in ds]
    assert sum(ms[0] for ds in priced[:2] for ms in ds) == pytest.approx(sum(fwd))
    assert price_comm(layouts, measured_ms, "measured") == measured_ms


def test_price_comm_by_width_with_every_width_alike_is_the_mean_and_never_negative() -> None:
    assert price_comm([[8, 8], [8, 8]], [[(1.0, 2.0), (3.0, 2.0)], [(1.0, 2.0), (3.0, 2.0)]], "width") == [
        [(2.0, 2.0), (2.0, 2.0)], [(2.0, 2.0), (2.0, 2.0)]]
    # a steep line would price a narrow device below zero: an exchange costs at least nothing
    priced = price_comm([[0, 10, 100]], [[(0.0, 0.0), (0.0, 0.0), (9.0, 9.0)]], "width")
    assert min(ms for ds in priced for pair in ds for ms in pair) == 0.0


def test_measure_plans_prices_the_all_to_all_by_width_and_keeps_each_devices_own_median(monkeypatch) -> None:
    kernels = _Kernels(monkeypatch)
    noise = iter([0.02, -0.01, 0.01, -0.02])

    def exchanges(layouts, batch_size, *, backend, iters):  # 0.01 ms per column, each device off by some noise
        return [[CommTiming(w / 100 + (n := next(noise)), 2 * w / 100 + n, 0, None, (), ()) for w in widths]
                for widths in layouts]

    monkeypatch.setattr(measured, "measure_all_to_all_many", exchanges)
    valid, other = measure_plans([(TASK, VALID), (TASK, OTHER)], MeasurementSettings(device="cpu"), progress=False)
    assert valid.timing["comm_pricing"] == "width" and kernels.calibrations == 1
    # VALID's widths 16, 32; OTHER's 32, 16: the noise cancels in the line
    assert [d.comm_fwd_ms for d in valid.devices] == pytest.approx([0.16, 0.32])
    assert [d.comm_bwd_ms for d in other.devices] == pytest.approx([0.64, 0.32])
    assert [d.comm_fwd_measured_ms for d in valid.devices] == pytest.approx([0.18, 0.31])
    assert [d.comm_bwd_measured_ms for d in other.devices] == pytest.approx([0.65, 0.30])
    comparison = compare_measured([("valid", valid), ("other", other)])
    assert comparison.comm_pricing == "width" and "line in its pooled width" in comparison.table()
    noise = iter([0.02, -0.01, 0.01, -0.02])
    raw = measure_plans([(TASK, VALID)], MeasurementSettings(device="cpu", comm_pricing="measured"), progress=False)
    assert [d.comm_fwd_ms for d in raw[0].devices] == pytest.approx([0.18, 0.31])
    assert raw[0].timing["comm_pricing"] == "measured"


def test_a_device_the_host_launches_slower_than_it_runs_is_named_launch_bound() -> None:
    cost = _cost([(1.0, 2.0, 0.5, 0.5), (3.0, 4.0, 0.5, 0.5)], [250, 600])
    assert cost.launch_bound_devices == () and "launch-bound" not in cost.table()  # CPU: nothing launched
    on_gpu = cost.model_copy(update={"device_kind": "cuda", "devices": (
        cost.devices[0].model_copy(update={"launch_ms": 3.5}),  # 3 ms of kernels, 3.5 ms to launch them
        cost.devices[1].model_copy(update={"launch_ms": 3.5}),  # 7 ms of kernels
    )})
    assert on_gpu.launch_bound_devices == (0,)
    assert "launch-bound: device(s) 0" in on_gpu.table() and "3.500 ms to launch" in on_gpu.table()
    assert on_gpu.to_json()["launch_bound_devices"] == [0]
    assert MeasuredPlanCost.model_validate(on_gpu.model_dump()).devices[0].launch_ms == 3.5
