"""The pipeline's components, one per step (definitions in src/shardwise/pipelines/components.py).

Each components/<step>.yaml is that component compiled (regenerate with `python pipelines/compile.py`);
load one into another pipeline with `kfp.components.load_component_from_file("components/<step>.yaml")`.
"""

from shardwise.pipelines.components import (
    IMAGE,
    augment_tables,
    evaluate_plans,
    make_task,
    make_workload,
    pretrain_cost_model,
    profile_costs,
    publish_plans,
    search_plan,
    train_policies,
)

__all__ = [
    "IMAGE",
    "augment_tables",
    "evaluate_plans",
    "make_task",
    "make_workload",
    "pretrain_cost_model",
    "profile_costs",
    "publish_plans",
    "search_plan",
    "train_policies",
]
