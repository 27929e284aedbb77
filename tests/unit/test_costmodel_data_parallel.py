"""The data-parallel cost: a measured all-reduce line (fit, held-out error, storage with the model) and the dense
kernel on the local batch, priced by a line fitted to measured dense kernels (or, for a model without one, by the
compute model)."""

import json

import numpy as np
import pytest
from search_doubles import FeatureCostModel

from shardwise.costmodel.data_parallel import (
    AllReduceCost,
    DataParallelKernelCost,
    all_reduce_of,
    data_parallel_cost,
    data_parallel_kernel_of,
    data_parallel_kernel_terms,
    fit_all_reduce,
    fit_data_parallel_kernel,
    gradient_bytes,
    heldout_all_reduce_errors,
    heldout_data_parallel_kernel_errors,
    local_batch_table,
)
from shardwise.workload import TableSpec, local_batch

TRUE = AllReduceCost(latency_ms=0.2, hop_ms=0.05, ms_per_mib=1.5)


def _points(cost: AllReduceCost, noise: float = 0.0, seed: int = 0) -> list[tuple[int, int, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for devices in (2, 4):
        for size in (4096, 2**16, 2**20, 2**22, 2**24):
            ms = float(cost.predict_ms(size, devices)) * (1 + noise * rng.standard_normal())
            out.append((devices, size, ms))
    return out


def test_the_fit_recovers_a_line_from_its_points():
    fitted = fit_all_reduce(_points(TRUE))
    assert fitted.latency_ms == pytest.approx(0.2, rel=1e-6)
    assert fitted.hop_ms == pytest.approx(0.05, rel=1e-6)
    assert fitted.ms_per_mib == pytest.approx(1.5, rel=1e-6)
    assert len(fitted.points) == 10


def test_one_device_count_fits_no_hop_term_and_coefficients_stay_non_negative():
    two = [p for p in _points(TRUE) if p[0] == 2]
    fitted = fit_all_reduce(two)
    assert fitted.hop_ms == 0.0 and fitted.latency_ms > 0 and fitted.ms_per_mib > 0
    # a time that falls with size would need a negative slope: dropped, never predicted below zero
    falling = fit_all_reduce([(2, 4096, 3.0), (2, 2**20, 2.0), (2, 2**22, 1.0)])
    assert min(falling.latency_ms, falling.hop_ms, falling.ms_per_mib) >= 0.0


def test_nothing_to_reduce_or_one_device_costs_nothing():
    assert float(TRUE.predict_ms(0, 4)) == 0.0
    assert float(TRUE.predict_ms(2**20, 1)) == 0.0
    assert float(TRUE.predict_ms(2**21, 4)) > float(TRUE.predict_ms(2**20, 4)) > float(TRUE.predict_ms(2**20, 2))


def test_held_out_errors_predict_each_size_from_the_others():
    errors = heldout_all_reduce_errors(_points(TRUE, noise=0.05))
    assert len(errors) == 10
    mape = np.mean([abs(pred - ms) / ms for _, _, ms, pred in errors])
    assert mape < 0.15  # 5% noise: a left-out size is still predicted closely


def test_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError, match="at least 2"):
        fit_all_reduce([(2, 4096, 1.0)])
    with pytest.raises(ValueError, match="num_devices >= 2"):
        fit_all_reduce([(1, 4096, 1.0), (2, 8192, 1.0)])
    with pytest.raises(ValueError, match="finite and >= 0"):
        AllReduceCost.from_json({"latency_ms": -1, "hop_ms": 0, "ms_per_mib": 1})


def test_json_round_trip():
    fitted = fit_all_reduce(_points(TRUE), backend="gloo", hardware_kind="cpu-test")
    again = AllReduceCost.from_json(json.loads(json.dumps(fitted.to_json())))
    assert again == fitted


def test_the_local_batch_is_priced_as_the_table_with_its_lookups_spread_over_the_devices():
    table = TableSpec(name="t", rows=1000, dim=16, pooling_factor=8.0, zipf_alpha=1.1)
    local = local_batch_table(table, 4)
    assert local.pooling_factor == 2.0 and (local.rows, local.dim) == (1000, 16)
    assert local_batch_table(table, 1) is table
    # the same lookups in a batch: the Zipf reuse bins come from batch x pooling factor draws
    np.testing.assert_allclose(local.reuse_features(1024), table.reuse_features(256))


def test_data_parallel_cost_is_the_local_kernel_plus_the_gradient_all_reduce():
    tables = [TableSpec(name=f"t{i}", rows=100 * (i + 1), dim=16, pooling_factor=4.0) for i in range(3)]
    model = FeatureCostModel()
    with pytest.raises(ValueError, match="no measured all-reduce"):
        data_parallel_cost(model, tables, 4)
    model.all_reduce = TRUE  # type: ignore[attr-defined]
    assert all_reduce_of(model) is TRUE
    cost = data_parallel_cost(model, tables, 4)
    kernel = model.predict_compute([[local_batch_table(t, 4) for t in tables]])[0]
    assert (cost.fwd_ms, cost.bwd_ms) == pytest.approx(tuple(kernel))
    assert cost.all_reduce_ms == pytest.approx(float(TRUE.predict_ms(gradient_bytes(tables), 4)))
    assert gradient_bytes(tables) == 4 * 16 * 600
    assert data_parallel_cost(model, [], 4).total_ms == 0.0


def test_each_measured_device_count_gets_its_own_line_and_others_the_line_over_all():
    # 4 processes on 2 cores: dearer per byte than any hop term over 2 processes predicts
    two = AllReduceCost(latency_ms=0.1, hop_ms=0.0, ms_per_mib=1.0)
    four = AllReduceCost(latency_ms=0.5, hop_ms=0.0, ms_per_mib=6.0)
    points = [(d, size, float((two if d == 2 else four).predict_ms(size, d)))
              for d in (2, 4) for size in (4096, 2**16, 2**20, 2**22, 2**24)]
    fitted = fit_all_reduce(points)
    assert [d for d, *_ in fitted.by_devices] == [2, 4]
    for d, truth in ((2, two), (4, four)):
        for size in (8192, 2**21, 2**25):  # sizes it never saw
            assert float(fitted.predict_ms(size, d)) == pytest.approx(float(truth.predict_ms(size, d)), rel=1e-6)
    one_line = fit_all_reduce(points, per_device_count=False)
    assert one_line.by_devices == ()
    # a count not measured: the line over every count, never below a measured smaller count's line (8 under 4 here)
    four_line = AllReduceCost(latency_ms=fitted.by_devices[1][1], hop_ms=0.0, ms_per_mib=fitted.by_devices[1][2])
    for size in (4096, 2**22):
        eight = float(fitted.predict_ms(size, 8))
        assert eight == pytest.approx(max(float(one_line.predict_ms(size, 8)), float(four_line.predict_ms(size, 8))))
        assert eight >= float(fitted.predict_ms(size, 4))
    # held out, the per-count lines predict each size from the rest far better than one line over both
    own = heldout_all_reduce_errors(points)
    shared = heldout_all_reduce_errors(points, per_device_count=False)
    assert max(abs(p - m) / m for *_, m, p in own) < 1e-6 < min(
        max(abs(p - m) / m for *_, m, p in shared), 1.0)


def test_a_stored_line_from_before_the_per_device_lines_still_loads():
    doc = {"latency_ms": 0.2, "hop_ms": 0.05, "ms_per_mib": 1.5, "backend": "gloo", "points": [[2, 4096, 0.3]]}
    cost = AllReduceCost.from_json(doc)
    assert cost.by_devices == () and float(cost.predict_ms(2**20, 4)) == pytest.approx(float(TRUE.predict_ms(2**20, 4)))
    with pytest.raises(ValueError, match="by_devices"):
        AllReduceCost.from_json({**doc, "by_devices": [{"num_devices": 2, "latency_ms": 0.1, "ms_per_mib": -1}]})


DENSE = DataParallelKernelCost(fwd=(0.02, 0.01, 0.001, 0.003, 0.002, 0.0, 0.0),
                               bwd=(0.03, 0.02, 0.0, 0.004, 0.001, 0.002, 0.5), batch_size=2048)


def _dense_kernels(truth: DataParallelKernelCost, noise: float = 0.0, seed: int = 0, n: int = 40):
    """Measured dense kernels of random sets of tables at 2, 4 and 8 devices' local batches, timed by `truth`."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        tables = [TableSpec(name=f"t{k}_{i}", rows=int(rng.integers(100, 50_000)), dim=int(rng.choice([8, 32, 128])),
                            pooling_factor=float(rng.uniform(1, 30))) for i in range(int(rng.integers(1, 6)))]
        devices = (2, 4, 8)[k % 3]
        fwd, bwd = truth.predict_ms(tables, devices)
        out.append((tables, devices, fwd * (1 + noise * rng.standard_normal()), bwd * (1 + noise * rng.standard_normal())))
    return out


def test_the_dense_kernel_line_recovers_its_coefficients_and_prices_the_local_batch():
    fitted = fit_data_parallel_kernel(_dense_kernels(DENSE), 2048, hardware_kind="cpu-test")
    np.testing.assert_allclose(fitted.fwd, DENSE.fwd, atol=1e-9)
    np.testing.assert_allclose(fitted.bwd, DENSE.bwd, atol=1e-9)
    assert fitted.measured == 40 and fitted.hardware_kind == "cpu-test"
    table = TableSpec(name="t", rows=10_000, dim=32, pooling_factor=10.0)
    # a device of 4 looks up 512 of the 2048 samples: the lookups and outputs terms shrink 4x, the elements do not
    assert local_batch(2048, 4) == 512 and local_batch(2049, 4) == 513
    terms = data_parallel_kernel_terms([table], 512)
    assert terms[[0, 1, 2, 3, 4, 6]] == pytest.approx([1, 1, 5.12, 512 * 10 * 48 / 1e3, 512 * 32 / 1e3, 0.32])
    # 5,120 uniform lookups over 10,000 rows: most touch a row of their own
    assert 4000 < terms[5] * 1e3 / 32 < 5120
    fwd_2, bwd_2 = fitted.predict_ms([table], 2)
    fwd_8, bwd_8 = fitted.predict_ms([table], 8)
    assert fwd_8 < fwd_2 and bwd_8 < bwd_2 and bwd_8 > 0.5 * 0.32  # the optimizer's step over every row stays
    assert fitted.predict_ms([], 4) == (0.0, 0.0)


def test_the_dense_kernel_line_is_evaluated_held_out_and_refuses_what_it_cannot_fit():
    errors = heldout_data_parallel_kernel_errors(_dense_kernels(DENSE, noise=0.05), 2048)
    assert len(errors) == 40
    assert np.mean([abs(p - m) / m for m, p, _, _ in errors]) < 0.1
    with pytest.raises(ValueError, match="at least 7"):
        fit_data_parallel_kernel(_dense_kernels(DENSE)[:6], 2048)
    bad = _dense_kernels(DENSE)
    bad[0] = (bad[0][0], 2, 0.0, 1.0)
    with pytest.raises(ValueError, match="finite and > 0"):
        fit_data_parallel_kernel(bad, 2048)


def test_the_dense_kernel_line_round_trips_through_json_and_refuses_a_damaged_one():
    doc = json.loads(json.dumps(DENSE.to_json()))
    assert DataParallelKernelCost.from_json(doc) == DENSE
    with pytest.raises(ValueError, match="terms must be"):
        DataParallelKernelCost.from_json({**doc, "terms": ["constant"]})
    with pytest.raises(ValueError, match="finite coefficient >= 0"):
        DataParallelKernelCost.from_json({**doc, "bwd": [0.1, -1, 0, 0, 0, 0, 0]})
    with pytest.raises(ValueError, match="finite coefficient >= 0"):
        DataParallelKernelCost.from_json({**doc, "fwd": [0.1, 0, 0]})


def test_a_model_with_a_dense_kernel_line_prices_data_parallel_kernels_with_it():
    tables = [TableSpec(name=f"t{i}", rows=100 * (i + 1), dim=16, pooling_factor=4.0) for i in range(3)]
    model = FeatureCostModel()
    model.all_reduce = TRUE  # type: ignore[attr-defined]
    network = data_parallel_cost(model, tables, 4)
    assert data_parallel_kernel_of(model) is None
    model.data_parallel_kernel = DENSE  # type: ignore[attr-defined]
    assert data_parallel_kernel_of(model) is DENSE
    cost = data_parallel_cost(model, tables, 4)
    assert (cost.fwd_ms, cost.bwd_ms) == pytest.approx(DENSE.predict_ms(tables, 4))
    assert (cost.fwd_ms, cost.bwd_ms) != pytest.approx((network.fwd_ms, network.bwd_ms))
    assert cost.all_reduce_ms == network.all_reduce_ms
