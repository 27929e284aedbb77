"""What a data-parallel table costs each device: its kernel on the local batch, priced by the compute model, plus
the all-reduce of its dense gradient, priced by a latency + bandwidth line fitted to measured all-reduces.

A data-parallel table sits on every device; each device looks up its own B / D samples (no all-to-all) and the
tables' gradients (rows x dim fp32, dense: TorchRec's data-parallel sharding runs the dense kernel under DDP) are
summed over the devices every step. The compute model was trained at one batch size B and its features hold no
batch size, so a table at the local batch is priced as the same table with pooling factor / D at B: the same
lookups and the same distinct rows (a Zipf table's reuse bins come from B x pooling-factor draws), only the pooled
output is D times larger than the kernel writes (`benchmarks/bench_data_parallel_accuracy.py` measures the error).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shardwise.workload import TableSpec

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
    processes: 48% held-out error, per device count 17-19%, bench_data_parallel_accuracy.py).

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
        """Read `to_json`'s document (one without `by_devices`, from before, prices every device count with the one
        line); coefficients must be finite and not negative."""
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
    """Every device's cost of the data-parallel `tables` (one fused kernel over all of them at the local batch, one
    all-reduce of all their gradients); ValueError when the model has no all-reduce to price them with."""
    if not tables:
        return DataParallelCost(0.0, 0.0, 0.0)
    all_reduce = all_reduce_of(cost_model)
    if all_reduce is None:
        raise ValueError(f"cost model for {cost_model.hardware_kind!r} has no measured all-reduce: it cannot price "
                         "data-parallel tables (profile one with `measure_all_reduce` and fit it, fit_all_reduce)")
    fwd, bwd = np.asarray(cost_model.predict_compute([[local_batch_table(t, num_devices) for t in tables]]))[0]
    return DataParallelCost(float(fwd), float(bwd), float(all_reduce.predict_ms(gradient_bytes(tables), num_devices)))
