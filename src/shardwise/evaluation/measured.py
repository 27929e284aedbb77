"""Measured plan cost: each device's shard on the real fbgemm kernel plus the real all-to-all.

The measuring sessions live here; the records they return (`DeviceCost`, `MeasuredPlanCost`, `PlanComparison`)
and their JSON live in `measured_records`, and are importable from here too."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
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

from .measured_records import (
    COMPARISON_FORMAT,
    MEASURED_FORMAT,
    DeviceCost,
    MeasuredPlanCost,
    PlanComparison,
    PlanComparisonRow,
    compare_measured,
    describe_comm_pricing,
    save_measured,
)

__all__ = [
    "COMPARISON_FORMAT",
    "MEASURED_FORMAT",
    "DeviceCost",
    "KernelShard",
    "MeasuredPlanCost",
    "PlanComparison",
    "PlanComparisonRow",
    "compare_measured",
    "describe_comm_pricing",
    "distinct_shards",
    "everywhere_kernels",
    "measure_all_reduces",
    "measure_comm",
    "measure_plan",
    "measure_plans",
    "measure_row_wise_comm",
    "price_comm",
    "resolve_timing",
    "save_measured",
    "time_shards_in_rounds",
    "timing_document",
]


# How many rounds and iterations a measurement takes, and why, is MeasurementSettings' (shardwise.profiling):
# per device, the median of `timing_rounds` interleaved kernel timings (one timing of a shard swings by 20% on
# a shared CPU) and of `comm_rounds` x `comm_iters` all-to-alls (one exchange swings by 2x with scheduling),
# each device's all-to-all then priced as `comm_pricing` says (`price_comm`).


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
    """How a measurement was timed, as stored in `MeasuredPlanCost.timing` (keys of shardwise.measured/v2):
    the protocol's settings (its reference is stored on its own), compute_rounds, comm_iters, comm_rounds,
    comm_pricing."""
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


class _PlanKernels(NamedTuple):
    """One plan's kernel medians per device: forward and backward ms (its shards, plus the plan's data-parallel
    dense kernel and its own row blocks), and the host's launch ms (None where none was timed on CUDA)."""

    compute: list[tuple[float, float]]
    launch: list[float | None]


class _PlanCollectives(NamedTuple):
    """One plan's collective medians: each device's forward and backward all-to-all ms as priced and as measured,
    and the plan's data-parallel all-reduce and row-wise collectives ms (the same on every device)."""

    comm: list[tuple[float, float]]
    measured_comm: list[tuple[float, float]]
    all_reduce_ms: float
    row_wise_comm_ms: float


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
    replicated = [data_parallel_specs(plan, task) for task, plan in items]
    blocks = [row_block_specs(plan, task) for task, plan in items]
    kernels = _time_plan_kernels(items, layouts, replicated, blocks, batches, measurement, device=device,
                                 protocol=protocol, progress=progress)
    widths = [[sum(t.dim for t in tables) for tables in devices] for devices in layouts]
    collectives = _measure_plan_collectives(items, widths, replicated, batches, measurement,
                                            backend=comm_backend or default_backend(device.type))

    kind = hardware_kind(device)
    timing = timing_document(protocol, measurement)
    return [
        MeasuredPlanCost(
            method=plan.method,
            batch_size=batches[k],
            device_kind=device.type,
            hardware_kind=kind,
            device_memory_bytes=task.device_memory_bytes,
            timing=timing,
            reference_ms=protocol.reference_ms,
            devices=_device_costs(task, plan, layouts[k], widths[k], replicated[k], blocks[k], kernels[k],
                                  collectives[k]),
            data_parallel=plan.data_parallel,
            row_wise=plan.row_wise,
        )
        for k, (task, plan) in enumerate(items)
    ]


def _time_plan_kernels(
    items: Sequence[tuple[ShardingTask, Plan]],
    layouts: Sequence[Sequence[Sequence[TableSpec]]],
    replicated: Sequence[Sequence[TableSpec]],
    blocks: Sequence[Sequence[Sequence[TableSpec]]],
    batches: Sequence[int],
    measurement: MeasurementSettings,
    *,
    device: torch.device,
    protocol: TimingProtocol,
    progress: bool,
) -> list[_PlanKernels]:
    """`measure_plans`' kernel phase: every plan's device shards (`layouts`), data-parallel tables (`replicated`)
    and row `blocks` timed together in interleaved rounds; per plan, its devices' medians."""
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
    return [_PlanKernels(*per_plan) for per_plan in zip(compute, launch, strict=True)]


def _measure_plan_collectives(
    items: Sequence[tuple[ShardingTask, Plan]],
    widths: Sequence[Sequence[int]],
    replicated: Sequence[Sequence[TableSpec]],
    batches: Sequence[int],
    measurement: MeasurementSettings,
    *,
    backend: str,
) -> list[_PlanCollectives]:
    """`measure_plans`' collectives phase: the all-to-alls of plans with equal device count and batch in one process
    group (each plan's devices' pooled `widths`), with the data-parallel all-reduces and row-wise collectives of
    those that have them; each device's all-to-all priced as `measurement.comm_pricing` says."""
    comm: list[list[tuple[float, float]]] = [[(0.0, 0.0)] * len(w) for w in widths]  # one device: no exchange
    groups: dict[tuple[int, int], list[int]] = {}
    for k, (w, batch) in enumerate(zip(widths, batches)):
        if len(w) > 1:
            groups.setdefault((len(w), batch), []).append(k)
    measured_comm = [list(c) for c in comm]
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
    return [_PlanCollectives(*per_plan)
            for per_plan in zip(comm, measured_comm, all_reduce, row_wise_comm, strict=True)]


def _device_costs(
    task: ShardingTask,
    plan: Plan,
    layout: Sequence[Sequence[TableSpec]],
    widths: Sequence[int],
    replicated: Sequence[TableSpec],
    blocks: Sequence[Sequence[TableSpec]],
    kernels: _PlanKernels,
    collectives: _PlanCollectives,
) -> tuple[DeviceCost, ...]:
    """`measure_plans`' last phase, for one plan: each device's cost from the phases' medians."""
    memory = plan_memory_bytes(plan, task)
    return tuple(
        DeviceCost(
            device=d,
            shards=tuple(t.name for t in [*tables, *replicated, *blocks[d]]),
            width=widths[d],
            fwd_ms=kernels.compute[d][0],
            bwd_ms=kernels.compute[d][1],
            comm_fwd_ms=collectives.comm[d][0],
            comm_bwd_ms=collectives.comm[d][1],
            memory_bytes=memory[d],
            comm_fwd_measured_ms=collectives.measured_comm[d][0],
            comm_bwd_measured_ms=collectives.measured_comm[d][1],
            launch_ms=kernels.launch[d],
            all_reduce_ms=collectives.all_reduce_ms,
            row_wise_comm_ms=collectives.row_wise_comm_ms,
        )
        for d, tables in enumerate(layout)
    )


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
