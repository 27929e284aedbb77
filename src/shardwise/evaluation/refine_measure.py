"""The refiner's measuring of a layout: a plan's shards as refinement changes them (`Layout`), each device's
kernels, all-to-all and tables on every device timed on this machine (`Refiner`), layouts measured side by side in
one session (`side_by_side`), and refinement's clock (`Clock`), read between every two shard timings."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

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


class OutOfTime(Exception):
    """Refinement's budget ran out in the middle of a measurement that decides nothing unfinished (a round's change, a
    check): the plan measured so far stands."""


@dataclass
class Clock:
    """Refinement's time budget: seconds since `started` (time.perf_counter), none when `budget_s` is None."""

    budget_s: float | None
    started: float = field(default_factory=time.perf_counter)
    #: seconds kept back at the end of the budget for what follows the measuring (closing the process group)
    closing_s: float = 0.0

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def left_s(self) -> float:
        """Seconds left of the budget for measuring (infinite without one, negative once spent)."""
        return math.inf if self.budget_s is None else self.budget_s - self.closing_s - self.elapsed_s()

    def spent(self) -> bool:
        return self.left_s() <= 0

    def why(self) -> str:
        """Why refinement stopped early, as its record says it."""
        return f"the {self.budget_s:g} s budget was spent"


@dataclass
class Layout:
    """A plan's shards as refinement changes them, and the tables on every device as the plan has them."""

    shards: list[Shard]
    data_parallel: tuple[str, ...] = ()  #: kept as the plan has them
    row_wise: tuple[str, ...] = ()  #: kept as the plan has them

    @classmethod
    def of(cls, plan: Plan) -> Layout:
        return cls(list(plan.shards), plan.data_parallel, plan.row_wise)

    @property
    def everywhere(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The tables on every device: data-parallel, row-wise."""
        return self.data_parallel, self.row_wise

    def on(self, device: int) -> list[Shard]:
        return [s for s in self.shards if s.device == device]


def layout_key(layout: Layout, num_devices: int) -> tuple[object, ...]:
    """What makes two layouts the same plan: each device's column slices (devices are alike, so in any order) and
    the tables on every device."""
    groups = sorted(tuple(sorted((s.table, s.col_offset, s.dim) for s in layout.on(d))) for d in range(num_devices))
    return (tuple(groups), *(tuple(sorted(names)) for names in layout.everywhere))


def distinct_layouts(candidates: Sequence[tuple[str, Layout]],
                     num_devices: int) -> tuple[list[tuple[str, Layout]], dict[str, str]]:
    """The candidates with one of each layout (devices are alike: the same groups on other devices are the same
    layout), and which start was left out as the same as which."""
    kept: list[tuple[str, Layout]] = []
    seen: dict[object, str] = {}
    same_as: dict[str, str] = {}
    for name, layout in candidates:
        key = layout_key(layout, num_devices)
        if key in seen:
            same_as[name] = seen[key]
        else:
            seen[key] = name
            kept.append((name, layout))
    return kept, same_as


def _specs(shards: Sequence[Shard], task: ShardingTask) -> list[TableSpec]:
    return [s.spec(task.table(s.table)) for s in shards]


class Refiner:
    """Times layouts' kernels, all-to-alls and tables on every device on this machine, on refinement's clock."""

    def __init__(self, task: ShardingTask, cost_model: CostModel, measurement: MeasurementSettings,
                 progress: bool, dataset: str | Path | None, comm: AllToAllSession | None,
                 clock: Clock | None = None) -> None:
        self.task, self.model = task, cost_model
        self.clock = clock or Clock(None)
        self.opened = time.perf_counter()  #: when measuring began (a start timed before it is not a device shard)
        # what a shard timing and a layout's exchanges have taken so far: what the final check is expected to take
        self.timing_s, self.timings, self.comm_s, self.comm_layouts = 0.0, 0, 0.0, 0
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

    def hold(self, layout: Layout) -> None:
        """Memory checks from now on leave room for `layout`'s data-parallel replicas and each device's row blocks."""
        task = self.task
        self.reserved_bytes = data_parallel_bytes([task.table(n) for n in layout.data_parallel], task)
        self.blocks = row_blocks([task.table(n) for n in layout.row_wise], task.num_devices)

    def beside(self, layout: Layout) -> np.ndarray:
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

    def measure(self, groups: Sequence[Sequence[Shard]], *, first_round: bool = False) -> list[float]:
        """Measured fwd + bwd ms of each group of shards (one device's), median over interleaved rounds. The clock is
        read before every shard's timing: once the budget is spent, OutOfTime, or with `first_round` (the figures
        refinement cannot start without) the rounds done so far, the first of them always finished."""
        shards = [KernelShard(_specs(g, self.task), self.batch, self.task.optimizer, self.task.weights_precision)
                  for g in groups if g]
        timed = iter(self._time_in_rounds(shards, first_round))
        out = []
        for g in groups:
            if not g:
                out.append(0.0)
                continue
            timings = next(timed)
            self._store(_specs(g, self.task), timings)
            out.append(statistics.median(t.fwd_ms + t.bwd_ms for t in timings))
        return out

    def _time_in_rounds(self, shards: Sequence[KernelShard], first_round: bool) -> list[list[ShardTiming]]:
        """Each shard's timings, the distinct shards timed once per round in turn (as `time_shards_in_rounds`), the
        rounds cut short where the clock says so (see `measure`): a round left unfinished is dropped whole, so every
        shard keeps as many timings as the others, taken in the same rounds."""
        unique, index = distinct_shards(shards)
        timings: list[list[ShardTiming]] = [[] for _ in unique]
        with tqdm(total=self.rounds * len(unique), desc="measure shards", unit="shard",
                  disable=not self.progress) as bar:
            for done in range(self.rounds):
                for shard, row in zip(unique, timings, strict=True):
                    if self.clock.spent() and not (first_round and done == 0):
                        if first_round:
                            return [timings[i][:done] for i in index]
                        raise OutOfTime
                    timing_started = time.perf_counter()
                    row += time_shards_in_rounds([shard], 1, device=self.device, protocol=self.protocol,
                                                 progress=False)[0]
                    self.timing_s += time.perf_counter() - timing_started
                    self.timings += 1
                    if done == 0:  # a shard given twice is timed once
                        self.devices_measured += 1
                    bar.update()
        return [timings[i] for i in index]

    def predicted(self, groups: Sequence[Sequence[Shard]]) -> np.ndarray:
        return self.cache.compute_ms([_specs(g, self.task) for g in groups]).sum(axis=1)

    def widths(self, layout: Layout) -> list[int]:
        return [sum(s.dim for s in layout.on(d)) for d in range(self.task.num_devices)]

    def measure_comm(self, layouts: Sequence[Layout]) -> list[np.ndarray]:
        """Each layout's ms per device beside its own shards' kernels: the fwd + bwd all-to-all, interleaved in the
        session's process group and priced over these layouts as the measurement's `comm_pricing` says (none on one
        device), and its tables on every device (`beside`)."""
        started = time.perf_counter()
        exchanges = [np.zeros(self.task.num_devices) for _ in layouts]
        if self.session is not None:
            widths = [self.widths(layout) for layout in layouts]
            timed = measure_comm(widths, self.batch, self.measurement, backend=self.session.backend,
                                 session=self.session)
            priced = price_comm(widths, timed, self.measurement.comm_pricing)
            exchanges = [np.array([fwd + bwd for fwd, bwd in devices]) for devices in priced]
        beside = [ms + self.beside(layout) for ms, layout in zip(exchanges, layouts, strict=True)]
        self.comm_s += time.perf_counter() - started
        self.comm_layouts += len(layouts)
        return beside

    def first_round_s(self, layouts: int) -> float:
        """Seconds that `layouts` layouts side by side take for one timing of each device shard and their exchanges,
        at what timings and exchanges have taken so far: the least a final check takes."""
        timing_s = self.timing_s / max(self.timings, 1)
        return layouts * (timing_s * self.task.num_devices + self.comm_s / max(self.comm_layouts, 1))

    def fits(self, shards: Sequence[Shard], device: int) -> bool:
        """Whether `shards` fit on `device` beside its row blocks and the data-parallel replicas (`hold`)."""
        task = self.task
        names = [s.table for s in shards]
        return len(names) == len(set(names)) and shard_memory_bytes(
            [*_specs(shards, task), *self.blocks[device]], task.batch_size, task.optimizer,
            task.weights_precision) <= task.device_memory_bytes - self.reserved_bytes


def side_by_side(refiner: Refiner, layouts: Sequence[Layout], *,
                 first_round: bool = False) -> tuple[list[list[float]], list[np.ndarray], list[float]]:
    """Layouts measured in one session, kernels interleaved then all-to-alls interleaved, so their figures compare:
    each one's per-device kernel ms, per-device ms beside them (exchange, tables on every device) and slowest
    device. The clock as `Refiner.measure` reads it (`first_round`: the session refinement starts from, cut short
    but never empty)."""
    n = refiner.task.num_devices
    timed = refiner.measure([layout.on(d) for layout in layouts for d in range(n)], first_round=first_round)
    kernels = [timed[i * n:(i + 1) * n] for i in range(len(layouts))]
    if refiner.clock.spent() and not first_round:
        raise OutOfTime
    comm = refiner.measure_comm(layouts)
    return kernels, comm, [float(max(np.array(k) + c)) for k, c in zip(kernels, comm, strict=True)]
