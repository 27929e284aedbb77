"""A sharding plan: which column slice of which table sits on which device; `shardwise.plan/v1` JSON IO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shardwise.workload import TableSpec

PLAN_FORMAT = "shardwise.plan/v1"


class PlanError(ValueError):
    """A plan that is malformed, invalid for its task, or over a device's memory."""


class Shard(BaseModel):
    """Columns [col_offset, col_offset + dim) of `table`, placed on `device`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    table: str
    col_offset: int = Field(ge=0)
    dim: int = Field(ge=1)
    device: int = Field(ge=0)

    def spec(self, table: TableSpec) -> TableSpec:
        """The column slice as a table of its own (whole tables keep their name)."""
        if self.col_offset == 0 and self.dim == table.dim:
            return table
        return table.with_dim(self.dim, name=f"{table.name}[{self.col_offset}:{self.col_offset + self.dim}]")


class Plan(BaseModel):
    """Shards over `num_devices` devices; `extra` holds method, predicted costs, memory, provenance."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    format: str = PLAN_FORMAT
    num_devices: int = Field(ge=1)
    shards: tuple[Shard, ...]
    method: str = "unknown"
    extra: dict[str, Any] = Field(default_factory=dict)

    def device_shards(self, device: int) -> list[Shard]:
        """The shards on `device`."""
        return [s for s in self.shards if s.device == device]

    def to_json(self) -> dict[str, Any]:
        """The `shardwise.plan/v1` document (extra keys at the top level)."""
        doc = self.model_dump(mode="json", exclude={"extra"})
        doc.update(self.extra)
        return doc


def plan_from_json(doc: Any, source: str = "plan") -> Plan:
    """Parse a `shardwise.plan/v1` document; unknown top-level keys go to `extra`."""
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise PlanError(f"{source}: field 'format' must be {PLAN_FORMAT!r}")
    known = {"format", "num_devices", "shards", "method"}
    try:
        return Plan.model_validate(
            {**{k: v for k, v in doc.items() if k in known}, "extra": {k: v for k, v in doc.items() if k not in known}}
        )
    except ValidationError as err:
        fields = "; ".join(
            f"field '{'.'.join(map(str, e['loc']))}': {e['msg']}" for e in err.errors()
        )
        raise PlanError(f"{source}: {fields}") from None


def load_plan(path: str | Path) -> Plan:
    """Read a `shardwise.plan/v1` JSON file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise PlanError(f"{path}: not valid JSON ({err})") from None
    return plan_from_json(doc, source=str(path))


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write `plan` as `shardwise.plan/v1` JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.to_json(), indent=1))
    return path
