"""What a shard with tables in host memory costs (fbgemm's UVM kernels, in TorchRec's words "fused_uvm_caching" and
"fused_uvm"): the compute network's price of the same shard in HBM, plus a line per kernel in the bytes its lookups
read from host memory, fitted to such shards profiled on a GPU (`profile --caching-shards`).

A cached table's lookups miss its cache in the share of them that fall outside its hottest `cache_load_factor` x
rows rows (an LRU cache in steady training holds about the hottest rows): under the Zipf skew the profiler samples,
`expected_hit_rate`. A table without a cache reads every lookup from host memory. The line's slope is ms per GB read
from host memory, its intercept what a kernel with a cache or UVM tables costs beyond its HBM price once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from shardwise.workload import TableSpec
from shardwise.workload.memory import BYTES_PER_ELEMENT

from .types import CostModel

#: the kernels a line prices, in the order of their channels
UVM_KERNELS: tuple[str, ...] = ("fused_uvm_caching", "fused_uvm")
#: a line needs at least this many profiled shards of its kernel
MIN_SHARDS = 4


def expected_hit_rate(table: TableSpec) -> float:
    """The share of a table's lookups its cache holds (its `cache_load_factor` x rows hottest rows) under the
    profiler's Zipf(zipf_alpha) access (uniform without one): 1 in HBM, 0 on "fused_uvm"."""
    if table.compute_kernel == "fused_uvm":
        return 0.0
    if table.compute_kernel != "fused_uvm_caching":
        return 1.0
    rows = table.rows
    cached = min(rows, max(0, math.floor((table.cache_load_factor or 0.0) * rows)))
    alpha = float(table.zipf_alpha or 0.0)
    # the sampler's continuous power law over x in [1, rows + 1], rank = floor(x) - 1: P(rank < k) = F(k + 1)
    if alpha <= 0.0:
        return cached / rows
    if abs(alpha - 1.0) < 1e-6:
        return math.log(cached + 1.0) / math.log(rows + 1.0)
    a = 1.0 - alpha
    return ((cached + 1.0) ** a - 1.0) / ((rows + 1.0) ** a - 1.0)


def host_read_gb(table: TableSpec, batch_size: int) -> float:
    """GB a batch's lookups of `table` read from host memory: those that miss its cache, each a row of its dim."""
    missed = table.pooling_factor * batch_size * (1.0 - expected_hit_rate(table))
    return missed * table.dim * BYTES_PER_ELEMENT["fp32"] / 1e9


def in_hbm(table: TableSpec) -> TableSpec:
    """The same table all in HBM (what the compute network prices)."""
    return table.on_kernel("fused") if table.compute_kernel is not None else table


@dataclass(frozen=True)
class KernelLine:
    """ms beyond the shard's HBM price: slope x GB read from host memory + intercept, forward and backward."""

    slope_ms_per_gb: tuple[float, float]
    intercept_ms: tuple[float, float]
    num_shards: int
    #: in-sample MAPE of the shards' total ms (the line plus the network's HBM price), percent
    fit_mape_pct: float = field(default=float("nan"))

    def extra_ms(self, read_gb: np.ndarray, present: np.ndarray) -> np.ndarray:
        """[N, 2] ms the line adds to N shards reading `read_gb` from host memory (`present`: any table on it)."""
        slope, intercept = np.asarray(self.slope_ms_per_gb), np.asarray(self.intercept_ms)
        return read_gb[:, None] * slope[None, :] + present[:, None] * intercept[None, :]

    def to_json(self) -> dict[str, object]:
        return {"slope_ms_per_gb": list(self.slope_ms_per_gb), "intercept_ms": list(self.intercept_ms),
                "num_shards": self.num_shards, "fit_mape_pct": self.fit_mape_pct}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> KernelLine:
        """A line as `to_json` wrote it; ValueError naming the field where a figure is not finite and >= 0."""
        pairs = {}
        for key in ("slope_ms_per_gb", "intercept_ms"):
            values = tuple(float(v) for v in doc[key])  # type: ignore[attr-defined]
            if len(values) != 2 or not all(math.isfinite(v) and v >= 0 for v in values):
                raise ValueError(f"{key} {list(values)}: two finite ms figures >= 0 (forward, backward)")
            pairs[key] = values
        return cls(pairs["slope_ms_per_gb"], pairs["intercept_ms"], int(doc["num_shards"]),  # type: ignore[arg-type,call-overload]
                   float(doc.get("fit_mape_pct", float("nan"))))  # type: ignore[arg-type]


def fit_kernel_lines(model: CostModel, shards: Sequence[Sequence[TableSpec]], fwd_ms: np.ndarray, bwd_ms: np.ndarray,
                     batch_size: int) -> dict[str, KernelLine]:
    """A line per UVM kernel fitted to profiled shards with tables in host memory: what each shard's measured ms
    exceed the network's price of it in HBM by, against the GB its lookups read from host memory (least squares,
    slope and intercept at least 0); a kernel with fewer than MIN_SHARDS shards gets none."""
    measured = np.stack([np.asarray(fwd_ms, np.float64), np.asarray(bwd_ms, np.float64)], axis=1)
    in_hbm_ms = model.predict_compute([[in_hbm(t) for t in shard] for shard in shards]) if shards else np.zeros((0, 2))
    lines: dict[str, KernelLine] = {}
    for kernel in UVM_KERNELS:
        mine = np.array([_shard_kernel(shard) == kernel for shard in shards], dtype=bool)
        if mine.sum() < MIN_SHARDS:
            continue
        read = np.array([sum(host_read_gb(t, batch_size) for t in shard) for shard in shards])[mine]
        excess = measured[mine] - in_hbm_ms[mine]
        design = np.stack([read, np.ones_like(read)], axis=1)
        coef = np.linalg.lstsq(design, excess, rcond=None)[0]  # [2 (slope, intercept), 2 (fwd, bwd)]
        coef = np.maximum(coef, 0.0)  # reading from host memory never makes a kernel faster
        line = KernelLine(tuple(map(float, coef[0])), tuple(map(float, coef[1])), int(mine.sum()))  # type: ignore[arg-type]
        predicted = in_hbm_ms[mine] + line.extra_ms(read, np.ones(len(read)))
        mape = float(np.mean(np.abs(predicted.sum(1) - measured[mine].sum(1)) / measured[mine].sum(1)) * 100)
        lines[kernel] = KernelLine(line.slope_ms_per_gb, line.intercept_ms, line.num_shards, round(mape, 2))
    return lines


def with_host_memory(model: CostModel) -> CostModel:
    """`model` able to price tables in host memory where it carries fitted UVM kernel lines (`uvm_kernels`, set by
    pretrain on a profile with caching shards), else itself."""
    lines = getattr(model, "uvm_kernels", None)
    if not lines or isinstance(model, HostMemoryCostModel):
        return model
    return HostMemoryCostModel(model, lines)


def _shard_kernel(shard: Sequence[TableSpec]) -> str:
    """A shard's kernel as the profiler names it: cached where any table is, else UVM where any is, else fused."""
    kernels = {t.compute_kernel for t in shard}
    if "fused_uvm_caching" in kernels:
        return "fused_uvm_caching"
    return "fused_uvm" if "fused_uvm" in kernels else "fused"


class HostMemoryCostModel:
    """A cost model that also prices tables in host memory: `base` (the compute network and its all-to-all) for the
    shard as if in HBM, plus the fitted line of each UVM kernel. Table embeddings carry two channels per kernel
    beside the base's (GB read from host memory, tables on the kernel), so a device's cost is still one vector add
    and one head call."""

    def __init__(self, base: CostModel, lines: Mapping[str, KernelLine]) -> None:
        self.base = base
        self.lines = dict(lines)
        self.hardware_kind = base.hardware_kind
        self.batch_size = base.batch_size
        #: the kernels this model prices (what the offload stage asks of a cost model)
        self.compute_kernels: tuple[str, ...] = ("fused", *[k for k in UVM_KERNELS if k in self.lines])
        self._width: int | None = None

    def table_embeddings(self, tables: Sequence[TableSpec]) -> np.ndarray:
        base = np.asarray(self.base.table_embeddings([in_hbm(t) for t in tables]), dtype=np.float64)
        self._width = base.shape[1] if base.ndim == 2 else self._width
        extra = np.zeros((len(tables), 2 * len(UVM_KERNELS)))
        for i, t in enumerate(tables):
            if t.compute_kernel in UVM_KERNELS:
                k = UVM_KERNELS.index(t.compute_kernel)
                extra[i, 2 * k] = host_read_gb(t, self.batch_size)
                extra[i, 2 * k + 1] = 1.0
        return np.concatenate([base.reshape(len(tables), -1), extra], axis=1)

    def compute_from_embeddings(self, summed: np.ndarray) -> np.ndarray:
        summed = np.asarray(summed, dtype=np.float64)
        width = summed.shape[1] - 2 * len(UVM_KERNELS)
        ms = np.asarray(self.base.compute_from_embeddings(summed[:, :width]), dtype=np.float64)
        for k, kernel in enumerate(UVM_KERNELS):
            if kernel in self.lines:
                ms = ms + self.lines[kernel].extra_ms(summed[:, width + 2 * k], summed[:, width + 2 * k + 1] > 0.5)
        return ms

    def predict_compute(self, shards: Sequence[Sequence[TableSpec]]) -> np.ndarray:
        if not shards:
            return np.zeros((0, 2))
        ms = np.asarray(self.base.predict_compute([[in_hbm(t) for t in shard] for shard in shards]), dtype=np.float64)
        for kernel, line in self.lines.items():
            on = [[t for t in shard if t.compute_kernel == kernel] for shard in shards]
            read = np.array([sum(host_read_gb(t, self.batch_size) for t in tables) for tables in on])
            ms = ms + line.extra_ms(read, np.array([bool(tables) for tables in on], dtype=np.float64))
        return ms

    def predict_comm(self, widths: np.ndarray, compute_ms: np.ndarray) -> np.ndarray:
        return self.base.predict_comm(widths, compute_ms)

    def __getattr__(self, name: str) -> object:
        # the base's other parts (its collectives' and dense kernels' lines, its training ranges) are this model's too
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)
