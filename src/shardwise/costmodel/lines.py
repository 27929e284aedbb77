"""The lines fitted to a cost dataset's measured collectives and dense kernels (the analytic prices of
`data_parallel`), each evaluated held out."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pandas as pd

from .caching import UVM_KERNELS, HostMemoryCostModel, KernelLine, fit_kernel_lines, in_hbm
from .data_parallel import (
    AllReduceCost,
    DataParallelKernelCost,
    fit_all_reduce,
    fit_data_parallel_kernel,
    heldout_all_reduce_errors,
    heldout_data_parallel_kernel_errors,
    local_batch_table,
)
from .evaluate import regression_metrics, torchrec_estimates
from .model import NeuralCostModel
from .samples import all_reduce_points, compute_samples, dense_kernel_samples
from .splits import shard_sources

#: fewest measured dense kernels a model fits its data-parallel kernel line to (with fewer, the compute network
#: prices them: `costmodel.data_parallel`)
MIN_DENSE_KERNELS = 10


def fit_data_parallel_kernel_rows(df: pd.DataFrame, model: NeuralCostModel, heldout_sources: Collection[str] = (),
                                  ) -> tuple[DataParallelKernelCost | None, pd.DataFrame]:
    """The data-parallel kernel's line fitted to the dataset's measured dense kernels (None with fewer than
    MIN_DENSE_KERNELS) and its evaluation, beside the compute network's price of the same kernels (the fused kernel at
    pooling / D, what `model` would price them with otherwise). Where the dataset has dense kernels of the held-out
    tables alone (`heldout_sources`, given: a held-out profile's) and enough of the rest, the line is fitted to the
    rest and evaluated on them, as the compute network is; else 5-fold held-out over every kernel."""
    measured = dense_kernel_samples(df)
    held_set = set(heldout_sources)
    apart = [m for m in measured if shard_sources(m[0]) <= held_set]
    rest = [m for m in measured if not shard_sources(m[0]) & held_set]
    if apart and len(rest) >= MIN_DENSE_KERNELS:
        fitted = fit_data_parallel_kernel(rest, model.batch_size, hardware_kind=model.hardware_kind)
        predicted_ms = np.array([fitted.predict_ms(tables, d) for tables, d, _, _ in apart])
        held = np.array([(m[2], p[0], m[3], p[1]) for m, p in zip(apart, predicted_ms, strict=True)])
        evaluated, how = apart, "held-out tables' dense kernels, the line fitted to the training tables'"
    elif len(measured) >= MIN_DENSE_KERNELS:
        fitted = fit_data_parallel_kernel(measured, model.batch_size, hardware_kind=model.hardware_kind)
        held = np.array(heldout_data_parallel_kernel_errors(measured, model.batch_size))  # [N, measured/predicted x 2]
        evaluated, how = measured, "5-fold: each kernel predicted by the line fitted to the other folds"
    else:
        return None, pd.DataFrame()
    network = np.asarray(model.predict_compute([[local_batch_table(t, d) for t in tables]
                                                for tables, d, _, _ in evaluated]), dtype=np.float64)
    ms = np.array([(fwd, bwd) for *_, fwd, bwd in evaluated])
    rows = []
    for method, split, predicted, truth, note in (
        ("data_parallel_kernel_line", "held-out dense kernels", held[:, [1, 3]], held[:, [0, 2]], how),
        ("data_parallel_kernel_network", "dense kernels", network, ms,
         "the compute network at pooling / devices (models profiled without dense kernels)"),
    ):
        for j, target in enumerate(("fwd", "bwd")):
            rows.append({"split": split, "method": method, "target": target, "n": len(truth),
                         **regression_metrics(predicted[:, j], truth[:, j]), "note": note})
        rows.append({"split": split, "method": method, "target": "total", "n": len(truth),
                     **regression_metrics(predicted.sum(axis=1), truth.sum(axis=1)), "note": note})
    return fitted, pd.DataFrame(rows)


#: what each collective prices, in the evaluation's notes
_COLLECTIVE_USE = {"all_reduce": "data-parallel gradient all-reduce", "reduce_scatter": "row-wise outputs' reduce-scatter",
                   "all_gather": "row-wise gradients' all-gather", "all_to_all": "row-wise ids' all-to-all"}


def fit_all_reduce_rows(df: pd.DataFrame, hardware_kind: str,
                        collective: str = "all_reduce") -> tuple[AllReduceCost | None, pd.DataFrame]:
    """The all-reduce (or `collective`) lines fitted to the dataset's rows of that kind (None without two of them)
    and their held-out evaluation: each size left out in turn and predicted by the lines through the rest, per device
    count, for the line of each device count (what the model stores) and for one line over every device count."""
    points = all_reduce_points(df, collective)
    if len(points) < 2:
        return None, pd.DataFrame()
    backends = sorted(map(str, df.loc[df["kind"] == collective, "backend"].dropna().unique()))
    fitted = fit_all_reduce(points, backend=",".join(backends), hardware_kind=hardware_kind, collective=collective)
    rows = []
    if len({size for _, size, _ in points}) >= 3:  # two sizes left after one is held out
        for method, per_count in ((f"{collective}_lines", True), (f"{collective}_one_line", False)):
            errors = heldout_all_reduce_errors(points, per_device_count=per_count, collective=collective)
            for count in sorted({d for d, *_ in errors}):
                mine = [(ms, pred) for d, _, ms, pred in errors if d == count]
                rows.append({
                    "split": "held-out sizes", "method": method, "target": f"{count}_devices", "n": len(mine),
                    **regression_metrics(np.array([p for _, p in mine]), np.array([m for m, _ in mine])),
                    "note": (f"{_COLLECTIVE_USE[collective]}, each size left out; "
                             + ("one line per device count" if per_count else "one line over every device count")),
                })
    return fitted, pd.DataFrame(rows)


def fit_uvm_kernel_rows(df: pd.DataFrame, model: NeuralCostModel, heldout_sources: Collection[str] = (),
                        ) -> tuple[dict[str, KernelLine], pd.DataFrame]:
    """Per UVM kernel, the line fitted to the dataset's shards on it of the training tables (`caching.py`; none with
    fewer than its MIN_SHARDS) and, where the held-out tables have shards on it, its error on them beside the
    network's HBM price of the same shards and TorchRec's estimator (scaled to this machine by its median ratio on
    the training shards)."""
    samples = compute_samples(df, UVM_KERNELS)
    if not len(samples):
        return {}, pd.DataFrame()
    held_set = set(heldout_sources)
    held = np.array([shard_sources(s) <= held_set for s in samples.shards])
    kernels = np.array(["fused_uvm_caching" if any(t.compute_kernel == "fused_uvm_caching" for t in s) else "fused_uvm"
                        for s in samples.shards])
    train = np.flatnonzero(~held)
    lines = fit_kernel_lines(model, [samples.shards[i] for i in train], samples.fwd_ms[train], samples.bwd_ms[train],
                             model.batch_size)
    if not lines or not held.any():
        return lines, pd.DataFrame()
    priced = HostMemoryCostModel(model, lines)
    measured = np.stack([samples.fwd_ms, samples.bwd_ms], axis=1)
    ours = priced.predict_compute(samples.shards)
    in_hbm_ms = np.asarray(model.predict_compute([[in_hbm(t) for t in s] for s in samples.shards]), dtype=np.float64)
    torchrec = torchrec_estimates(samples.shards, model.batch_size)
    rows = []
    for kernel in lines:
        test, fit = held & (kernels == kernel), ~held & (kernels == kernel)
        if not test.any():
            continue
        scale = np.median(measured[fit] / np.maximum(torchrec[fit], 1e-12), axis=0)
        for method, predicted, note in (
            ("uvm_kernel_line", ours[test], "the network's HBM price plus the kernel's line in GB read from host"),
            ("network_in_hbm", in_hbm_ms[test], "the network's price of the same shards in HBM"),
            ("torchrec_estimator", scale * torchrec[test], "TorchRec's estimator, scaled by its median ratio"),
        ):
            truth = measured[test]
            for j, target in enumerate(("fwd", "bwd")):
                rows.append({"split": f"held-out {kernel} shards", "method": method, "target": target,
                             "n": len(truth), **regression_metrics(predicted[:, j], truth[:, j]), "note": note})
            rows.append({"split": f"held-out {kernel} shards", "method": method, "target": "total", "n": len(truth),
                         **regression_metrics(predicted.sum(axis=1), truth.sum(axis=1)), "note": note})
    return lines, pd.DataFrame(rows)
