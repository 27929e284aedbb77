"""A sharding task: tables, devices, memory per device, batch size; `shardwise.task/v1` JSON IO."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from shardwise.errors import ShardwiseError

from .documents import describe_validation_error, read_json_document, write_json_document
from .memory import Optimizer, WeightsPrecision
from .tables import TableCollection, TableSpec

TASK_FORMAT: Literal["shardwise.task/v1"] = "shardwise.task/v1"


class TaskError(ShardwiseError, ValueError):
    """A task file or object that cannot be used; the message names the offending field."""


class ShardingTask(TableCollection):
    """Place `tables` on `num_devices` devices of `device_memory_bytes` each, for `batch_size` samples."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    format: Literal["shardwise.task/v1"] = TASK_FORMAT
    num_devices: int = Field(ge=1)
    device_memory_bytes: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    tables: tuple[TableSpec, ...] = Field(min_length=1)
    optimizer: Optimizer = "rowwise_adagrad"
    weights_precision: WeightsPrecision = "fp32"



def task_from_json(doc: Any, source: str = "task") -> ShardingTask:
    """Validate a parsed task document; refuse it naming the field that is wrong."""
    if not isinstance(doc, dict):
        raise TaskError(f"{source}: expected a JSON object with format {TASK_FORMAT!r}")
    if doc.get("format", TASK_FORMAT) != TASK_FORMAT:
        raise TaskError(f"{source}: field 'format' is {doc.get('format')!r}, expected {TASK_FORMAT!r}")
    try:
        return ShardingTask.model_validate(doc)
    except ValidationError as err:
        raise TaskError(f"{source}: {describe_validation_error(err)}") from None


def load_task(path: str | Path) -> ShardingTask:
    """Read and validate a `shardwise.task/v1` JSON file."""
    return task_from_json(read_json_document(path, TaskError, "task"), source=str(path))


def save_task(task: ShardingTask, path: str | Path) -> Path:
    """Write `task` as `shardwise.task/v1` JSON."""
    return write_json_document(task.to_json(), path)
