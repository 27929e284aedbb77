"""Pre-training the cost model on a cost dataset: generalisation splits, early stopping, evaluation."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm.auto import tqdm

from shardwise.errors import ShardwiseError
from shardwise.workload import NUM_FEATURES, TableSpec

from .coverage import FeatureRanges
from .data_parallel import (
    AllReduceCost,
    DataParallelKernelCost,
    MeasuredDenseKernel,
    fit_all_reduce,
    fit_data_parallel_kernel,
    heldout_all_reduce_errors,
    heldout_data_parallel_kernel_errors,
    local_batch_table,
)
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
    comm_features,
    network_inputs,
)
from .model import MIN_MS, ModelMeta, NetworkConfig, NeuralCostModel
from .networks import CommNet, ComputeNet

REQUIRED_COLUMNS = ("kind", "config_id", "repeat", "fwd_ms", "bwd_ms", "batch_size", "hardware_kind")


class CostDataError(ShardwiseError, ValueError):
    """A cost dataset that cannot be trained on (missing columns, mixed hardware, no compute rows)."""


class TrainConfig(BaseModel):
    """Training settings; every field has a default that works for a few thousand shards."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epochs: int = Field(default=400, ge=1)
    patience: int = Field(default=40, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    #: L2 on all weights: 1e-3 beat 1e-5 on held-out tables in 3 of 3 seeds with ~250 measured shards
    weight_decay: float = Field(default=1e-3, ge=0)
    batch_shards: int = Field(default=128, ge=1)
    holdout_fraction: float = Field(default=0.2, gt=0, lt=1)
    val_fraction: float = Field(default=0.1, gt=0, lt=1)
    #: shard sizes (table counts) kept out of training and reported separately; None picks one interior size; none
    #: by default: a size held out costs the model its shards and made its held-out error hang on the seed (records
    #: `costmodel_seeds_patience`, `costmodel_seeds_all_sizes`)
    holdout_num_tables: tuple[int, ...] | None = ()
    #: source tables held out; None picks them from the data (whole co-occurrence components if possible)
    holdout_sources: tuple[str, ...] | None = None
    #: 128 beat 64 on held-out tables (record `costmodel_accuracy`)
    hidden: int = Field(default=128, ge=1)
    layers: int = Field(default=2, ge=1)
    head_layers: int = Field(default=2, ge=1)
    comm_hidden: int = Field(default=32, ge=1)
    comm_epochs: int = Field(default=300, ge=1)
    device: str = "cpu"
    progress: bool = True


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


# -- dataset -> samples -------------------------------------------------------------------------------------
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
            f"cost dataset mixes CUDA timers {timers}: 'events' (and rows from before the timer was recorded) time "
            "the host's launches where they outlast the kernels, 'held' and 'graph' the device's work; profile into "
            "a new dataset (or dataset_uri prefix) with a device timer"
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
    """The CUDA timers a GPU's compute rows were timed with ("events" where none was recorded: the only CUDA timer
    before `timer` was stored); [] on CPU, whose clock did not change."""
    if not hardware_kind.startswith("cuda"):
        return []
    timers = compute["timer"] if "timer" in compute.columns else pd.Series("events", index=compute.index)
    return sorted(map(str, timers.fillna("events").unique()))


def compute_samples(df: pd.DataFrame) -> ComputeSamples:
    """Compute rows -> one sample per config_id, fwd/bwd averaged over its repeats."""
    rows = df[df["kind"] == "compute"]
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


#: fewest measured dense kernels a model fits its data-parallel kernel line to (with fewer, it prices them as models
#: profiled before did: `costmodel.data_parallel`)
MIN_DENSE_KERNELS = 10


def dense_kernel_samples(df: pd.DataFrame) -> list[MeasuredDenseKernel]:
    """kind='data_parallel' rows (a shard's dense kernel at a device count's local batch) -> (tables, num_devices,
    fwd ms, bwd ms), repeats averaged; [] for datasets from before they were profiled."""
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


def fit_data_parallel_kernel_rows(df: pd.DataFrame, model: NeuralCostModel, heldout_sources: Collection[str] = (),
                                  ) -> tuple[DataParallelKernelCost | None, pd.DataFrame]:
    """The data-parallel kernel's line fitted to the dataset's measured dense kernels (None with fewer than
    MIN_DENSE_KERNELS) and its evaluation, beside the compute network's price of the same kernels (the fused kernel at
    pooling / D, what `model` would price them with otherwise). Where the dataset has dense kernels of the held-out
    tables alone (`heldout_sources`, given: a held-out profile's) and enough of the rest, the line is fitted to the
    rest and evaluated on them, as the compute network is; else 5-fold held-out over every kernel."""
    measured = dense_kernel_samples(df)
    held_set = set(heldout_sources)
    apart = [m for m in measured if _sources(m[0]) <= held_set]
    rest = [m for m in measured if not _sources(m[0]) & held_set]
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
         "the compute network at pooling / devices (models profiled before dense kernels were)"),
    ):
        for j, target in enumerate(("fwd", "bwd")):
            rows.append({"split": split, "method": method, "target": target, "n": len(truth),
                         **regression_metrics(predicted[:, j], truth[:, j]), "note": note})
        rows.append({"split": split, "method": method, "target": "total", "n": len(truth),
                     **regression_metrics(predicted.sum(axis=1), truth.sum(axis=1)), "note": note})
    return fitted, pd.DataFrame(rows)


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
#: what each collective prices, in the evaluation's notes
_COLLECTIVE_USE = {"all_reduce": "data-parallel gradient all-reduce", "reduce_scatter": "row-wise outputs' reduce-scatter",
                   "all_gather": "row-wise gradients' all-gather", "all_to_all": "row-wise ids' all-to-all"}


def all_reduce_points(df: pd.DataFrame, collective: str = "all_reduce") -> list[tuple[int, int, float]]:
    """(num_devices, size_bytes, ms) of each all-reduce (or `collective`: "reduce_scatter") the dataset measured, the
    median over its rows (runs add to one history); [] when it has none (datasets from before they were profiled)."""
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


# -- splits -----------------------------------------------------------------------------------------------------
def _sources(shard: Sequence[TableSpec]) -> set[str]:
    return {t.source or t.name for t in shard}


def pick_heldout_sources(samples: ComputeSamples, fraction: float, seed: int) -> tuple[str, ...]:
    """Source tables to hold out: whole groups of tables that never share a shard with the rest if the data
    has them (a profile of held-out tables), else a random `fraction` of the sources."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for shard in samples.shards:
        srcs = sorted(_sources(shard))
        for s in srcs[1:]:
            parent[find(s)] = find(srcs[0])
        find(srcs[0])
    comp_shards: dict[str, int] = {}
    for shard in samples.shards:
        root = find(next(iter(_sources(shard))))
        comp_shards[root] = comp_shards.get(root, 0) + 1
    rng = np.random.default_rng(seed)
    target = fraction * len(samples)
    roots = sorted(comp_shards)
    chosen: set[str] = set()
    taken = 0
    for i in rng.permutation(len(roots)):
        root = roots[i]
        if taken + comp_shards[root] <= 1.5 * target and comp_shards[root] > 1:
            chosen.add(root)
            taken += comp_shards[root]
        if taken >= 0.5 * target:
            return tuple(sorted(s for s in parent if find(s) in chosen))
    sources = sorted(parent)
    k = max(1, round(fraction * len(sources)))
    return tuple(sorted(sources[i] for i in rng.choice(len(sources), size=k, replace=False)))


def _pick_size_holdout(samples: ComputeSamples, seed: int) -> tuple[int, ...]:
    sizes = sorted({len(s) for s in samples.shards})
    interior = [s for s in sizes if 1 < s < sizes[-1]]
    if len(sizes) < 4 or not interior:
        return ()
    return (int(np.random.default_rng(seed).choice(interior)),)


# -- fitting ----------------------------------------------------------------------------------------------------
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
) -> tuple[int, int, float]:
    """Adam on MSE of log costs, minibatches in a seeded order, best validation weights restored; stopped early
    at `deadline` (a time.perf_counter() value) when given."""
    device = torch.device(cfg.device)
    net.to(device)
    train_xy = tuple(t.to(device) for t in train_xy)
    val_xy = tuple(t.to(device) for t in val_xy)
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
            loss = torch.mean((predict(*inputs) - target) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            *inputs, target = val_xy
            val = float(torch.mean((predict(*inputs) - target) ** 2))
        sched.step(val)
        if val < best[0]:
            best = (val, epoch, copy.deepcopy(net.state_dict()))
        bar.set_postfix(val_log_mse=f"{val:.4f}", best=f"{best[0]:.4f}")
        if epoch - best[1] >= cfg.patience or (deadline is not None and time.perf_counter() >= deadline):
            break
    net.load_state_dict(best[2])
    net.to("cpu").eval()
    return epoch + 1, best[1], best[0]


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
    notes: list[str] = []

    heldout = cfg.holdout_sources if cfg.holdout_sources is not None else pick_heldout_sources(samples, cfg.holdout_fraction, seed)
    held = set(heldout)
    srcs = [_sources(s) for s in samples.shards]
    test_idx = [i for i, s in enumerate(srcs) if s <= held]
    # held-out row blocks (a row-wise table's share of one device) are evaluated apart: the held-out tables' figure,
    # which the promotion gate compares, stays the whole shards' it always was
    blocks = {i for i in test_idx if any(t.is_row_block for t in samples.shards[i])}
    block_idx, test_idx = sorted(blocks), [i for i in test_idx if i not in blocks]
    pool_idx = [i for i, s in enumerate(srcs) if not s & held]
    sizes_out = cfg.holdout_num_tables if cfg.holdout_num_tables is not None else _pick_size_holdout(samples.subset(pool_idx), seed)
    size_idx = [i for i in pool_idx if len(samples.shards[i]) in sizes_out]
    fit_idx = np.asarray([i for i in pool_idx if len(samples.shards[i]) not in sizes_out])
    if len(fit_idx) < 10:
        raise CostDataError(f"only {len(fit_idx)} training shards after holding out tables {list(heldout)[:5]}...: profile more shards")
    if len(test_idx) < 20:
        notes.append(f"only {len(test_idx)} shards built purely from held-out tables: metrics are rough")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(fit_idx)
    n_val = max(1, round(cfg.val_fraction * len(perm)))
    val, train = samples.subset(perm[:n_val]), samples.subset(perm[n_val:])
    test, size_test, block_test = samples.subset(test_idx), samples.subset(size_idx), samples.subset(block_idx)

    features = TableFeatureCache(batch_size)
    unique_train = list(dict.fromkeys(t for s in train.shards for t in s))
    normaliser = FeatureNormaliser.fit(features(unique_train), TABLE_FEATURE_NAMES)
    log_train = np.log(np.maximum(train.costs_ms, MIN_MS))
    offset = log_train.mean(axis=0)
    net_cfg = NetworkConfig(cfg.hidden, cfg.layers, cfg.head_layers, cfg.comm_hidden)
    net = ComputeNet(NUM_FEATURES, net_cfg.hidden, net_cfg.layers, net_cfg.head_layers, NUM_WORK_CHANNELS)

    def xy(s: ComputeSamples) -> tuple[torch.Tensor, ...]:
        x, mask = _padded(s, features, normaliser)
        return x, mask, torch.from_numpy((np.log(np.maximum(s.costs_ms, MIN_MS)) - offset).astype(np.float32))

    epochs_run, best_epoch, best_val = _fit(
        net, lambda x, m: _shard_log_ms(net, x, m), xy(train), xy(val), cfg, cfg.epochs, seed, "compute model"
    )

    comm_net, comm_norm, comm_offset, comm_test = None, None, np.zeros(2), None
    comm = comm_samples(df)
    if comm is not None:
        layouts = np.unique(comm.layout)
        lperm = np.random.default_rng(seed + 1).permutation(layouts)
        n_test = max(1, round(cfg.holdout_fraction * len(layouts))) if len(layouts) >= 5 else 0
        n_cval = max(1, round(cfg.val_fraction * len(layouts)))
        is_test = np.isin(comm.layout, lperm[:n_test])
        is_val = np.isin(comm.layout, lperm[n_test : n_test + n_cval])
        is_train = ~(is_test | is_val)
        if is_train.sum() == 0:
            is_train = ~is_test
        comm_norm = FeatureNormaliser.fit(comm.features[is_train], COMM_FEATURE_NAMES)
        comm_log = np.log(np.maximum(comm.costs_ms, MIN_MS))
        comm_offset = comm_log[is_train].mean(axis=0)
        comm_net = CommNet(NUM_COMM_FEATURES, net_cfg.comm_hidden, net_cfg.comm_layers)

        def cxy(mask: np.ndarray) -> tuple[torch.Tensor, ...]:
            return (torch.from_numpy(comm_norm(comm.features[mask])),
                    torch.from_numpy((comm_log[mask] - comm_offset).astype(np.float32)))

        _fit(comm_net, comm_net, cxy(is_train), cxy(is_val if is_val.any() else is_train), cfg, cfg.comm_epochs, seed + 1, "comm model")
        comm_test = is_test

    meta = ModelMeta(
        hardware_kind=hardware_kind,
        batch_size=batch_size,
        reference_ms=_reference_ms(df),
        compute_log_offset=(float(offset[0]), float(offset[1])),
        comm_log_offset=(float(comm_offset[0]), float(comm_offset[1])),
        info={"seed": seed, "train_shards": len(train), "heldout_sources": len(heldout), "torch": torch.__version__},
        feature_ranges=FeatureRanges.of_training(features(unique_train), [len(s) for s in train.shards], batch_size),
    )
    model = NeuralCostModel(net, normaliser, meta, net_cfg, comm_net, comm_norm)
    collective_evaluations = []
    for collective in COLLECTIVE_MS_COLUMN:  # all_reduce, reduce_scatter, all_gather, all_to_all: model attributes
        line, evaluation = fit_all_reduce_rows(df, hardware_kind, collective)
        setattr(model, collective, line)
        collective_evaluations.append(evaluation)
    model.data_parallel_kernel, dense_evaluation = fit_data_parallel_kernel_rows(df, model, cfg.holdout_sources or ())
    collective_evaluations.append(dense_evaluation)

    single = {s[0]: c for s, c in zip(samples.shards, samples.costs_ms) if len(s) == 1}
    frames = [evaluate_compute(model, train, test, single_table_ms=single)]
    if len(size_test):
        frames.append(evaluate_compute(model, train, size_test, single_table_ms=single,
                                       split=f"held-out sizes {list(sizes_out)}", baselines=False))
    if len(block_test):
        frames.append(evaluate_compute(model, train, block_test, single_table_ms=single, split="held-out row blocks",
                                       baselines=False))
    frames.append(noise_floor_table(df[df["kind"] == "compute"]))
    frames.append(noise_floor_table(df[df["kind"] == "data_parallel"], split="dense kernel repeats"))
    if comm is not None and comm_test is not None and comm_test.any():
        pred = np.exp(comm_net(torch.from_numpy(comm_norm(comm.features[comm_test]))).detach().numpy() + comm_offset)  # type: ignore[misc,arg-type]
        meas = comm.costs_ms[comm_test]
        frames.append(pd.DataFrame([
            {"split": "held-out layouts", "method": "neural_comm", "target": k, "n": int(comm_test.sum()),
             **regression_metrics(pred[:, j], meas[:, j]), "note": "per device"}
            for j, k in enumerate(("fwd", "bwd"))
        ]))
    frames += collective_evaluations
    evaluation = pd.concat([f for f in frames if not f.empty], ignore_index=True)
    # a unique first column: pipelines flatten the table to `<label>_<column>` metrics
    evaluation.insert(0, "label", [_label(r.method, r.split, r.target) for r in evaluation.itertuples(index=False)])
    metrics = _metrics(evaluation)
    report = TrainingReport(
        seed=seed, hardware_kind=hardware_kind, batch_size=batch_size, heldout_sources=tuple(heldout),
        heldout_num_tables=tuple(sizes_out),
        sizes={"train": len(train), "val": len(val), "test": len(test), "size_test": len(size_test),
               "row_block_test": len(block_test),
               "comm_rows": 0 if comm is None else len(comm.layout),
               **{f"{c}_points": len(line.points) if (line := getattr(model, c)) else 0 for c in COLLECTIVE_MS_COLUMN},
               "dense_kernels": model.data_parallel_kernel.measured if model.data_parallel_kernel else 0},
        epochs_run=epochs_run, best_epoch=best_epoch, best_val_loss=best_val, evaluation=evaluation,
        metrics=metrics, train=train, test=test, size_test=size_test, single_table_ms=single, notes=notes,
    )
    return model, report


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

    def xy(s: ComputeSamples) -> tuple[torch.Tensor, ...]:
        x, mask = _padded(s, features, model.normaliser)
        return x, mask, torch.from_numpy((np.log(np.maximum(s.costs_ms, MIN_MS)) - offset).astype(np.float32))

    cfg = TrainConfig(lr=lr, patience=max(10, epochs // 10), batch_shards=32, progress=False)
    epochs_run, _, _ = _fit(net, lambda x, m: _shard_log_ms(net, x, m), xy(train), xy(held), cfg, epochs, seed,
                            "fine-tune", None if time_budget_s is None else start + time_budget_s)
    seen = list(dict.fromkeys(t for shard in samples.shards for t in shard))
    ranges = FeatureRanges.of_training(features(seen), [len(s) for s in samples.shards], model.batch_size)
    meta = dataclasses.replace(
        model.meta, info={**model.meta.info, "fine_tuned_shards": len(samples)},
        feature_ranges=model.meta.feature_ranges.union(ranges) if model.meta.feature_ranges else ranges)
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


def _reference_ms(df: pd.DataFrame) -> float | None:
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
    common = _reference_ms(df)
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


def _label(method: str, split: str, target: str) -> str:
    """`neural_heldout_tables_total`: method, split (without the size list) and target as one metric stem."""
    slug = split.split(" [")[0].replace("held-out ", "heldout_").replace(" ", "_").replace("-", "_")
    return f"{method}_{slug}_{target}"


def _metrics(evaluation: pd.DataFrame) -> dict[str, float]:
    """Flat metric names for tracking: `<method>_<split>_<target>_<metric>`, plus the noise ratio."""
    out: dict[str, float] = {}
    for rec in evaluation.itertuples(index=False):
        for m in ("mape_pct", "rmse_ms", "spearman"):
            value = float(getattr(rec, m))
            if math.isfinite(value):
                out[f"{rec.label}_{m}"] = value
    model_mape = out.get("neural_heldout_tables_total_mape_pct")
    noise_mape = out.get("noise_floor_repeats_total_mape_pct")
    if model_mape is not None and noise_mape:
        out["neural_over_noise_mape_ratio"] = model_mape / noise_mape
    return out
