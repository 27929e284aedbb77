"""Network inputs: per-table features (log-scaled sizes + reuse bins), per-device comm features, and the
normaliser fitted on training data and saved with the model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from shardwise.workload import FEATURE_NAMES, NUM_FEATURES, TableSpec, table_features

#: dim, rows, pooling factor and size span orders of magnitude; the reuse bins are already fractions
LOG_FEATURES = 4
COMM_FEATURE_NAMES: tuple[str, ...] = (
    "log_own_width",
    "log_total_width",
    "log_max_width",
    "log_mean_width",
    "own_over_max_width",
    "log_num_devices",
    "log_fwd_compute_skew_ms",  # max compute - own compute: how long this device waits in the forward a2a
)
NUM_COMM_FEATURES = len(COMM_FEATURE_NAMES)


def transformed_table_features(table: TableSpec, batch_size: int) -> np.ndarray:
    """One table's 21 features with log1p on dim, rows, pooling factor and size (before normalisation)."""
    raw = table_features(table, batch_size)
    raw[:LOG_FEATURES] = np.log1p(raw[:LOG_FEATURES])
    return raw


class TableFeatureCache:
    """Transformed features per TableSpec, computed once (reuse bins of Zipf tables cost a sampled batch)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self._rows: dict[TableSpec, np.ndarray] = {}

    def __call__(self, tables: Sequence[TableSpec]) -> np.ndarray:
        """Feature matrix [len(tables), 21] (float32)."""
        if not tables:
            return np.zeros((0, NUM_FEATURES), dtype=np.float32)
        rows = self._rows
        out = []
        for table in tables:
            row = rows.get(table)
            if row is None:
                row = rows[table] = transformed_table_features(table, self.batch_size).astype(np.float32)
            out.append(row)
        return np.stack(out)


#: channels summed over a shard in linear scale, so the head sees the shard's total work directly: lookup
#: bytes-ish work pooling x (dim + 16) (what single-table CPU cost ranks best with), lookups, width, and the
#: distinct rows a batch touches (per sample) and their width: with the cache flushed before each call every
#: distinct row is a memory miss, and the backward's optimizer update reads and writes each one. All but the
#: last two are per-table features the network could weigh itself; the distinct rows it would have to infer
#: from the reuse bins, and giving them explicitly lowered held-out-table error (record `costmodel_accuracy`).
#: Also fed, log1p-scaled, to the per-table MLP.
WORK_CHANNELS: tuple[str, ...] = (
    "kilo_pooling_x_dim16", "pooling_over_10", "dim_over_100", "unique_rows_per_sample", "unique_rows_x_dim_over_100"
)
NUM_WORK_CHANNELS = len(WORK_CHANNELS)
#: a representative access count per reuse bin (bin 0: 1; bin k: the middle of (2^(k-1), 2^k])
_BIN_ACCESS_COUNTS = np.array(
    [1.0] + [0.75 * 2.0**k for k in range(1, NUM_FEATURES - LOG_FEATURES)], dtype=np.float32
)


def accesses_per_row(transformed: np.ndarray) -> np.ndarray:
    """[T] transformed table features -> how often a batch reads each distinct row it touches, on average, read
    off the reuse bins: the access skew in one number (1: every lookup a new row; the more, the more skewed)."""
    return np.maximum(transformed[:, LOG_FEATURES:] @ _BIN_ACCESS_COUNTS, 1.0)


def distinct_rows_per_sample(transformed: np.ndarray) -> np.ndarray:
    """[T] transformed table features -> the distinct rows a batch touches, per sample: its lookups over the mean
    accesses per distinct row (`accesses_per_row`)."""
    return np.expm1(transformed[:, 2]) / accesses_per_row(transformed)


def network_inputs(transformed: np.ndarray, normaliser: FeatureNormaliser) -> np.ndarray:
    """[T, 21] transformed table features -> [T, 21 + 5]: normalised features, then the work channels."""
    dim = np.expm1(transformed[:, 0])
    pooling = np.expm1(transformed[:, 2])
    unique = distinct_rows_per_sample(transformed)
    work = np.stack([pooling * (dim + 16) / 1e3, pooling / 10, dim / 100, unique, unique * dim / 100], axis=1)
    return np.concatenate([normaliser(transformed), work.astype(np.float32)], axis=1)


def _layouts(widths: np.ndarray, compute_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    widths = np.asarray(widths, dtype=np.float64)
    compute_ms = np.asarray(compute_ms, dtype=np.float64)
    if widths.ndim != 2:
        raise ValueError(f"widths must be [layouts, devices], got shape {widths.shape}")
    if compute_ms.shape != widths.shape:
        raise ValueError(f"compute_ms shape {compute_ms.shape} differs from widths shape {widths.shape}")
    return widths, compute_ms


def _device_features(own_width: np.ndarray, total: np.ndarray, peak: np.ndarray, skew: np.ndarray,
                     num_devices: int) -> np.ndarray:
    """The features of devices of width `own_width` in layouts of `total` and `peak` width, `skew` ms below the
    slowest device's compute (all broadcast to `own_width`'s shape) -> [..., 7]."""
    # each column computed in float64 and written into float32 (the rounding np.stack(...).astype made): search
    # asks this thousands of times on small layouts, where broadcast_to and stack cost more than the arithmetic
    feats = np.empty((*own_width.shape, 7), dtype=np.float32)
    feats[..., 0] = np.log1p(own_width)
    feats[..., 1] = np.log1p(total)
    feats[..., 2] = np.log1p(peak)
    feats[..., 3] = np.log1p(total / num_devices)
    feats[..., 4] = own_width / np.maximum(peak, 1.0)
    feats[..., 5] = np.log(float(num_devices))
    feats[..., 6] = np.log1p(np.maximum(skew, 0.0))
    return feats


def comm_features(widths: np.ndarray, compute_ms: np.ndarray) -> np.ndarray:
    """[N, D] per-device output widths and compute ms -> [N, D, 7] communication features."""
    widths, compute_ms = _layouts(widths, compute_ms)
    skew = compute_ms.max(axis=1, keepdims=True) - compute_ms
    return _device_features(widths, widths.sum(axis=1, keepdims=True), widths.max(axis=1, keepdims=True), skew,
                            widths.shape[1])


def comm_features_after(widths: np.ndarray, compute_ms: np.ndarray, devices: np.ndarray, added_width: np.ndarray,
                        new_compute_ms: np.ndarray, layout_of: np.ndarray | None = None) -> np.ndarray:
    """`comm_features` of device `devices[n, j]` ([N, K]) in layout n after it takes `added_width[n]` more columns
    and its compute becomes `new_compute_ms[n, j]`, the rest of the layout unchanged -> [N, K, 7]. What search
    asks of every candidate device for a shard, in O(N x D) instead of building N x K layouts.

    With `layout_of` ([N] indices into [L, D] `widths` and `compute_ms`), row n's layout is `layout_of[n]`: search's
    candidates share layouts, and each layout's totals are taken once (O(L x D)), the same features."""
    widths, compute_ms = _layouts(widths, compute_ms)
    layouts, d = widths.shape
    of = np.arange(layouts) if layout_of is None else np.asarray(layout_of, dtype=np.int64)
    n = of.size
    devices = np.asarray(devices, dtype=np.int64)
    added = np.asarray(added_width, dtype=np.float64).reshape(n, 1)
    new_compute_ms = np.asarray(new_compute_ms, dtype=np.float64)
    if devices.ndim != 2 or devices.shape[0] != n or new_compute_ms.shape != devices.shape:
        raise ValueError(f"devices and new_compute_ms must be [{n}, K] alike, got {devices.shape} and "
                         f"{new_compute_ms.shape}")
    own_width = widths[of[:, None], devices] + added
    peak = np.maximum(widths.max(axis=1, keepdims=True)[of], own_width)
    # the slowest other device: the layout's slowest, or its second slowest where the candidate is the slowest
    # (max, then max of a copy without it: 12x faster than np.partition on 1,024 devices, search's hot path)
    rows = np.arange(layouts)
    slowest = compute_ms.argmax(axis=1)
    first = compute_ms[rows, slowest][:, None]
    rest = compute_ms.copy()
    rest[rows, slowest] = -np.inf
    second = rest.max(axis=1)[:, None]
    others = np.where(devices == slowest[of, None], second[of], first[of])
    skew = np.maximum(others, new_compute_ms) - new_compute_ms
    return _device_features(own_width, widths.sum(axis=1, keepdims=True)[of] + added, peak, skew, d)


@dataclass(frozen=True)
class FeatureNormaliser:
    """Per-feature standardisation fitted on training inputs.

    A feature constant in training (std 0: e.g. the compute skew of profiled all-to-alls, which carry none)
    maps to 0 whatever its value at prediction time: the networks never saw it vary, so a new value would
    only move their outputs arbitrarily."""

    names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def fit(cls, features: np.ndarray, names: Sequence[str]) -> FeatureNormaliser:
        """Mean and standard deviation of each column of `features` [M, F]."""
        features = np.asarray(features, dtype=np.float64).reshape(-1, len(names))
        if features.shape[0] == 0:
            raise ValueError("cannot fit a feature normaliser on zero rows")
        std = features.std(axis=0)
        std = np.where(std < 1e-6, 0.0, std)  # constant in training: ignored at prediction time
        return cls(tuple(names), tuple(features.mean(axis=0).tolist()), tuple(std.tolist()))

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """Standardised features, same shape, float32 (0 for features constant in training)."""
        mean, divisor, varies = self._arrays
        scaled = (np.asarray(features, dtype=np.float32) - mean) / divisor
        return np.where(varies, scaled, 0.0).astype(np.float32)

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """float32 mean, the divisor (std, 1 where constant) and where std > 0: once, not per call (search calls
        thousands of times)."""
        mean = np.asarray(self.mean, dtype=np.float32)
        std = np.asarray(self.std, dtype=np.float32)
        return mean, np.where(std > 0, std, 1.0), std > 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"names": list(self.names), "mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> FeatureNormaliser:
        """Inverse of `to_json`."""
        names, mean, std = tuple(doc["names"]), tuple(doc["mean"]), tuple(doc["std"])
        if not (len(names) == len(mean) == len(std)):
            raise ValueError("normaliser: 'names', 'mean' and 'std' must have the same length")
        return cls(names, tuple(float(m) for m in mean), tuple(float(s) for s in std))


TABLE_FEATURE_NAMES = tuple(
    f"log1p_{n}" if i < LOG_FEATURES else n for i, n in enumerate(FEATURE_NAMES)
)
