import numpy as np
import pandas as pd
import pytest

from shardwise.costmodel.evaluate import (
    format_table,
    noise_floor_table,
    regression_metrics,
    top_decile_mape_pct,
    torchrec_estimates,
)
from shardwise.workload import TableSpec


def test_regression_metrics_known_values():
    m = regression_metrics(np.array([1.1, 1.8, 3.0]), np.array([1.0, 2.0, 3.0]))
    assert m["mape_pct"] == pytest.approx((10 + 10 + 0) / 3)
    assert m["rmse_ms"] == pytest.approx(np.sqrt((0.01 + 0.04) / 3))
    assert m["spearman"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="shape"):
        regression_metrics(np.ones(2), np.ones(3))


def test_top_decile_mape_is_taken_over_the_costliest_tenth_by_measured_ms():
    """20 shards: the top decile is the 2 with the largest measured ms, whatever the prediction says; a cheap
    shard's large error and an overpriced cheap shard do not count."""
    measured = np.arange(1.0, 21.0)
    predicted = measured.copy()
    predicted[19] = 18.0  # measured 20, 10% low: the slowest device's kind of error
    predicted[0] = 2.0  # measured 1, 100% off, but cheap
    predicted[1] = 40.0  # measured 2, predicted the costliest: picked by measured ms, so not in the top decile
    order = np.random.default_rng(0).permutation(20)
    assert top_decile_mape_pct(predicted[order], measured[order]) == pytest.approx((10 + 0) / 2)
    metrics = regression_metrics(predicted, measured)
    assert metrics["top_decile_mape_pct"] == pytest.approx(5.0) and metrics["mape_pct"] > 5.0
    # at least one shard: of 5, the costliest alone
    assert top_decile_mape_pct(np.array([1.0, 2, 3, 4, 4.4]), np.array([1.0, 2, 3, 4, 5])) == pytest.approx(12.0)
    assert np.isnan(top_decile_mape_pct(np.zeros(0), np.zeros(0)))


def test_torchrec_estimator_sums_tables_and_grows_with_pooling():
    small = TableSpec(name="s", rows=10_000, dim=64, pooling_factor=2.0)
    big = small.model_copy(update={"name": "b", "pooling_factor": 40.0})
    est = torchrec_estimates([[small], [big], [small, big], []], batch_size=1024)
    assert est.shape == (4, 2)
    assert est[1, 0] > est[0, 0] > 0
    np.testing.assert_allclose(est[2], est[0] + est[1])
    np.testing.assert_array_equal(est[3], [0, 0])


def test_torchrec_estimator_prices_other_sharding_types_on_the_first_devices_shard():
    table = TableSpec(name="t", rows=100_000, dim=64, pooling_factor=8.0)
    whole = torchrec_estimates([[table]], batch_size=1024, world_size=4)
    rows = torchrec_estimates([[table]], batch_size=1024, sharding_type="row_wise", world_size=4)
    replicated = torchrec_estimates([[table]], batch_size=1024, sharding_type="data_parallel", world_size=4)
    assert 0 < rows.sum() < whole.sum()  # a quarter of the rows' lookups
    assert 0 < replicated.sum() < whole.sum()  # a quarter of the batch
    with_comms = torchrec_estimates([[table]], batch_size=1024, sharding_type="data_parallel", world_size=4,
                                    comms=True)
    assert with_comms[0, 0] == pytest.approx(replicated[0, 0])  # no forward exchange
    assert with_comms[0, 1] > replicated[0, 1]  # the gradient's all-reduce


def test_noise_floor_compares_repeats_to_the_first_measurement():
    df = pd.DataFrame({
        "config_id": ["a", "a", "b", "b", "c"], "repeat": [0, 1, 0, 1, 0],
        "fwd_ms": [1.0, 1.1, 2.0, 2.0, 5.0], "bwd_ms": [1.0, 1.1, 2.0, 2.0, 5.0],
    })
    table = noise_floor_table(df).set_index("target")
    assert table.loc["total", "n"] == 2
    assert table.loc["total", "mape_pct"] == pytest.approx(5.0)
    assert "noise_floor" in format_table(table.reset_index())
