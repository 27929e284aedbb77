"""DreamShard and AutoShard: trained on small tasks, applied without retraining to larger unseen ones.

Each policy is trained against the cost model on tasks of 20-60 tables on 4 devices drawn from the training
split of synthetic tables, then plans tasks of 80-120 tables on 8 devices drawn from the held-out split
(tables never seen in training). Prints the mean predicted plan cost (the cost model's max device ms) of
every method, its mean per-task ratio to NeuroShard and to the best greedy baseline, and planning times,
then the issue's two checks: within 5% of NeuroShard and below every greedy baseline on average, and
planning 100 tables on 8 devices in under 1 s.

    python benchmarks/bench_rl_policies.py --model runs/cost_model --tables runs/split/train.json \\
        --holdout runs/split/holdout.json     # --record: also write benchmarks/results/rl_policies.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from record import record

from shardwise.cli import quiet_libraries
from shardwise.costmodel.types import CostModel
from shardwise.integrations.mlflow import MlflowService
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="cost model URI (models:/..., runs:/..., or a directory)")
    parser.add_argument("--tables", help="training tables (shardwise.tables/v1); default: synthesize and split")
    parser.add_argument("--holdout", help="held-out tables for the test tasks (required with --tables)")
    parser.add_argument("--num-tasks", type=int, default=40, help="training tasks (20-60 tables, 4 devices)")
    parser.add_argument("--test-tasks", type=int, default=10, help="test tasks (80-120 tables, 8 devices)")
    parser.add_argument("--episodes", type=int, default=200, help="training batches of rollouts per policy")
    parser.add_argument("--samples", type=int, default=16, help="sampled rollouts for the best-of-k variants")
    parser.add_argument("--torchrec", action="store_true", help="also plan with TorchRec's planner (table-wise)")
    parser.add_argument("--device", default=None, help="where the policies train and then plan (cpu, cuda; "
                        "default: cuda when present, as `shardwise train-policy` trains; `plan` loads a saved "
                        "policy on the CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/rl_policies.json")
    args = parser.parse_args()
    quiet_libraries(verbose=False)  # MLflow's download bars and INFO logs, as the CLI without -v
    torch.set_num_threads(1)

    cost_model = MlflowService().load_cost_model(args.model)
    if args.tables:
        if not args.holdout:
            parser.error("--holdout is required with --tables")
        train_tables, holdout_tables = load_tables(args.tables), load_tables(args.holdout)
    else:
        tables = synthesize_tables(num_tables=400, seed=args.seed, row_scale=0.01, batch_size=2048, progress=False)
        train_tables, holdout_tables = split_tables(tables, holdout_fraction=0.3, seed=args.seed)
    held = {t.source or t.name for t in holdout_tables.tables}
    assert not held & {t.source or t.name for t in train_tables.tables}, "holdout tables leak into training"

    train_tasks = sample_training_tasks(train_tables, args.num_tasks, args.seed, min_tables=20, max_tables=60,
                                        num_devices=4)
    test_tasks = sample_training_tasks(holdout_tables, args.test_tasks, args.seed + 100, min_tables=80,
                                       max_tables=120, num_devices=8)
    print(f"cost model {cost_model.hardware_kind} (batch {cost_model.batch_size}); training on {len(train_tasks)} "
          f"tasks of 20-60 tables / 4 devices from {len(train_tables.tables)} tables; testing on {len(test_tasks)} "
          f"tasks of 80-120 tables / 8 devices from {len(holdout_tables.tables)} held-out tables")

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

    print(f"\n{'method':<22} {'mean cost ms':>12} {'/ neuroshard':>12} {'/ ' + best_greedy:>22} {'plan s':>8}")
    for name, (costs, times) in results.items():
        c = np.array(costs)
        print(f"{name:<22} {np.nanmean(c):>12.3f} {np.nanmean(c / reference):>12.3f} "
              f"{np.nanmean(c / greedy_costs[best_greedy]):>22.3f} {np.nanmean(times):>8.3f}")

    # planning time for exactly 100 held-out tables on 8 devices (median of 3)
    task_100 = sample_task(holdout_tables, 100, 8, seed=args.seed)
    print("\nplanning 100 tables on 8 devices (median of 3 runs):")
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
        if runs:
            print(f"  {name:<22} {timing[name]:.3f} s")

    print("\nchecks (mean over test tasks of per-task ratios):")
    checks: list[str] = []
    for method in policies:
        for name in (method, f"{method}+best{args.samples}"):
            c = np.array(results[name][0])
            vs_neuro = float(np.nanmean(c / reference))
            worst_greedy = max(float(np.nanmean(c / greedy_costs[g])) for g in GREEDY)
            checks.append(f"{name}: {'ok' if vs_neuro <= 1.05 else 'MISSED'} / neuroshard <= 1.05, "
                          f"{'ok' if worst_greedy < 1.0 else 'MISSED'} / every greedy < 1, "
                          f"{'ok' if timing[name] < 1.0 else 'MISSED'} 100x8 planning < 1 s")
            print(f"  {name:<22} / neuroshard {vs_neuro:.3f} ({'ok' if vs_neuro <= 1.05 else 'MISSED'} <= 1.05), "
                  f"/ every greedy (max ratio) {worst_greedy:.3f} ({'ok' if worst_greedy < 1.0 else 'MISSED'} < 1), "
                  f"100x8 planning {timing[name]:.3f} s ({'ok' if timing[name] < 1.0 else 'MISSED'} < 1 s)")

    if args.record:
        def figure(value: float) -> float | None:  # NaN (no plan) is no figure
            return round(float(value), 3) if np.isfinite(value) else None

        rows = []
        for name, (costs, times) in results.items():
            c = np.array(costs)
            policy = name.split("+")[0] in policies
            rows.append({
                "method": name, "mean_cost_ms": figure(np.nanmean(c)),
                "over_neuroshard": figure(np.nanmean(c / reference)),
                f"over_{best_greedy}": figure(np.nanmean(c / greedy_costs[best_greedy])),
                "max_over_every_greedy": figure(max(np.nanmean(c / greedy_costs[g]) for g in GREEDY))
                if policy else None,
                "plan_s": figure(np.nanmean(times)), "plan_100x8_s": figure(timing[name]),
            })
        record("rl_policies", "Learned policies on larger unseen tasks", rows,
               notes=f"trained on {len(train_tasks)} tasks of 20-60 tables / 4 devices "
                     f"({args.episodes} episodes), tested on {len(test_tasks)} tasks of 80-120 held-out "
                     f"tables / 8 devices; cost model {args.model}; ratios: mean over test tasks of per-task "
                     "predicted plan cost ratios; plan_s: mean over test tasks; plan_100x8_s: median of 3 on "
                     "100 held-out tables / 8 devices; checks: " + "; ".join(checks))


if __name__ == "__main__":
    main()
