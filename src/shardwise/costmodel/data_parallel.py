"""What a data-parallel table costs each device: TorchRec's dense kernel on the local batch, priced by a line
fitted to measured dense kernels, plus the all-reduce of its dense gradient, priced by a latency + bandwidth line
fitted to measured all-reduces.

A data-parallel table sits on every device; each device looks up its own B / D samples (no all-to-all), and the
tables' gradients (rows x dim fp32, dense: TorchRec's data-parallel sharding runs the dense kernel under DDP) are
summed over the devices and applied to every row every step. The profiler times that kernel (fbgemm's dense TBE, its
backward with the SGD step over the whole tables) on sampled shards of the training tables at each device count's
local batch (`shardwise profile --data-parallel-shards`), and `pretrain` fits `DataParallelKernelCost` to them: a
line in the lookups, the rows they touch, the pooled outputs and the tables' elements. The compute network cannot
price this kernel: it was trained at one batch on the fused kernel, whose optimizer touches only the rows looked up
(on held-out tables the line is far closer: record `sharding_type_accuracy`). A model profiled without dense
kernels prices the kernel through the compute network: the same tables with pooling factor / D at B
(`local_batch_table`), the fused kernel's cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from shardwise.workload import TableSpec, local_batch

from .features import distinct_rows_per_sample, transformed_table_features
from .types import CostModel

#: dense fp32 gradient bytes per element, what the all-reduce moves
GRADIENT_BYTES_PER_ELEMENT = 4
MIB = 2**20


def gradient_bytes(tables: Sequence[TableSpec]) -> int:
    """Bytes a step all-reduces for these data-parallel tables: their dense fp32 gradients, rows x dim x 4."""
    return sum(t.rows * t.dim * GRADIENT_BYTES_PER_ELEMENT for t in tables)


def local_batch_table(table: TableSpec, num_devices: int) -> TableSpec:
    """`table` as the compute model, trained at batch B, prices its kernel on the local batch B / `num_devices`."""
    if num_devices == 1:
        return table
    return table.model_copy(update={"pooling_factor": table.pooling_factor / num_devices,
                                    "source": table.source or table.name})


#: the collectives a line prices, and how many times (D - 1) / D of its bytes a ring moves per device: an all-reduce
#: is a reduce-scatter and an all-gather (row-wise tables' pooled outputs are reduce-scattered, their gradients
#: all-gathered and their ids sent by an even all-to-all, `costmodel.row_wise`)
RING_VOLUME: dict[str, float] = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0, "all_to_all": 1.0}


def _ring_terms(num_devices: np.ndarray, size_bytes: np.ndarray, collective: str = "all_reduce") -> np.ndarray:
    """[N, 3] the line's terms: 1, hops (D - 1), and the MiB a ring collective moves per device (an all-reduce:
    2 (D-1)/D x size, a reduce-scatter: (D-1)/D x size)."""
    if collective not in RING_VOLUME:
        raise ValueError(f"collective {collective!r} is not one of {sorted(RING_VOLUME)}")
    d = np.asarray(num_devices, dtype=np.float64)
    mib = np.asarray(size_bytes, dtype=np.float64) / MIB
    return np.stack([np.ones_like(d), d - 1.0, RING_VOLUME[collective] * (d - 1.0) / d * mib], axis=-1)


@dataclass(frozen=True)
class AllReduceCost:
    """ms of an fp32 sum all-reduce over D devices: where D's all-reduces were measured at two sizes or more, D's own
    line, latency_ms + ms_per_mib x 2 (D - 1) / D x MiB (`by_devices`); at any other D, the line over every device
    count, latency_ms + hop_ms x (D - 1) + ms_per_mib x 2 (D - 1) / D x MiB, but never below the line of a measured
    count under D (more ranks on the same machines do not all-reduce faster: on 2 cores the line over 2 and
    4 processes put 8 under the 4 measured). Fitted to measured all-reduces on one
    hardware kind and backend (`fit_all_reduce`); `points` are what it was fitted on. One line per device count:
    on a 2-core CPU, 4 processes' all-reduces follow no hop term that 2 processes' do (one line over 2 and 4
    processes priced held-out all-reduces far worse than one line per count).

    `collective` "reduce_scatter", "all_gather" or "all_to_all": the same lines for that collective of `size_bytes`
    (each device's input, or output for an all-gather; it moves (D - 1) / D of it), what prices row-wise tables'
    collectives (`costmodel.row_wise`)."""

    latency_ms: float
    hop_ms: float
    ms_per_mib: float
    backend: str = ""
    hardware_kind: str = ""
    #: (num_devices, size_bytes, ms) of every measured all-reduce (medians) the line was fitted to
    points: tuple[tuple[int, int, float], ...] = field(default_factory=tuple)
    #: (num_devices, latency_ms, ms_per_mib): each measured device count's own line
    by_devices: tuple[tuple[int, float, float], ...] = field(default_factory=tuple)
    collective: str = "all_reduce"

    def predict_ms(self, size_bytes: float | np.ndarray, num_devices: int | np.ndarray) -> np.ndarray:
        """Predicted ms of all-reducing `size_bytes` over `num_devices` (0 for nothing or one device)."""
        size = np.asarray(size_bytes, dtype=np.float64)
        d = np.broadcast_to(np.asarray(num_devices, dtype=np.float64), size.shape)
        terms = _ring_terms(d, size, self.collective)
        ms = terms @ np.array([self.latency_ms, self.hop_ms, self.ms_per_mib])
        for devices, latency_ms, ms_per_mib in sorted(self.by_devices):  # ascending: the largest count under D last
            own = terms @ np.array([latency_ms, 0.0, ms_per_mib])
            ms = np.where(d == devices, own, np.where(d > devices, np.maximum(ms, own), ms))
        return np.where((size > 0) & (d > 1), ms, 0.0)

    def to_json(self) -> dict[str, Any]:
        """The coefficients, provenance and points, as stored in a cost model's `cost_model.json`."""
        return {**asdict(self), "points": [list(p) for p in self.points],
                "by_devices": [{"num_devices": d, "latency_ms": lat, "ms_per_mib": bw} for d, lat, bw in self.by_devices]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AllReduceCost:
        """Read `to_json`'s document (without per-count lines in `by_devices`, the one line prices every device
        count); coefficients must be finite and not negative."""
        coef = {k: float(doc[k]) for k in ("latency_ms", "hop_ms", "ms_per_mib")}
        lines = tuple((int(line["num_devices"]), float(line["latency_ms"]), float(line["ms_per_mib"]))
                      for line in doc.get("by_devices") or ())
        values = [*coef.values(), *(v for _, lat, bw in lines for v in (lat, bw))]
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"all_reduce: latency_ms, hop_ms and ms_per_mib must be finite and >= 0, got {coef}"
                             + (f" and by_devices {list(lines)}" if lines else ""))
        points = tuple((int(d), int(b), float(ms)) for d, b, ms in doc.get("points", ()))
        collective = str(doc.get("collective", "all_reduce"))
        if collective not in RING_VOLUME:
            raise ValueError(f"collective {collective!r} is not one of {sorted(RING_VOLUME)}")
        return cls(**coef, backend=str(doc.get("backend", "")), hardware_kind=str(doc.get("hardware_kind", "")),
                   points=points, by_devices=lines, collective=collective)


def _non_negative_fit(terms: np.ndarray, active: list[int]) -> np.ndarray:
    """Least squares of `terms` @ coef = 1 (rows already scaled to relative error) over the `active` columns, a
    negative coefficient dropped and the rest refitted; zeros elsewhere."""
    coef = np.zeros(terms.shape[1])
    active = list(active)
    while active:
        solution, *_ = np.linalg.lstsq(terms[:, active], np.ones(len(terms)), rcond=None)
        if (solution >= 0).all():
            coef[active] = solution
            break
        active.remove(active[int(np.argmin(solution))])
    return coef


def fit_all_reduce(points: Sequence[tuple[int, int, float]], *, backend: str = "", hardware_kind: str = "",
                   per_device_count: bool = True, collective: str = "all_reduce") -> AllReduceCost:
    """The lines through measured (num_devices, size_bytes, ms) all-reduces, least squares on relative error (a
    10 us latency and a 100 ms transfer both matter), coefficients kept >= 0 (a negative one is dropped and the
    rest refitted): one over every point (hop_ms is 0 where every point has one device count: it cannot be told
    from the latency) and, with `per_device_count`, one for each device count measured at two sizes or more.
    `collective`: what was measured, "all_reduce", "reduce_scatter", "all_gather" or "all_to_all" (`RING_VOLUME`)."""
    if len(points) < 2:
        raise ValueError(f"fit_all_reduce needs at least 2 measured {collective}s, got {len(points)}")
    d = np.array([p[0] for p in points], dtype=np.float64)
    size = np.array([p[1] for p in points], dtype=np.float64)
    ms = np.array([p[2] for p in points], dtype=np.float64)
    if (d < 2).any() or (ms <= 0).any():
        raise ValueError("fit_all_reduce: every point needs num_devices >= 2 and ms > 0")
    terms = _ring_terms(d, size, collective) / ms[:, None]  # rows scaled by 1 / ms: relative error
    coef = _non_negative_fit(terms, [0, 2] if np.ptp(d) == 0 else [0, 1, 2])
    lines = []
    for devices in sorted(set(d.tolist())) if per_device_count else ():
        mine = d == devices
        if len(set(size[mine].tolist())) >= 2:
            own = _non_negative_fit(terms[mine], [0, 2])
            lines.append((int(devices), float(own[0]), float(own[2])))
    return AllReduceCost(latency_ms=float(coef[0]), hop_ms=float(coef[1]), ms_per_mib=float(coef[2]), backend=backend,
                         hardware_kind=hardware_kind,
                         points=tuple((int(a), int(b), float(c)) for a, b, c in points), by_devices=tuple(lines),
                         collective=collective)


def heldout_all_reduce_errors(points: Sequence[tuple[int, int, float]], *, per_device_count: bool = True,
                              collective: str = "all_reduce") -> list[tuple[int, int, float, float]]:
    """Leave one size out: each distinct size's all-reduces predicted by the lines fitted to the other sizes;
    (num_devices, size_bytes, measured ms, predicted ms) per point. The held-out accuracy of `fit_all_reduce`."""
    sizes = sorted({p[1] for p in points})
    out = []
    for size in sizes:
        fitted = fit_all_reduce([p for p in points if p[1] != size], per_device_count=per_device_count,
                                collective=collective)
        for d, b, ms in (p for p in points if p[1] == size):
            out.append((d, b, ms, float(fitted.predict_ms(b, d))))
    return out


def all_reduce_of(cost_model: CostModel) -> AllReduceCost | None:
    """The model's fitted all-reduce (None: it has none, so data-parallel tables cannot be priced with it)."""
    cost = getattr(cost_model, "all_reduce", None)
    return cost if isinstance(cost, AllReduceCost) else None


#: what a data-parallel kernel's line sums over its tables at the local batch b = ceil(B / D): a constant, the
#: tables (a kernel's per-table work), the lookups b x pooling / 1e3 and their work b x pooling x (dim + 16) / 1e3
#: (what a CPU kernel's cost ranks best with, `features.WORK_CHANNELS`), the pooled outputs b x dim / 1e3, the
#: distinct rows the lookups touch x dim / 1e3 (each a cache miss and a gradient row, from the reuse bins:
#: `features.distinct_rows_per_sample`) and the tables' elements rows x dim / 1e6 (the dense gradient written in
#: backward and the optimizer's step over every row); it prices held-out dense kernels far closer than the compute
#: network (record `sharding_type_accuracy`)
DATA_PARALLEL_KERNEL_TERMS: tuple[str, ...] = ("constant", "tables", "kilo_lookups", "kilo_lookups_x_dim16",
                                              "kilo_outputs", "kilo_distinct_rows_x_dim", "mega_elements")


@lru_cache(maxsize=1 << 16)
def _distinct_rows(table: TableSpec, batch: int) -> float:
    """The rows `batch` samples of `table` touch: their lookups over the accesses per distinct row (reuse bins)."""
    return batch * float(distinct_rows_per_sample(transformed_table_features(table, batch)[None])[0])


def data_parallel_kernel_terms(tables: Sequence[TableSpec], batch: int) -> np.ndarray:
    """[len(DATA_PARALLEL_KERNEL_TERMS)] the line's terms of one dense kernel over `tables` at (local) batch `batch`."""
    return np.array([
        1.0, len(tables), sum(batch * t.pooling_factor for t in tables) / 1e3,
        sum(batch * t.pooling_factor * (t.dim + 16) for t in tables) / 1e3, sum(batch * t.dim for t in tables) / 1e3,
        sum(_distinct_rows(t, batch) * t.dim for t in tables) / 1e3, sum(t.rows * t.dim for t in tables) / 1e6,
    ])


@dataclass(frozen=True)
class DataParallelKernelCost:
    """Forward and backward ms of TorchRec's dense kernel over data-parallel tables at the local batch: for each, the
    sum of `DATA_PARALLEL_KERNEL_TERMS` x its coefficients (ms per term, >= 0), fitted to measured dense kernels on
    one hardware kind (`fit_data_parallel_kernel`). The batch is the model's: a device of D looks up ceil(B / D)."""

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    batch_size: int
    hardware_kind: str = ""
    #: how many measured kernels (sets of tables at a device count) it was fitted to
    measured: int = 0

    def predict_ms(self, tables: Sequence[TableSpec], num_devices: int) -> tuple[float, float]:
        """(fwd_ms, bwd_ms) of one dense kernel over `tables` on each of `num_devices` devices (0 for none)."""
        if not tables:
            return 0.0, 0.0
        terms = data_parallel_kernel_terms(tables, local_batch(self.batch_size, num_devices))
        return float(terms @ np.array(self.fwd)), float(terms @ np.array(self.bwd))

    def to_json(self) -> dict[str, Any]:
        """The coefficients by term and provenance, as stored in a cost model's `cost_model.json`."""
        return {"terms": list(DATA_PARALLEL_KERNEL_TERMS), "fwd": list(self.fwd), "bwd": list(self.bwd),
                "batch_size": self.batch_size, "hardware_kind": self.hardware_kind, "measured": self.measured}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DataParallelKernelCost:
        """Read `to_json`'s document; its terms must be these, its coefficients finite and not negative."""
        if tuple(doc.get("terms", ())) != DATA_PARALLEL_KERNEL_TERMS:
            raise ValueError(f"data_parallel_kernel: terms must be {list(DATA_PARALLEL_KERNEL_TERMS)}, got "
                             f"{doc.get('terms')}")
        fwd, bwd = (tuple(float(v) for v in doc[k]) for k in ("fwd", "bwd"))
        if not all(len(c) == len(DATA_PARALLEL_KERNEL_TERMS) and all(math.isfinite(v) and v >= 0 for v in c)
                   for c in (fwd, bwd)):
            raise ValueError("data_parallel_kernel: fwd and bwd need one finite coefficient >= 0 per term, got "
                             f"{list(fwd)} and {list(bwd)}")
        if int(doc["batch_size"]) < 1:
            raise ValueError(f"data_parallel_kernel: batch_size must be >= 1, got {doc['batch_size']}")
        return cls(fwd, bwd, int(doc["batch_size"]), str(doc.get("hardware_kind", "")), int(doc.get("measured", 0)))


#: (tables, num_devices, fwd_ms, bwd_ms) of one measured dense kernel at the local batch
MeasuredDenseKernel = tuple[Sequence[TableSpec], int, float, float]


def fit_data_parallel_kernel(measured: Sequence[MeasuredDenseKernel], batch_size: int, *,
                             hardware_kind: str = "") -> DataParallelKernelCost:
    """The lines through measured dense kernels (`MeasuredDenseKernel`s at the local batch of `batch_size`), least
    squares on relative error, each coefficient kept >= 0 (a negative one dropped and the rest refitted)."""
    if len(measured) < len(DATA_PARALLEL_KERNEL_TERMS):
        raise ValueError(f"fit_data_parallel_kernel needs at least {len(DATA_PARALLEL_KERNEL_TERMS)} measured dense "
                         f"kernels, got {len(measured)}")
    terms = np.stack([data_parallel_kernel_terms(tables, local_batch(batch_size, d)) for tables, d, _, _ in measured])
    coefficients = []
    for column in (2, 3):
        ms = np.array([m[column] for m in measured], dtype=np.float64)
        if not (np.isfinite(ms).all() and (ms > 0).all()):
            raise ValueError("fit_data_parallel_kernel: every measured fwd_ms and bwd_ms must be finite and > 0")
        coefficients.append(tuple(_non_negative_fit(terms / ms[:, None], list(range(terms.shape[1]))).tolist()))
    return DataParallelKernelCost(coefficients[0], coefficients[1], int(batch_size), hardware_kind, len(measured))


def heldout_data_parallel_kernel_errors(measured: Sequence[MeasuredDenseKernel], batch_size: int,
                                        folds: int = 5) -> list[tuple[float, float, float, float]]:
    """`folds`-fold held-out accuracy of `fit_data_parallel_kernel`: each measured kernel predicted by the lines
    fitted to the other folds; (measured fwd, predicted fwd, measured bwd, predicted bwd) ms per kernel."""
    out = []
    for fold in range(folds):
        rest = [m for k, m in enumerate(measured) if k % folds != fold]
        fitted = fit_data_parallel_kernel(rest, batch_size)
        for tables, d, fwd, bwd in (m for k, m in enumerate(measured) if k % folds == fold):
            predicted_fwd, predicted_bwd = fitted.predict_ms(tables, d)
            out.append((fwd, predicted_fwd, bwd, predicted_bwd))
    return out


def data_parallel_kernel_of(cost_model: CostModel) -> DataParallelKernelCost | None:
    """The model's fitted dense kernel (None: profiled without dense kernels, the compute network prices it)."""
    kernel = getattr(cost_model, "data_parallel_kernel", None)
    return kernel if isinstance(kernel, DataParallelKernelCost) else None


@dataclass(frozen=True)
class DataParallelCost:
    """What data-parallel tables add to every device: their kernel on the local batch and their all-reduce."""

    fwd_ms: float
    bwd_ms: float
    all_reduce_ms: float

    @property
    def total_ms(self) -> float:
        """Kernel plus all-reduce ms, on every device."""
        return self.fwd_ms + self.bwd_ms + self.all_reduce_ms


def data_parallel_cost(cost_model: CostModel, tables: Sequence[TableSpec], num_devices: int) -> DataParallelCost:
    """Every device's cost of the data-parallel `tables` (one dense kernel over all of them at the local batch, one
    all-reduce of all their gradients); ValueError when the model has no all-reduce to price them with."""
    if not tables:
        return DataParallelCost(0.0, 0.0, 0.0)
    all_reduce = all_reduce_of(cost_model)
    if all_reduce is None:
        raise ValueError(f"cost model for {cost_model.hardware_kind!r} has no measured all-reduce: it cannot price "
                         "data-parallel tables (profile one with `measure_all_reduce` and fit it, fit_all_reduce)")
    kernel = data_parallel_kernel_of(cost_model)
    if kernel is not None:
        fwd, bwd = kernel.predict_ms(tables, num_devices)
    else:  # a model profiled without dense kernels: the fused kernel's price
        fwd, bwd = np.asarray(cost_model.predict_compute([[local_batch_table(t, num_devices) for t in tables]]))[0]
    return DataParallelCost(float(fwd), float(bwd), float(all_reduce.predict_ms(gradient_bytes(tables), num_devices)))
