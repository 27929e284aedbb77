"""What is sharded: tables, their features and memory, synthetic DLRM workloads, tasks."""

from .augment import augment_tables
from .dlrm_datasets import (
    DlrmDataset,
    DlrmDatasetError,
    read_dlrm_dataset,
    read_index_data,
    write_dlrm_dataset,
)
from .features import FEATURE_NAMES, NUM_FEATURES, table_features, tables_features
from .memory import (
    Optimizer,
    WeightsPrecision,
    activation_buffer_bytes,
    data_parallel_memory_bytes,
    local_batch,
    shard_memory_bytes,
    table_memory_bytes,
)
from .mlperf import MLPERF_DCNV2_DIM, MLPERF_DCNV2_POOLING, MLPERF_DCNV2_ROWS, mlperf_dcnv2_tables
from .synthetic import DIMS, index_seed, synthesize_tables, write_index_data
from .tables import (
    NUM_REUSE_BINS,
    REUSE_BIN_EDGES,
    TableSpec,
    derive_reuse_bins,
    reuse_histogram,
    row_wise_rows,
    sample_batch,
    stable_seed,
)
from .tableset import (
    TABLES_FORMAT,
    TableSet,
    TableSetError,
    load_tables,
    sample_task,
    save_tables,
    split_tables,
    tableset_from_json,
)
from .task import TASK_FORMAT, ShardingTask, TaskError, load_task, save_task, task_fits, task_from_json

__all__ = [
    "DIMS",
    "MLPERF_DCNV2_DIM",
    "MLPERF_DCNV2_POOLING",
    "MLPERF_DCNV2_ROWS",
    "TABLES_FORMAT",
    "DlrmDataset",
    "DlrmDatasetError",
    "TableSet",
    "TableSetError",
    "augment_tables",
    "index_seed",
    "load_tables",
    "mlperf_dcnv2_tables",
    "read_dlrm_dataset",
    "read_index_data",
    "sample_task",
    "save_tables",
    "split_tables",
    "synthesize_tables",
    "tableset_from_json",
    "write_dlrm_dataset",
    "write_index_data",
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
    "row_wise_rows",
    "sample_batch",
    "stable_seed",
    "save_task",
    "data_parallel_memory_bytes",
    "local_batch",
    "shard_memory_bytes",
    "table_features",
    "table_memory_bytes",
    "tables_features",
    "task_fits",
    "task_from_json",
]
