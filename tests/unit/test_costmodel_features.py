import numpy as np
import pytest

from shardwise.costmodel.features import (
    NUM_COMM_FEATURES,
    TABLE_FEATURE_NAMES,
    FeatureNormaliser,
    TableFeatureCache,
    comm_features,
    transformed_table_features,
)
from shardwise.workload import TableSpec


def test_size_features_are_log_scaled_and_bins_kept():
    t = TableSpec(name="t", rows=999, dim=64, pooling_factor=3.0, zipf_alpha=1.0)
    f = transformed_table_features(t, 256)
    assert f.shape == (21,)
    assert f[0] == pytest.approx(np.log1p(64)) and f[1] == pytest.approx(np.log1p(999))
    assert f[4:].sum() == pytest.approx(1.0)


def test_feature_cache_returns_same_rows_as_direct_extraction():
    a = TableSpec(name="a", rows=100, dim=8, pooling_factor=2.0)
    b = TableSpec(name="b", rows=5000, dim=16, pooling_factor=9.0, zipf_alpha=0.8)
    cache = TableFeatureCache(128)
    got = cache([a, b, a])
    assert got.shape == (3, 21)
    np.testing.assert_allclose(got[1], transformed_table_features(b, 128), rtol=1e-6)
    np.testing.assert_array_equal(got[0], got[2])
    assert cache([]).shape == (0, 21)


def test_normaliser_standardises_and_round_trips_through_json():
    x = np.random.default_rng(0).normal(5.0, 3.0, size=(200, 21))
    x[:, 3] = 7.0  # a constant feature must not divide by zero
    norm = FeatureNormaliser.fit(x, TABLE_FEATURE_NAMES)
    z = norm(x)
    np.testing.assert_allclose(z.mean(axis=0), 0, atol=1e-5)
    assert np.all(np.isfinite(z)) and np.allclose(z[:, 3], 0)
    again = FeatureNormaliser.from_json(norm.to_json())
    np.testing.assert_array_equal(again(x), z)
    unseen = x.copy()
    unseen[:, 3] = 100.0  # a value the constant feature never had in training is ignored too
    np.testing.assert_array_equal(norm(unseen), z)


def test_normaliser_refuses_mismatched_json():
    with pytest.raises(ValueError, match="same length"):
        FeatureNormaliser.from_json({"names": ["a", "b"], "mean": [0.0], "std": [1.0]})


def test_comm_features_shape_and_forward_skew():
    widths = np.array([[64, 0, 128], [32, 32, 32]])
    compute = np.array([[1.0, 3.0, 2.0], [1.0, 1.0, 1.0]])
    f = comm_features(widths, compute)
    assert f.shape == (2, 3, NUM_COMM_FEATURES)
    # the device with the least compute waits longest; a balanced layout has no skew
    np.testing.assert_allclose(f[0, :, 6], np.log1p([2.0, 0.0, 1.0]), rtol=1e-6)
    assert np.all(f[1, :, 6] == 0)
    with pytest.raises(ValueError, match="compute_ms shape"):
        comm_features(widths, compute[:, :2])
