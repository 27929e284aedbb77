"""A sharding task: tables, devices, memory per device, batch size; `shardwise.task/v1` JSON IO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .memory import Optimizer, WeightsPrecision
from .tables import TableSpec

TASK_FORMAT: Literal["shardwise.task/v1"] = "shardwise.task/v1"


class TaskError(ValueError):
    """A task file or object that cannot be used; the message names the offending field."""


class ShardingTask(BaseModel):
    """Place `tables` on `num_devices` devices of `device_memory_bytes` each, for `batch_size` samples."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    format: Literal["shardwise.task/v1"] = TASK_FORMAT
    num_devices: int = Field(ge=1)
    device_memory_bytes: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    tables: tuple[TableSpec, ...] = Field(min_length=1)
    optimizer: Optimizer = "rowwise_adagrad"
    weights_precision: WeightsPrecision = "fp32"

    @field_validator("tables")
    @classmethod
    def _unique_names(cls, tables: tuple[TableSpec, ...]) -> tuple[TableSpec, ...]:
        seen: set[str] = set()
        for t in tables:
            if t.name in seen:
                raise ValueError(f"table name {t.name!r} appears more than once (names must be unique)")
            seen.add(t.name)
        return tables

    def table(self, name: str) -> TableSpec:
        """The table called `name`."""
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"no table {name!r} in the task")

    def to_json(self) -> dict[str, Any]:
        """The `shardwise.task/v1` document."""
        return self.model_dump(mode="json", exclude_none=True)


def _describe(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(document)"
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"field '{loc}': {msg}")
    return "; ".join(lines)


def task_from_json(doc: Any, source: str = "task") -> ShardingTask:
    """Validate a parsed task document; refuse it naming the field that is wrong."""
    if not isinstance(doc, dict):
        raise TaskError(f"{source}: expected a JSON object with format {TASK_FORMAT!r}")
    if doc.get("format", TASK_FORMAT) != TASK_FORMAT:
        raise TaskError(f"{source}: field 'format' is {doc.get('format')!r}, expected {TASK_FORMAT!r}")
    try:
        return ShardingTask.model_validate(doc)
    except ValidationError as err:
        raise TaskError(f"{source}: {_describe(err)}") from None


def load_task(path: str | Path) -> ShardingTask:
    """Read and validate a `shardwise.task/v1` JSON file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise TaskError(f"{path}: no such task file") from None
    except json.JSONDecodeError as err:
        raise TaskError(f"{path}: not valid JSON ({err})") from None
    return task_from_json(doc, source=str(path))


def save_task(task: ShardingTask, path: str | Path) -> Path:
    """Write `task` as `shardwise.task/v1` JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(task.to_json(), indent=1))
    return path
