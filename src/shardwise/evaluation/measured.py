"""Measured plan cost: each device's shard on the real fbgemm kernel plus the real all-to-all."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from shardwise.costmodel.data_parallel import gradient_bytes
from shardwise.costmodel.row_wise import ids_bytes, output_bytes
from shardwise.profiling import (
    AllToAllSession,
    CommPricing,
    ComputeKernel,
    MeasurementSettings,
    ShardTiming,
    TimingProtocol,
    hardware_kind,
    measure_all_to_all_many,
    measure_shard,
    resolve_timing,
)
from shardwise.profiling.comm import default_backend
from shardwise.search.plan import (
    Plan,
    data_parallel_specs,
    device_specs,
    plan_memory_bytes,
    row_block_specs,
    row_wise_specs,
    validate_plan,
)
from shardwise.workload import Optimizer, ShardingTask, TableSpec, WeightsPrecision, local_batch

MEASURED_FORMAT = "shardwise.measured/v1"
COMPARISON_FORMAT = "shardwise.comparison/v1"
# How many rounds and iterations a measurement takes, and why, is MeasurementSettings' (shardwise.profiling):
# per device, the median of `timing_rounds` interleaved kernel timings (one timing of a shard swings by 20% on
# a shared CPU) and of `comm_rounds` x `comm_iters` all-to-alls (one exchange swings by 2x with scheduling),
# each device's all-to-all then priced as `comm_pricing` says (`price_comm`).


class DeviceCost(BaseModel):
    """One device's measured cost for one training iteration, and the memory its shard holds."""

    model_config = ConfigDict(frozen=True)

    device: int
    shards: tuple[str, ...]  # shard names ("t3", "t7[0:32]")
    width: int  # pooled output width on this device (sum of shard dims)
    fwd_ms: float
    bwd_ms: float
    comm_fwd_ms: float  # as priced (the measurement's `timing["comm_pricing"]`)
    comm_bwd_ms: float
    memory_bytes: int
    # the device's own median all-to-all ms, before pricing (None in older files)
    comm_fwd_measured_ms: float | None = None
    comm_bwd_measured_ms: float | None = None
    #: the host's median ms to launch the shard's forward and backward (CUDA; None on CPU and in older files)
    launch_ms: float | None = None
    #: the plan's data-parallel tables' gradient all-reduce, the same on every device (their kernel on the local
    #: batch is in fwd_ms and bwd_ms, their names in `shards`); 0 without data-parallel tables and in older files
    all_reduce_ms: float = 0.0
    #: the plan's row-wise tables' collectives, the same on every device: their outputs' reduce-scatter, their
    #: gradients' all-gather and their ids' all-to-all (their kernel on the device's row blocks is in fwd_ms and
    #: bwd_ms, the blocks' names in `shards`); 0 without row-wise tables and in older files
    row_wise_comm_ms: float = 0.0

    @property
    def compute_ms(self) -> float:
        """Forward plus backward kernel time."""
        return self.fwd_ms + self.bwd_ms

    @property
    def launch_bound(self) -> bool:
        """Whether the host takes longer to launch the device's kernels than the device takes to run them: a
        training step on it then waits for the host, whatever the plan puts there."""
        return self.launch_ms is not None and self.launch_ms > self.compute_ms

    @property
    def comm_ms(self) -> float:
        """Forward plus backward all-to-all time."""
        return self.comm_fwd_ms + self.comm_bwd_ms

    @property
    def total_ms(self) -> float:
        """Forward + backward + forward all-to-all + backward all-to-all (+ the data-parallel all-reduce)."""
        return self.compute_ms + self.comm_ms + self.all_reduce_ms + self.row_wise_comm_ms

    @property
    def own_comm_fwd_bwd_ms(self) -> tuple[float, float]:
        """The device's own median forward and backward all-to-all ms, before any pricing (older files priced
        none, so their figures are those)."""
        if self.comm_fwd_measured_ms is None or self.comm_bwd_measured_ms is None:
            return self.comm_fwd_ms, self.comm_bwd_ms
        return self.comm_fwd_measured_ms, self.comm_bwd_measured_ms


class MeasuredPlanCost(BaseModel):
    """A plan's measured per-device costs; the plan costs what its slowest device costs."""

    model_config = ConfigDict(frozen=True)

    format: str = MEASURED_FORMAT
    method: str
    batch_size: int
    device_kind: str  # "cpu" / "cuda"
    hardware_kind: str
    device_memory_bytes: int
    timing: dict[str, Any] = Field(default_factory=dict)
    reference_ms: float | None = None
    devices: tuple[DeviceCost, ...]
    #: the tables replicated on every device (empty in older files)
    data_parallel: tuple[str, ...] = ()
    #: the tables split by rows over every device (empty in older files)
    row_wise: tuple[str, ...] = ()

    @property
    def max_cost_ms(self) -> float:
        """The plan's cost: the slowest device's total."""
        return max(d.total_ms for d in self.devices)

    @property
    def max_compute_ms(self) -> float:
        """The slowest device's kernel time alone (fwd + bwd), without the all-to-all."""
        return max(d.compute_ms for d in self.devices)

    @property
    def mean_cost_ms(self) -> float:
        """Mean per-device total."""
        return sum(d.total_ms for d in self.devices) / len(self.devices)

    @property
    def imbalance(self) -> float:
        """max / mean of the per-device totals (1.0 is perfectly balanced)."""
        mean = self.mean_cost_ms
        return self.max_cost_ms / mean if mean > 0 else 1.0

    @property
    def comm_pricing(self) -> CommPricing:
        """How each device's all-to-all was priced (older files: each device's own median)."""
        return "width" if self.timing.get("comm_pricing") == "width" else "measured"

    @property
    def max_memory_bytes(self) -> int:
        """The fullest device's memory."""
        return max(d.memory_bytes for d in self.devices)

    @property
    def own_comm_max_cost_ms(self) -> float:
        """The plan cost with each device's all-to-all its own median, before any pricing."""
        return max(d.compute_ms + sum(d.own_comm_fwd_bwd_ms) + d.all_reduce_ms + d.row_wise_comm_ms
                   for d in self.devices)

    @property
    def memory_headroom(self) -> float:
        """Fraction of the per-device cap left free on the fullest device."""
        return 1.0 - self.max_memory_bytes / self.device_memory_bytes

    @property
    def launch_bound_devices(self) -> tuple[int, ...]:
        """The devices whose kernels the host launches slower than they run (CUDA measurements only)."""
        return tuple(d.device for d in self.devices if d.launch_bound)

    def to_json(self) -> dict[str, Any]:
        """The `shardwise.measured/v1` document, with the derived totals for readers."""
        doc = self.model_dump(mode="json")
        doc.update(
            max_cost_ms=self.max_cost_ms,
            max_compute_ms=self.max_compute_ms,
            mean_cost_ms=self.mean_cost_ms,
            imbalance=self.imbalance,
            memory_headroom=self.memory_headroom,
            launch_bound_devices=list(self.launch_bound_devices),
        )
        for dev, row in zip(self.devices, doc["devices"]):
            row["total_ms"] = dev.total_ms
        return doc

    def table(self) -> str:
        """A per-device text table (what `shardwise evaluate` prints)."""
        head = f"{'device':>6} {'shards':>6} {'width':>6} {'fwd_ms':>9} {'bwd_ms':>9} {'a2a_fwd':>9} {'a2a_bwd':>9} {'total_ms':>9} {'mem_GiB':>8}"
        lines = [head]
        for d in self.devices:
            lines.append(
                f"{d.device:>6} {len(d.shards):>6} {d.width:>6} {d.fwd_ms:>9.3f} {d.bwd_ms:>9.3f} "
                f"{d.comm_fwd_ms:>9.3f} {d.comm_bwd_ms:>9.3f} {d.total_ms:>9.3f} {d.memory_bytes / 2**30:>8.3f}"
            )
        lines.append(
            f"plan ({self.method}): max {self.max_cost_ms:.3f} ms, mean {self.mean_cost_ms:.3f} ms, "
            f"imbalance {self.imbalance:.3f}, memory headroom {self.memory_headroom:.1%} "
            f"(batch {self.batch_size}, {self.hardware_kind})"
        )
        if self.data_parallel:
            lines.append(
                f"data-parallel on every device: {', '.join(self.data_parallel)} (their kernel on the local batch in "
                f"fwd_ms / bwd_ms, their gradient all-reduce {self.devices[0].all_reduce_ms:.3f} ms in total_ms)"
            )
        if self.row_wise:
            lines.append(
                f"row-wise over every device: {', '.join(self.row_wise)} (the kernel on each device's row blocks in "
                f"fwd_ms / bwd_ms, their collectives {self.devices[0].row_wise_comm_ms:.3f} ms in total_ms)"
            )
        if self.launch_bound_devices:
            worst = max((d for d in self.devices if d.launch_bound), key=lambda d: d.launch_ms or 0.0)
            lines.append(
                f"launch-bound: device(s) {', '.join(map(str, self.launch_bound_devices))}: the host takes longer to "
                f"launch their kernels than the device runs them (device {worst.device}: {worst.launch_ms:.3f} ms "
                f"to launch, {worst.compute_ms:.3f} ms to run); a larger per-device batch, not another plan, "
                "speeds them up"
            )
        return "\n".join(lines)


def describe_comm_pricing(pricing: CommPricing) -> str:
    """How each device's all-to-all was priced, in words (reports and tables)."""
    if pricing == "width":
        return "each device's all-to-all priced by a line in its pooled width fitted over the devices measured together"
    return "each device's all-to-all its own median"


def save_measured(cost: MeasuredPlanCost, path: str | Path) -> Path:
    """Write a measured plan cost as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cost.to_json(), indent=1))
    return path


class KernelShard(NamedTuple):
    """What one kernel timing needs: a device's tables, the batch they are timed at, the task's optimizer and
    weights precision, and the kernel ("dense" for data-parallel tables: `ComputeKernel`)."""

    tables: Sequence[TableSpec]
    batch_size: int
    optimizer: Optimizer = "rowwise_adagrad"
    weights_precision: WeightsPrecision = "fp32"
    compute_kernel: ComputeKernel = "fused"


def everywhere_kernels(task: ShardingTask, replicated: Sequence[TableSpec], blocks: Sequence[Sequence[TableSpec]],
                       batch_size: int) -> list[KernelShard]:
    """The kernels a plan's tables on every device add, in this order: one dense kernel over the data-parallel
    `replicated` tables at the local batch (the same on every device; none without them), then each device's row
    `blocks` at `batch_size` (a block's lookups are the batch's ids that fall in its rows; devices holding none left
    out)."""
    kernels = [KernelShard(replicated, local_batch(batch_size, task.num_devices), task.optimizer,
                           task.weights_precision, "dense")] if replicated else []
    return kernels + [KernelShard(device_blocks, batch_size, task.optimizer, task.weights_precision)
                      for device_blocks in blocks if device_blocks]


def timing_document(protocol: TimingProtocol, measurement: MeasurementSettings) -> dict[str, Any]:
    """How a measurement was timed, as stored in `MeasuredPlanCost.timing` (keys of shardwise.measured/v1):
    the protocol's settings (its reference is stored on its own), compute_rounds, comm_iters, comm_rounds,
    comm_pricing (absent in older files: "measured")."""
    return {
        **protocol.model_dump(mode="json", exclude={"reference_ms"}),
        "compute_rounds": measurement.timing_rounds,
        "comm_iters": measurement.comm_iters,
        "comm_rounds": measurement.comm_rounds,
        "comm_pricing": measurement.comm_pricing,
    }


def time_shards_in_rounds(
    shards: Sequence[KernelShard],
    rounds: int,
    *,
    device: torch.device,
    protocol: TimingProtocol,
    progress: bool = True,
) -> list[list[ShardTiming]]:
    """Each shard timed once per round, `rounds` rounds interleaved over all of them, so machine drift during
    the run hits every shard alike; per shard, its timings in round order. `device` and `protocol` as
    `resolve_timing` gives them (a normalised protocol needs its reference set).

    Shards that are the same (the same tables, in any order, at the same batch, optimizer and precision: a device
    two plans lay out alike) are timed once and share their timings, so plans that agree on a device get the same
    figure there instead of two noisy ones."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    unique, index = distinct_shards(shards)
    timings: list[list[ShardTiming]] = [[] for _ in unique]
    with tqdm(total=rounds * len(unique), desc="measure shards", unit="shard", disable=not progress) as bar:
        for _ in range(rounds):
            for shard, row in zip(unique, timings):
                row.append(measure_shard(
                    shard.tables, shard.batch_size, device=device, protocol=protocol, optimizer=shard.optimizer,
                    weights_precision=shard.weights_precision, compute_kernel=shard.compute_kernel,
                ))
                bar.update()
    return [list(timings[i]) for i in index]


def distinct_shards(shards: Sequence[KernelShard]) -> tuple[list[KernelShard], list[int]]:
    """The distinct shards (the same tables in any order, batch, optimizer and precision: a refined plan's shards
    are sorted), each as first given, and the index of each of `shards` among them."""
    distinct: dict[tuple[Any, ...], int] = {}
    unique: list[KernelShard] = []
    index = []
    for shard in shards:
        key = (tuple(sorted(t.model_dump_json() for t in shard.tables)), shard.batch_size, shard.optimizer,
               shard.weights_precision, shard.compute_kernel)
        if key not in distinct:
            distinct[key] = len(unique)
            unique.append(shard)
        index.append(distinct[key])
    return unique, index


def _median_fwd_bwd(timings: Sequence[ShardTiming]) -> tuple[float, float]:
    return statistics.median(t.fwd_ms for t in timings), statistics.median(t.bwd_ms for t in timings)


def _median_launch_ms(timings: Sequence[ShardTiming]) -> float | None:
    """The host's median launch ms over a shard's timings (None where none was timed on CUDA)."""
    launches = [t.launch_ms for t in timings if t.launch_ms is not None]
    return statistics.median(launches) if launches else None


def measure_all_reduces(sizes_bytes: Sequence[int], measurement: MeasurementSettings,
                        session: AllToAllSession) -> list[float]:
    """Median ms of each size's fp32 all-reduce (data-parallel gradients) in `session`'s process group, the sizes
    taking turns, `comm_rounds` x `comm_iters` each as the all-to-alls; sizes given twice are timed once."""
    distinct = sorted({int(size) for size in sizes_bytes if size > 0})
    timed = session.measure_all_reduce(distinct, iters=measurement.comm_rounds * measurement.comm_iters)
    medians = {size: statistics.median(samples) for size, samples in zip(distinct, timed, strict=True)}
    return [medians.get(int(size), 0.0) for size in sizes_bytes]


def measure_row_wise_comm(tables_of: Sequence[Sequence[TableSpec]], batch_size: int, num_devices: int,
                          measurement: MeasurementSettings, session: AllToAllSession) -> list[float]:
    """Median ms of each plan's row-wise collectives (`tables_of`: each plan's row-wise tables) in `session`'s
    process group: the outputs' reduce-scatter, the gradients' all-gather (the same bytes) and the ids' all-to-all,
    each size timed `comm_rounds` x `comm_iters` times, the sizes taking turns; 0 for a plan without any."""
    iters = measurement.comm_rounds * measurement.comm_iters
    sizes = [(output_bytes(tables, batch_size), ids_bytes(tables, batch_size, num_devices)) if tables else (0, 0)
             for tables in tables_of]
    medians: dict[tuple[str, int], float] = {}
    for op, column in (("reduce_scatter", 0), ("all_gather", 0), ("all_to_all", 1)):
        distinct = sorted({max(4 * num_devices, s[column]) for s, tables in zip(sizes, tables_of) if tables})
        for size, samples in zip(distinct, session.measure_collective(op, distinct, iters=iters), strict=True):
            medians[(op, size)] = statistics.median(samples)
    return [sum(medians[(op, max(4 * num_devices, s[column]))]
                for op, column in (("reduce_scatter", 0), ("all_gather", 0), ("all_to_all", 1))) if tables else 0.0
            for s, tables in zip(sizes, tables_of, strict=True)]


def measure_comm(
    layouts: Sequence[Sequence[int]], batch_size: int, measurement: MeasurementSettings, *, backend: str,
    session: AllToAllSession | None = None,
) -> list[list[tuple[float, float]]]:
    """Per layout (its devices' pooled widths; every layout with the same device count), each device's median
    forward and backward all-to-all ms. One process group (`session`'s, else a new one); every layout timed
    `comm_rounds` x `comm_iters` times, the layouts taking turns exchange by exchange, the median of all its
    exchanges per device: machine drift during the run then hits all layouts alike instead of whichever happened
    to run during a slow spell. Layouts with the same widths are timed once and share their figures."""
    distinct = [list(w) for w in dict.fromkeys(tuple(w) for w in layouts)]
    iters = measurement.comm_rounds * measurement.comm_iters
    if session is None:
        exchanges = measure_all_to_all_many(distinct, batch_size, backend=backend, iters=iters)
    else:
        exchanges = session.measure(distinct, batch_size, iters=iters)
    medians = {tuple(w): [(t.fwd_ms, t.bwd_ms) for t in timed] for w, timed in zip(distinct, exchanges, strict=True)}
    return [medians[tuple(w)] for w in layouts]


def price_comm(
    layouts: Sequence[Sequence[int]], measured: Sequence[Sequence[tuple[float, float]]], pricing: CommPricing,
) -> list[list[tuple[float, float]]]:
    """Each device's forward and backward all-to-all ms as `pricing` says, from `measure_comm`'s medians of the
    same layouts (each layout its devices' pooled widths). "measured": the medians as they are. "width": a straight
    line in the device's width, fitted by least squares over every device of the distinct layouts (timed together,
    so one session's exchanges), forward and backward each; when every width is the same, their mean. The line
    keeps the part of a device's figure that follows its width, which repeats between sessions, and drops the
    rest, which does not (see CommPricing); its mean over the fitted devices is theirs."""
    if pricing == "measured":
        return [list(devices) for devices in measured]
    distinct = dict(zip((tuple(w) for w in layouts), measured, strict=True))
    widths = np.array([w for layout in distinct for w in layout], dtype=float)
    figures = np.array([ms for devices in distinct.values() for ms in devices], dtype=float).reshape(-1, 2)
    if np.ptp(widths) > 0:
        slope, intercept = np.polyfit(widths, figures, 1)  # one line per column: forward, backward
    else:
        slope, intercept = np.zeros(2), figures.mean(axis=0)
    priced = [[np.maximum(intercept + slope * w, 0.0) for w in layout] for layout in layouts]
    return [[(float(fwd), float(bwd)) for fwd, bwd in devices] for devices in priced]


def measure_plans(
    items: Sequence[tuple[ShardingTask, Plan]],
    measurement: MeasurementSettings | None = None,
    *,
    comm_backend: str | None = None,
    progress: bool = True,
) -> list[MeasuredPlanCost]:
    """Measure several (task, plan) pairs in one session; refuse invalid plans before anything runs.

    One reference calibration for all (unless `measurement.reference_ms` pins it), every device shard timed in
    `timing_rounds` interleaved rounds at `measurement.batch_size` (default: each task's), and all-to-alls of
    equal device count and batch in one process group (`comm_backend`: NCCL on CUDA, gloo on CPU by default),
    the layouts taking turns exchange by exchange, `comm_rounds` x `comm_iters` each; medians per device."""
    measurement = measurement or MeasurementSettings()
    for task, plan in items:
        validate_plan(plan, task)  # refuses columns covered twice, devices out of range, over memory
    device, protocol = resolve_timing(measurement)
    batches = [measurement.batch_size or task.batch_size for task, _ in items]
    layouts = [device_specs(plan, task) for task, plan in items]  # column slices keep their source's data

    # every device's shard timed once per round, rounds interleaved over all plans, median per device: one
    # timing of a shard swings by 20% on a shared CPU (the reference normalises drift, not preemption)
    shards = [
        KernelShard(tables, batch, task.optimizer, task.weights_precision)
        for (task, _), devices, batch in zip(items, layouts, batches)
        for tables in devices
        if tables
    ]
    # data-parallel tables (one dense kernel over all of a plan's, on the local batch, the same on every device) and
    # row-wise tables (one kernel over each device's row blocks); devices with the same blocks are timed once
    replicated = [data_parallel_specs(plan, task) for task, plan in items]
    blocks = [row_block_specs(plan, task) for task, plan in items]
    shards += [kernel for (task, _), tables, devices, batch in zip(items, replicated, blocks, batches)
               for kernel in everywhere_kernels(task, tables, devices, batch)]
    timed = iter(time_shards_in_rounds(
        shards, measurement.timing_rounds, device=device, protocol=protocol, progress=progress
    ))
    timings = [[next(timed) if tables else [] for tables in devices] for devices in layouts]
    replicated_ms: list[tuple[float, float]] = []
    block_ms: list[list[tuple[float, float]]] = []
    for tables, devices in zip(replicated, blocks, strict=True):  # in everywhere_kernels' order
        replicated_ms.append(_median_fwd_bwd(next(timed)) if tables else (0.0, 0.0))
        block_ms.append([_median_fwd_bwd(next(timed)) if device_blocks else (0.0, 0.0) for device_blocks in devices])
    compute = [[_median_fwd_bwd(t) if t else (0.0, 0.0) for t in devices] for devices in timings]
    compute = [[(fwd + extra[0] + own[0], bwd + extra[1] + own[1]) for (fwd, bwd), own in zip(devices, rows, strict=True)]
               for devices, extra, rows in zip(compute, replicated_ms, block_ms, strict=True)]
    launch = [[_median_launch_ms(t) for t in devices] for devices in timings]

    widths = [[sum(t.dim for t in tables) for tables in devices] for devices in layouts]
    comm: list[list[tuple[float, float]]] = [[(0.0, 0.0)] * len(w) for w in widths]  # one device: no exchange
    groups: dict[tuple[int, int], list[int]] = {}
    for k, (w, batch) in enumerate(zip(widths, batches)):
        if len(w) > 1:
            groups.setdefault((len(w), batch), []).append(k)
    measured_comm = [list(c) for c in comm]
    backend = comm_backend or default_backend(device.type)
    all_reduce = [0.0] * len(items)
    row_wise_comm = [0.0] * len(items)
    split = [row_wise_specs(plan, task) for task, plan in items]
    for (num_devices, batch), members in groups.items():
        group = [widths[k] for k in members]
        if not any(replicated[k] or split[k] for k in members):
            medians = measure_comm(group, batch, measurement, backend=backend)
        else:  # data-parallel gradients' all-reduces and row-wise collectives in the all-to-alls' process group
            with AllToAllSession(num_devices, backend=backend) as session:
                medians = measure_comm(group, batch, measurement, backend=backend, session=session)
                if any(replicated[k] for k in members):
                    sizes = measure_all_reduces([gradient_bytes(replicated[k]) for k in members], measurement,
                                                session)
                    for k, ms in zip(members, sizes, strict=True):
                        all_reduce[k] = ms
                if any(split[k] for k in members):
                    collectives = measure_row_wise_comm([split[k] for k in members], batch, num_devices, measurement,
                                                        session)
                    for k, ms in zip(members, collectives, strict=True):
                        row_wise_comm[k] = ms
        for k, raw, priced in zip(members, medians, price_comm(group, medians, measurement.comm_pricing)):
            measured_comm[k], comm[k] = raw, priced

    kind = hardware_kind(device)
    timing = timing_document(protocol, measurement)
    results = []
    for k, (task, plan) in enumerate(items):
        memory = plan_memory_bytes(plan, task)
        costs = tuple(
            DeviceCost(
                device=d,
                shards=tuple(t.name for t in [*tables, *replicated[k], *blocks[k][d]]),
                width=widths[k][d],
                fwd_ms=compute[k][d][0],
                bwd_ms=compute[k][d][1],
                comm_fwd_ms=comm[k][d][0],
                comm_bwd_ms=comm[k][d][1],
                memory_bytes=memory[d],
                comm_fwd_measured_ms=measured_comm[k][d][0],
                comm_bwd_measured_ms=measured_comm[k][d][1],
                launch_ms=launch[k][d],
                all_reduce_ms=all_reduce[k],
                row_wise_comm_ms=row_wise_comm[k],
            )
            for d, tables in enumerate(layouts[k])
        )
        results.append(
            MeasuredPlanCost(
                method=plan.method,
                batch_size=batches[k],
                device_kind=device.type,
                hardware_kind=kind,
                device_memory_bytes=task.device_memory_bytes,
                timing=timing,
                reference_ms=protocol.reference_ms,
                devices=costs,
                data_parallel=plan.data_parallel,
                row_wise=plan.row_wise,
            )
        )
    return results


def measure_plan(
    task: ShardingTask,
    plan: Plan,
    measurement: MeasurementSettings | None = None,
    *,
    comm_backend: str | None = None,
    progress: bool = True,
) -> MeasuredPlanCost:
    """Measure `plan` on real hardware: per device fwd + bwd kernel + fwd/bwd all-to-all; refuse invalid plans.

    For the measurement to compare with a cost model's predictions, time as its training data was:
    `measurement.for_cost_model(model.reference_ms, model.batch_size)`."""
    return measure_plans([(task, plan)], measurement, comm_backend=comm_backend, progress=progress)[0]


class PlanComparisonRow(BaseModel):
    """One plan's line in a comparison of plans measured in the same session."""

    model_config = ConfigDict(frozen=True)

    name: str
    method: str
    max_cost_ms: float
    max_compute_ms: float
    max_comm_ms: float
    mean_cost_ms: float
    imbalance: float
    memory_headroom: float
    ratio_to_first: float  # max_cost_ms / the first plan's (below 1: cheaper than the first plan)
    predicted_max_cost_ms: float | None = None


class PlanComparison(BaseModel):
    """Plans of one task measured in one session (same reference timing, same all-to-all process group)."""

    model_config = ConfigDict(frozen=True)

    format: str = COMPARISON_FORMAT
    batch_size: int
    hardware_kind: str
    reference_ms: float | None
    compute_rounds: int
    comm_iters: int
    comm_rounds: int
    comm_pricing: CommPricing = "measured"
    plans: tuple[PlanComparisonRow, ...]

    def row(self, name: str) -> PlanComparisonRow:
        """The row of plan `name`."""
        for r in self.plans:
            if r.name == name:
                return r
        raise KeyError(f"no plan named {name!r} in the comparison; plans: {[r.name for r in self.plans]}")

    def table(self) -> str:
        """A text table, one line per plan (what `shardwise evaluate` prints for several plans)."""
        lines = [
            f"{'plan':<20} {'method':<14} {'max_ms':>9} {'compute':>9} {'a2a':>9} {'imbal':>7} {'headroom':>8} "
            f"{'vs_first':>8} {'predicted':>9}"
        ]
        for r in self.plans:
            predicted = "-" if r.predicted_max_cost_ms is None else f"{r.predicted_max_cost_ms:.3f}"
            lines.append(
                f"{r.name:<20} {r.method:<14} {r.max_cost_ms:>9.3f} {r.max_compute_ms:>9.3f} {r.max_comm_ms:>9.3f} "
                f"{r.imbalance:>7.3f} {r.memory_headroom:>8.1%} {r.ratio_to_first:>8.3f} {predicted:>9}"
            )
        lines.append(
            f"measured in one session: batch {self.batch_size}, {self.hardware_kind}, reference_ms "
            f"{'-' if self.reference_ms is None else format(self.reference_ms, '.4f')}; medians of "
            f"{self.compute_rounds} interleaved kernel timings and {self.comm_rounds} interleaved rounds x "
            f"{self.comm_iters} all-to-alls per device, {describe_comm_pricing(self.comm_pricing)}"
        )
        return "\n".join(lines)


def compare_measured(
    named: Sequence[tuple[str, MeasuredPlanCost]],
    *,
    predicted_max_ms: Sequence[float | None] | None = None,
) -> PlanComparison:
    """The comparison of plans measured together (`measure_plans`); ratios are to the first plan."""
    if not named:
        raise ValueError("plans: nothing to compare")
    first = named[0][1].max_cost_ms
    predicted = list(predicted_max_ms) if predicted_max_ms is not None else [None] * len(named)
    rows = tuple(
        PlanComparisonRow(
            name=name,
            method=cost.method,
            max_cost_ms=cost.max_cost_ms,
            max_compute_ms=cost.max_compute_ms,
            max_comm_ms=max(d.comm_ms for d in cost.devices),
            mean_cost_ms=cost.mean_cost_ms,
            imbalance=cost.imbalance,
            memory_headroom=cost.memory_headroom,
            ratio_to_first=cost.max_cost_ms / first if first > 0 else float("nan"),
            predicted_max_cost_ms=p,
        )
        for (name, cost), p in zip(named, predicted)
    )
    ref = named[0][1]
    return PlanComparison(
        batch_size=ref.batch_size,
        hardware_kind=ref.hardware_kind,
        reference_ms=ref.reference_ms,
        compute_rounds=int(ref.timing.get("compute_rounds", 1)),
        comm_iters=int(ref.timing.get("comm_iters", 0)),
        comm_rounds=int(ref.timing.get("comm_rounds", 1)),
        comm_pricing=ref.comm_pricing,
        plans=rows,
    )
