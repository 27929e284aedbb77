"""Honest accuracy: the neural model next to TorchRec's analytical estimator, an additive baseline and the
measurement noise floor, on shards built from tables the model never saw."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from shardwise.workload import TableSpec

from .types import CostModel

log = logging.getLogger(__name__)

Shard = tuple[TableSpec, ...]
TARGETS = ("fwd", "bwd", "total")
EVAL_COLUMNS = ("split", "method", "target", "n", "mape_pct", "top_decile_mape_pct", "rmse_ms", "spearman", "note")
#: the share of shards, the costliest by measured ms, that `top_decile_mape_pct` is taken over: the slowest device
#: sets a plan's cost, so the error on the costliest shards is the one that decides a plan
TOP_SHARE = 0.1


@dataclass(frozen=True)
class ComputeSamples:
    """Measured shards, repeats averaged: tables, forward and backward ms, and how many repeats went in."""

    shards: tuple[Shard, ...]
    fwd_ms: np.ndarray
    bwd_ms: np.ndarray
    config_ids: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.shards)

    @property
    def costs_ms(self) -> np.ndarray:
        """[N, 2] forward and backward ms."""
        return np.stack([self.fwd_ms, self.bwd_ms], axis=1)

    def subset(self, index: Sequence[int] | np.ndarray) -> ComputeSamples:
        """The samples at `index`, in that order."""
        idx = np.asarray(index, dtype=np.int64)
        ids = tuple(self.config_ids[i] for i in idx) if self.config_ids else ()
        return ComputeSamples(tuple(self.shards[i] for i in idx), self.fwd_ms[idx], self.bwd_ms[idx], ids)


def top_decile_mape_pct(predicted: np.ndarray, measured: np.ndarray) -> float:
    """MAPE (%) over the costliest `TOP_SHARE` of the shards by `measured` ms (at least one); NaN when empty."""
    predicted = np.asarray(predicted, dtype=np.float64)
    measured = np.asarray(measured, dtype=np.float64)
    if measured.size == 0:
        return float("nan")
    top = np.argsort(-measured, kind="stable")[: max(1, math.ceil(TOP_SHARE * measured.size))]
    return float(np.mean(np.abs(predicted[top] - measured[top]) / np.maximum(np.abs(measured[top]), 1e-9)) * 100)


def regression_metrics(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """MAPE (%), MAPE over the costliest tenth by measured ms (%), RMSE (ms) and Spearman rank correlation of
    `predicted` against `measured`."""
    predicted = np.asarray(predicted, dtype=np.float64)
    measured = np.asarray(measured, dtype=np.float64)
    if predicted.shape != measured.shape:
        raise ValueError(f"predicted shape {predicted.shape} differs from measured shape {measured.shape}")
    if measured.size == 0:
        return {"mape_pct": float("nan"), "top_decile_mape_pct": float("nan"), "rmse_ms": float("nan"),
                "spearman": float("nan")}
    mape = float(np.mean(np.abs(predicted - measured) / np.maximum(np.abs(measured), 1e-9)) * 100)
    rmse = float(np.sqrt(np.mean((predicted - measured) ** 2)))
    rho = float(spearmanr(predicted, measured).statistic) if measured.size > 2 else float("nan")
    return {"mape_pct": mape, "top_decile_mape_pct": top_decile_mape_pct(predicted, measured), "rmse_ms": rmse,
            "spearman": rho}


def heldout_mape_pct(model: CostModel, samples: ComputeSamples, scale: float = 1.0) -> float:
    """MAPE (%) of `model`'s predicted total (forward + backward) compute ms on `samples`; NaN when empty.

    What the registry's promotion gate compares two cost models on (the same held-out shards). `scale` puts the
    model's ms in the samples' units: reference-normalised timings are ratios to a reference kernel times the
    reference's time when the profile was calibrated, so a model trained on a profile calibrated at another
    reference time predicts in other units (the samples' reference_ms over the model's)."""
    return heldout_metrics(model, samples, scale)["mape_pct"]


def heldout_metrics(model: CostModel, samples: ComputeSamples, scale: float = 1.0) -> dict[str, float]:
    """`regression_metrics` of `model`'s predicted total compute ms (times `scale`) on `samples`; NaN when empty."""
    if not len(samples):
        return regression_metrics(np.zeros(0), np.zeros(0))
    predicted = scale * np.asarray(model.predict_compute(samples.shards)).sum(axis=1)
    return regression_metrics(predicted, samples.costs_ms.sum(axis=1))


def _with_total(costs_ms: np.ndarray) -> dict[str, np.ndarray]:
    return {"fwd": costs_ms[:, 0], "bwd": costs_ms[:, 1], "total": costs_ms.sum(axis=1)}


def _median_scale(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Per-column median of measured/predicted: the one factor that puts an estimate in this machine's ms."""
    ok = np.all(predicted > 0, axis=1)
    if not ok.any():
        return np.ones(predicted.shape[1])
    return np.median(measured[ok] / predicted[ok], axis=0)


def torchrec_estimates(shards: Sequence[Sequence[TableSpec]], batch_size: int, *, sharding_type: str = "table_wise",
                       world_size: int = 2, comms: bool = False) -> np.ndarray:
    """[N, 2] TorchRec `EmbeddingPerfEstimator` fwd/bwd compute ms, table-wise and fused (a table in host memory on
    its UVM kernel, which TorchRec prices by its cache's load factor), summed per shard.

    TorchRec models a device's compute as the sum of its shards' estimates (no fused-kernel sharing), for
    a GPU: absolute values are not this machine's milliseconds, so callers fit a scale. `sharding_type` (TorchRec's
    word; "data_parallel" runs the dense kernel, the others the fused one) over `world_size` devices: the first
    device's shard of each table; with `comms`, its fwd / bwd communication added (a data-parallel table's gradient
    all-reduce, a row-wise table's output reduce-scatter and ids' all-to-all, ...)."""
    # torchrec: heavy (seconds to import), needed only for this comparison
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator
    from torchrec.distributed.planner.types import ParameterConstraints, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    unique = list(dict.fromkeys(t for shard in shards for t in shard))
    names = [f"t{i}" for i in range(len(unique))]
    configs = [
        EmbeddingBagConfig(name=n, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[f"f_{n}"])
        for n, t in zip(names, unique)
    ]
    from torchrec.distributed.types import CacheParams

    # a table in host memory (`TableSpec.compute_kernel`) on its UVM kernel, its cache's load factor as TorchRec's
    constraints = {
        n: ParameterConstraints(
            sharding_types=[sharding_type],
            compute_kernels=[t.compute_kernel or ("dense" if sharding_type == "data_parallel" else "fused")],
            pooling_factors=[max(t.pooling_factor, 1e-3)],
            cache_params=CacheParams(load_factor=t.cache_load_factor) if t.cache_load_factor is not None else None,
        )
        for n, t in zip(names, unique)
    }
    # it warns that the topology was built directly: on purpose, an estimator needs no real hardware
    logging.getLogger("torchrec.distributed.planner.types").setLevel(logging.ERROR)
    # compute_device="cuda": TorchRec's perf model is a GPU model; world_size 2 so table-wise is offered
    topology = Topology(world_size=world_size, compute_device="cuda")
    estimator = EmbeddingPerfEstimator(topology=topology, constraints=constraints)
    enumerator = EmbeddingEnumerator(topology, batch_size, constraints=constraints, estimator=estimator)
    per_table: dict[str, tuple[float, float]] = {}
    if unique:
        ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        for option in enumerator.enumerate(ebc, [EmbeddingBagCollectionSharder()]):  # type: ignore[list-item]
            perf = option.shards[0].perf
            assert perf is not None
            # TorchRec's unit is seconds
            per_table[option.name] = ((perf.fwd_compute + comms * perf.fwd_comms) * 1e3,
                                      (perf.bwd_compute + comms * perf.bwd_comms) * 1e3)
    index = {t: n for n, t in zip(names, unique)}
    out = np.zeros((len(shards), 2))
    for i, shard in enumerate(shards):
        for t in shard:
            out[i] += per_table[index[t]]
    return out


def additive_estimates(
    shards: Sequence[Sequence[TableSpec]], single_table_ms: Mapping[TableSpec, np.ndarray], model: CostModel
) -> np.ndarray:
    """[N, 2] sum of each table's cost alone: measured where the dataset has it, else the model's prediction."""
    missing = list(dict.fromkeys(t for shard in shards for t in shard if t not in single_table_ms))
    predicted = dict(zip(missing, model.predict_compute([[t] for t in missing]))) if missing else {}
    out = np.zeros((len(shards), 2))
    for i, shard in enumerate(shards):
        for t in shard:
            out[i] += single_table_ms[t] if t in single_table_ms else predicted[t]
    return out


def noise_floor_rows(compute_df: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Metrics of repeated measurements (repeat >= 1) against the first (repeat 0) of the same config."""
    first = compute_df[compute_df["repeat"] == 0].drop_duplicates("config_id").set_index("config_id")
    later = compute_df[(compute_df["repeat"] >= 1) & compute_df["config_id"].isin(first.index)]
    if later.empty:
        return {}
    base = first.loc[later["config_id"]]
    m = np.stack([base["fwd_ms"].to_numpy(), base["bwd_ms"].to_numpy()], axis=1)
    r = np.stack([later["fwd_ms"].to_numpy(), later["bwd_ms"].to_numpy()], axis=1)
    return {k: regression_metrics(_with_total(r)[k], _with_total(m)[k]) | {"n": float(len(later))} for k in TARGETS}


def evaluate_compute(
    model: CostModel,
    train: ComputeSamples,
    test: ComputeSamples,
    *,
    single_table_ms: Mapping[TableSpec, np.ndarray],
    split: str = "held-out tables",
    baselines: bool = True,
) -> pd.DataFrame:
    """Evaluation rows (EVAL_COLUMNS) for the neural model and, if `baselines`, TorchRec and additive."""
    rows: list[dict[str, object]] = []
    measured = _with_total(test.costs_ms)

    def add(method: str, costs_ms: np.ndarray, note: str, targets: Sequence[str] = TARGETS) -> None:
        pred = _with_total(costs_ms)
        for k in targets:
            rows.append({"split": split, "method": method, "target": k, "n": len(test), **regression_metrics(pred[k], measured[k]), "note": note})

    add("neural", model.predict_compute(test.shards) if len(test) else np.zeros((0, 2)), "")
    if baselines and len(test):
        try:
            tr_train = torchrec_estimates(train.shards, model.batch_size)
            tr_test = torchrec_estimates(test.shards, model.batch_size)
            scale = _median_scale(tr_train, train.costs_ms)
            add("torchrec_estimator", tr_test * scale, "scale fitted on train (MAPE, RMSE); Spearman unaffected")
        except Exception as err:  # TorchRec is a baseline: report its absence rather than fail training
            log.warning("TorchRec estimator baseline failed: %s", err)
            rows.append({"split": split, "method": "torchrec_estimator", "target": "total", "n": 0, "mape_pct": float("nan"),
                         "rmse_ms": float("nan"), "spearman": float("nan"), "note": f"failed: {err}"})
        add_train = additive_estimates(train.shards, single_table_ms, model)
        add_test = additive_estimates(test.shards, single_table_ms, model)
        scale = _median_scale(add_train, train.costs_ms)
        add("additive", add_test * scale, "sum of single-table costs (measured, else predicted); scale fitted on train")
    return pd.DataFrame(rows, columns=list(EVAL_COLUMNS))


def noise_floor_table(compute_df: pd.DataFrame, split: str = "repeats") -> pd.DataFrame:
    """Evaluation rows for the noise floor (repeated measurements vs the first one) of `compute_df`'s kernels (the
    shards', or with `split` "dense kernel repeats", data-parallel tables' dense kernels)."""
    rows = [
        {"split": split, "method": "noise_floor", "target": k, "n": int(v.pop("n")), **v,
         "note": "repeat >= 1 vs repeat 0 of the same config"}
        for k, v in noise_floor_rows(compute_df).items()
    ]
    return pd.DataFrame(rows, columns=list(EVAL_COLUMNS))


def format_table(table: pd.DataFrame) -> str:
    """The evaluation table as aligned text for the terminal."""
    shown = table.drop(columns=["label"], errors="ignore")
    for col, fmt in (("mape_pct", "{:.2f}"), ("top_decile_mape_pct", "{:.2f}"), ("rmse_ms", "{:.4f}"), ("spearman", "{:.4f}")):
        shown[col] = shown[col].map(lambda v, f=fmt: "-" if pd.isna(v) else f.format(v))
    return shown.to_string(index=False)
