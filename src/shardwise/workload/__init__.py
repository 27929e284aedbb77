"""What is sharded: tables, their features and memory, synthetic DLRM workloads, tasks."""

from .features import FEATURE_NAMES, NUM_FEATURES, table_features, tables_features
from .memory import Optimizer, WeightsPrecision, activation_buffer_bytes, shard_memory_bytes, table_memory_bytes
from .tables import (
    NUM_REUSE_BINS,
    REUSE_BIN_EDGES,
    TableSpec,
    derive_reuse_bins,
    reuse_histogram,
    sample_batch,
    stable_seed,
)
from .task import TASK_FORMAT, ShardingTask, TaskError, load_task, save_task, task_from_json

__all__ = [
    "FEATURE_NAMES",
    "NUM_FEATURES",
    "NUM_REUSE_BINS",
    "REUSE_BIN_EDGES",
    "TASK_FORMAT",
    "Optimizer",
    "ShardingTask",
    "TableSpec",
    "TaskError",
    "WeightsPrecision",
    "activation_buffer_bytes",
    "derive_reuse_bins",
    "load_task",
    "reuse_histogram",
    "sample_batch",
    "stable_seed",
    "save_task",
    "shard_memory_bytes",
    "table_features",
    "table_memory_bytes",
    "tables_features",
    "task_from_json",
]
