"""The drop-in's one error type: TorchRec's `PlannerError` (so `except PlannerError` around `plan()` catches it),
and shardwise's `PlanError` (so shardwise's callers do too)."""

from __future__ import annotations

from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError
from torchrec.distributed.planner.types import PlannerErrorType

from shardwise.search import PlanError


class PlannerError(TorchRecPlannerError, PlanError):
    """A model, constraint or setting the planner cannot honour: one line naming the table or setting."""

    def __init__(self, message: str, error_type: PlannerErrorType = PlannerErrorType.OTHER) -> None:
        super().__init__(message, error_type)

    def __reduce__(self) -> tuple[type[PlannerError], tuple[str, PlannerErrorType]]:
        # collective_plan sends it to every rank: its error_type travels with it
        return (type(self), (str(self), self.error_type))
