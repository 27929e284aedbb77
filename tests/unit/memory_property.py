"""The memory property, checked by arithmetic of its own: seeded random tasks (1-500 tables, 1-128 devices, memory
slack 1.0-3.0 over the floor no plan goes under: the larger of an even share of the tables' total and the largest
table's thinnest column slice, so slack 1.0 is at the edge of feasible; tables from tiny, 10 rows and 4 columns, to
huge, 10^8 rows and 512 columns; random batch size, optimizer and precision) through every method that plans
without measuring on this machine, NeuroShard and the DreamShard/AutoShard policies included (a small cost model
trained here on synthetic measurements; policies trained for a few episodes). The check does not call
`validate_plan`: it recomputes each device's bytes from the shards (weights, optimizer state, the kernel's pooled
output and its gradient) and the column tiling itself.

A sample runs in tests/unit/test_search_memory_property.py; `python -m benchmarks memory_property` runs it at
scale (10,000 tasks) and records the tallies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from shardwise.search import PlanError, PolicySearch, Searcher, get_method, make_searcher, method_names
from shardwise.search.plan import Plan, check_memory_bounds
from shardwise.workload import ShardingTask, TableSpec, task_fits

#: bytes per weight, and fp32 optimizer state values per row / per element (written out here on purpose: the
#: check must not share code with the planner's memory accounting)
WEIGHT_BYTES = {"fp32": 4, "fp16": 2}
STATE_VALUES = {"sgd": (0, 0), "rowwise_adagrad": (1, 0), "adam": (0, 2)}
DIMS = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def random_task(rng: np.random.Generator, index: int, *, max_tables: int = 500, max_devices: int = 128) -> ShardingTask:
    """One task of the property's space: sizes log-uniform from tiny to huge."""
    num_tables = int(rng.integers(1, max_tables + 1))
    num_devices = int(rng.integers(1, max_devices + 1))
    tables = [
        TableSpec(name=f"t{index}_{i}", rows=int(10 ** rng.uniform(1, 8)), dim=int(rng.choice(DIMS)),
                  pooling_factor=float(10 ** rng.uniform(0, 2)), zipf_alpha=float(rng.uniform(0, 1.5)))
        for i in range(num_tables)
    ]
    batch_size = int(rng.choice([512, 2048, 8192, 65536]))
    optimizer = str(rng.choice(list(STATE_VALUES)))
    precision = str(rng.choice(list(WEIGHT_BYTES)))
    total = sum(device_bytes([(t.rows, t.dim)], batch_size, optimizer, precision) for t in tables)
    # the floor no plan goes under: an even share of everything, and each table's thinnest column slice (split
    # over every device on the 4-column grid); slack 1.0 is at the edge of feasible, 3.0 roomy
    thinnest = max(device_bytes([(t.rows, -(-t.dim // min(num_devices, t.dim // 4 or 1)))], batch_size, optimizer,
                                precision) for t in tables)
    slack = float(rng.uniform(1.0, 3.0))
    memory = slack * max(total / num_devices, thinnest)
    return ShardingTask(tables=tables, num_devices=num_devices, batch_size=batch_size, optimizer=optimizer,
                        weights_precision=precision, device_memory_bytes=max(1, min(int(memory), 2**50 - 1)))


def device_bytes(shards: list[tuple[int, int]], batch_size: int, optimizer: str, precision: str) -> int:
    """A device holding (rows, columns) shards: weights + optimizer state + pooled output and gradient (fp32)."""
    if not shards:
        return 0
    per_row, per_element = STATE_VALUES[optimizer]
    state = sum(rows * cols * WEIGHT_BYTES[precision] + 4 * rows * (per_row + per_element * cols)
                for rows, cols in shards)
    return state + 2 * 4 * batch_size * sum(cols for _, cols in shards)


def check_plan(plan: Plan, task: ShardingTask) -> tuple[bool, bool]:
    """(over memory, mis-tiled) for `plan`, by this module's arithmetic only."""
    rows = {t.name: t.rows for t in task.tables}
    dims = {t.name: t.dim for t in task.tables}
    per_device: list[list[tuple[int, int]]] = [[] for _ in range(task.num_devices)]
    columns: dict[str, list[tuple[int, int]]] = {name: [] for name in dims}
    mis_tiled = plan.num_devices != task.num_devices
    for shard in plan.shards:
        if shard.table not in dims or not 0 <= shard.device < task.num_devices:
            return False, True
        per_device[shard.device].append((rows[shard.table], shard.dim))
        columns[shard.table].append((shard.col_offset, shard.dim))
    # a data-parallel table is whole on every device, with no shard, and a row-wise one a block of its rows on every
    # device: each listed once, never also sharded, never both
    replicated, by_rows = list(plan.data_parallel), list(plan.row_wise)
    mis_tiled |= len(set(replicated + by_rows)) != len(replicated + by_rows) or any(
        name not in dims or columns[name] for name in replicated + by_rows)
    for name in by_rows:
        if name in dims:  # blocks of ceil(rows / devices), the last device(s) the rest, at the whole batch
            block = -(-rows[name] // task.num_devices)
            for d in range(task.num_devices):
                if (held := min(block, rows[name] - d * block)) > 0:
                    per_device[d].append((held, dims[name]))
    for name, pieces in columns.items():
        if name in replicated or name in by_rows:
            continue
        end = 0
        for offset, width in sorted(pieces):
            mis_tiled |= offset != end
            end = offset + width
        mis_tiled |= end != dims[name]
    # every device holds each replica, its dense fp32 gradient, and buffers for its own ceil(batch / devices) samples
    local_batch = -(-task.batch_size // task.num_devices)
    replicas = [(rows[n], dims[n]) for n in replicated if n in dims]
    everywhere = device_bytes(replicas, local_batch, task.optimizer, task.weights_precision) + sum(
        4 * r * c for r, c in replicas)
    over = any(device_bytes(d, task.batch_size, task.optimizer, task.weights_precision) + everywhere
               > task.device_memory_bytes for d in per_device)
    return over, mis_tiled


def certainly_infeasible(task: ShardingTask) -> bool:
    """This module's own lower bound: all state together exceeds all memory (no split can help)."""
    need = sum(device_bytes([(t.rows, t.dim)], task.batch_size, task.optimizer, task.weights_precision)
               for t in task.tables)
    return need > task.device_memory_bytes * task.num_devices


@dataclass
class Tally:
    """One method's counts."""

    tasks: int = 0
    plans: int = 0
    over_memory: int = 0
    mis_tiled: int = 0
    infeasible_planned: int = 0
    refused: int = 0
    refused_feasible: int = 0
    refused_without_reason: int = 0
    skipped: int = 0
    seconds: float = 0.0
    first_refusal: str = ""
    failures: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        """The property: no plan over memory or mis-tiled, no plan for an impossible task, every refusal says why."""
        return not (self.over_memory or self.mis_tiled or self.infeasible_planned or self.refused_without_reason)


def small_cost_model(seed: int = 0):  # noqa: ANN201 - NeuralCostModel, imported lazily with its training data
    """A real NeuralCostModel trained for a few epochs on synthetic measurements (tests/unit/costmodel_synthetic)."""
    import pandas as pd
    from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables

    from shardwise.costmodel import TrainConfig, train_cost_model

    frame = pd.concat([cost_frame({"a": synthetic_tables("a", 16, seed)}, {"a": 80}, seed), comm_rows(12, seed)],
                      ignore_index=True)
    return train_cost_model(frame, seed, TrainConfig(epochs=5, comm_epochs=5, progress=False))[0]


def searchers(cost_model, seed: int) -> dict[str, Callable[[], Searcher]]:  # noqa: ANN001
    """Every registered method that does not measure on this machine; policies trained briefly here."""
    from shardwise.search import train_policy

    rng = np.random.default_rng(seed)
    training: list[ShardingTask] = []
    while len(training) < 6:  # policies place whole tables: train on tasks where that fits
        task = random_task(rng, -1 - len(training), max_tables=30, max_devices=8)
        try:
            check_memory_bounds(task, column_split=False)
        except PlanError:
            continue
        training.append(task)
    made: dict[str, Callable[[], Searcher]] = {}
    for name in method_names():
        spec = get_method(name)
        if spec.measures:
            continue
        if spec.policy is not None:
            policy, _ = train_policy(name, cost_model, training, seed, episodes=2, progress=False)
            made[name] = lambda policy=policy: PolicySearch(policy)
        else:
            made[name] = lambda name=name: make_searcher(name)
    return made


def run(num_tasks: int, seed: int = 0, *, start: int = 0, max_tables: int = 500, max_devices: int = 128,
        torchrec_max_tables: int = 100, progress: bool = True, indices: Sequence[int] | None = None,
        cost_model=None) -> dict[str, Tally]:  # noqa: ANN001 - a NeuralCostModel
    """Plan random tasks `start` .. `start + num_tasks - 1` (or those of `indices`) with every method; the tallies
    per method. Task i is drawn from its own seed (seed, i), so any range is the same tasks whichever run draws it.
    `cost_model`: the model the searches and policies use (default: small_cost_model(seed), trained here)."""
    from tqdm.auto import tqdm

    cost_model = cost_model if cost_model is not None else small_cost_model(seed)
    made = searchers(cost_model, seed)
    tallies = {name: Tally() for name in made}
    chosen = range(start, start + num_tasks) if indices is None else indices
    for index in tqdm(chosen, desc="tasks", disable=not progress):
        rng = np.random.default_rng([seed, index])
        task = random_task(rng, index, max_tables=max_tables, max_devices=max_devices)
        impossible = certainly_infeasible(task) or task_fits(task) is not None
        refusals: dict[str, str] = {}
        planned: set[str] = set()
        for name, make in made.items():
            tally = tallies[name]
            # TorchRec's planner takes minutes on hundreds of tables with column-wise options: cap its tasks
            if name.startswith("torchrec") and len(task.tables) > torchrec_max_tables:
                tally.skipped += 1
                continue
            tally.tasks += 1
            start = time.perf_counter()
            try:
                plan = make().search(task, cost_model, seed=index)
            except PlanError as err:
                tally.seconds += time.perf_counter() - start
                tally.refused += 1
                tally.refused_without_reason += not str(err).strip()
                refusals[name] = str(err)[:160]
                continue
            tally.seconds += time.perf_counter() - start
            tally.plans += 1
            planned.add(name)
            over, mis_tiled = check_plan(plan, task)
            tally.over_memory += over
            tally.mis_tiled += mis_tiled
            tally.infeasible_planned += impossible  # a plan for a task no plan can fit means a broken check
            if over or mis_tiled:
                tally.failures.append(f"task {index}: {'over memory' if over else 'mis-tiled'}")
        # a task another method planned within memory is feasible for certain: refusing it is a weaker search
        # (table-wise methods refuse tasks only column splits can fit; their reason says so)
        for name, reason in refusals.items():
            if planned:
                tallies[name].refused_feasible += 1
                tallies[name].first_refusal = tallies[name].first_refusal or reason
    return tallies
