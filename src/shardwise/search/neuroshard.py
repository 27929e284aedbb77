"""NeuroShard: beam search over column splits around a greedy grid search for table-wise placement, from the best
set of data-parallel tables.

The inner greedy places shards in descending predicted cost, each on the device whose predicted cost
(compute + all-to-all) after taking it is lowest, under memory and a cap on the dims a device holds.
Adding a shard to a device is one vector add in the cost model's table-embedding space, so one step
is a single batched head call over every cap's least-loaded devices; the caps of the grid run in lockstep.

Data-parallel tables (a replica on every device, each device looking up its own samples, the gradients
all-reduced) leave the placement: they add the same kernel and all-reduce ms and the same memory to every device
(`costmodel.data_parallel`). Which ones: the tables in ascending rows (the gradient bytes all-reduced per column
taken out of the all-to-all), as prefixes of 1, 2, 4, ... tables, each placed by the greedy grid; the best prefix
(or none) is the root of the beam over column splits. Only with a cost model that has a measured all-reduce. A root
whose replicated ms alone (every device pays them) reach the best root's cost so far is not placed: its plan could
not be cheaper, so the search picks what it would have picked placing it.

Row-wise tables (split by rows over every device, each device looking up its block's share of the whole batch's
ids, the partial outputs reduce-scattered) also leave the placement: each device gets a block of each, and the
collectives' ms (`costmodel.row_wise`). They are for a table that alone sets the slowest device: the costliest tables,
each at least 3/4 of a device's even share of the predicted work, as prefixes of 1, 2, 4, ... tables on top of the
best data-parallel set (a table that fits on no device even split by columns is row-wise in every prefix); the best of
them roots the beam beside the data-parallel set, so that column splits of the same tables compete with them. Only
with a cost model that has a measured reduce-scatter.

A table whose predicted cost alone exceeds a balanced device's share (the head on 1 / devices of every table's
embedding) sets the slowest device wherever it goes: its column halves and quarters are priced with the beam's first
depth (in its lockstep calls), so that a depth where one split alone does not help cannot stop the beam first.

Tables that do not fit in HBM: before the search, `offload.place_within_memory` moves the tables cheapest to cache
onto fbgemm's UVM kernels (the task's plan space allowing), and the search places them as any other table.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
from pydantic import Field

from shardwise.costmodel.data_parallel import all_reduce_of, data_parallel_cost
from shardwise.costmodel.row_wise import reduce_scatter_of, row_wise_cost
from shardwise.costmodel.types import CostModel
from shardwise.workload import ShardingTask, TableSpec, row_blocks, shard_memory_bytes
from shardwise.workload.tables import DIM_ALIGNMENT

from .offload import place_within_memory, plan_kernels
from .plan import Plan, PlanError, Shard, check_memory_bounds, data_parallel_bytes, shard_state_bytes
from .registry import MethodOptions, MethodSpec, register_method
from .report import finish_plan
from .simulator import ShardCostCache, predict_comm_after_ms, predict_comm_ms
from .threads import single_thread

#: the greedy re-prices every device's all-to-all once per this many placements (the chosen device's at each),
#: and once per devices / COMM_REFRESH_DEVICES placements on more devices: one placement moves a layout's totals
#: by about 1 / devices, and re-pricing all of them is the slowest part of a step at a thousand devices
COMM_REFRESH_STEPS = 8
COMM_REFRESH_DEVICES = 32
#: pieces per table (1 = whole table, 2 = halves, 4 = quarters, ...; 0 = data-parallel, -1 = row-wise), indexed like
#: task.tables
SplitState = tuple[int, ...]
DATA_PARALLEL = 0
ROW_WISE = -1
#: row-wise is tried for tables whose predicted cost alone is at least this share of a device's even share of the
#: work (the sum of the tables' costs / devices): a table that alone sets the slowest device, not one that balances
ROW_WISE_MIN_SHARE = 0.75
#: the most tables tried row-wise (prefixes 1, 2, 4, 8 of the costliest)
ROW_WISE_MAX_TABLES = 8
#: the most tables above a balanced device's share whose column halves and quarters root the beam (the costliest)
BOTTLENECK_MAX_TABLES = 4


@dataclass(frozen=True)
class NeuroShardConfig:
    """Search breadth: beam over column splits, candidates per step, depth, and the grid of dim caps."""

    beam_width: int = 2
    #: per criterion: the largest (memory) and the most costly (predicted) shards are both tried
    num_candidates: int = 2
    max_depth: int = 3
    #: a device may hold at most factor x (total dim / devices) columns; inf = cost-greedy only
    dim_cap_factors: tuple[float, ...] = (1.0, 1.1, 1.25, 1.5, float("inf"))
    #: a device may hold at most factor x (sum of single-shard predicted costs / devices): a balance cap on
    #: work rather than width (it catches what the dim caps miss when pooling factors differ widely)
    cost_cap_factors: tuple[float, ...] = (1.0, 1.05, 1.1, 1.25)
    #: devices per step the head prices the shard on: the allowed ones least loaded now (all of them on up to
    #: this many devices; fewer make hundreds of devices fast)
    device_candidates: int = 8
    #: devices per step whose all-to-all is priced exactly (the rest are ranked by their current one)
    comm_candidates: int = 3
    #: stop widening the beam once this much time is spent (None: run to `max_depth`)
    time_budget_s: float | None = None
    #: try data-parallel tables (where the cost model has a measured all-reduce to price them with)
    data_parallel: bool = True
    #: try row-wise tables (where the cost model has a measured reduce-scatter to price them with)
    row_wise: bool = True
    #: (table name, pieces): tables split into this many column slices from the root on (the beam may split them
    #: further); refinement asks for the table that holds its measured slowest device up split (evaluation.refine)
    split: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        for name in ("beam_width", "num_candidates", "device_candidates", "comm_candidates"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_depth < 0:
            raise ValueError(f"max_depth must be >= 0, got {self.max_depth}")
        if not self.dim_cap_factors or any(f <= 0 for f in self.dim_cap_factors):
            raise ValueError(f"dim_cap_factors must be positive, got {self.dim_cap_factors}")
        if any(f <= 0 for f in self.cost_cap_factors):
            raise ValueError(f"cost_cap_factors must be positive, got {self.cost_cap_factors}")


@dataclass
class _Evaluated:
    cost_ms: float
    devices: np.ndarray | None  # per unit, the chosen device (None when nothing fit)
    units: list[tuple[int, int, int]] = field(default_factory=list)  # (table index, piece, pieces)


class _Placer:
    """The greedy grid for one task and model; caches per-(table, pieces) embeddings, costs and memory."""

    def __init__(self, task: ShardingTask, cost_model: CostModel, config: NeuroShardConfig) -> None:
        self.task = task
        self.model = cost_model
        self.config = config
        self._piece: dict[tuple[int, int], tuple[np.ndarray, float, int]] = {}
        self._replicated: dict[tuple[int, ...], tuple[float, int]] = {}
        self._replicated_bytes: dict[tuple[int, ...], int] = {}
        self._piece_bytes: dict[tuple[int, int], int] = {}  # (table, pieces) -> one piece's bytes, no model call
        #: per table, the most column slices its plan space allows (`TableSpec.max_column_pieces`)
        self.max_pieces = [t.max_column_pieces(task.num_devices) for t in task.tables]
        self.head_calls = 0

    def replicated(self, state: SplitState) -> tuple[float, int]:
        """The state's tables on every device: ms and bytes each device adds for its data-parallel tables (kernel on
        the local batch + all-reduce) and row-wise tables (kernel on its blocks + collectives), the most of any
        device for the row-wise ones (blocks of ceil(rows / devices): the last may be smaller)."""
        key = _replicated_key(state)
        if key not in self._replicated:
            task = self.task
            tables = [task.tables[i] for i in key if i >= 0]
            cost = data_parallel_cost(self.model, tables, task.num_devices) if tables else None
            ms = cost.total_ms if cost else 0.0
            split = [task.tables[-1 - i] for i in key if i < 0]
            if split:
                ms += float(row_wise_cost(self.model, split, task.num_devices, task.batch_size).total_ms.max())
            self._replicated[key] = (ms, self.replicated_bytes(state))
        return self._replicated[key]

    def replicated_bytes(self, state: SplitState) -> int:
        """`replicated`'s bytes alone (no cost model call: what a memory check of many states needs)."""
        key = _replicated_key(state)
        if key not in self._replicated_bytes:
            task = self.task
            used = data_parallel_bytes([task.tables[i] for i in key if i >= 0], task)
            split = [task.tables[-1 - i] for i in key if i < 0]
            if split:
                used += max(shard_memory_bytes(blocks, task.batch_size, task.optimizer, task.weights_precision)
                            for blocks in row_blocks(split, task.num_devices))
            self._replicated_bytes[key] = used
        return self._replicated_bytes[key]

    def piece_spec(self, i: int, pieces: int, k: int = 0) -> TableSpec:
        table = self.task.tables[i]
        if pieces == 1:
            return table
        width = table.dim // pieces
        return table.with_dim(width, name=f"{table.name}[{k * width}:{(k + 1) * width}]")

    def _fill(self, keys: list[tuple[int, int]]) -> None:
        missing = sorted({k for k in keys if k not in self._piece})
        if not missing:
            return
        # all pieces of a split table have the same features, so one embedding serves them all
        specs = [self.piece_spec(i, p) for i, p in missing]
        emb = np.asarray(self.model.table_embeddings(specs), dtype=np.float64)
        cost = np.asarray(self.model.compute_from_embeddings(emb), dtype=np.float64).sum(axis=1)
        self.head_calls += 1
        for key, spec, e, c in zip(missing, specs, emb, cost):
            self._piece[key] = (e, float(c), shard_state_bytes(spec, self.task))

    def balanced_share_ms(self) -> float:
        """Predicted fwd+bwd ms of a device holding 1 / devices of every table: the head on the mean of the tables'
        summed embeddings (a perfectly balanced device pays the kernel's fixed cost once, not once per table)."""
        tables = range(len(self.task.tables))
        self._fill([(i, 1) for i in tables])
        mean = np.stack([self._piece[(i, 1)][0] for i in tables]).sum(axis=0) / self.task.num_devices
        self.head_calls += 1
        return float(np.asarray(self.model.compute_from_embeddings(mean[None, :]), dtype=np.float64).sum())

    def piece_cost(self, i: int, pieces: int) -> tuple[float, int]:
        """Predicted fwd+bwd ms of one piece alone, and its memory bytes."""
        self._fill([(i, pieces)])
        _, cost, memory = self._piece[(i, pieces)]
        return cost, memory

    def evaluate(self, states: list[SplitState]) -> list[_Evaluated]:
        """Best table-wise placement of each state's shards over the grid of dim caps.

        States with the same number of shards (a beam's children) and every cap run in lockstep: one
        step places one shard in every (state, cap) row with one head call and one all-to-all call."""
        by_count: dict[int, list[int]] = {}
        for j, state in enumerate(states):
            by_count.setdefault(sum(max(p, 0) for p in state), []).append(j)
        results: list[_Evaluated] = [_Evaluated(float("inf"), None)] * len(states)
        for j in by_count.pop(0, []):  # every table data-parallel or row-wise: nothing to place
            ms, used = self.replicated(states[j])
            if used <= self.task.device_memory_bytes:
                results[j] = _Evaluated(ms, np.zeros(0, dtype=np.int64))
        for group in by_count.values():
            # a state with a shard bigger than an empty device's room (beside its replicas) places nothing: every
            # row of it would die at that shard's step (on 5,000 tables x 1,024 devices, a data-parallel or row-wise
            # root beside a table as big as a device: 1.6-2.7 s each)
            placeable = [j for j in group if self._fits_empty_device(states[j])]
            for j in group:
                if j not in placeable:
                    results[j] = _Evaluated(float("inf"), None, _units(states[j]))
            if placeable:
                for j, result in zip(placeable, self._evaluate_lockstep([states[j] for j in placeable])):
                    results[j] = result
        return results

    def _fits_empty_device(self, state: SplitState) -> bool:
        """Whether the state's largest shard fits on a device that holds only the state's replicas."""
        room = self.task.device_memory_bytes - self.replicated_bytes(state)
        for key in {(i, p) for i, p in enumerate(state) if p >= 1}:
            if key not in self._piece_bytes:
                self._piece_bytes[key] = shard_state_bytes(self.piece_spec(*key), self.task)
            if self._piece_bytes[key] > room:
                return False
        return True

    def _evaluate_lockstep(self, states: list[SplitState]) -> list[_Evaluated]:
        task, model, config = self.task, self.model, self.config
        num_devices = task.num_devices
        units = [_units(state) for state in states]
        self._fill([(i, p) for state_units in units for i, _, p in state_units])
        emb = np.stack([np.stack([self._piece[(i, p)][0] for i, _, p in su]) for su in units])  # [S, U, H]
        cost = np.array([[self._piece[(i, p)][1] for i, _, p in su] for su in units])
        memory = np.array([[self._piece[(i, p)][2] for i, _, p in su] for su in units], dtype=np.int64)
        dims = np.array([[task.tables[i].dim // p for i, _, p in su] for su in units], dtype=np.float64)
        table_of = np.array([[i for i, _, _ in su] for su in units])
        order = np.argsort(-cost, axis=1, kind="stable")  # most costly shards first

        # the grid: each row caps either a device's total dim or its sum of single-shard costs
        factors = np.array(config.dim_cap_factors + config.cost_cap_factors, dtype=np.float64)
        on_cost = np.arange(len(factors)) >= len(config.dim_cap_factors)
        grid = len(factors)
        rows = len(states) * grid
        state_of = np.repeat(np.arange(len(states)), grid)
        capped_by_cost = np.tile(on_cost, len(states))
        size = np.where(capped_by_cost[:, None], cost[state_of], dims[state_of])  # [R, U] what each cap counts
        cap = np.maximum(np.tile(factors, len(states)) * size.sum(axis=1) / num_devices, size.max(axis=1))
        load = np.zeros((rows, num_devices))
        hidden = emb.shape[2]
        summed = np.zeros((rows, num_devices, hidden))
        compute = np.zeros((rows, num_devices))
        width = np.zeros((rows, num_devices))
        # data-parallel tables: the same ms and bytes on every device of a state's rows
        replicated = [self.replicated(state) for state in states]
        replicated_ms = np.array([ms for ms, _ in replicated])
        replicated_bytes = np.array([used for _, used in replicated], dtype=np.int64)
        free = np.repeat(task.device_memory_bytes - replicated_bytes, grid)[:, None] + np.zeros(
            (1, num_devices), dtype=np.int64)
        # slices of one table go to different devices: two on one device would only add a kernel input
        holds = np.zeros((rows, len(task.tables), num_devices), dtype=bool)  # [R, table, device]: rows contiguous
        alive = np.ones(rows, dtype=bool)
        chosen = np.full((rows, emb.shape[1]), -1)
        row_idx = np.arange(rows)
        across = row_idx[:, None]  # fancy indexing by [R, C] column ids: np.take_along_axis's arithmetic, less overhead
        # rows that have placed every shard alike so far hold the same layout (the grid's caps bind late), so the
        # networks price each (layout, device) once: `same[r]` is one row of r's layout
        same = state_of * grid
        comm_now = predict_comm_ms(model, width, compute).sum(axis=2)
        near_count = min(num_devices, config.device_candidates)
        k = min(near_count, config.comm_candidates)
        refresh = max(COMM_REFRESH_STEPS, num_devices // COMM_REFRESH_DEVICES)

        for step in range(emb.shape[1]):
            u = order[state_of, step]
            e, m, dm, tb = emb[state_of, u], memory[state_of, u], dims[state_of, u], table_of[state_of, u]
            su = size[row_idx, u]
            feasible = (free >= m[:, None]) & ~holds[row_idx, tb] & alive[:, None]
            alive &= feasible.any(axis=1)
            if not alive.any():
                break
            under_cap = feasible & (load + su[:, None] <= cap[:, None] * (1 + 1e-9))
            allowed = np.where(under_cap.any(axis=1, keepdims=True), under_cap, feasible)
            # the head prices the shard on the allowed devices least loaded now (compute + all-to-all): what a
            # shard adds grows with what a device holds, so the best device is among them, and one head call
            # over every device of every row is what makes hundreds of devices slow
            near = _lowest(np.where(allowed, compute + comm_now, np.inf), near_count)  # [R, near] device ids
            near_allowed = allowed[across, near]
            pair, at = _distinct_pairs(same, near, num_devices)  # [P] flat positions in [R, near], [R, near]
            pair_row, pair_device = pair // near_count, near.reshape(-1)[pair]
            new_compute = model.compute_from_embeddings(summed[pair_row, pair_device] + e[pair_row])
            new_compute = np.asarray(new_compute, dtype=np.float64).sum(axis=1)[at]
            # shortlist by compute plus the device's current all-to-all, then price the candidate device's own
            # all-to-all exactly in the layout it would make
            approx = np.where(near_allowed, new_compute + comm_now[across, near], np.inf)
            pos = _lowest(approx, k)  # [R, k] positions in `near`
            short = near[across, pos]
            short_compute = new_compute[across, pos]
            pair, at = _distinct_pairs(same, short, num_devices)
            pair_row = pair // k
            # each layout's totals once, not once per candidate device (what a step at 1,024 devices spent most on)
            one, layout_of = _representatives(pair_row, rows)
            own_comm = predict_comm_after_ms(model, width[pair_row[one]], compute[pair_row[one]],
                                             short.reshape(-1)[pair, None], dm[pair_row],
                                             short_compute.reshape(-1)[pair, None], layout_of=layout_of)
            own_comm = own_comm.sum(axis=2)[:, 0][at]
            score = np.where(near_allowed[across, pos], short_compute + own_comm, np.inf)
            pick = np.argmin(score, axis=1)
            live = row_idx[alive]
            d = short[live, pick[live]]
            chosen[live, u[live]] = d
            summed[live, d] += e[live]
            compute[live, d] = short_compute[live, pick[live]]
            width[live, d] += dm[live]
            load[live, d] += su[live]
            free[live, d] -= m[live]
            holds[live, tb[live], d] = True
            # the chosen device's all-to-all is the one just priced; the others' move a little with the layout's
            # totals and are re-priced every few steps (all of them each step is the slowest part at scale)
            comm_now[live, d] = own_comm[live, pick[live]]
            # rows of one layout that chose the same device still share one
            one, at = _representatives(same[live] * num_devices + d, rows * num_devices)
            same[live] = live[one][at]
            if step % refresh == refresh - 1:
                one, at = _representatives(same[live], rows)
                layouts = same[live][one]
                comm_now[live] = predict_comm_ms(model, width[layouts], compute[layouts]).sum(axis=2)[at]
            self.head_calls += 2

        # a row's plan cost: its slowest device under the final layout's all-to-all
        comm_now = predict_comm_ms(model, width, compute).sum(axis=2)
        plan_cost = np.where(alive, (compute + comm_now).max(axis=1) + replicated_ms[state_of], np.inf)
        results = []
        for j, su in enumerate(units):
            mine = np.flatnonzero(state_of == j)
            best = mine[int(np.argmin(plan_cost[mine]))]
            if np.isfinite(plan_cost[best]):
                results.append(_Evaluated(float(plan_cost[best]), chosen[best].copy(), su))
            else:
                results.append(_Evaluated(float("inf"), None, su))
        return results


def _units(state: SplitState) -> list[tuple[int, int, int]]:
    """The state's shards to place: (table index, piece, pieces), data-parallel and row-wise tables left out."""
    return [(i, k, p) for i, p in enumerate(state) for k in range(p)]


def _replicated_key(state: SplitState) -> tuple[int, ...]:
    """The data-parallel (i) and row-wise (-1 - i) tables of a state: what its replicated ms and bytes depend on."""
    return tuple(i if p == DATA_PARALLEL else -1 - i for i, p in enumerate(state) if p in (DATA_PARALLEL, ROW_WISE))


def _cost(seen: dict[SplitState, _Evaluated], state: SplitState) -> float:
    """A root's predicted plan cost; inf for one not placed (bounded: never below the best root before it)."""
    return seen[state].cost_ms if state in seen else float("inf")


def _place_unless_bounded(placer: _Placer, seen: dict[SplitState, _Evaluated], bounded: set[SplitState],
                          state: SplitState, best_ms: float) -> None:
    """Place `state` by the greedy grid unless its lower bound reaches `best_ms` (then it joins `bounded`).

    The bound is the ms its data-parallel and row-wise tables add to every device: a plan's cost is that plus its
    slowest device's compute and all-to-all, both >= 0 (the networks predict exp(...)), so a state bounded here
    costs at least `best_ms`, which an earlier root reached: the search picks the same root without placing it
    (on 1,000 tables on 64 devices, one all-reduce alone was 1.7x the best plan, and each root most of a second).
    The placed tables' predicted work (their sum / devices, the costliest alone) would bound it tighter only if
    a device's predicted cost never fell below its tables' work, which a learned head does not promise."""
    if state in seen or state in bounded:
        return
    if placer.replicated(state)[0] >= best_ms:
        bounded.add(state)
    else:
        seen[state] = placer.evaluate([state])[0]


def _too_big_for_columns(task: ShardingTask, table: TableSpec) -> bool:
    """Whether `table` fits on no device even in the narrowest column split its plan space allows (as many 4-aligned
    slices as there are devices, none below `min_partition`; whole where it allows no column split)."""
    widest = table.widest_slice_dim(task.num_devices)
    return shard_state_bytes(table.with_dim(widest), task) > task.device_memory_bytes


def _distinct_pairs(same: np.ndarray, devices: np.ndarray, num_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (layout, device) pairs of [R, C] `devices` (row r's layout is `same[r]`): flat positions in
    `devices` of one occurrence of each, and [R, C] which of them each position is."""
    key = (same[:, None] * num_devices + devices).reshape(-1)
    one, at = _representatives(key, same.size * num_devices)
    return one, at.reshape(devices.shape)


def _representatives(key: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """For integer keys in [0, size): the positions of one occurrence of each distinct key, and for each position
    which of them holds its key. A scatter and a gather: np.unique's sort cost more than the networks it saved."""
    slot = np.empty(size, dtype=np.int64)
    slot[key] = np.arange(key.size)  # of a repeated key one position wins: any one will do
    rep = slot[key]
    one = np.flatnonzero(rep == np.arange(key.size))
    index = np.empty(key.size, dtype=np.int64)
    index[one] = np.arange(one.size)
    return one, index[rep]


def _lowest(values: np.ndarray, count: int) -> np.ndarray:
    """[R, count] column indices of each row's `count` smallest values (all columns when there are no more)."""
    if count >= values.shape[1]:
        return np.tile(np.arange(values.shape[1]), (values.shape[0], 1))
    # torch's top-k: 3-5x faster than np.argpartition on [rows, 1,024 devices], search's hottest line at scale
    # (imported here: listing the registered methods, `plan --help`, does without torch)
    import torch

    return torch.topk(torch.from_numpy(np.ascontiguousarray(values)), count, dim=1, largest=False,
                      sorted=False).indices.numpy()


class NeuroShardSearch:
    """Cost-model-guided search: greedy grid for placement inside a beam search over column splits."""

    name = "neuroshard"

    def __init__(self, config: NeuroShardConfig | None = None, **options: object) -> None:
        self.config = config or NeuroShardConfig(**options)  # type: ignore[arg-type]

    def _candidates(self, placer: _Placer, state: SplitState) -> list[int]:
        # pieces are powers of two, and the splits a table allows are all those up to its most
        splittable = [i for i, p in enumerate(state) if p >= 1 and 2 * p <= placer.max_pieces[i]]
        if not splittable:
            return []
        placer._fill([(i, state[i]) for i in splittable])  # one batched model call for all of them
        costs = {i: placer.piece_cost(i, state[i]) for i in splittable}
        k = self.config.num_candidates
        by_cost = sorted(splittable, key=lambda i: -costs[i][0])[:k]
        by_memory = sorted(splittable, key=lambda i: -costs[i][1])[:k]
        return list(dict.fromkeys(by_cost + by_memory))

    def _data_parallel_order(self, placer: _Placer) -> list[int]:
        """Tables in the order they are tried data-parallel: ascending rows (the fewest gradient bytes all-reduced
        per output column taken out of the all-to-all; ties: the costliest first), those whose plan space allows it.
        Empty where none are tried."""
        task = placer.task
        if not self.config.data_parallel or task.num_devices < 2 or all_reduce_of(placer.model) is None:
            return []
        placer._fill([(i, 1) for i in range(len(task.tables))])
        allowed = [i for i, t in enumerate(task.tables) if t.allows("data_parallel")]
        return sorted(allowed, key=lambda i: (task.tables[i].rows, -placer.piece_cost(i, 1)[0]))

    def _forced_splits(self, task: ShardingTask) -> dict[int, int]:
        """The config's `split` as pieces by table index; PlanError where a split cannot be laid out or the table's
        plan space forbids it."""
        index = {t.name: i for i, t in enumerate(task.tables)}
        forced: dict[int, int] = {}
        for name, pieces in self.config.split:
            if name not in index:
                raise PlanError(f"neuroshard: split {name!r}: the task has no such table")
            dim = task.tables[index[name]].dim
            if (pieces < 1 or pieces & (pieces - 1) or pieces > task.num_devices or dim % pieces
                    or (dim // pieces) % DIM_ALIGNMENT):
                raise PlanError(f"neuroshard: split {name!r} into {pieces}: pieces must be a power of two up to the "
                                f"{task.num_devices} devices, each a multiple of {DIM_ALIGNMENT} of its {dim} columns")
            table = task.tables[index[name]]
            if pieces > (most := table.max_column_pieces(task.num_devices)):
                raise PlanError(f"neuroshard: split {name!r} into {pieces}: its plan space ({table.plan_space()}) "
                                f"allows at most {most} column slice(s)")
            forced[index[name]] = pieces
        return forced

    def _data_parallel_search(self, placer: _Placer, seen: dict[SplitState, _Evaluated], bounded: set[SplitState],
                              order: list[int], forced: dict[int, int] | None = None) -> SplitState:
        """The best root: no data-parallel table, or a prefix of `order` (1, 2, 4, ... tables, then the counts
        halfway to the best one's neighbours), each prefix's other tables placed by the greedy grid (the `forced`
        ones in their pieces). Past 2 tables, the doubling goes on only while the longest prefix so far is the best:
        where replicating the tables with the fewest gradient bytes costs more (an all-reduce on every device) than
        it saves, longer prefixes are not priced (3 roots instead of 2 + log2(tables); on 1,000 tables on 64
        devices each root is a greedy grid of most of a second of CPU). One table alone may not pay where two do
        (the all-reduce's latency is paid once for both), so 1 and 2 are always priced; roots are placed one at a
        time, and one whose replicated ms alone reach the best root's cost so far is not placed (`bounded`)."""
        task = placer.task
        forced = forced or {}

        def prefix(count: int) -> SplitState:
            chosen = set(order[:count])
            return tuple(DATA_PARALLEL if i in chosen else forced.get(i, 1) for i in range(len(task.tables)))

        counts, k = [0], 1
        while order and k < len(order):
            counts.append(k)
            k *= 2
        if order:
            counts.append(len(order))
        # a longer prefix holds more bytes on every device: stop at the first that does not fit by itself
        fitting = [c for c in counts if placer.replicated_bytes(prefix(c)) <= task.device_memory_bytes]
        counts = counts[:len(fitting)]
        states = [prefix(c) for c in counts[:3]]
        for state in states:
            _place_unless_bounded(placer, seen, bounded, state, min(_cost(seen, s) for s in states))
        while len(states) < len(counts) and _cost(seen, states[-1]) < min(_cost(seen, s) for s in states[:-1]):
            states.append(prefix(counts[len(states)]))
            _place_unless_bounded(placer, seen, bounded, states[-1], min(_cost(seen, s) for s in states))
        counts = counts[:len(states)]
        at = min(range(len(counts)), key=lambda j: _cost(seen, states[j]))
        between = {(counts[at] + counts[j]) // 2 for j in (at - 1, at + 1) if 0 <= j < len(counts)} - set(counts)
        for count in sorted(between):
            states.append(prefix(count))
            _place_unless_bounded(placer, seen, bounded, states[-1], min(_cost(seen, s) for s in states))
        return min(states, key=lambda state: _cost(seen, state))

    def _row_wise_possible(self, task: ShardingTask, cost_model: CostModel) -> bool:
        """Whether row-wise tables are tried: on, on 2 devices or more, with a measured reduce-scatter to price them."""
        return self.config.row_wise and task.num_devices >= 2 and reduce_scatter_of(cost_model) is not None

    def _row_wise_order(self, placer: _Placer, root: SplitState) -> list[int]:
        """The tables tried row-wise (never those the config's `split` splits by columns, nor those whose plan space
        does not allow it): first those that fit on no device even split by columns (every prefix holds them), then
        the costliest: those not data-parallel in `root` whose predicted cost alone is at least ROW_WISE_MIN_SHARE of
        a device's even share of the work, with a row for every device; at most ROW_WISE_MAX_TABLES of those. Empty
        where none are tried."""
        task = placer.task
        if not self._row_wise_possible(task, placer.model):
            return []
        placer._fill([(i, 1) for i in range(len(task.tables))])
        alone = {i: placer.piece_cost(i, 1)[0] for i in range(len(task.tables))}
        share = sum(alone.values()) / task.num_devices
        split = self._forced_splits(task)  # tables the config splits by columns stay so
        candidates = [i for i, p in enumerate(root) if p != DATA_PARALLEL and i not in split
                      and task.tables[i].rows >= task.num_devices and task.tables[i].allows("row_wise")]
        forced = [i for i in candidates if _too_big_for_columns(task, task.tables[i])]
        costly = [i for i in candidates if alone[i] >= ROW_WISE_MIN_SHARE * share and i not in forced]
        return forced + sorted(costly, key=lambda i: -alone[i])[:ROW_WISE_MAX_TABLES]

    def _row_wise_search(self, placer: _Placer, seen: dict[SplitState, _Evaluated], bounded: set[SplitState],
                         root: SplitState, order: list[int]) -> SplitState:
        """The best of `root` and `root` with a prefix of `order` (1, 2, 4, ... tables) row-wise, each state's
        other tables placed by the greedy grid (a state over memory costs inf; one whose replicated ms alone reach
        the best cost so far is not placed)."""
        forced = sum(1 for i in order if _too_big_for_columns(placer.task, placer.task.tables[i]))
        counts = sorted({c for c in (forced, 1, 2, 4, 8) if 0 < c < len(order) and c >= forced}
                        | ({len(order)} if order else set()))
        states = []
        for count in counts:
            chosen = set(order[:count])
            states.append(tuple(ROW_WISE if i in chosen else p for i, p in enumerate(root)))
        states = [s for s in states if s not in seen]
        for state in states:
            _place_unless_bounded(placer, seen, bounded, state, min(_cost(seen, s) for s in [root, *states]))
        return min([root, *states], key=lambda state: _cost(seen, state))

    def _column_roots(self, placer: _Placer, root: SplitState) -> list[SplitState]:
        """`root` with a table whose predicted cost alone exceeds a balanced device's share in column halves, and in
        quarters, as its plan space allows (the costliest BOTTLENECK_MAX_TABLES such tables), and, where several
        exceed it, with all of them in halves: roots of the beam beside `root`. Such a table alone sets the slowest
        device; a depth whose one split does not lower the plan's cost (quarters pay where halves do not, or a second
        such table still sets it) would end the beam before the split that pays is priced."""
        whole = [i for i, p in enumerate(root) if p == 1 and placer.max_pieces[i] >= 2]
        if not whole:
            return []
        share = placer.balanced_share_ms()
        alone = {i: placer.piece_cost(i, 1)[0] for i in whole}
        over = sorted((i for i in whole if alone[i] > share), key=lambda i: -alone[i])[:BOTTLENECK_MAX_TABLES]
        roots = [root[:i] + (p,) + root[i + 1:] for i in over for p in (2, 4) if p <= placer.max_pieces[i]]
        if len(over) > 1:
            roots.append(tuple(2 if i in over else p for i, p in enumerate(root)))
        return roots

    def search(self, task: ShardingTask, cost_model: CostModel | None, seed: int) -> Plan:
        """The lowest-predicted-cost plan found; PlanError when nothing fits in memory."""
        if cost_model is None:
            raise PlanError("neuroshard needs a cost model (pass --model, or `shardwise pretrain` one)")
        with single_thread():
            started = time.perf_counter()
            return place_within_memory(task, cost_model,
                                       lambda placed, model: self._search(placed, model, seed, task, started))

    def _search(self, task: ShardingTask, cost_model: CostModel, seed: int, original: ShardingTask,
                started: float) -> Plan:
        """Place `task` (`original` with the kernels the offload stage chose set on its tables)."""
        check_memory_bounds(task, column_split=True, row_wise=self._row_wise_possible(task, cost_model))
        placer = _Placer(task, cost_model, self.config)
        seen: dict[SplitState, _Evaluated] = {}
        bounded: set[SplitState] = set()  # roots not placed: their replicated ms alone reach a better root's cost
        forced = self._forced_splits(task)
        # the beam over column splits starts from the best set of data-parallel tables (or none)
        best = self._data_parallel_search(placer, seen, bounded, [i for i in self._data_parallel_order(placer)
                                                                  if i not in forced], forced)
        data_parallel_sets = len(seen) + len(bounded) - 1
        data_parallel_bounded = len(bounded)
        # the costliest tables row-wise on top of it: the best such set roots the beam beside it, so that splitting
        # those tables by columns instead is tried too
        split_rows = self._row_wise_search(placer, seen, bounded, best, self._row_wise_order(placer, best))
        row_wise_sets = len(seen) + len(bounded) - 1 - data_parallel_sets
        beam, unsplit = list(dict.fromkeys([split_rows, best])), best
        best = split_rows
        column_roots: list[SplitState] = []
        depth_reached = 0
        for depth in range(1, self.config.max_depth + 1):
            budget = self.config.time_budget_s
            if budget is not None and time.perf_counter() - started > budget:
                break
            if depth == 1:
                # the tables that alone exceed a balanced device's share, in halves and quarters, priced beside the
                # first depth's children (in the same lockstep calls): no depth's "no gain" can stop the beam first
                column_roots = [s for s in self._column_roots(placer, unsplit) if s not in seen]
            children: list[SplitState] = list(column_roots) if depth == 1 else []
            for state in beam:
                for i in self._candidates(placer, state):
                    child = state[:i] + (state[i] * 2,) + state[i + 1 :]
                    if child not in seen and child not in children:
                        children.append(child)
            if not children:
                break
            seen.update(zip(children, placer.evaluate(children)))
            depth_reached = depth
            children.sort(key=lambda s: seen[s].cost_ms)
            beam = children[: self.config.beam_width]
            if seen[beam[0]].cost_ms < seen[best].cost_ms:
                best = beam[0]
            elif np.isfinite(seen[best].cost_ms):
                break  # splitting further no longer helps the best plan
        result = seen[best]
        if result.devices is None:
            raise PlanError(
                f"neuroshard: no memory-feasible plan found with up to {self.config.max_depth} column splits "
                "(raise max_depth or add devices)"
            )
        shards = []
        for (i, k, p), device in zip(result.units, result.devices):
            table = task.tables[i]
            width = table.dim // p
            shards.append(Shard(table=table.name, col_offset=k * width, dim=width, device=int(device)))
        replicated = tuple(t.name for t, p in zip(task.tables, best) if p == DATA_PARALLEL)
        by_rows = tuple(t.name for t, p in zip(task.tables, best) if p == ROW_WISE)
        plan = Plan(num_devices=task.num_devices, shards=tuple(shards), data_parallel=replicated, row_wise=by_rows,
                    kernels=plan_kernels(task), method=self.name)
        plan = plan.model_copy(
            update={
                "extra": {
                    "search": {
                        "states_evaluated": len(seen),
                        "depth_reached": depth_reached,
                        "split_tables": {
                            task.tables[i].name: p for i, p in enumerate(best) if p > 1
                        },
                        "data_parallel_sets_tried": data_parallel_sets,
                        "row_wise_sets_tried": row_wise_sets,
                        "column_roots_tried": len(column_roots),
                        "data_parallel_sets_bounded": data_parallel_bounded,
                        "row_wise_sets_bounded": len(bounded) - data_parallel_bounded,
                        "predicted_max_cost_ms": round(result.cost_ms, 4),
                    }
                }
            }
        )
        options = {k: v for k, v in asdict(self.config).items()}
        options["dim_cap_factors"] = [str(f) if not np.isfinite(f) else f for f in self.config.dim_cap_factors]
        if not self.config.split:
            del options["split"]  # plans of an ordinary search say what they always said
        return finish_plan(
            plan,
            original,
            cost_model,
            planning_time_s=time.perf_counter() - started,
            seed=seed,
            options=options,
            cache=ShardCostCache(cost_model),
        )


_DEFAULT = NeuroShardConfig()


class NeuroShardOptions(MethodOptions):
    """What `shardwise plan` may set of NeuroShardConfig (the grids of caps keep their defaults)."""

    beam_width: int = Field(default=_DEFAULT.beam_width, ge=1, description="split states kept per depth")
    num_candidates: int = Field(default=_DEFAULT.num_candidates, ge=1,
                                description="largest and costliest tables tried per step")
    max_depth: int = Field(default=_DEFAULT.max_depth, ge=0, description="column splits explored")
    device_candidates: int = Field(default=_DEFAULT.device_candidates, ge=1,
                                   description="least-loaded devices each shard is priced on")
    time_budget_s: float | None = Field(default=_DEFAULT.time_budget_s, gt=0,
                                        description="stop widening the beam after this many seconds")
    data_parallel: bool = Field(default=_DEFAULT.data_parallel,
                                description="try data-parallel tables (a cost model with a measured all-reduce)")
    row_wise: bool = Field(default=_DEFAULT.row_wise,
                           description="try the costliest tables row-wise (a cost model with a measured reduce-scatter)")


register_method(MethodSpec(
    name=NeuroShardSearch.name,
    factory=lambda options: NeuroShardSearch(NeuroShardConfig(**options.model_dump())),
    options=NeuroShardOptions,
    description="cost-model-guided greedy grid inside a beam search over column splits",
    needs_cost_model=True,
    learned=True,
))
