"""Search: plans (validity, memory, JSON IO), the simulator, the method registry and the methods.

Each method module registers itself when imported; the imports below, in this order, are the registry's
contents and order (a new method is one new module and one line here). DreamShard and AutoShard register from
policy_methods, which imports their networks (torch) only when a policy is loaded or trained: importing this package
imports no torch, so a command's options (`shardwise plan --help`) are built in a fraction of a second."""

from __future__ import annotations

# isort: off
# the methods register themselves on import, in this order: the order `shardwise plan --help` and the
# benchmark list them
from . import neuroshard, baselines, torchrec_planner, policy_methods  # noqa: F401
# isort: on
from .baselines import GREEDY_KEYS, MEASURED_KEY, GreedySearch, RandomSearch, SingleTableTimings
from .neuroshard import NeuroShardConfig, NeuroShardSearch
from .plan import (
    PLAN_FORMAT,
    Plan,
    PlanError,
    Shard,
    check_memory_bounds,
    device_specs,
    load_plan,
    plan_from_json,
    plan_memory_bytes,
    save_plan,
    validate_plan,
)
from .policy_files import PolicyError
from .policy_search import PolicySearch, mean_plan_cost
from .policy_training import sample_training_tasks, train_policy
from .registry import (
    MethodError,
    MethodOptions,
    MethodSpec,
    NoOptions,
    PolicyHooks,
    get_method,
    load_policy_dir,
    make_searcher,
    method_names,
    method_options,
    register_method,
    unregister_method,
)
from .report import finish_plan, format_plan
from .simulator import PlanCost, ShardCostCache, simulate
from .torchrec_planner import TorchRecPlannerSearch
from .types import Searcher

__all__ = [
    "GREEDY_KEYS",
    "MEASURED_KEY",
    "PLAN_FORMAT",
    "GreedySearch",
    "MethodError",
    "MethodOptions",
    "MethodSpec",
    "NeuroShardConfig",
    "NeuroShardSearch",
    "NoOptions",
    "Plan",
    "PlanCost",
    "PlanError",
    "PolicyError",
    "PolicyHooks",
    "PolicySearch",
    "RandomSearch",
    "Searcher",
    "Shard",
    "ShardCostCache",
    "SingleTableTimings",
    "TorchRecPlannerSearch",
    "check_memory_bounds",
    "device_specs",
    "finish_plan",
    "format_plan",
    "get_method",
    "load_plan",
    "load_policy_dir",
    "make_searcher",
    "mean_plan_cost",
    "method_names",
    "method_options",
    "plan_from_json",
    "plan_memory_bytes",
    "register_method",
    "sample_training_tasks",
    "save_plan",
    "simulate",
    "train_policy",
    "unregister_method",
    "validate_plan",
]
