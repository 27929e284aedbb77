"""What a placement policy is trained on (tasks sampled from a table set) and the training entry point shared
by `shardwise train-policy` and the RL benchmark (dispatched through the registry)."""

from __future__ import annotations

import numpy as np

from shardwise.costmodel.types import CostModel
from shardwise.workload import ShardingTask, TableSet, sample_task

from .placement import PlacementPolicy
from .registry import MethodError, get_method, method_names


def sample_training_tasks(tableset: TableSet, num_tasks: int, seed: int, *, min_tables: int = 20,
                          max_tables: int = 60, num_devices: int = 4, memory_slack: float = 1.5) -> list[ShardingTask]:
    """`num_tasks` tasks of `min_tables`..`max_tables` tables from `tableset`, seeded."""
    if num_tasks < 1:
        raise ValueError(f"num_tasks {num_tasks} must be >= 1")
    if not 1 <= min_tables <= max_tables:
        raise ValueError(f"need 1 <= min_tables ({min_tables}) <= max_tables ({max_tables})")
    max_tables = min(max_tables, len(tableset.tables))
    min_tables = min(min_tables, max_tables)
    rng = np.random.default_rng(seed)
    return [
        sample_task(tableset, int(rng.integers(min_tables, max_tables + 1)), num_devices,
                    seed=int(rng.integers(2**31)), memory_slack=memory_slack)
        for _ in range(num_tasks)
    ]


def train_policy(method: str, cost_model: CostModel, tasks: list[ShardingTask], seed: int, *, episodes: int = 200,
                 device: str | None = None, progress: bool = True) -> tuple[PlacementPolicy, list[dict[str, float]]]:
    """Train a `method` policy for about `episodes` batches of rollouts; returns (policy, history)."""
    hooks = get_method(method).policy
    if hooks is None:
        trainable = ", ".join(n for n in method_names() if get_method(n).policy is not None)
        raise MethodError(f"{method!r} plans without a trained policy; one of {trainable} trains one")
    return hooks.train(cost_model, tasks, seed, episodes=episodes, device=device, progress=progress)
