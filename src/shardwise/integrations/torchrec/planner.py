"""`ShardwisePlanner`: TorchRec's `EmbeddingShardingPlanner` with shardwise's stages in it.

TorchRec's planner runs as it always does: its storage reservation, its plan loader, context hash, validation and
its `PlannerError` where nothing fits. shardwise's stages go through TorchRec's constructor, each made with what it
needs and the proposer, perf model and stats with one shared `ShardwiseSearch`: an enumerator that adds the column
splits the search lays out (`ShardwiseEnumerator`), a proposer whose plan comes from a shardwise search on the
learned cost model (`ShardwiseProposer`), a partitioner that keeps the ranks that search gave (`PlacedPartitioner`),
a perf model that rates plans by the cost model (`ShardwisePerfModel`) and stats that say what was done
(`ShardwiseStats`). Tables the cost model has not learned get TorchRec's planner's own plan, unless `adapt=` or
`refine=` asks to measure them here (`ShardwiseSearch.defers`).
"""

from __future__ import annotations

import logging
import math
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.comm import get_local_size, get_topology_domain_multiple
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    Enumerator,
    Partitioner,
    PerfModel,
    PlanLoader,
    PlannerErrorType,
    Proposer,
    ShardingOption,
    Stats,
    StorageReservation,
    Topology,
)
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import ShardingPlan
from torchrec.distributed.utils import get_device_type

from shardwise.costmodel.types import CostModel
from shardwise.search import Plan, Searcher
from shardwise.workload import Optimizer, ShardingTask

from .enumerator import ShardwiseEnumerator
from .errors import PlannerError, TorchRecPlannerError
from .partitioner import PlacedPartitioner
from .perf_model import ShardwisePerfModel
from .plan_loader import MlflowPlanLoader
from .proposer import ShardwiseProposer
from .search import ShardwiseSearch
from .stats import ShardwiseStats

if TYPE_CHECKING:
    from shardwise.evaluation.adapt import AdaptRecord
    from shardwise.evaluation.refine import Refinement

log = logging.getLogger("shardwise.torchrec")


class ShardwisePlanner(EmbeddingShardingPlanner):
    """TorchRec's `EmbeddingShardingPlanner`, its plans searched by shardwise on a learned cost model.

    Takes every argument TorchRec's planner takes, with the same defaults (`batch_size` 512 per rank, TorchRec's
    storage reservation, its enumerator, stats and plan loader); a `proposer`, `partitioner` or `performance_model`
    given replaces shardwise's. shardwise's own, by keyword: `method` (a registered search method) or `searcher`;
    `cost_model` (an object, a directory or a models:/ URI; default this hardware's champion in the MLflow registry
    at `tracking_uri`); `task`, a shardwise task whose tables give access skew (and, without a topology, the
    devices and their budget); `adapt` and `refine` (seconds on this machine: `ShardwiseSearch`; without either,
    tables the cost model has not learned get TorchRec's planner's plan); `optimizer`; and without a topology,
    `world_size`, `local_world_size`, `device_memory_bytes`, `device_type` to make one."""

    def __init__(
        self,
        topology: Topology | None = None,
        batch_size: int | None = None,
        enumerator: Enumerator | None = None,
        storage_reservation: StorageReservation | float | None = None,
        proposer: Proposer | list[Proposer] | None = None,
        partitioner: Partitioner | None = None,
        performance_model: PerfModel | None = None,
        stats: Stats | list[Stats] | None = None,
        constraints: dict[str, Any] | None = None,
        debug: bool = True,
        callbacks: list[Any] | None = None,
        timeout_seconds: int | None = None,
        plan_loader: PlanLoader | None = None,
        *,
        method: str = "neuroshard",
        searcher: Searcher | None = None,
        cost_model: CostModel | str | Path | None = None,
        tracking_uri: str | None = None,
        task: ShardingTask | None = None,
        optimizer: Optimizer = "rowwise_adagrad",
        seed: int = 0,
        adapt: float | None = None,
        adapt_dataset: str | Path | None = None,
        refine: float | None = None,
        world_size: int | None = None,
        local_world_size: int | None = None,
        device_memory_bytes: int | None = None,
        device_type: str | None = None,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise PlannerError(f"batch_size {batch_size}: samples per rank, >= 1", PlannerErrorType.INPUT_VALIDATION)
        # a task's own budget is each rank's memory as it states it, where no topology or memory overrides it
        budget_from_task = topology is None and task is not None and device_memory_bytes is None
        if topology is None and (task is not None or world_size is not None):
            topology = _topology(task, world_size, local_world_size, device_memory_bytes, device_type)
        if topology is None and not dist.is_initialized():
            raise PlannerError("ShardwisePlanner needs a topology (a TorchRec Topology, or world_size= and "
                               "device_memory_bytes=, or a shardwise task=), or an initialised process group to take "
                               "one from, as TorchRec's planner does", PlannerErrorType.INPUT_VALIDATION)
        if task is not None and batch_size is None:
            batch_size = math.ceil(task.batch_size / task.num_devices)  # a task's batch is the step's, over the ranks
        if isinstance(storage_reservation, int | float):
            if not 0.0 <= storage_reservation < 1.0:
                raise PlannerError(f"storage_reservation {storage_reservation}: a share of memory in [0, 1), or a "
                                   "TorchRec StorageReservation", PlannerErrorType.INPUT_VALIDATION)
            storage_reservation = FixedPercentageStorageReservation(float(storage_reservation))
        elif storage_reservation is None and budget_from_task:
            storage_reservation = FixedPercentageStorageReservation(0.0)  # a task states its budget already
        if topology is None:  # as TorchRec's planner takes it, so that shardwise's stages are made with it
            topology = _process_group_topology()
        batch_size = batch_size or BATCH_SIZE
        self.search = ShardwiseSearch(
            topology, method=method, searcher=searcher, cost_model=cost_model, tracking_uri=tracking_uri, seed=seed,
            constraints=constraints, task=task, optimizer=optimizer, adapt=adapt, adapt_dataset=adapt_dataset,
            refine=refine)
        # TorchRec's enumerator, with the column splits shardwise's search lays out
        enumerator = enumerator or ShardwiseEnumerator(topology=topology, batch_size=batch_size, constraints=constraints)
        if isinstance(plan_loader, MlflowPlanLoader) and plan_loader.enumerator is None:
            plan_loader.enumerator = enumerator  # so that a registered plan for other inputs names what changed
        self.shardwise_stats = ShardwiseStats(self.search, plan_loader)
        #: the enumerator TorchRec's planner enumerates with (TorchRec keeps its own reference private)
        self.enumerator: Enumerator = enumerator
        #: the last plan's sharding options, as TorchRec's planner chose them (after the callbacks given; None
        #: before a plan), kept by the last callback: TorchRec keeps its own private
        self.last_best_plan: list[ShardingOption] | None = None
        super().__init__(topology=topology, batch_size=batch_size, enumerator=enumerator,
                         storage_reservation=storage_reservation, constraints=constraints, debug=debug,
                         callbacks=[*(callbacks or []), self._keep_best_plan], timeout_seconds=timeout_seconds,
                         plan_loader=plan_loader,
                         proposer=proposer or ShardwiseProposer(self.search),
                         partitioner=partitioner or PlacedPartitioner(),
                         performance_model=performance_model or ShardwisePerfModel(self.search),
                         stats=self.shardwise_stats if stats is None else stats)

    # -- what the last plan was made of ------------------------------------------------------------------------
    @property
    def last_plan(self) -> Plan | None:
        """The shardwise plan the last search made (None where it found none, or where TorchRec's planner planned)."""
        return self.search.last_plan

    @property
    def last_task(self) -> ShardingTask | None:
        """The shardwise task of the tables the last search placed (None where no search ran)."""
        return self.search.last_task

    @property
    def last_stats(self) -> str | None:
        """shardwise's account of the last plan (`ShardwiseStats`)."""
        return self.shardwise_stats.last

    @property
    def last_adaptation(self) -> AdaptRecord | None:
        return self.search.last_adaptation

    @property
    def last_refinement(self) -> Refinement | None:
        return self.search.last_refinement

    def resolved_cost_model(self) -> CostModel | None:
        """The cost model the planner plans with (loaded on first use)."""
        return self.search.resolved_cost_model()

    def _keep_best_plan(self, best_plan: list[ShardingOption]) -> list[ShardingOption]:
        self.last_best_plan = best_plan
        return best_plan

    # -- TorchRec's interface ----------------------------------------------------------------------------------
    def plan(self, module: nn.Module, sharders: list[Any] | None = None) -> ShardingPlan:
        """TorchRec's planner's plan of `module` for `sharders` (TorchRec's default sharders where None); where none
        fits, TorchRec's error as shardwise's `PlannerError` in one line, with why shardwise's search found none."""
        self.search.load(None)  # the proposer loads the search space where proposals run: none where a plan is loaded
        self.last_best_plan = None
        if self.plan_loader is None:
            self.search.resolved_cost_model()  # a missing model is its own error, before any proposal is rated
        try:
            return super().plan(module, get_default_sharders() if sharders is None else sharders)
        except TorchRecPlannerError as err:
            if isinstance(err, PlannerError):
                raise
            log.info("%s", err)  # TorchRec's own account: storage, reservation and what to try
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            why = self.search.last_error or (lines[-1] if len(lines) > 1 else "")
            raise PlannerError(f"{lines[0].rstrip(' .')}{': ' + why if why else ''}", err.error_type) from None

    def collective_plan(self, module: nn.Module, sharders: list[Any] | None = None, pg: Any = None) -> ShardingPlan:
        """`plan` on rank 0, broadcast to every rank of `pg`; where rank 0 cannot plan, every rank raises its error
        (the others would otherwise wait on a broadcast that never comes)."""
        if not dist.is_initialized():
            return self.plan(module, sharders)
        group = pg if pg is not None else dist.group.WORLD
        assert group is not None  # initialised above
        failure: BaseException | None = None
        holder: list[Any] = [None]
        if dist.get_rank(group) == 0:
            try:
                holder[0] = self.plan(module, sharders)
            except Exception as err:  # noqa: BLE001 - sent to the other ranks, then raised here as it was
                failure = err
                holder[0] = _PlanFailure(_sendable(err))
        dist.broadcast_object_list(holder, src=dist.get_global_rank(group, 0), group=group)
        if failure is not None:
            raise failure
        if isinstance(holder[0], _PlanFailure):
            raise holder[0].error
        return holder[0]


def _process_group_topology() -> Topology:
    """The topology TorchRec's planner takes from the initialised process group where it is given none."""
    return Topology(local_world_size=get_local_size(), world_size=dist.get_world_size(),
                    compute_device=get_device_type(), pod_size=get_topology_domain_multiple())


def _topology(task: ShardingTask | None, world_size: int | None, local_world_size: int | None,
              device_memory_bytes: int | None, device_type: str | None) -> Topology:
    """A TorchRec topology from a shardwise task or the planner's keyword arguments: each rank's memory is HBM on
    GPUs and DDR on a CPU topology, as TorchRec's planner takes it."""
    device = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    ranks = world_size or (task.num_devices if task else 1)
    if local_world_size is None and os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():
        local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])  # torchrun's ranks per host
    memory = device_memory_bytes or (task.device_memory_bytes if task else None)
    caps = {"ddr_cap": memory} if device == "cpu" else {"hbm_cap": memory}
    types_logger = logging.getLogger("torchrec.distributed.planner.types")
    level = types_logger.level
    types_logger.setLevel(logging.ERROR)  # its advice to use the topology factory is for the planner's own callers
    try:
        return Topology(world_size=ranks, compute_device=device, local_world_size=local_world_size, **caps)
    finally:
        types_logger.setLevel(level)


@dataclass(frozen=True)
class _PlanFailure:
    """What rank 0 broadcasts in place of a plan when planning failed."""

    error: Exception


def _sendable(err: Exception) -> Exception:
    """`err` itself where it pickles (a PlannerError does), else a PlannerError with the same one line."""
    try:
        return pickle.loads(pickle.dumps(err))  # noqa: S301 - our own bytes, round-tripped to check they travel
    except Exception:  # noqa: BLE001 - any exception type, any reason it does not pickle
        return PlannerError(f"rank 0 could not plan: {type(err).__name__}: {err}")


__all__ = ["ShardwisePlanner"]
