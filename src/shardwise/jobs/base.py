"""What every job shares: frozen, validated settings; a result that renders a summary and serialises to JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shardwise.errors import ShardwiseError
from shardwise.workload.documents import describe_validation_error


class SettingsError(ShardwiseError):
    """Settings that a job refuses: the message names the field and what is wrong with it."""


class JobSettings(BaseModel):
    """A job's settings: frozen, unknown keys refused (a typo in a config file is an error, not a no-op)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


#: refinement's time budget on a plan where `plan` and `evaluate` (the pipeline's evaluate step too) are given none:
#: seconds per table of the task, at least REFINE_MIN_S and at most REFINE_MAX_S. The starts' first session alone
#: measures every device's shard of each start 9 times, so the budget grows with the tables it times
REFINE_S_PER_TABLE = 2.0
REFINE_MIN_S = 30.0
REFINE_MAX_S = 600.0


def default_refine_budget_s(num_tables: int) -> float:
    """Refinement's time budget for a task of `num_tables` tables where none is given."""
    return min(max(REFINE_S_PER_TABLE * num_tables, REFINE_MIN_S), REFINE_MAX_S)


def refine_budget_field(*, scaled: bool = False) -> Any:
    """The `refine_budget_s` setting of every job that refines a plan (plan, evaluate, benchmark); `scaled`: its
    default is the task's (`default_refine_budget_s`), else the rounds alone limit refinement."""
    default = (f"{REFINE_S_PER_TABLE:g} s per table, at least {REFINE_MIN_S:g} s, at most {REFINE_MAX_S:g} s"
               if scaled else "the rounds alone limit it")
    return Field(default=None, gt=0, allow_inf_nan=False,
                 description="stop refining a plan after this many seconds, mid-round where needed, with the plan "
                             f"measured fastest so far (default: {default})")


class JobResult(BaseModel):
    """What a job did: `summary()` for the terminal, `to_json()` for files and pipeline steps."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    def summary(self) -> str:
        """What the terminal shows when the job is done."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON-ready document."""
        return self.model_dump(mode="json")


S = TypeVar("S", bound=BaseModel)


def build_settings(settings_type: type[S], values: Mapping[str, Any]) -> S:
    """`settings_type` validated from `values`, or a SettingsError naming every bad field."""
    try:
        return settings_type.model_validate(dict(values))
    except ValidationError as err:
        raise SettingsError(f"{settings_type.__name__}: {describe_validation_error(err)}") from None
