"""Refinement on hardware: a searched plan made better by measuring it.

Search balances the cost model's predictions almost exactly, so the slowest device on hardware is the one whose
prediction was furthest off. Refinement measures every device's shard and all-to-all (the model's least accurate
part), scales the model's predictions by the measured residuals, and moves or swaps one shard off the slowest
device a round, leaving data-parallel and row-wise tables as the plan has them; a change is kept only when a paired
session of before and after measures the slowest device faster. Other plans of the task (`starts`) are measured
beside it, and the plan returned is never measured slower than the searched one or any start. Each round is
recorded in the plan's `extra["refinement"]`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from shardwise.costmodel.data_parallel import gradient_bytes
from shardwise.costmodel.types import CostModel
from shardwise.profiling import AllToAllSession, MeasurementSettings, ShardTiming, hardware_info
from shardwise.profiling.comm import default_backend
from shardwise.profiling.dataset import prepare_dataset, write_part
from shardwise.profiling.kernel import resolve_timing
from shardwise.profiling.runner import compute_row
from shardwise.profiling.sampling import shard_config_id
from shardwise.search import Searcher
from shardwise.search.baselines import MEASURED_KEY, GreedySearch
from shardwise.search.neuroshard import NeuroShardSearch
from shardwise.search.plan import Plan, PlanError, Shard, data_parallel_bytes, validate_plan
from shardwise.search.report import finish_plan
from shardwise.search.simulator import ShardCostCache, simulate
from shardwise.workload import ShardingTask, TableSpec, row_blocks, shard_memory_bytes
from shardwise.workload.tables import DIM_ALIGNMENT

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

#: a plan of the task with the named table split into this many column slices and the other tables placed around
#: them (None: none fits); refinement asks for one where a shard holds the measured slowest device up
Resplit = Callable[[str, int], "Plan | None"]


def search_resplit(searcher: Searcher, task: ShardingTask, cost_model: CostModel, seed: int = 0) -> Resplit | None:
    """The searcher's plans with a table split, for `refine_plan(resplit=...)`: NeuroShard's beam and greedy grid
    from a root with the table in that many slices (None: the searcher cannot be asked for one)."""
    if not isinstance(searcher, NeuroShardSearch):
        return None
    config = searcher.config

    def resplit(table: str, pieces: int) -> Plan | None:
        split = tuple((name, p) for name, p in config.split if name != table) + ((table, pieces),)
        try:
            return NeuroShardSearch(dataclasses.replace(config, split=split)).search(task, cost_model, seed)
        except PlanError:
            return None

    return resplit


class RefinementRound(BaseModel):
    """One round: the measured slowest device before, what changed, and whether it was kept."""

    round: int
    measured_max_ms: float  #: the slowest device's measured compute + all-to-all before this round
    slowest_device: int
    #: "t3[0] 0->2" (a move), "t3[0] 0->2, t7[0] 2->0" (a swap), several joined by "; "; "" when nothing
    #: promised a gain
    change: str
    predicted_max_ms: float | None = None  #: the corrected prediction of the change
    after_ms: float | None = None  #: measured after the change
    kept: bool = False
    seconds: float = 0.0

    @property
    def described(self) -> str:
        """What the round changed, as the terminal and the report show it."""
        return self.change or "nothing promised a gain"


class Refinement(BaseModel):
    """What refinement did: every round, the measured slowest device before and after, and the time it took."""

    rounds: list[RefinementRound]
    #: the measured slowest device of each plan refinement could start from, by method; it went on from the fastest
    starts: dict[str, float] = {}
    start: str = ""
    #: the start's and the returned plan's measured slowest device, side by side in one session: the second paired
    #: session's where the plan departs from the starts given, else the final paired check's when a round kept a
    #: change, else the first session's (nothing changed); so they may differ from `starts`
    before_ms: float
    after_ms: float
    seconds: float
    devices_measured: int
    #: why it ended: the rounds were done, a round promised nothing, or the time budget was spent
    stopped: str = ""

    def table(self) -> str:
        """One line per round, then the measured slowest device before and after and the time it took."""
        lines = [f"{'round':>5}  {'slowest ms':>10}  {'device':>6}  {'after ms':>8}  {'kept':>4}  change"]
        for r in self.rounds:
            after = f"{r.after_ms:.3f}" if r.after_ms is not None else "-"
            lines.append(f"{r.round:>5}  {r.measured_max_ms:>10.3f}  {r.slowest_device:>6}  {after:>8}  "
                         f"{'yes' if r.kept else 'no':>4}  {r.described}")
        if len(self.starts) > 1:
            lines.insert(0, "start: " + ", ".join(f"{m} {ms:.3f} ms" for m, ms in self.starts.items())
                         + f" measured; refined from {self.start}")
        lines.append(f"refinement: {self.outcome()}")
        return "\n".join(lines)

    def outcome(self) -> str:
        """The measured slowest device before and after, what it cost and why it stopped, in one line."""
        return (f"slowest device {self.before_ms:.3f} -> {self.after_ms:.3f} ms, measured side by side in one "
                f"session ({self.after_ms / self.before_ms:.3f}x), {self.devices_measured} device shards timed in "
                f"{self.seconds:.1f} s" + (f"; stopped: {self.stopped}" if self.stopped else ""))


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


@dataclass(frozen=True)
class _Change:
    """A move of one shard off a device (or a swap with another device's shard), priced by the corrected model."""

    description: str  #: "t3[0] 0->2" (a move) or "t3[0] 0->2, t7[0] 2->0" (a swap)
    move: str  #: the shard it takes off the device and where to: "t3[0] 0->2" for both
    devices: tuple[int, int]  #: the device it relieves, the device it loads
    shards: list[Shard]  #: both devices' shards after it
    compute_ms: tuple[float, float]  #: both devices' corrected predicted compute after it
    pair_ms: float  #: the larger of the two devices' corrected cost (compute + all-to-all) after it
    max_ms: float  #: the corrected slowest device of the whole plan after it


def _candidates(refiner: _Refiner, layout: _Layout, compute: Sequence[float], comm: np.ndarray,
                slowest: int, exclude: Collection[int] = ()) -> list[_Change]:
    """Moves and swaps off the slowest device to any device but `exclude`, with their corrected predictions, best
    first (one cost-model call for all of them). `compute` is each device's compute, measured (or predicted, for a
    device changed earlier in the round); the model's prediction of a changed device is scaled by that device's
    residual, compute / predicted."""
    task = refiner.task
    devices = range(task.num_devices)
    predicted = refiner.predicted([layout.on(d) for d in devices])
    residual = [m / p if p > 0 else 1.0 for m, p in zip(compute, predicted, strict=True)]
    costs = np.array(compute) + comm
    options: list[tuple[str, str, int, list[Shard], list[Shard]]] = []  # change, move, device, both devices' shards
    source = layout.on(slowest)
    for other in devices:
        if other == slowest or other in exclude:
            continue
        target = layout.on(other)
        for s in source:
            rest = [x for x in source if x is not s]
            moved = s.model_copy(update={"device": other})
            move = f"{s.table}[{s.col_offset}] {slowest}->{other}"
            options.append((move, move, other, rest, [*target, moved]))
            for t in target:
                back = t.model_copy(update={"device": slowest})
                options.append((f"{move}, {t.table}[{t.col_offset}] {other}->{slowest}", move, other, [*rest, back],
                                [*[x for x in target if x is not t], moved]))
    options = [o for o in options if refiner.fits(o[3], slowest) and refiner.fits(o[4], o[2])]
    if not options:
        return []
    ms = refiner.predicted([group for o in options for group in (o[3], o[4])]).reshape(-1, 2)
    found = []
    for (change, move, other, a_shards, b_shards), (a_ms, b_ms) in zip(options, ms, strict=True):
        a_ms, b_ms = float(a_ms * residual[slowest]), float(b_ms * residual[other])
        new = costs.copy()
        new[slowest], new[other] = a_ms + comm[slowest], b_ms + comm[other]
        found.append(_Change(change, move, (slowest, other), [*a_shards, *b_shards], (a_ms, b_ms),
                             float(max(new[slowest], new[other])), float(new.max())))
    found.sort(key=lambda c: (c.max_ms, c.pair_ms))
    return found


def _plan_round(refiner: _Refiner, layout: _Layout, measured: Sequence[float], comm: np.ndarray,
                refused: set[str]) -> tuple[_Layout, list[_Change], float]:
    """One round's changes, on corrected predictions: relieve the slowest device, then the next slowest, ... while
    each change lowers the device it relieves without loading another to that level. Several devices within noise
    of the slowest are common (8 devices, a balanced start): a single move off one of them cannot lower the plan's
    slowest device, a move off each can. Each device changes at most once a round, so every prediction is
    corrected by a residual measured on that device as it was (chained changes would compound the model's error).
    Returns the changed layout, the changes and the predicted slowest device. `refused`: first changes of rounds
    the measurements refused, not proposed first again (with any partner)."""
    compute = list(measured)
    changes: list[_Change] = []
    touched: set[int] = set()
    while True:
        costs = np.array(compute) + comm
        slowest = int(costs.argmax())
        if slowest in touched:  # relieved once this round and still the slowest: nothing more to gain now
            break
        options = [c for c in _candidates(refiner, layout, compute, comm, slowest, exclude=touched)
                   if c.pair_ms < costs[slowest] and not (not changes and c.move in refused)]
        if not options:
            break
        change = options[0]
        layout = _Layout([s for s in layout.shards if s.device not in change.devices] + change.shards,
                         layout.data_parallel, layout.row_wise)
        (a, b), (a_ms, b_ms) = change.devices, change.compute_ms
        compute[a], compute[b] = a_ms, b_ms
        touched.update(change.devices)
        changes.append(change)
    return layout, changes, float(max(np.array(compute) + comm))


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


def measured_greedy_start(task: ShardingTask, measurement: MeasurementSettings) -> list[Plan]:
    """The greedy on each table's measured single-table cost, as a start for refinement ([] when it finds no
    plan within memory: the searched plan is then the only start)."""
    try:
        return [GreedySearch(MEASURED_KEY, measurement=measurement).search(task, None, 0)]
    except PlanError:
        return []


def refine_plan(task: ShardingTask, plan: Plan, cost_model: CostModel, measurement: MeasurementSettings | None = None,
                *, rounds: int = 3, time_budget_s: float | None = None, dataset: str | Path | None = None,
                starts: Sequence[Plan] = (), progress: bool = True,
                resplit: Resplit | None = None, exchange: bool = True) -> tuple[Plan, Refinement]:
    """`plan` refined on this machine's kernels (see the module docstring); the refinement record. With
    `starts`, other plans of the task are measured too and refinement goes on from the fastest. With `resplit`
    (`search_resplit`), a table whose shard alone keeps the slowest device above the mean (predicted or measured)
    is tried split in a re-searched plan first. With `dataset`
    (a cost dataset directory or s3:// prefix), every device shard it times is appended there (`provenance`
    "refine"), so the next pre-training learns from the shards plans actually produce. `exchange=False` refines on
    the kernels alone, no all-to-all measured: where this machine cannot host the task's ranks (one GPU for a
    task of several devices: bench_gpu_method.py)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    for candidate in (plan, *starts):
        validate_plan(candidate, task)
        if candidate.row_wise or candidate.data_parallel:
            simulate(candidate, task, cost_model)  # the refined plan is priced so: a model that cannot fails first
    started = time.perf_counter()
    if dataset is not None:
        prepare_dataset(dataset)  # a path that cannot hold the dataset fails before anything is measured
    with _open_refiner(task, cost_model, measurement, progress, dataset, exchange) as refiner:
        return _refine(refiner, plan, starts, rounds, time_budget_s, started, resplit)


def measure_side_by_side(task: ShardingTask, plans: Sequence[Plan], cost_model: CostModel,
                         measurement: MeasurementSettings | None = None, *,
                         progress: bool = False) -> list[tuple[float, float]]:
    """Each plan's measured slowest device, kernels + all-to-all and kernels alone (ms), measured as refinement
    measures the plans it can start from: one session, its all-to-all process group open while the kernels are
    timed, fwd + bwd per timing. For comparing refinement's measurements with `measure_plans`'
    (bench_measurement_noise.py)."""
    for plan in plans:
        validate_plan(plan, task)
    with _open_refiner(task, cost_model, measurement, progress, None) as refiner:
        kernels, _, totals = _side_by_side(refiner, [_Layout.of(plan) for plan in plans])
    return [(total, max(k)) for total, k in zip(totals, kernels, strict=True)]


@contextlib.contextmanager
def _open_refiner(task: ShardingTask, cost_model: CostModel, measurement: MeasurementSettings | None,
                  progress: bool, dataset: str | Path | None, exchange: bool = True) -> Iterator[_Refiner]:
    """A refiner with its all-to-all process group open (none on one device, or without `exchange`), closed on
    the way out."""
    measurement = measurement or MeasurementSettings()
    with contextlib.ExitStack() as stack:
        session = None
        if task.num_devices > 1 and exchange:
            backend = default_backend(resolve_timing(measurement)[0].type)
            session = stack.enter_context(AllToAllSession(task.num_devices, backend=backend))
        yield _Refiner(task, cost_model, measurement, progress, dataset, session)


def _holding_up(refiner: _Refiner, layout: _Layout, kernel_ms: Sequence[float], slowest: int) -> tuple[str, int] | None:
    """The table whose shard keeps device `slowest` above the mean, and the column slices to split it into: the
    device's costliest shard alone by the model, scaled by the device's residual (its `kernel_ms`, measured or
    predicted, over the model's prediction), where that is more than the devices' mean `kernel_ms` and the table
    has aligned slices of half its shard's width, no more of them than devices (None otherwise)."""
    task = refiner.task
    shards = layout.on(slowest)
    if not shards:
        return None
    predicted = refiner.predicted([shards, *([s] for s in shards)])
    residual = kernel_ms[slowest] / predicted[0] if predicted[0] > 0 else 1.0
    top = int(np.argmax(predicted[1:]))
    if predicted[1 + top] * residual <= float(np.mean(kernel_ms)):
        return None
    shard, dim = shards[top], task.table(shards[top].table).dim
    pieces = 2 * (dim // shard.dim)
    if pieces > task.num_devices or dim % pieces or (dim // pieces) % DIM_ALIGNMENT:
        return None
    return shard.table, pieces


def _split_change(split: tuple[str, int]) -> str:
    return f"{split[0]} split into {split[1]} column slices, the other tables searched around them"


def _refine(refiner: _Refiner, plan: Plan, starts: Sequence[Plan], rounds: int, time_budget_s: float | None,
            started: float, resplit: Resplit | None = None) -> tuple[Plan, Refinement]:
    task, cost_model = refiner.task, refiner.model
    candidates = [(c.method, _Layout.of(c)) for c in (plan, *starts)]
    tried: set[tuple[str, int]] = set()  # the splits asked of `resplit`
    if resplit is not None:
        # a shard no move can balance, by the model: the search's plan with its table split is one more start
        searched = candidates[0][1]
        predicted = [float(ms) for ms in refiner.predicted([searched.on(d) for d in range(task.num_devices)])]
        split = _holding_up(refiner, searched, predicted, int(np.argmax(predicted)))
        other = resplit(*split) if split is not None else None
        if split is not None:
            tried.add(split)
        if other is not None and split is not None:
            validate_plan(other, task)
            candidates.append((f"{plan.method} with {split[0]} in {split[1]}",
                               _Layout.of(other)))
    # a start with another's layout (the measured greedy and TorchRec's planner often agree) is measured once
    candidates, same_as = _distinct(candidates, task.num_devices)
    # the start and the slowest device are chosen on measured kernels and exchanges, every start's side by side
    measured_of, comm_of, totals = _side_by_side(refiner, [layout for _, layout in candidates])
    best = int(np.argmin(totals))
    start, layout = candidates[best]
    measured, comm, before = measured_of[best], comm_of[best], totals[best]
    refiner.hold(layout)
    history: list[RefinementRound] = []
    refused: set[str] = set()
    stopped = f"{rounds} round{'s' if rounds > 1 else ''} done"
    slowest = int((np.array(measured) + comm).argmax())
    in_budget = time_budget_s is None or time.perf_counter() - started <= time_budget_s
    split = _holding_up(refiner, layout, measured, slowest) if resplit is not None and in_budget else None
    if split is not None and resplit is not None and split not in tried:
        # a shard no move can balance, measured (the model under-predicted it): the search's plan with its table
        # split, measured beside the layout in one session (paired)
        round_started = time.perf_counter()
        other = resplit(*split)
        if other is None:
            history.append(RefinementRound(round=1, measured_max_ms=float(max(np.array(measured) + comm)),
                                           slowest_device=slowest, change=f"{_split_change(split)}: none fits",
                                           seconds=time.perf_counter() - round_started))
        else:
            validate_plan(other, task)
            trial = _Layout.of(other)
            kernels, comms, paired = _side_by_side(refiner, [layout, trial])
            kept = paired[1] < paired[0]
            history.append(RefinementRound(round=1, measured_max_ms=paired[0], slowest_device=slowest,
                                           change=_split_change(split),
                                           predicted_max_ms=other.extra.get("predicted", {}).get("max_cost_ms"),
                                           after_ms=paired[1], kept=kept, seconds=time.perf_counter() - round_started))
            if kept:
                layout, measured, comm = trial, kernels[1], comms[1]
                refiner.hold(layout)
    for _ in range(rounds):
        if time_budget_s is not None and time.perf_counter() - started > time_budget_s:
            stopped = f"the {time_budget_s:g} s budget was spent"
            break
        round_started = time.perf_counter()
        costs = np.array(measured) + comm
        slowest = int(costs.argmax())
        trial, changes, predicted_max = _plan_round(refiner, layout, measured, comm, refused)
        if not changes or predicted_max >= costs.max():
            history.append(RefinementRound(round=len(history) + 1, measured_max_ms=float(costs.max()),
                                           slowest_device=slowest, change="",
                                           seconds=time.perf_counter() - round_started))
            stopped = "no change promised a gain"
            break
        change = "; ".join(c.description for c in changes)
        touched = sorted({d for c in changes for d in c.devices})
        if time_budget_s is not None:
            # a round is started only where its measurement fits in what is left, at the seconds a device shard
            # has taken so far (sessions, exchanges and all): one run past the budget cost the drop-in 30 s
            elapsed = time.perf_counter() - started
            need = elapsed / max(refiner.devices_measured, 1) * 2 * len(touched)
            if elapsed + need > time_budget_s:
                stopped = (f"the {time_budget_s:g} s budget was spent: the next round's {2 * len(touched)} device "
                           f"shards would take about {need:.0f} s")
                break
        # the changed devices timed together with the same devices as they are now: a paired comparison. The
        # slowest device's earlier figure is the largest of several noisy ones, biased high: against it, a
        # change would look like a gain more often than it is one
        timed = refiner.measure([trial.on(d) for d in touched] + [layout.on(d) for d in touched])
        trial_measured, current = list(measured), list(measured)
        for d, new, old in zip(touched, timed[:len(touched)], timed[len(touched):], strict=True):
            trial_measured[d], current[d] = new, old
        trial_comm = comm
        now = float(max(np.array(current) + comm))
        after = float(max(np.array(trial_measured) + comm))
        if after < now:
            # the kernels gained: the exchanges decide, the changed layout's timed paired with the current one's
            # (a change the kernels refuse is refused without them: moving a shard keeps the total width, and
            # the exchange's change is small next to a kernel's)
            trial_comm, current_comm = refiner.measure_comm([trial, layout])
            now = float(max(np.array(current) + current_comm))
            after = float(max(np.array(trial_measured) + trial_comm))
        kept = after < now
        history.append(RefinementRound(round=len(history) + 1, measured_max_ms=now, slowest_device=slowest,
                                       change=change, predicted_max_ms=predicted_max, after_ms=after, kept=kept,
                                       seconds=time.perf_counter() - round_started))
        if kept:
            layout, measured, comm = trial, trial_measured, trial_comm
        else:
            # the layout keeps its earlier figures, so the next round starts from the same slowest device. Taking the
            # refused round's fresh figures instead (they replace a figure biased high by being the largest) mixes
            # sessions minutes apart on a drifting machine: measured, no gain and two 8-device tasks above the
            # greedy (benchmarks/results/plan_quality_fresh_after_refusal.json against plan_quality_width)
            refused.add(changes[0].move)
    after_ms = before  # nothing kept: the start, as first measured (a refused round leaves its figures alone)
    if any(r.kept for r in history):
        # the rounds' figures come from sessions minutes apart, and a shared machine drifts between them: the
        # refined layout is measured once more beside every start, in one paired session, and the fastest of them
        # is returned (never a plan measured slower than the one searched)
        layouts = [layout, *(c for _, c in candidates)]
        final = _side_by_side(refiner, layouts)[2]
        after_ms, before = final[0], final[1 + best]
        if (fastest := int(np.argmin(final))) > 0:
            layout, after_ms = layouts[fastest], final[fastest]
            stopped += (f"; measured side by side at the end, {candidates[fastest - 1][0]}'s plan was faster than "
                        "the refined one: it is returned")
    names = {same_as.get(s.method, s.method) for s in starts}  # a start given, or the candidate measured for it
    given = [(m, c) for m, c in candidates if m in names]
    session = [(f"{plan.method}+refine", layout), *given]
    keys = [_layout_key(c, task.num_devices) for _, c in session]
    if given and keys[0] not in keys[1:]:
        # the plan departs from the starts given (the measured greedy's, say) only where a second paired session
        # agrees that it is faster: one session's win within noise can measure slower in the next (record
        # `plan_quality_types`). The session has the start before_ms is of too, where it is neither; the fastest
        # there is returned, before_ms and after_ms both from it (so after <= before)
        start_key = _layout_key(candidates[best][1], task.num_devices)
        if start_key not in keys:
            session.append(candidates[best])
            keys.append(start_key)
        confirm = _side_by_side(refiner, [c for _, c in session])[2]
        before = confirm[keys.index(start_key)]
        fastest = int(np.argmin(confirm))
        (name, layout), after_ms = session[fastest], confirm[fastest]
        if fastest > 0:
            stopped += (f"; measured again beside the starts, {name}'s plan was faster ({confirm[fastest]:.3f} ms "
                        f"against {confirm[0]:.3f}): it is returned")
        else:
            stopped += (f"; a second paired session confirmed it faster than {', '.join(m for m, _ in given)}'s "
                        f"({confirm[0]:.3f} ms against {min(confirm[1:len(given) + 1]):.3f})")
    starts_ms = {m: ms for (m, _), ms in zip(candidates, totals, strict=True)}
    record = Refinement(rounds=history, starts=starts_ms | {m: starts_ms[other] for m, other in same_as.items()},
                        start=start, before_ms=before, after_ms=after_ms, seconds=time.perf_counter() - started,
                        devices_measured=refiner.devices_measured, stopped=stopped)
    shards = tuple(sorted(layout.shards, key=lambda s: (s.table, s.col_offset)))
    refined = Plan(num_devices=plan.num_devices, shards=shards, data_parallel=layout.data_parallel,
                   row_wise=layout.row_wise,
                   method=f"{plan.method}+refine")
    # predicted costs, memory and provenance of the refined layout (validated: never over memory)
    refined = finish_plan(refined, task, cost_model, planning_time_s=record.seconds, seed=0,
                          options={"rounds": rounds, "time_budget_s": time_budget_s}, cache=refiner.cache)
    return refined.model_copy(update={"extra": {**refined.extra, "refinement": record.model_dump()}}), record
