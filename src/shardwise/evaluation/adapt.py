"""Adaptation on the user's hardware: time a task's own tables here (each alone, then the column halves of the
costliest alone, then sampled fused groups, some with a table's column half, as plans lay them out) within a time
budget, and fine-tune the cost model on them, so that a model profiled on other tables plans this task from its own
kernels' costs.

The halves alone are what a plan's column split is decided on: a table that holds a device up alone is split when
its halves cost much less than it. On a CPU a kernel's cost is mostly its lookups, not its width; seen only in
fused groups, a half's saving was under-predicted and no plan split the table.

`shardwise plan --adapt SECONDS` and `ShardwisePlanner(..., adapt=SECONDS)` call `adapt_cost_model`; with a cost
dataset, every shard it times is appended there with provenance "adapt", so the next pre-training learns it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardwise.costmodel.evaluate import ComputeSamples
from shardwise.costmodel.model import NeuralCostModel
from shardwise.costmodel.train import FineTuneReport, fine_tune_cost_model
from shardwise.errors import ShardwiseError
from shardwise.profiling import MeasurementSettings, hardware_info, hardware_kind, measure_shard
from shardwise.profiling.dataset import prepare_dataset, write_part
from shardwise.profiling.kernel import resolve_timing
from shardwise.profiling.runner import compute_row
from shardwise.profiling.sampling import shard_config_id
from shardwise.workload import DIMS, ShardingTask, TableSpec, shard_memory_bytes

#: the share of the budget spent timing shards; the rest is fine-tuning (a few seconds for a few hundred shards)
MEASURE_SHARE = 0.9
#: the chance that a table in a sampled group is its column half instead (plans split the costliest tables)
HALF_CHANCE = 0.25
#: groups drawn in a row that fit no device as pairs before sampling stops (memory too tight for any two tables)
MAX_MISSES = 100
#: a table costlier alone than this share of a device's even share of all the tables alone has its column half
#: timed alone too (a table that costly is the one a plan splits to balance the devices)
HALVED_SHARE = 0.5


class AdaptError(ShardwiseError):
    """Adaptation that cannot run here: the cost model is for other hardware, or the budget timed too little."""


@dataclass(frozen=True)
class AdaptRecord:
    """What adaptation did: the shards it timed, how long it took, and the model's error before and after."""

    seconds: float
    singles: int  #: tables timed alone
    groups: int  #: sampled fused groups timed
    fine_tune: FineTuneReport
    dataset: str | None = None
    halves: int = 0  #: column halves of the costliest tables timed alone

    @property
    def kept(self) -> bool:
        """Whether the fine-tuned model plans (it predicts the held-out shards better than the one it started from)."""
        return self.fine_tune.improved

    def line(self) -> str:
        """One line for a plan's notes and the drop-in's stats."""
        tune = self.fine_tune
        outcome = "the adapted model plans" if self.kept else "no better: the model as it was plans"
        stored = f"; rows appended to {self.dataset} (provenance adapt)" if self.dataset else ""
        halves = f", {self.halves} column halves alone" if self.halves else ""
        return (f"adapted on this machine in {self.seconds:.0f} s: {self.singles} tables alone{halves} and "
                f"{self.groups} fused groups timed, error on {tune.heldout_shards} of them left out "
                f"{_pct(tune.heldout_mape_before_pct)} -> {_pct(tune.heldout_mape_after_pct)}, {outcome}{stored}")


def _pct(value: float) -> str:
    """A percentage error as a line says it (a model far outside its training is off by orders of magnitude)."""
    return f"{value:.0f}%" if value < 1e4 else f"{value:.1e}%"


def cannot_adapt_here(model: object, device: str | None) -> str | None:
    """Why adaptation cannot run on `device` of this machine for `model` (None: it can): it fine-tunes a neural
    cost model on this machine's kernels, so the model must be one, and for this machine's hardware."""
    if not isinstance(model, NeuralCostModel):
        return f"adaptation fine-tunes a neural cost model, not a {type(model).__name__}"
    try:
        here = hardware_kind(device)
    except (RuntimeError, ValueError) as err:
        return f"adaptation times kernels on this machine: {err}"
    if model.hardware_kind != here:
        return (f"adaptation times kernels on this machine ({here}), but the cost model is for {model.hardware_kind}: "
                "adapt where the plan will run")
    return None


def _half(table: TableSpec) -> TableSpec | None:
    """The table's first column half, as a column-split plan lays it out (None where it has no aligned half)."""
    half = table.dim // 2
    return table.with_dim(half) if half >= min(DIMS) and half % min(DIMS) == 0 else None


def adaptation_shards(task: ShardingTask, seed: int, batch_size: int,
                      alone_ms: Mapping[str, float] | None = None) -> Iterator[list[TableSpec]]:
    """The shards adaptation times, in order: each table alone (halved until it fits a device, as a plan would
    split it); with `alone_ms` (each table's measured ms alone, by name, filled by the caller as it times them),
    the column half alone of each table costlier than `HALVED_SHARE` of a device's even share of them, costliest
    first, at most one per device; then random fused groups of 2 up to a device's share of the tables and two
    more, a table sometimes as its column half; only what fits one device's memory at `batch_size` (no plan puts
    more there, and timing it would allocate it); endless (the budget stops it)."""

    def fits(shard: list[TableSpec]) -> bool:
        return shard_memory_bytes(shard, batch_size, task.optimizer, task.weights_precision) <= task.device_memory_bytes

    tables: list[TableSpec] = []
    for table in task.tables:
        part: TableSpec | None = table
        while part is not None and not fits([part]):
            part = _half(part)
        if part is not None:
            tables.append(part)
            yield [part]
    if alone_ms is not None:
        yield from ([half] for half in _costliest_halves(tables, alone_ms, task.num_devices))
    if len(tables) < 2:
        return
    rng = np.random.default_rng(seed)
    most = min(len(tables), math.ceil(len(tables) / task.num_devices) + 2)
    misses = 0
    while misses < MAX_MISSES:
        size = int(rng.integers(2, most + 1))
        group = [tables[i] for i in rng.choice(len(tables), size=size, replace=False)]
        shard = [(_half(t) or t) if rng.random() < HALF_CHANCE else t for t in group]
        while len(shard) > 1 and not fits(shard):
            shard.pop()  # as a device full of them would hold fewer
        if len(shard) > 1:
            misses = 0
            yield shard
        else:
            misses += 1


def _costliest_halves(tables: Sequence[TableSpec], alone_ms: Mapping[str, float],
                      num_devices: int) -> list[TableSpec]:
    """The column halves of the tables (as timed alone) costlier alone than `HALVED_SHARE` of a device's even
    share of all of them, costliest first, at most `num_devices` (those without an aligned half left out)."""
    timed = [t for t in tables if t.name in alone_ms]
    if num_devices < 2 or not timed:
        return []
    bar = HALVED_SHARE * sum(alone_ms[t.name] for t in timed) / num_devices
    costly = sorted((t for t in timed if alone_ms[t.name] > bar), key=lambda t: -alone_ms[t.name])
    return [half for half in map(_half, costly) if half is not None][:num_devices]


def adapt_cost_model(task: ShardingTask, model: NeuralCostModel, budget_s: float, *, seed: int = 0,
                     measurement: MeasurementSettings | None = None, dataset: str | Path | None = None,
                     ) -> tuple[NeuralCostModel, AdaptRecord]:
    """The model fine-tuned on the task's own shards timed here within `budget_s` seconds (at the model's batch
    and reference, as its training data was), and what was done; the model as it was where fine-tuning did not
    lower its error on the shards left out. With `dataset`, the timed shards are appended there."""
    start = time.perf_counter()
    settings = (measurement or MeasurementSettings()).for_cost_model(model.reference_ms, model.batch_size)
    reason = cannot_adapt_here(model, settings.device)
    if reason:
        raise AdaptError(reason)
    if dataset is not None:
        prepare_dataset(dataset)  # a path that cannot hold the dataset fails before anything is measured
    device, protocol = resolve_timing(settings)
    batch = model.batch_size
    common = {**hardware_info(device), "batch_size": batch}
    shards: list[list[TableSpec]] = []
    costs: list[tuple[float, float]] = []
    rows = []
    stop = start + MEASURE_SHARE * budget_s
    alone_ms: dict[str, float] = {}  # each table's ms alone, as timed: which halves are timed alone too
    for tables in adaptation_shards(task, seed, batch, alone_ms):
        if time.perf_counter() >= stop:
            break
        timing = measure_shard(tables, batch, device=device, protocol=protocol, optimizer=task.optimizer,
                               weights_precision=task.weights_precision)
        if len(shards) < len(task.tables):
            alone_ms.setdefault(tables[0].name, timing.fwd_ms + timing.bwd_ms)
        shards.append(tables)
        costs.append((timing.fwd_ms, timing.bwd_ms))
        config = shard_config_id(tables, batch, task.optimizer, task.weights_precision, common["hardware_kind"])
        rows.append(compute_row(tables, timing, config_id=config, repeat=0, common=common,
                                timing=protocol.settings_json(), optimizer=task.optimizer,
                                weights_precision=task.weights_precision, provenance="adapt"))
    if dataset is not None:
        write_part(dataset, rows)
    if len(shards) < 4:
        raise AdaptError(f"adaptation timed {len(shards)} shard(s) in {budget_s:g} s, too few to learn from: give it "
                         "more time")
    measured = np.asarray(costs)
    samples = ComputeSamples(tuple(tuple(s) for s in shards), measured[:, 0], measured[:, 1])
    tuned, report = fine_tune_cost_model(model, samples, seed,
                                         time_budget_s=max(1.0, budget_s - (time.perf_counter() - start)))
    singles = sum(len(s) == 1 for s in shards[: len(task.tables)])
    halves = sum(len(s) == 1 for s in shards[singles:])  # groups hold two tables or more
    record = AdaptRecord(seconds=time.perf_counter() - start, singles=singles, halves=halves,
                         groups=len(shards) - singles - halves, fine_tune=report,
                         dataset=None if dataset is None else str(dataset))
    return (tuned if record.kept else model), record
