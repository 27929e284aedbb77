"""DreamShard and AutoShard: trained on small tasks, applied without retraining to larger unseen ones.

Each policy is trained against the cost model on tasks of 20-60 tables on 4 devices drawn from the training
split of synthetic tables, then plans tasks of 80-120 tables on 8 devices drawn from the held-out split
(tables never seen in training). Per method: the mean predicted plan cost (the cost model's max device ms), its mean
per-task ratio to NeuroShard and to the best greedy baseline, and planning times; then the policies' two checks:
within 5% of NeuroShard and below every greedy baseline on average, and planning 100 tables on 8 devices in under
1 s.

    python -m benchmarks rl_policies --model runs/cost_model --tables runs/split/train.json \\
        --holdout runs/split/holdout.json
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import Field

from benchmarks.harness import BenchmarkError, Context, Experiment, ExperimentSettings, Outcome, register
from shardwise.costmodel.types import CostModel
from shardwise.search import (
    GREEDY_KEYS,
    PlanError,
    PolicySearch,
    Searcher,
    make_searcher,
    sample_training_tasks,
    simulate,
    train_policy,
)
from shardwise.search.placement import select_device
from shardwise.workload import ShardingTask
from shardwise.workload.synthetic import synthesize_tables
from shardwise.workload.tableset import load_tables, sample_task, split_tables

GREEDY = tuple(f"{k}_greedy" for k in GREEDY_KEYS)


def plan_costs(search: Callable[[ShardingTask, int], object], tasks: list[ShardingTask],
               cost_model: CostModel) -> tuple[list[float], list[float]]:
    """Predicted plan cost (ms) and planning time (s) per task; NaN where the method found no plan."""
    costs, times = [], []
    for seed, task in enumerate(tasks):
        started = time.perf_counter()
        try:
            plan = search(task, seed)
        except PlanError as err:
            print(f"  no plan: {err}")
            costs.append(float("nan"))
            times.append(float("nan"))
            continue
        times.append(time.perf_counter() - started)
        costs.append(simulate(plan, task, cost_model).max_cost_ms)  # type: ignore[arg-type]
    return costs, times


class RlPoliciesSettings(ExperimentSettings):
    """Which cost model, which tables, how long the policies train."""

    model: str = Field(description="cost model URI (models:/..., runs:/..., or a directory)")
    tables: str | None = Field(default=None, description="training tables (shardwise.tables/v1); default: "
                               "synthesize and split")
    holdout: str | None = Field(default=None, description="held-out tables for the test tasks (required with "
                                "--tables)")
    num_tasks: int = Field(default=40, ge=1, description="training tasks (20-60 tables, 4 devices)")
    test_tasks: int = Field(default=10, ge=1, description="test tasks (80-120 tables, 8 devices)")
    episodes: int = Field(default=200, ge=1, description="training batches of rollouts per policy")
    samples: int = Field(default=16, ge=1, description="sampled rollouts for the best-of-k variants")
    torchrec: bool = Field(default=False, description="also plan with TorchRec's planner (table-wise)")
    device: str | None = Field(default=None, description="where the policies train and then plan (cpu, cuda; "
                               "default: cuda when present, as `shardwise train-policy` trains; `plan` loads a saved "
                               "policy on the CPU)")
    seed: int = 0


def run(args: RlPoliciesSettings, context: Context) -> Outcome:
    """Train both policies, plan the test tasks with every method; one row per method."""
    cost_model = context.cost_model(args.model, required=True)
    if args.tables:
        if not args.holdout:
            raise BenchmarkError(f"--tables {args.tables}: give the held-out tables too (--holdout)")
        train_tables, holdout_tables = load_tables(args.tables), load_tables(args.holdout)
    else:
        tables = synthesize_tables(num_tables=400, seed=args.seed, row_scale=0.01, batch_size=2048, progress=False)
        train_tables, holdout_tables = split_tables(tables, holdout_fraction=0.3, seed=args.seed)
    held = {t.source or t.name for t in holdout_tables.tables}
    if leaked := held & {t.source or t.name for t in train_tables.tables}:
        raise BenchmarkError(f"--holdout: {len(leaked)} held-out source tables are also training tables")

    train_tasks = sample_training_tasks(train_tables, args.num_tasks, args.seed, min_tables=20, max_tables=60,
                                        num_devices=4)
    test_tasks = sample_training_tasks(holdout_tables, args.test_tasks, args.seed + 100, min_tables=80,
                                       max_tables=120, num_devices=8)

    policies = {}
    for method in ("dreamshard", "autoshard"):
        started = time.perf_counter()
        policies[method], _ = train_policy(method, cost_model, train_tasks, args.seed, episodes=args.episodes,
                                           device=args.device)
        print(f"trained {method} on {select_device(args.device)} in {time.perf_counter() - started:.0f} s")

    def bind(searcher: Searcher) -> Callable[[ShardingTask, int], object]:
        return lambda task, seed: searcher.search(task, cost_model, seed)

    searchers: dict[str, Callable[[ShardingTask, int], object]] = {}
    for method, policy in policies.items():
        searchers[method] = bind(PolicySearch(policy))
        searchers[f"{method}+best{args.samples}"] = bind(PolicySearch(policy, samples=args.samples))
    for method in ("neuroshard", *GREEDY, "random") + (("torchrec",) if args.torchrec else ()):
        searchers[method] = bind(make_searcher(method))

    results = {}
    for name, search in searchers.items():
        results[name] = plan_costs(search, test_tasks, cost_model)
    reference = np.array(results["neuroshard"][0])
    greedy_costs = {g: np.array(results[g][0]) for g in GREEDY}
    best_greedy = min(greedy_costs, key=lambda g: np.nanmean(greedy_costs[g]))

    # planning time for exactly 100 held-out tables on 8 devices (median of 3)
    task_100 = sample_task(holdout_tables, 100, 8, seed=args.seed)
    timing = {}
    for name in [*searchers]:
        runs = []
        for r in range(3):
            started = time.perf_counter()
            try:
                searchers[name](task_100, r)
            except PlanError as err:
                print(f"  {name:<22} no plan ({str(err)[:80]})")
                break
            runs.append(time.perf_counter() - started)
        timing[name] = statistics.median(runs) if runs else float("nan")

    checks: list[str] = []
    for method in policies:
        for name in (method, f"{method}+best{args.samples}"):
            c = np.array(results[name][0])
            vs_neuro = float(np.nanmean(c / reference))
            worst_greedy = max(float(np.nanmean(c / greedy_costs[g])) for g in GREEDY)
            checks.append(f"{name}: {'ok' if vs_neuro <= 1.05 else 'MISSED'} / neuroshard <= 1.05, "
                          f"{'ok' if worst_greedy < 1.0 else 'MISSED'} / every greedy < 1, "
                          f"{'ok' if timing[name] < 1.0 else 'MISSED'} 100x8 planning < 1 s")

    def figure(value: Any) -> float | None:  # NaN (no plan) is no figure
        return round(float(value), 3) if np.isfinite(value) else None

    rows = []
    for name, (costs, times) in results.items():
        c = np.array(costs)
        policy = name.split("+")[0] in policies
        rows.append({
            "method": name, "mean_cost_ms": figure(np.nanmean(c)),
            "over_neuroshard": figure(np.nanmean(c / reference)),
            f"over_{best_greedy}": figure(np.nanmean(c / greedy_costs[best_greedy])),
            "max_over_every_greedy": figure(max(np.nanmean(c / greedy_costs[g]) for g in GREEDY)) if policy else None,
            "plan_s": figure(np.nanmean(times)), "plan_100x8_s": figure(timing[name]),
        })
    return Outcome(rows, notes=[
        f"trained on {len(train_tasks)} tasks of 20-60 tables / 4 devices ({args.episodes} episodes) from "
        f"{len(train_tables.tables)} tables, tested on {len(test_tasks)} tasks of 80-120 held-out tables / 8 devices "
        f"from {len(holdout_tables.tables)}; cost model {context.model} ({cost_model.hardware_kind}, batch "
        f"{cost_model.batch_size}); ratios: mean over test tasks of per-task predicted plan cost ratios; plan_s: mean "
        "over test tasks; plan_100x8_s: median of 3 on 100 held-out tables / 8 devices; checks: " + "; ".join(checks)])


register(Experiment(
    name="rl_policies",
    title="Learned policies on larger unseen tasks",
    settings=RlPoliciesSettings,
    run=run,
))
