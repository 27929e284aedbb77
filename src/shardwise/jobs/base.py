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


def refine_budget_field() -> Any:
    """The `refine_budget_s` setting of every job that refines a plan (plan, evaluate, benchmark)."""
    return Field(default=None, gt=0, allow_inf_nan=False,
                 description="start no new refinement round after this many seconds on a plan (default: the rounds "
                             "alone limit it)")


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
