"""The refiner's measuring of a layout: a plan's shards as refinement changes them (`_Layout`), each device's
kernels, all-to-all and tables on every device timed on this machine (`_Refiner`), and layouts measured side by
side in one session (`_side_by_side`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardwise.costmodel.data_parallel import gradient_bytes
from shardwise.costmodel.types import CostModel
from shardwise.profiling import AllToAllSession, MeasurementSettings, ShardTiming, hardware_info
from shardwise.profiling.dataset import write_part
from shardwise.profiling.kernel import resolve_timing
from shardwise.profiling.runner import compute_row
from shardwise.profiling.sampling import shard_config_id
from shardwise.search.plan import Plan, Shard, data_parallel_bytes
from shardwise.search.simulator import ShardCostCache
from shardwise.workload import ShardingTask, TableSpec, row_blocks, shard_memory_bytes

from .measured import (
    KernelShard,
    distinct_shards,
    everywhere_kernels,
    measure_all_reduces,
    measure_comm,
    measure_row_wise_comm,
    price_comm,
    time_shards_in_rounds,
)


@dataclass
class _Layout:
    shards: list[Shard]
    data_parallel: tuple[str, ...] = ()  #: kept as the plan has them
    row_wise: tuple[str, ...] = ()  #: kept as the plan has them

    @classmethod
    def of(cls, plan: Plan) -> _Layout:
        return cls(list(plan.shards), plan.data_parallel, plan.row_wise)

    @property
    def everywhere(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The tables on every device: data-parallel, row-wise."""
        return self.data_parallel, self.row_wise

    def on(self, device: int) -> list[Shard]:
        return [s for s in self.shards if s.device == device]


def _layout_key(layout: _Layout, num_devices: int) -> tuple[object, ...]:
    """What makes two layouts the same plan: each device's column slices (devices are alike, so in any order) and
    the tables on every device."""
    groups = sorted(tuple(sorted((s.table, s.col_offset, s.dim) for s in layout.on(d))) for d in range(num_devices))
    return (tuple(groups), *(tuple(sorted(names)) for names in layout.everywhere))


def _distinct(candidates: Sequence[tuple[str, _Layout]],
              num_devices: int) -> tuple[list[tuple[str, _Layout]], dict[str, str]]:
    """The candidates with one of each layout (devices are alike: the same groups on other devices are the same
    layout), and which start was left out as the same as which."""
    kept: list[tuple[str, _Layout]] = []
    seen: dict[object, str] = {}
    same_as: dict[str, str] = {}
    for name, layout in candidates:
        key = _layout_key(layout, num_devices)
        if key in seen:
            same_as[name] = seen[key]
        else:
            seen[key] = name
            kept.append((name, layout))
    return kept, same_as


def _specs(shards: Sequence[Shard], task: ShardingTask) -> list[TableSpec]:
    return [s.spec(task.table(s.table)) for s in shards]


class _Refiner:
    def __init__(self, task: ShardingTask, cost_model: CostModel, measurement: MeasurementSettings,
                 progress: bool, dataset: str | Path | None, comm: AllToAllSession | None) -> None:
        self.task, self.model = task, cost_model
        self.device, self.protocol = resolve_timing(measurement)
        self.measurement = measurement
        self.rounds = measurement.timing_rounds
        self.batch = measurement.batch_size or task.batch_size
        self.cache = ShardCostCache(cost_model)
        self.progress = progress
        self.devices_measured = 0
        self.dataset = dataset
        info = hardware_info(self.device)
        self.kind = info["hardware_kind"]
        self.common = {**info, "batch_size": self.batch}
        self.written: set[str] = set()
        self.session = comm  # the all-to-all's process group (None on one device: no exchange)
        # what the refined layout's tables on every device take of each device's memory: the data-parallel
        # replicas (the same everywhere) and the device's row blocks (`hold`)
        self.reserved_bytes = 0
        self.blocks: list[list[TableSpec]] = [[] for _ in range(task.num_devices)]
        self._beside: dict[tuple[tuple[str, ...], tuple[str, ...]], np.ndarray] = {}

    def hold(self, layout: _Layout) -> None:
        """Memory checks from now on leave room for `layout`'s data-parallel replicas and each device's row blocks."""
        task = self.task
        self.reserved_bytes = data_parallel_bytes([task.table(n) for n in layout.data_parallel], task)
        self.blocks = row_blocks([task.table(n) for n in layout.row_wise], task.num_devices)

    def beside(self, layout: _Layout) -> np.ndarray:
        """Measured ms each device pays for `layout`'s tables on every device, beside its own shards: the
        data-parallel tables' dense kernel on the local batch and their gradients' all-reduce (the same on every
        device), the device's row blocks' kernel at the batch and the row-wise collectives; kernels the median over
        the rounds, once per set of such tables."""
        key = layout.everywhere
        if key not in self._beside:
            task, n = self.task, self.task.num_devices
            replicated, split = ([task.table(name) for name in names] for names in key)
            blocks = row_blocks(split, n)
            shards = everywhere_kernels(task, replicated, blocks, self.batch)
            timed = iter(time_shards_in_rounds(shards, self.rounds, device=self.device, protocol=self.protocol,
                                               progress=False) if shards else [])

            def kernel_ms() -> float:
                return statistics.median(t.fwd_ms + t.bwd_ms for t in next(timed))

            cost = np.full(n, kernel_ms() if replicated else 0.0)
            cost += np.array([kernel_ms() if b else 0.0 for b in blocks])
            if self.session is not None and replicated:
                cost += measure_all_reduces([gradient_bytes(replicated)], self.measurement, self.session)[0]
            if self.session is not None and split:
                cost += measure_row_wise_comm([split], self.batch, n, self.measurement, self.session)[0]
            self._beside[key] = cost
        return self._beside[key]

    def _store(self, specs: list[TableSpec], timings: Sequence[ShardTiming]) -> None:
        """Append one device shard's measurement to the cost dataset (once per shard per refinement)."""
        task = self.task
        config = shard_config_id(specs, self.batch, task.optimizer, task.weights_precision, self.kind)
        if self.dataset is None or config in self.written:
            return
        fwd, bwd, raw_fwd, raw_bwd = (statistics.median(getattr(t, f) for t in timings)
                                      for f in ("fwd_ms", "bwd_ms", "raw_fwd_ms", "raw_bwd_ms"))
        launches = [t.launch_ms for t in timings if t.launch_ms is not None]
        median = ShardTiming(fwd_ms=fwd, bwd_ms=bwd, raw_fwd_ms=raw_fwd, raw_bwd_ms=raw_bwd,
                             reference_ms=timings[0].reference_ms,
                             launch_ms=statistics.median(launches) if launches else None, timer=timings[0].timer)
        row = compute_row(specs, median, config_id=config, repeat=0, common=self.common,
                          timing=self.protocol.settings_json(), optimizer=task.optimizer,
                          weights_precision=task.weights_precision, provenance="refine")
        write_part(self.dataset, [row])
        self.written.add(config)

    def measure(self, groups: Sequence[Sequence[Shard]]) -> list[float]:
        """Measured fwd + bwd ms of each group of shards (one device's), median over interleaved rounds."""
        shards = [KernelShard(_specs(g, self.task), self.batch, self.task.optimizer, self.task.weights_precision)
                  for g in groups if g]
        timed = iter(time_shards_in_rounds(shards, self.rounds, device=self.device, protocol=self.protocol,
                                           progress=self.progress))
        self.devices_measured += len(distinct_shards(shards)[0])  # a shard given twice is timed once
        out = []
        for g in groups:
            if not g:
                out.append(0.0)
                continue
            timings = next(timed)
            self._store(_specs(g, self.task), timings)
            out.append(statistics.median(t.fwd_ms + t.bwd_ms for t in timings))
        return out

    def predicted(self, groups: Sequence[Sequence[Shard]]) -> np.ndarray:
        return self.cache.compute_ms([_specs(g, self.task) for g in groups]).sum(axis=1)

    def widths(self, layout: _Layout) -> list[int]:
        return [sum(s.dim for s in layout.on(d)) for d in range(self.task.num_devices)]

    def measure_comm(self, layouts: Sequence[_Layout]) -> list[np.ndarray]:
        """Each layout's ms per device beside its own shards' kernels: the fwd + bwd all-to-all, interleaved in the
        session's process group and priced over these layouts as the measurement's `comm_pricing` says (none on one
        device), and its tables on every device (`beside`)."""
        exchanges = [np.zeros(self.task.num_devices) for _ in layouts]
        if self.session is not None:
            widths = [self.widths(layout) for layout in layouts]
            timed = measure_comm(widths, self.batch, self.measurement, backend=self.session.backend,
                                 session=self.session)
            priced = price_comm(widths, timed, self.measurement.comm_pricing)
            exchanges = [np.array([fwd + bwd for fwd, bwd in devices]) for devices in priced]
        return [ms + self.beside(layout) for ms, layout in zip(exchanges, layouts, strict=True)]

    def fits(self, shards: Sequence[Shard], device: int) -> bool:
        """Whether `shards` fit on `device` beside its row blocks and the data-parallel replicas (`hold`)."""
        task = self.task
        names = [s.table for s in shards]
        return len(names) == len(set(names)) and shard_memory_bytes(
            [*_specs(shards, task), *self.blocks[device]], task.batch_size, task.optimizer,
            task.weights_precision) <= task.device_memory_bytes - self.reserved_bytes


def _side_by_side(refiner: _Refiner, layouts: Sequence[_Layout]) -> tuple[list[list[float]], list[np.ndarray],
                                                                          list[float]]:
    """Layouts measured in one session, kernels interleaved then all-to-alls interleaved, so their figures compare:
    each one's per-device kernel ms, per-device ms beside them (exchange, tables on every device) and slowest
    device."""
    n = refiner.task.num_devices
    timed = refiner.measure([layout.on(d) for layout in layouts for d in range(n)])
    kernels = [timed[i * n:(i + 1) * n] for i in range(len(layouts))]
    comm = refiner.measure_comm(layouts)
    return kernels, comm, [float(max(np.array(k) + c)) for k, c in zip(kernels, comm, strict=True)]
