"""A cost dataset -> training samples: the checks it must pass, its compute shards, dense kernels, all-to-alls and
collectives (repeats averaged), and its kernel rows put on one reference."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from shardwise.errors import ShardwiseError
from shardwise.profiling.schema import COMPUTE_DEFAULTS
from shardwise.workload import TableSpec

from .data_parallel import MeasuredDenseKernel
from .evaluate import ComputeSamples
from .features import comm_features

REQUIRED_COLUMNS = ("kind", "config_id", "repeat", "fwd_ms", "bwd_ms", "batch_size", "hardware_kind")


class CostDataError(ShardwiseError, ValueError):
    """A cost dataset that cannot be trained on (missing columns, mixed hardware, no compute rows)."""


def check_cost_frame(df: pd.DataFrame) -> tuple[str, int]:
    """Refuse datasets the model cannot learn from; return their hardware kind and batch size."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise CostDataError(f"cost dataset lacks column(s) {missing} (see shardwise.profiling.schema)")
    kinds = sorted(map(str, df["hardware_kind"].dropna().unique()))
    if len(kinds) != 1:
        raise CostDataError(
            f"cost dataset mixes hardware kinds {kinds}: a cost model is trained per hardware kind, pass one kind's data"
            if kinds else "cost dataset has no rows with a 'hardware_kind'"
        )
    sizes = sorted(int(b) for b in df["batch_size"].unique())
    if len(sizes) != 1:
        raise CostDataError(f"cost dataset mixes batch sizes {sizes}: profile one batch size per model")
    bad_kinds = set(df["kind"].unique()) - {"compute", "comm", "data_parallel", *COLLECTIVE_MS_COLUMN}
    if bad_kinds:
        raise CostDataError(f"column 'kind' has values {sorted(bad_kinds)}, expected 'compute', 'comm', "
                            f"'data_parallel' or one of {sorted(COLLECTIVE_MS_COLUMN)}")
    compute = df[df["kind"] == "compute"]
    if compute.empty:
        raise CostDataError("cost dataset has no kind='compute' rows")
    timers = _cuda_timers(compute, kinds[0])
    if "events" in timers and len(timers) > 1:
        raise CostDataError(
            f"cost dataset mixes CUDA timers {timers}: 'events' time the host's launches where they outlast the "
            "kernels, 'held' and 'graph' the device's work; profile into a new dataset (or dataset_uri prefix) with a "
            "device timer"
        )
    if "reference_ms" in compute.columns and 0 < compute["reference_ms"].notna().sum() < len(compute):
        raise CostDataError(
            f"cost dataset mixes kernels normalised by the reference kernel ({compute['reference_ms'].notna().sum()} "
            f"compute rows with a 'reference_ms') and timed raw ({compute['reference_ms'].isna().sum()}, profiled with "
            "--no-reference-normalisation): their ms are on different scales; profile into one dataset one way"
        )
    if "tables_json" not in compute.columns:
        raise CostDataError("cost dataset lacks column 'tables_json' for kind='compute' rows")
    costs = compute[["fwd_ms", "bwd_ms"]].to_numpy(dtype=np.float64)
    if not np.all(np.isfinite(costs)) or np.any(costs <= 0):
        raise CostDataError("columns 'fwd_ms'/'bwd_ms' of compute rows must be finite and > 0")
    return kinds[0], sizes[0]


def _cuda_timers(compute: pd.DataFrame, hardware_kind: str) -> list[str]:
    """The CUDA timers a GPU's compute rows were timed with; [] on CPU, where every clock times the same work.
    A GPU's row without a timer is refused: which work its ms hold is unknown."""
    if not hardware_kind.startswith("cuda"):
        return []
    timers = compute["timer"] if "timer" in compute.columns else pd.Series(None, index=compute.index, dtype=object)
    if timers.isna().any():
        raise CostDataError(
            f"cost dataset: {int(timers.isna().sum())} compute rows on {hardware_kind!r} have no 'timer' (profiled by "
            "an older shardwise, their clock unknown): profile into a new dataset (or dataset_uri prefix)"
        )
    return sorted(map(str, timers.unique()))


def compute_samples(df: pd.DataFrame, kernels: tuple[str, ...] = ("fused",)) -> ComputeSamples:
    """Compute rows of shards run by one of `kernels` (default: all in HBM; a row without a kernel ran
    `schema.COMPUTE_DEFAULTS`'s) -> one sample per config_id, fwd/bwd averaged over its repeats."""
    rows = df[df["kind"] == "compute"]
    kernel = rows["kernel"] if "kernel" in rows.columns else pd.Series(None, index=rows.index, dtype=object)
    # the network's table features do not say which kernel runs a table: it trains on shards in HBM, and
    # shards in host memory train the UVM kernels' lines (`lines.fit_uvm_kernel_rows`)
    rows = rows[kernel.fillna(COMPUTE_DEFAULTS["kernel"]).isin(kernels)]
    grouped = rows.groupby("config_id", sort=True).agg(
        tables_json=("tables_json", "first"), fwd_ms=("fwd_ms", "mean"), bwd_ms=("bwd_ms", "mean")
    )
    shards = _parsed_tables(grouped)
    return ComputeSamples(
        tuple(shards), grouped["fwd_ms"].to_numpy(np.float64), grouped["bwd_ms"].to_numpy(np.float64),
        tuple(map(str, grouped.index)),
    )


def _parsed_tables(grouped: pd.DataFrame) -> list[tuple[TableSpec, ...]]:
    """Each row's `tables_json` (indexed by config id) as TableSpecs (rows with the same text share them)."""
    parsed: dict[str, tuple[TableSpec, ...]] = {}
    shards = []
    for cid, text in zip(grouped.index, grouped["tables_json"]):
        if text not in parsed:
            try:
                parsed[text] = tuple(TableSpec.model_validate(t) for t in json.loads(text))
            except (ValueError, TypeError) as err:
                raise CostDataError(f"config {cid}: column 'tables_json' is not a list of tables ({err})") from None
            if not parsed[text]:
                raise CostDataError(f"config {cid}: column 'tables_json' has no tables")
        shards.append(parsed[text])
    return shards


def dense_kernel_samples(df: pd.DataFrame) -> list[MeasuredDenseKernel]:
    """kind='data_parallel' rows (a shard's dense kernel at a device count's local batch) -> (tables, num_devices,
    fwd ms, bwd ms), repeats averaged; [] when the dataset has none (the compute network prices them)."""
    rows = df[df["kind"] == "data_parallel"]
    if rows.empty:
        return []
    if "num_devices" not in rows.columns or rows["num_devices"].isna().any() or (rows["num_devices"] < 1).any():
        raise CostDataError("column 'num_devices' of kind='data_parallel' rows must be a device count >= 1")
    grouped = rows.groupby("config_id", sort=True).agg(
        tables_json=("tables_json", "first"), num_devices=("num_devices", "first"), fwd_ms=("fwd_ms", "mean"),
        bwd_ms=("bwd_ms", "mean"))
    return [(tables, int(d), float(fwd), float(bwd)) for tables, d, fwd, bwd in zip(
        _parsed_tables(grouped), grouped["num_devices"], grouped["fwd_ms"], grouped["bwd_ms"], strict=True)]


@dataclass(frozen=True)
class CommSamples:
    """Per-device all-to-all measurements (repeats averaged): features [M, 7], fwd/bwd ms, layout ids."""

    features: np.ndarray
    costs_ms: np.ndarray
    layout: np.ndarray


def comm_samples(df: pd.DataFrame) -> CommSamples | None:
    """Comm rows -> per-device features and targets (None when the dataset has no comm rows).

    An optional column `compute_ms_json` (per-device compute ms of the layout) feeds the skew feature."""
    rows = df[df["kind"] == "comm"]
    if rows.empty:
        return None
    for col in ("widths_json", "device", "num_devices"):
        if col not in rows.columns:
            raise CostDataError(f"cost dataset lacks column {col!r} for kind='comm' rows")
    agg: dict[str, Any] = {"widths_json": ("widths_json", "first"), "fwd_ms": ("fwd_ms", "mean"), "bwd_ms": ("bwd_ms", "mean")}
    if "compute_ms_json" in rows.columns:
        agg["compute_ms_json"] = ("compute_ms_json", "first")
    grouped = rows.groupby(["config_id", "device"], sort=True).agg(**agg).reset_index()
    feats, costs, layout = [], [], []
    layout_ids = {cid: i for i, cid in enumerate(sorted(grouped["config_id"].unique()))}
    for rec in grouped.itertuples(index=False):
        widths = np.asarray(json.loads(rec.widths_json), dtype=np.float64)
        dev = int(rec.device)
        if not 0 <= dev < len(widths):
            raise CostDataError(f"comm config {rec.config_id}: device {dev} outside widths_json of {len(widths)} devices")
        compute = getattr(rec, "compute_ms_json", None)
        compute_ms = np.asarray(json.loads(compute), dtype=np.float64) if isinstance(compute, str) else np.zeros_like(widths)
        feats.append(comm_features(widths[None], compute_ms[None])[0, dev])
        costs.append((rec.fwd_ms, rec.bwd_ms))
        layout.append(layout_ids[rec.config_id])
    return CommSamples(np.stack(feats), np.asarray(costs, dtype=np.float64), np.asarray(layout))


#: the collectives a dataset's rows measured, and the column of a row's ms (where a training step runs it)
COLLECTIVE_MS_COLUMN = {"all_reduce": "bwd_ms", "reduce_scatter": "fwd_ms", "all_gather": "bwd_ms",
                        "all_to_all": "fwd_ms"}


def all_reduce_points(df: pd.DataFrame, collective: str = "all_reduce") -> list[tuple[int, int, float]]:
    """(num_devices, size_bytes, ms) of each all-reduce (or `collective`: "reduce_scatter") the dataset measured, the
    median over its rows (runs add to one history); [] when it has none."""
    rows = df[df["kind"] == collective]
    if rows.empty:
        return []
    for col in ("num_devices", "size_bytes"):
        if col not in rows.columns or rows[col].isna().any():
            raise CostDataError(f"cost dataset lacks column {col!r} for kind={collective!r} rows")
    column = COLLECTIVE_MS_COLUMN[collective]
    ms = rows.groupby(["num_devices", "size_bytes"], sort=True)[column].median()
    if not np.all(np.isfinite(ms.to_numpy())) or (ms <= 0).any():
        raise CostDataError(f"column {column!r} of {collective} rows must be finite and > 0")
    return [(int(d), int(size), float(v)) for (d, size), v in ms.items()]

def median_reference_ms(df: pd.DataFrame) -> float | None:
    """The rows' median reference-kernel time (None where no row was normalised against one)."""
    if "reference_ms" not in df.columns:
        return None
    ref = pd.to_numeric(df["reference_ms"], errors="coerce")
    ref = ref[ref > 0]
    return float(ref.median()) if len(ref) else None


def on_one_reference(df: pd.DataFrame) -> pd.DataFrame:
    """Kernel rows normalised against different reference calibrations (the profile's workers each calibrate one,
    datasets profiled apart and merged at pretrain) put on one scale: a row's fwd_ms and bwd_ms are its median
    ratios to the reference kernel times its own `reference_ms`, so they are rescaled to the rows' median
    reference_ms, the model's (`ModelMeta.reference_ms`, what plans are timed against). Rows without a reference
    (timed raw: CUDA, collectives) are left as they are."""
    common = median_reference_ms(df)
    if common is None:
        return df
    ref = pd.to_numeric(df["reference_ms"], errors="coerce")
    normalised = ref > 0
    if (ref[normalised] == common).all():
        return df
    scale = (common / ref).where(normalised, 1.0)
    out = df.copy()
    out["fwd_ms"] = out["fwd_ms"] * scale
    out["bwd_ms"] = out["bwd_ms"] * scale
    out.loc[normalised, "reference_ms"] = common
    return out
