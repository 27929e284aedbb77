"""Memory safety at scale: seeded random tasks through every method, each plan checked by arithmetic of its own.

Tasks: 1-500 tables, 1-128 devices, memory slack 1.0-3.0 (per-device memory = slack x the tables' total / devices),
tables from tiny (10 rows, 4 columns) to huge (10^8 rows, 512 columns), random batch size and optimizer. Every
method that plans without measuring on this machine runs, NeuroShard and the DreamShard/AutoShard policies
included (a small cost model trained here on synthetic measurements; policies trained for a few episodes). The
check does not call `validate_plan`: it recomputes each device's bytes from the shards (weights, optimizer state,
the kernel's pooled output and its gradient) and the column tiling itself. Per method it prints tasks, plans,
plans over memory, mis-tiled plans, infeasible tasks answered with a plan (must be 0), refusals (each must say
why) and how many of them another method did plan (a weaker search, with the first reason), and seconds.

    python benchmarks/bench_memory_property.py                   # 10,000 tasks per method (hours on 2 cores)
    python benchmarks/bench_memory_property.py --tasks 500       # a sample; tests/unit/test_search_memory_property.py
    (--record also writes benchmarks/results/memory_property.json)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))  # the synthetic cost data

from shardwise.search import PlanError, PolicySearch, Searcher, get_method, make_searcher, method_names  # noqa: E402
from shardwise.search.plan import Plan, check_memory_bounds  # noqa: E402
from shardwise.workload import ShardingTask, TableSpec, task_fits  # noqa: E402

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
    slack = float(rng.uniform(1.0, 3.0))
    return ShardingTask(tables=tables, num_devices=num_devices, batch_size=batch_size, optimizer=optimizer,
                        weights_precision=precision, device_memory_bytes=max(1, int(slack * total / num_devices)))


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
    for name, pieces in columns.items():
        end = 0
        for offset, width in sorted(pieces):
            mis_tiled |= offset != end
            end = offset + width
        mis_tiled |= end != dims[name]
    over = any(device_bytes(d, task.batch_size, task.optimizer, task.weights_precision) > task.device_memory_bytes
               for d in per_device)
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


def run(num_tasks: int, seed: int = 0, *, max_tables: int = 500, max_devices: int = 128,
        torchrec_max_tables: int = 100, progress: bool = True) -> dict[str, Tally]:
    """Plan `num_tasks` random tasks with every method; the tallies per method."""
    from tqdm.auto import tqdm

    cost_model = small_cost_model(seed)
    made = searchers(cost_model, seed)
    tallies = {name: Tally() for name in made}
    rng = np.random.default_rng(seed)
    for index in tqdm(range(num_tasks), desc="tasks", disable=not progress):
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="random tasks (each through every method)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tables", type=int, default=500)
    parser.add_argument("--max-devices", type=int, default=128)
    parser.add_argument("--torchrec-max-tables", type=int, default=100,
                        help="TorchRec's planner only on tasks up to this many tables (its column-wise search is slow)")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/memory_property.json")
    args = parser.parse_args()
    tallies = run(args.tasks, args.seed, max_tables=args.max_tables, max_devices=args.max_devices,
                  torchrec_max_tables=args.torchrec_max_tables)
    header = (f"{'method':<20}{'tasks':>7}{'plans':>7}{'over mem':>9}{'mis-tiled':>10}{'impossible':>11}"
              f"{'refused':>8}{'of them planned by another':>27}{'skipped':>8}{'seconds':>9}  first such refusal")
    print(header)
    rows = []
    for name, t in tallies.items():
        print(f"{name:<20}{t.tasks:>7}{t.plans:>7}{t.over_memory:>9}{t.mis_tiled:>10}{t.infeasible_planned:>11}"
              f"{t.refused:>8}{t.refused_feasible:>27}{t.skipped:>8}{t.seconds:>9.1f}  {t.first_refusal}")
        rows.append({"method": name, "tasks": t.tasks, "plans": t.plans, "over_memory": t.over_memory,
                     "mis_tiled": t.mis_tiled, "infeasible_planned": t.infeasible_planned, "refused": t.refused,
                     "refused_but_planned_by_another": t.refused_feasible, "seconds": round(t.seconds, 1)})
    bad = [name for name, t in tallies.items() if not t.ok()]
    print("property holds for every method" if not bad else f"PROPERTY BROKEN for {', '.join(bad)}")
    if args.record:
        from record import record

        record("memory_property", "Memory safety: random tasks, plans checked by independent arithmetic", rows,
               notes=f"{args.tasks} tasks, 1-{args.max_tables} tables, 1-{args.max_devices} devices, slack 1.0-3.0")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
