"""Planning with a trained placement policy (DreamShard, AutoShard): the searcher, the options and factory
their registry entries share, and the score a policy is validated by."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from shardwise.costmodel.types import CostModel
from shardwise.workload import ShardingTask

from .placement import PlacementPolicy, best_assignment, plan_from_assignment, prepare_task
from .plan import Plan, PlanError
from .policy_files import POLICY_FILE, PolicyError, find_policy_dir, read_policy_method
from .registry import MethodOptions
from .report import finish_plan
from .threads import single_thread
from .types import Searcher


class PolicyOptions(MethodOptions):
    """Options of a method that plans with a trained policy."""

    policy: str | None = Field(
        default=None,
        description="trained policy: directory or models:/<name>@<alias> (default: the registry's champion "
        "for the cost model's hardware)",
    )
    samples: int = Field(default=0, ge=0, description="sampled rollouts besides the greedy one")


class PolicySearch:
    """Plans with a trained policy: greedy placement plus `samples` sampled rollouts, the best fitting one
    by the CostModel's predicted plan cost."""

    def __init__(self, policy: PlacementPolicy, samples: int = 0) -> None:
        if samples < 0:
            raise ValueError(f"samples must be >= 0, got {samples}")
        self.policy = policy
        self.samples = samples
        self.name = policy.method

    def search(self, task: ShardingTask, cost_model: CostModel | None, seed: int) -> Plan:
        """A memory-feasible table-wise plan for `task`, or PlanError."""
        if cost_model is None:
            raise PlanError(f"{self.name} needs a cost model (pass --model)")
        started = time.perf_counter()
        prepared = prepare_task(task, cost_model)
        with single_thread():
            candidates = self.policy.candidates(cost_model, prepared, self.samples, seed)
        assignment, _ = best_assignment(cost_model, prepared, candidates, self.name)
        plan = plan_from_assignment(prepared, assignment, self.name, extra={"policy": self.policy.provenance})
        return finish_plan(
            plan, task, cost_model, planning_time_s=time.perf_counter() - started, seed=seed,
            options={"samples": self.samples, "candidates": len(candidates)},
        )


def policy_factory(method: str, load: Callable[[Path, str], PlacementPolicy]) -> Callable[[BaseModel], Searcher]:
    """The registry factory of a policy method: its PolicySearch over the policy directory in `options.policy`
    (loaded on the CPU with `load`), refusing none and another method's policy."""

    def factory(options: BaseModel) -> Searcher:
        assert isinstance(options, PolicyOptions)
        if options.policy is None:
            raise PlanError(
                f"{method} plans with a trained policy and none was given: train one with "
                f"`shardwise train-policy --method {method} ...`, or pass --policy DIR"
            )
        if ":/" in options.policy and not Path(options.policy).exists():
            raise PolicyError(
                f"policy {options.policy}: a registry URI; searchers load a local policy directory (`shardwise plan` "
                "resolves URIs, or load it with MlflowService.load(uri, ...) and pass the directory)"
            )
        directory = find_policy_dir(options.policy)
        found = read_policy_method(directory)
        if found != method:
            raise PolicyError(
                f"{directory / POLICY_FILE}: a {found} policy, not a {method} one (pass a {method} policy, "
                f"or --method {found})"
            )
        return PolicySearch(load(directory, "cpu"), samples=options.samples)

    return factory


def mean_plan_cost(searcher: Searcher, tasks: Sequence[ShardingTask], cost_model: CostModel) -> float:
    """Mean predicted plan cost over `tasks`, each in units of its scale (sum of table costs / devices)."""
    costs = []
    for seed, task in enumerate(tasks):
        plan = searcher.search(task, cost_model, seed)
        costs.append(float(plan.extra["predicted"]["max_cost_ms"]) / prepare_task(task, cost_model).scale_ms)
    return float(np.mean(costs))
