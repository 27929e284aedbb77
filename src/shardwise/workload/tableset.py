"""A population of tables (`shardwise.tables/v1` JSON), train/holdout splits, and tasks sampled from it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, Field, ValidationError

from shardwise.errors import ShardwiseError

from .documents import StrictInt, describe_validation_error, read_json_document, write_json_document
from .memory import Optimizer, WeightsPrecision, shard_memory_bytes
from .tables import TableCollection, TableSpec
from .task import MAX_BATCH_SIZE, ShardingTask

TABLES_FORMAT: Literal["shardwise.tables/v1"] = "shardwise.tables/v1"


class TableSetError(ShardwiseError, ValueError):
    """A table population file or request that cannot be used; the message names the offending field."""


class TableSet(TableCollection):
    """Tables to draw tasks and profiling shards from, described at one `batch_size`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    format: Literal["shardwise.tables/v1"] = TABLES_FORMAT
    batch_size: StrictInt = Field(ge=1, le=MAX_BATCH_SIZE)
    tables: tuple[TableSpec, ...] = Field(min_length=1)
    #: the user's own tables (the pipeline's `workload_tables`), not synthetic ones: augmentation covers their
    #: extremes and profiling seeds shards with their heaviest, the tables a plan for them turns on
    given: bool = False



def tableset_from_json(doc: Any, source: str = "tables") -> TableSet:
    """Validate a parsed `shardwise.tables/v1` document; refuse it naming the field that is wrong."""
    if not isinstance(doc, dict):
        raise TableSetError(f"{source}: expected a JSON object with format {TABLES_FORMAT!r}")
    if "format" not in doc:
        raise TableSetError(f"{source}: field 'format' is missing; expected \"format\": {TABLES_FORMAT!r}")
    if doc["format"] != TABLES_FORMAT:
        raise TableSetError(f"{source}: field 'format' is {repr(doc['format'])[:60]}, expected {TABLES_FORMAT!r}")
    try:
        return TableSet.model_validate(doc)
    except ValidationError as err:
        raise TableSetError(f"{source}: {describe_validation_error(err)}") from None


def load_tables(path: str | Path) -> TableSet:
    """Read and validate a `shardwise.tables/v1` JSON file."""
    return tableset_from_json(read_json_document(path, TableSetError, "table"), source=str(path))


def save_tables(tableset: TableSet, path: str | Path) -> Path:
    """Write `tableset` as `shardwise.tables/v1` JSON."""
    return write_json_document(tableset.to_json(), path, TableSetError)


def split_tables(tableset: TableSet, holdout_fraction: float, seed: int) -> tuple[TableSet, TableSet]:
    """Split into (train, holdout) by source table, so copies sharing index data never straddle the split."""
    if not 0.0 < holdout_fraction < 1.0:
        raise TableSetError(f"holdout_fraction {holdout_fraction} must be in (0, 1)")
    groups: dict[str, list[TableSpec]] = {}
    for t in tableset.tables:
        groups.setdefault(t.source or t.name, []).append(t)
    if len(groups) < 2:
        raise TableSetError(f"cannot split {len(groups)} source table(s) into train and holdout")
    keys = sorted(groups)
    order = np.random.default_rng(seed).permutation(len(keys))
    num_holdout = min(max(1, round(holdout_fraction * len(keys))), len(keys) - 1)
    holdout_keys = {keys[i] for i in order[:num_holdout]}
    train = [t for t in tableset.tables if (t.source or t.name) not in holdout_keys]
    holdout = [t for t in tableset.tables if (t.source or t.name) in holdout_keys]
    return (
        tableset.model_copy(update={"tables": tuple(train)}),
        tableset.model_copy(update={"tables": tuple(holdout)}),
    )


def sample_task(
    tableset: TableSet,
    num_tables: int,
    num_devices: int,
    seed: int,
    memory_slack: float = 1.5,
    device_memory_bytes: int | None = None,
    optimizer: Optimizer = "rowwise_adagrad",
    weights_precision: WeightsPrecision = "fp32",
) -> ShardingTask:
    """A task of `num_tables` tables drawn without replacement, on `num_devices` devices.

    Memory per device is `device_memory_bytes` if given, else `memory_slack` x (everything the tables need
    on one device) / `num_devices`, and never less than what the largest table needs alone (so that a
    table-wise plan is not ruled out by construction)."""
    if not 1 <= num_tables <= len(tableset.tables):
        raise TableSetError(f"num_tables {num_tables} must be in [1, {len(tableset.tables)}] for this table set")
    if num_devices < 1:
        raise TableSetError(f"num_devices {num_devices} must be >= 1")
    if not (math.isfinite(memory_slack) and memory_slack > 0):
        raise TableSetError(f"memory_slack {memory_slack} must be a finite number > 0 (1.5: half again the need)")
    rng = np.random.default_rng(seed)
    picked = sorted(rng.choice(len(tableset.tables), size=num_tables, replace=False).tolist())
    tables = tuple(tableset.tables[i] for i in picked)
    batch_size = tableset.batch_size
    if device_memory_bytes is None:
        total = shard_memory_bytes(tables, batch_size, optimizer, weights_precision)
        largest = max(shard_memory_bytes([t], batch_size, optimizer, weights_precision) for t in tables)
        share = memory_slack * total / num_devices
        if not share < 2**63:  # a finite slack can still overflow: 1e300 x the tables' bytes
            raise TableSetError(f"memory_slack {memory_slack} asks for {share:.3g} bytes per device: not a machine")
        device_memory_bytes = max(math.ceil(share), largest)
    elif device_memory_bytes < 1:
        raise TableSetError(f"device_memory_bytes {device_memory_bytes} must be >= 1")
    try:
        return ShardingTask(
            num_devices=num_devices,
            device_memory_bytes=device_memory_bytes,
            batch_size=batch_size,
            tables=tables,
            optimizer=optimizer,
            weights_precision=weights_precision,
        )
    except ValidationError as err:  # e.g. num_devices or the memory per device out of bounds
        raise TableSetError(f"task: {describe_validation_error(err)}") from None
