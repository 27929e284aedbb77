"""Pre-training the cost model on a cost dataset (early stopping, evaluation on what it never saw) and fine-tuning
it on a task's own shards. What it trains from: `samples` (the dataset's samples), `splits` (train / held-out) and
`lines` (the collectives' and dense kernels' lines)."""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from shardwise.workload import NUM_FEATURES, TableSpec

from .coverage import FeatureRanges
from .evaluate import (
    ComputeSamples,
    evaluate_compute,
    noise_floor_table,
    regression_metrics,
)
from .features import (
    COMM_FEATURE_NAMES,
    NUM_COMM_FEATURES,
    NUM_WORK_CHANNELS,
    TABLE_FEATURE_NAMES,
    FeatureNormaliser,
    TableFeatureCache,
    network_inputs,
)
from .lines import fit_all_reduce_rows, fit_data_parallel_kernel_rows, fit_uvm_kernel_rows
from .model import MIN_MS, ModelMeta, NetworkConfig, NeuralCostModel
from .networks import CommNet, ComputeNet
from .samples import (
    COLLECTIVE_MS_COLUMN,
    CommSamples,
    CostDataError,
    check_cost_frame,
    comm_samples,
    compute_samples,
    dense_kernel_samples,
    median_reference_ms,
    on_one_reference,
)
from .splits import ComputeSplit, pick_heldout_sources, split_comm_layouts, split_compute_samples
from .train_config import HELDOUT_TOP_DECILE_METRIC, TrainConfig

#: the names callers import from here: this module's own, and the samples', splits' and settings' they import beside
#: them
__all__ = [
    "CostDataError",
    "FineTuneReport",
    "TrainConfig",
    "TrainingReport",
    "check_cost_frame",
    "compute_samples",
    "dense_kernel_samples",
    "fine_tune_cost_model",
    "on_one_reference",
    "pick_heldout_sources",
    "train_cost_model",
]


#: the held-out figures a model keeps in its info (name there -> metric)
HELDOUT_FIGURES = {"heldout_mape_pct": "neural_heldout_tables_total_mape_pct",
                   HELDOUT_TOP_DECILE_METRIC: HELDOUT_TOP_DECILE_METRIC}


@dataclass
class TrainingReport:
    """What training did and how well the model does on data it never saw."""

    seed: int
    hardware_kind: str
    batch_size: int
    heldout_sources: tuple[str, ...]
    heldout_num_tables: tuple[int, ...]
    sizes: dict[str, int]
    epochs_run: int
    best_epoch: int
    best_val_loss: float
    evaluation: pd.DataFrame
    metrics: dict[str, float]
    train: ComputeSamples
    test: ComputeSamples
    size_test: ComputeSamples
    single_table_ms: dict[TableSpec, np.ndarray] = field(repr=False, default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _padded(samples: ComputeSamples, features: TableFeatureCache, normaliser: FeatureNormaliser) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, maxT, F] normalised features and [N, maxT, 1] mask."""
    max_tables = max(len(s) for s in samples.shards)
    x = np.zeros((len(samples), max_tables, NUM_FEATURES + NUM_WORK_CHANNELS), dtype=np.float32)
    mask = np.zeros((len(samples), max_tables, 1), dtype=np.float32)
    for i, shard in enumerate(samples.shards):
        x[i, : len(shard)] = network_inputs(features(shard), normaliser)
        mask[i, : len(shard)] = 1.0
    return torch.from_numpy(x), torch.from_numpy(mask)


def _shard_log_ms(net: ComputeNet, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return net.head_log_ms((net.embed(x) * mask).sum(dim=1))


def cost_weights(costs_ms: np.ndarray, power: float) -> np.ndarray:
    """[N, 1] each shard's total measured ms (forward + backward) to `power`, scaled to a mean of 1 (all 1 at 0)."""
    total = np.maximum(np.asarray(costs_ms, dtype=np.float64).reshape(len(costs_ms), -1).sum(axis=1), MIN_MS)
    weights = total**power
    return (weights / (weights.mean() if len(weights) else 1.0)).astype(np.float32)[:, None]


def _squared_error(predicted: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Mean squared error, each sample's weighted by `weight` ([N, 1], mean 1) where given."""
    squared = (predicted - target) ** 2
    return torch.mean(squared if weight is None else weight * squared)


def _fit(
    net: torch.nn.Module,
    predict: Any,
    train_xy: tuple[torch.Tensor, ...],
    val_xy: tuple[torch.Tensor, ...],
    cfg: TrainConfig,
    epochs: int,
    seed: int,
    desc: str,
    deadline: float | None = None,
    weights: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[int, int, float]:
    """Adam on MSE of log costs (each sample's weighted by `weights`, the training and validation samples', where
    given), minibatches in a seeded order, best validation weights restored; stopped early at `deadline` (a
    time.perf_counter() value) when given."""
    device = torch.device(cfg.device)
    net.to(device)
    train_xy = tuple(t.to(device) for t in train_xy)
    val_xy = tuple(t.to(device) for t in val_xy)
    train_w = None if weights is None else torch.from_numpy(weights[0]).to(device)
    val_w = None if weights is None else torch.from_numpy(weights[1]).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=max(cfg.patience // 3, 1))
    gen = torch.Generator().manual_seed(seed)
    n = train_xy[0].shape[0]
    best = (math.inf, 0, copy.deepcopy(net.state_dict()))
    epoch = 0
    bar = tqdm(range(epochs), desc=desc, disable=not cfg.progress, leave=False)
    for epoch in bar:
        net.train()
        for idx in torch.randperm(n, generator=gen).split(cfg.batch_shards):
            idx = idx.to(device)
            *inputs, target = (t[idx] for t in train_xy)
            loss = _squared_error(predict(*inputs), target, None if train_w is None else train_w[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            *inputs, target = val_xy
            val = float(_squared_error(predict(*inputs), target, val_w))
        sched.step(val)
        if val < best[0]:
            best = (val, epoch, copy.deepcopy(net.state_dict()))
        bar.set_postfix(val_log_mse=f"{val:.4f}", best=f"{best[0]:.4f}")
        if epoch - best[1] >= cfg.patience or (deadline is not None and time.perf_counter() >= deadline):
            break
    net.load_state_dict(best[2])
    net.to("cpu").eval()
    return epoch + 1, best[1], best[0]


def _inputs_and_targets(samples: ComputeSamples, features: TableFeatureCache, normaliser: FeatureNormaliser,
                        log_offset: np.ndarray) -> tuple[torch.Tensor, ...]:
    """`samples` as the compute network's inputs, mask and targets (log ms less `log_offset`)."""
    x, mask = _padded(samples, features, normaliser)
    return x, mask, torch.from_numpy((np.log(np.maximum(samples.costs_ms, MIN_MS)) - log_offset).astype(np.float32))


def train_cost_model(
    df: pd.DataFrame, seed: int, config: TrainConfig | None = None
) -> tuple[NeuralCostModel, TrainingReport]:
    """Train compute (and, if the data has comm rows, communication) networks and fit the all-reduce and
    reduce-scatter lines (if it has rows of those kinds: data-parallel and row-wise tables are priced with them);
    evaluate on held-out tables, layouts and sizes."""
    cfg = config or TrainConfig()
    hardware_kind, batch_size = check_cost_frame(df)
    df = on_one_reference(df)
    torch.manual_seed(seed)
    samples = compute_samples(df)
    split = split_compute_samples(samples, seed, holdout_sources=cfg.holdout_sources,
                                  holdout_fraction=cfg.holdout_fraction, holdout_num_tables=cfg.holdout_num_tables,
                                  val_fraction=cfg.val_fraction)
    net_cfg = NetworkConfig(cfg.hidden, cfg.layers, cfg.head_layers, cfg.comm_hidden)
    compute = _fit_compute(split, batch_size, net_cfg, cfg, seed)
    comm = comm_samples(df)
    comm_fit = None if comm is None else _fit_comm(comm, net_cfg, cfg, seed)
    model = _assembled_model(compute, comm_fit, net_cfg, df, hardware_kind, batch_size, seed, split)
    line_evaluations = _fit_lines(model, df, hardware_kind, cfg.holdout_sources or ())
    model.uvm_kernels, uvm_evaluation = fit_uvm_kernel_rows(df, model, split.heldout_sources)
    line_evaluations.append(uvm_evaluation)
    single = {s[0]: c for s, c in zip(samples.shards, samples.costs_ms) if len(s) == 1}
    evaluation = _evaluation(model, df, split, comm_fit, line_evaluations, single)
    metrics = _metrics(evaluation)
    # the held-out figures travel with the model (cost_model.json), for the reports of the plans it prices
    model.meta.info.update({name: metrics[key] for name, key in HELDOUT_FIGURES.items() if key in metrics})
    report = TrainingReport(
        seed=seed, hardware_kind=hardware_kind, batch_size=batch_size, heldout_sources=split.heldout_sources,
        heldout_num_tables=split.heldout_num_tables,
        sizes={"train": len(split.train), "val": len(split.val), "test": len(split.test),
               "size_test": len(split.size_test), "row_block_test": len(split.row_block_test),
               "comm_rows": 0 if comm is None else len(comm.layout),
               **{f"{c}_points": len(line.points) if (line := getattr(model, c)) else 0 for c in COLLECTIVE_MS_COLUMN},
               "dense_kernels": model.data_parallel_kernel.measured if model.data_parallel_kernel else 0,
               "uvm_kernel_shards": sum(line.num_shards for line in model.uvm_kernels.values())},
        epochs_run=compute.epochs_run, best_epoch=compute.best_epoch, best_val_loss=compute.best_val_loss,
        evaluation=evaluation, metrics=metrics, train=split.train, test=split.test, size_test=split.size_test,
        single_table_ms=single, notes=list(split.notes),
    )
    return model, report


@dataclass(frozen=True)
class _ComputeFit:
    """The compute network trained, with its feature normaliser, log offset and training ranges."""

    net: ComputeNet
    normaliser: FeatureNormaliser
    log_offset: np.ndarray
    feature_ranges: FeatureRanges
    epochs_run: int
    best_epoch: int
    best_val_loss: float


def _fit_compute(split: ComputeSplit, batch_size: int, net_cfg: NetworkConfig, cfg: TrainConfig,
                 seed: int) -> _ComputeFit:
    """The compute network trained on the training shards' log ms (less their mean), stopped early on the
    validation shards'."""
    train = split.train
    features = TableFeatureCache(batch_size)
    unique_train = list(dict.fromkeys(t for s in train.shards for t in s))
    normaliser = FeatureNormaliser.fit(features(unique_train), TABLE_FEATURE_NAMES)
    log_train = np.log(np.maximum(train.costs_ms, MIN_MS))
    offset = log_train.mean(axis=0)
    net = ComputeNet(NUM_FEATURES, net_cfg.hidden, net_cfg.layers, net_cfg.head_layers, NUM_WORK_CHANNELS)
    weights = (cost_weights(train.costs_ms, cfg.cost_weight_power), cost_weights(split.val.costs_ms, cfg.cost_weight_power))
    epochs_run, best_epoch, best_val = _fit(
        net, lambda x, m: _shard_log_ms(net, x, m), _inputs_and_targets(train, features, normaliser, offset),
        _inputs_and_targets(split.val, features, normaliser, offset), cfg, cfg.epochs, seed, "compute model",
        weights=weights,
    )
    ranges = FeatureRanges.of_training(features(unique_train), [len(s) for s in train.shards], batch_size)
    return _ComputeFit(net, normaliser, offset, ranges, epochs_run, best_epoch, best_val)


@dataclass(frozen=True)
class _CommFit:
    """The communication network trained on a dataset's all-to-alls, with its normaliser, log offset and the rows
    of the layouts it held out."""

    samples: CommSamples
    net: CommNet
    normaliser: FeatureNormaliser
    log_offset: np.ndarray
    test: np.ndarray


def _fit_comm(comm: CommSamples, net_cfg: NetworkConfig, cfg: TrainConfig, seed: int) -> _CommFit:
    """The communication network trained on the training layouts' per-device log ms (less their mean), stopped
    early on the validation layouts'."""
    is_train, is_val, is_test = split_comm_layouts(comm.layout, seed + 1, cfg.holdout_fraction, cfg.val_fraction)
    comm_norm = FeatureNormaliser.fit(comm.features[is_train], COMM_FEATURE_NAMES)
    comm_log = np.log(np.maximum(comm.costs_ms, MIN_MS))
    comm_offset = comm_log[is_train].mean(axis=0)
    comm_net = CommNet(NUM_COMM_FEATURES, net_cfg.comm_hidden, net_cfg.comm_layers)

    def cxy(mask: np.ndarray) -> tuple[torch.Tensor, ...]:
        return (torch.from_numpy(comm_norm(comm.features[mask])),
                torch.from_numpy((comm_log[mask] - comm_offset).astype(np.float32)))

    _fit(comm_net, comm_net, cxy(is_train), cxy(is_val if is_val.any() else is_train), cfg, cfg.comm_epochs, seed + 1, "comm model")
    return _CommFit(comm, comm_net, comm_norm, comm_offset, is_test)


def _assembled_model(compute: _ComputeFit, comm: _CommFit | None, net_cfg: NetworkConfig, df: pd.DataFrame,
                     hardware_kind: str, batch_size: int, seed: int, split: ComputeSplit) -> NeuralCostModel:
    """The trained networks as one model, with what it was trained on and at."""
    comm_offset = np.zeros(2) if comm is None else comm.log_offset
    meta = ModelMeta(
        hardware_kind=hardware_kind,
        batch_size=batch_size,
        reference_ms=median_reference_ms(df),
        compute_log_offset=(float(compute.log_offset[0]), float(compute.log_offset[1])),
        comm_log_offset=(float(comm_offset[0]), float(comm_offset[1])),
        info={"seed": seed, "train_shards": len(split.train), "heldout_sources": len(split.heldout_sources),
              "torch": torch.__version__},
        feature_ranges=compute.feature_ranges,
    )
    return NeuralCostModel(compute.net, compute.normaliser, meta, net_cfg, None if comm is None else comm.net,
                           None if comm is None else comm.normaliser)


def _fit_lines(model: NeuralCostModel, df: pd.DataFrame, hardware_kind: str,
               heldout_sources: tuple[str, ...]) -> list[pd.DataFrame]:
    """The collectives' and the data-parallel kernel's lines fitted to the dataset's rows of their kinds and set on
    `model` (None where it has too few); their evaluations."""
    collective_evaluations = []
    for collective in COLLECTIVE_MS_COLUMN:  # all_reduce, reduce_scatter, all_gather, all_to_all: model attributes
        line, evaluation = fit_all_reduce_rows(df, hardware_kind, collective)
        setattr(model, collective, line)
        collective_evaluations.append(evaluation)
    model.data_parallel_kernel, dense_evaluation = fit_data_parallel_kernel_rows(df, model, heldout_sources)
    collective_evaluations.append(dense_evaluation)
    return collective_evaluations


def _evaluation(model: NeuralCostModel, df: pd.DataFrame, split: ComputeSplit, comm: _CommFit | None,
                line_evaluations: list[pd.DataFrame], single: dict[TableSpec, np.ndarray]) -> pd.DataFrame:
    """One table of the model's errors on each held-out split, beside the baselines, the measurements' noise floor
    and the lines' evaluations; a unique label a row."""
    train = split.train
    frames = [evaluate_compute(model, train, split.test, single_table_ms=single)]
    if len(split.size_test):
        frames.append(evaluate_compute(model, train, split.size_test, single_table_ms=single,
                                       split=f"held-out sizes {list(split.heldout_num_tables)}", baselines=False))
    if len(split.row_block_test):
        frames.append(evaluate_compute(model, train, split.row_block_test, single_table_ms=single,
                                       split="held-out row blocks", baselines=False))
    frames.append(noise_floor_table(df[df["kind"] == "compute"]))
    frames.append(noise_floor_table(df[df["kind"] == "data_parallel"], split="dense kernel repeats"))
    if comm is not None and comm.test.any():
        features = comm.samples.features[comm.test]
        pred = np.exp(comm.net(torch.from_numpy(comm.normaliser(features))).detach().numpy() + comm.log_offset)
        meas = comm.samples.costs_ms[comm.test]
        frames.append(pd.DataFrame([
            {"split": "held-out layouts", "method": "neural_comm", "target": k, "n": int(comm.test.sum()),
             **regression_metrics(pred[:, j], meas[:, j]), "note": "per device"}
            for j, k in enumerate(("fwd", "bwd"))
        ]))
    frames += line_evaluations
    evaluation = pd.concat([f for f in frames if not f.empty], ignore_index=True)
    # a unique first column: pipelines flatten the table to `<label>_<column>` metrics
    evaluation.insert(0, "label", [_label(r.method, r.split, r.target) for r in evaluation.itertuples(index=False)])
    return evaluation


@dataclass(frozen=True)
class FineTuneReport:
    """What fine-tuning on a task's own shards did: how many it learned from and its error on the ones it left out
    (forward + backward ms), before and after."""

    train_shards: int
    heldout_shards: int
    heldout_mape_before_pct: float
    heldout_mape_after_pct: float
    epochs_run: int

    @property
    def improved(self) -> bool:
        """Whether the fine-tuned model predicts the held-out shards better than the model it started from."""
        return self.heldout_mape_after_pct < self.heldout_mape_before_pct


def fine_tune_cost_model(model: NeuralCostModel, samples: ComputeSamples, seed: int, *, epochs: int = 300,
                         lr: float = 1e-3, heldout_fraction: float = 0.25, time_budget_s: float | None = None,
                         ) -> tuple[NeuralCostModel, FineTuneReport]:
    """The compute network trained on from its weights on `samples` (shards of a task's own tables, measured at
    the model's batch and reference), its normalisers, offsets and communication network kept; a random
    `heldout_fraction` of the shards picks the best epoch and measures the error before and after; training stops
    after `time_budget_s` seconds if given. The new model's ranges take in the samples' tables."""
    start = time.perf_counter()
    if len(samples) < 4:
        raise CostDataError(f"only {len(samples)} measured shards to fine-tune on: give adaptation more time")
    torch.manual_seed(seed)
    perm = np.random.default_rng(seed).permutation(len(samples))
    n_held = max(1, round(heldout_fraction * len(samples)))
    held, train = samples.subset(perm[:n_held]), samples.subset(perm[n_held:])
    features = TableFeatureCache(model.batch_size)
    offset = np.asarray(model.meta.compute_log_offset)
    net = copy.deepcopy(model.compute_net)
    cfg = TrainConfig(lr=lr, patience=max(10, epochs // 10), batch_shards=32, progress=False)
    epochs_run, _, _ = _fit(net, lambda x, m: _shard_log_ms(net, x, m),
                            _inputs_and_targets(train, features, model.normaliser, offset),
                            _inputs_and_targets(held, features, model.normaliser, offset), cfg, epochs, seed,
                            "fine-tune", None if time_budget_s is None else start + time_budget_s)
    seen = list(dict.fromkeys(t for shard in samples.shards for t in shard))
    ranges = FeatureRanges.of_training(features(seen), [len(s) for s in samples.shards], model.batch_size)
    meta = dataclasses.replace(
        model.meta, info={**model.meta.info, "fine_tuned_shards": len(samples)},
        feature_ranges=model.meta.feature_ranges.union(ranges))
    tuned = NeuralCostModel(net, model.normaliser, meta, model.config, model.comm_net, model.comm_normaliser)
    for collective in COLLECTIVE_MS_COLUMN:  # measured on the same hardware; fine-tuning touches the kernels only
        setattr(tuned, collective, getattr(model, collective))
    tuned.data_parallel_kernel = model.data_parallel_kernel
    measured = held.costs_ms.sum(axis=1)

    def mape(m: NeuralCostModel) -> float:
        predicted = m.predict_compute([list(s) for s in held.shards]).sum(axis=1)
        return float(np.mean(np.abs(predicted - measured) / measured) * 100)

    report = FineTuneReport(train_shards=len(train), heldout_shards=len(held), heldout_mape_before_pct=mape(model),
                            heldout_mape_after_pct=mape(tuned), epochs_run=epochs_run)
    return tuned, report


def _label(method: str, split: str, target: str) -> str:
    """`neural_heldout_tables_total`: method, split (without the size list) and target as one metric stem."""
    slug = split.split(" [")[0].replace("held-out ", "heldout_").replace(" ", "_").replace("-", "_")
    return f"{method}_{slug}_{target}"


def _metrics(evaluation: pd.DataFrame) -> dict[str, float]:
    """Flat metric names for tracking: `<method>_<split>_<target>_<metric>`, plus the noise ratio."""
    out: dict[str, float] = {}
    for rec in evaluation.itertuples(index=False):
        for m in ("mape_pct", "top_decile_mape_pct", "rmse_ms", "spearman"):
            value = float(getattr(rec, m))
            if math.isfinite(value):
                out[f"{rec.label}_{m}"] = value
    top_decile = out.get("neural_heldout_tables_total_top_decile_mape_pct")
    if top_decile is not None:  # the figure the gate and the summaries name
        out[HELDOUT_TOP_DECILE_METRIC] = top_decile
    model_mape = out.get("neural_heldout_tables_total_mape_pct")
    noise_mape = out.get("noise_floor_repeats_total_mape_pct")
    if model_mape is not None and noise_mape:
        out["neural_over_noise_mape_ratio"] = model_mape / noise_mape
    return out
