"""How the drop-in makes a shardwise plan for the tables it searches: the cost model (given, or this hardware's
champion), the search, the model adapted on this machine and the search run again where that pays, and the plan
refined on this machine's kernels after adaptation ran. By default, tables the cost model has not learned are left
to TorchRec's planner (`ShardwiseSearch.defers`): its plan in its time, and one line saying how to get a learned one.

`ShardwiseSearch` is the one object shardwise's TorchRec stages share, each given it at construction (the proposer,
the perf model, the stats): the topology and what describes the tables (constraints, a shardwise task, the optimizer),
and, for the plan under way, its plan space (`load`) and the search's task, plan or why it found none."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardwise.costmodel.model import NeuralCostModel
from shardwise.costmodel.types import CostModel, KnowsItsTraining
from shardwise.errors import ServiceError, ShardwiseError
from shardwise.profiling import MeasurementSettings, hardware_kind
from shardwise.search import Plan, PlanError, Searcher, get_method, make_searcher
from shardwise.search.simulator import ShardCostCache
from shardwise.workload import Optimizer, ShardingTask, TableSpec, WeightsPrecision

from ..mlflow import MlflowService, champion_uri, cost_model_name
from .errors import PlannerError
from .space import PlanSpace

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import ShardingOption, Topology

    from shardwise.evaluation.adapt import AdaptRecord
    from shardwise.evaluation.refine import Refinement

log = logging.getLogger("shardwise.torchrec")

#: seconds of adaptation where `refine` is given and `adapt` is not, where it pays (`ShardwiseSearch._adapts`) and
#: this machine is the model's hardware (record `torchrec_dropin`: the MLPerf DLRM-DCNv2 tables time within it on 2
#: CPU cores)
DEFAULT_ADAPT_S = 120.0
#: seconds of refinement where `adapt` is given and `refine` is not, after adaptation ran (its plans are measured
#: here, so they can be refined on the same kernels and all-to-alls)
DEFAULT_REFINE_S = 50.0
#: the way to a learned plan, said where the drop-in returns TorchRec's planner's plan: adapting and refining by
#: default took 176 s for TorchRec's plan, mostly, where TorchRec's planner takes 0.3 s (record `torchrec_dropin`)
LEARNED_PLAN_HOWTO = (
    "for a learned plan, have the cost model learn these tables: export them and the model (export_tables, "
    "export_task) and run `shardwise pipeline run --local --workload-tables TABLES --production-tasks TASK`, or "
    "pass adapt=SECONDS or refine=SECONDS to measure them on this machine while planning")
#: by default adaptation runs where the plan's predicted slowest rank is this many times a lone table's fixed cost
#: (`OVERHEAD_TABLE`) or more: TorchRec's planner tests' few small tables lie under it, the MLPerf DLRM-DCNv2 tables
#: far above
ADAPT_MIN_OVERHEADS = 10.0
#: the cheapest table a kernel runs: what one call costs whatever its tables
OVERHEAD_TABLE = TableSpec(name="overhead", rows=1000, dim=4, pooling_factor=1.0)
#: refinement's rounds at most (its time budget ends it first)
REFINE_ROUNDS = 20
#: interleaved kernel timings per device shard while refining: 3, as `make run`'s evaluate step, so that the
#: side-by-side measurement of the starts fits the budget (record `torchrec_dropin`)
REFINE_TIMING_ROUNDS = 3


@dataclass
class ShardwiseSearch:
    """A shardwise search method with its cost model, adaptation and refinement for the ranks of `topology`:
    `plan(task)`; `defers(tables)` says where TorchRec's planner plans instead. The stages given it share the plan
    under way through it (`load`, `space_of`, `last_task`, `last_plan`, `last_error`)."""

    topology: Topology
    method: str = "neuroshard"
    searcher: Searcher | None = None
    cost_model: CostModel | str | Path | None = None
    tracking_uri: str | None = None
    seed: int = 0
    #: where adaptation and refinement time kernels, and whose champion is the default cost model ("": the
    #: topology's compute device)
    device_type: str = ""
    #: TorchRec's `ParameterConstraints` by table name, as the planner is given them (their `min_partition`)
    constraints: dict[str, Any] | None = None
    #: a shardwise task whose tables (matched by name) give measured access skew and pooling factors
    task: ShardingTask | None = None
    optimizer: Optimizer = "rowwise_adagrad"
    weights_precision: WeightsPrecision = "fp32"
    #: seconds to adapt the cost model on this machine (None: where it pays, `_adapts`, if `refine` is given, else
    #: never: `defers`; 0: never)
    adapt: float | None = None
    adapt_dataset: str | Path | None = None
    #: seconds to refine the searched plan on this machine (None: after adaptation ran, 0: never)
    refine: float | None = None
    #: what adaptation and refinement did for the last plan (None: they did not run)
    last_adaptation: AdaptRecord | None = None
    last_refinement: Refinement | None = None
    #: seconds the last plan's search, adaptation and refinement took
    last_seconds: dict[str, float] = field(default_factory=dict)
    #: the plan under way's search space in shardwise's terms (`load`; None: no proposals ran)
    space: PlanSpace | None = None
    #: the shardwise task and plan of the last search, and why the last plan has none (None: it has)
    last_task: ShardingTask | None = None
    last_plan: Plan | None = None
    #: the last plan as the search made it, before refinement (the same as `last_plan` where none ran)
    last_searched: Plan | None = None
    last_error: str | None = None
    _adapted_to: set[frozenset[TableSpec]] = field(default_factory=set)
    _defers: dict[frozenset[TableSpec], str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.refine is not None and not (0.0 <= self.refine < math.inf):
            raise PlannerError(f"refine {self.refine}: seconds of refinement, >= 0 (0: off; None: "
                               f"{DEFAULT_REFINE_S:g} s after adaptation ran)")
        if self.adapt is not None and not (0.0 <= self.adapt < math.inf):
            raise PlannerError(f"adapt {self.adapt}: seconds of adaptation, >= 0 (0: off; None: off, or with "
                               f"refine= given {DEFAULT_ADAPT_S:g} s where the tables lie outside the cost model's "
                               "training, the step is well above the kernels' overhead and this machine is the "
                               "model's hardware)")
        self.searcher = self.searcher or make_searcher(self.method)
        self.device_type = self.device_type or self.topology.compute_device
        if self.task is not None:  # the task states how its tables are trained and stored
            self.optimizer, self.weights_precision = self.task.optimizer, self.task.weights_precision

    # -- the plan under way, shared by the stages ----------------------------------------------------------------
    def load(self, search_space: Sequence[ShardingOption] | None) -> PlanSpace | None:
        """Start a plan from `search_space` (the enumerator's options; None: no proposals run, where a plan loader's
        plan is taken): its plan space, and nothing of the last plan's search."""
        self.forget()
        self.last_task = self.last_plan = self.last_searched = self.last_error = None
        self.space = None if search_space is None else self._space(search_space)
        return self.space

    def space_of(self, options: Sequence[ShardingOption]) -> PlanSpace:
        """The plan space `options` lie in: the loaded one, else (a plan no `load` began) one of their own."""
        if self.space is not None and {o.fqn for o in options} <= {t.fqn for t in self.space.tables}:
            return self.space
        return self._space(options)

    def _space(self, options: Sequence[ShardingOption]) -> PlanSpace:
        return PlanSpace(options, constraints=self.constraints, known=self.task, optimizer=self.optimizer,
                         weights_precision=self.weights_precision, world_size=self.topology.world_size)

    def resolved_cost_model(self) -> CostModel | None:
        """The cost model to plan with: the one given, loaded from a directory or URI, else the champion."""
        if self.cost_model is not None and not isinstance(self.cost_model, str | Path):
            return self.cost_model
        if self.cost_model is None and not get_method(self.method).needs_cost_model:
            return None
        service = MlflowService(self.tracking_uri)
        try:
            uri = str(self.cost_model) if self.cost_model is not None else champion_uri(
                cost_model_name(hardware_kind(self.device_type)))
        except ValueError as err:  # a GPU topology planned where there is none: whose champion is unknown here
            raise PlannerError(f"ShardwisePlanner: no cost model given, and the champion for this {self.device_type} "
                               f"topology is this machine's hardware's ({err}); pass cost_model= (a models:/ URI or a "
                               "directory) for the devices you plan for") from None
        try:
            model = service.load_cost_model(uri)
        except ServiceError as err:  # the registry is down or refused: its own line says which
            raise PlannerError(str(err)) from None
        except (ShardwiseError, ValueError, OSError) as err:  # RegistryError, ModelFileError, a damaged file
            raise PlannerError(
                f"ShardwisePlanner: no cost model at {uri} ({err}); make one with `make run` or `shardwise pretrain`,"
                " or pass cost_model=DIR or a models:/ URI"
            ) from None
        self.cost_model = model  # loaded once per planner
        return model

    def defers(self, tables: Sequence[TableSpec]) -> str | None:
        """Why TorchRec's planner plans `tables` instead of this search (None: the search plans them): by default
        (neither `adapt` nor `refine` given) where the cost model has not learned them, its line saying which lie
        outside its training and how far. Its plan of them would be extrapolated; TorchRec's is TorchRec's, in
        TorchRec's time."""
        if self.adapt is not None or self.refine is not None or not tables:
            return None
        key = frozenset(tables)
        if key not in self._defers:
            model = self.resolved_cost_model()
            self._defers[key] = model.outside_training(tables, model.batch_size) if (
                model is not None and isinstance(model, KnowsItsTraining)) else None
        return self._defers[key]

    def forget(self) -> None:
        """Clear what the last plan's adaptation and refinement did and how long each stage took."""
        self.last_seconds = {}
        self.last_adaptation = None
        self.last_refinement = None

    def plan(self, task: ShardingTask) -> Plan:
        """The searched plan of `task` (PlanError where the search finds none): searched, adapted for and searched
        again where that pays, refined after adaptation; kept as `last_task` and `last_plan` (`last_error`)."""
        self.forget()
        self.last_task, self.last_plan, self.last_searched, self.last_error = task, None, None, None
        model = self.resolved_cost_model()
        try:
            plan = self._searched(task, model)
            if model is not None and self._adapts(task, model, plan):
                adapted = self._adapted_cost_model(task, model)
                if adapted is not model:
                    model, plan = adapted, self._searched(task, adapted)
        except PlanError as err:
            self.last_error = str(err)
            raise
        self.last_searched = plan
        self.last_plan = self._refined(task, plan, model)
        return self.last_plan

    def _searched(self, task: ShardingTask, model: CostModel | None) -> Plan:
        assert self.searcher is not None  # set in __post_init__
        started = time.perf_counter()
        plan = self.searcher.search(task, model, self.seed)
        self.last_seconds["search"] = self.last_seconds.get("search", 0.0) + time.perf_counter() - started
        return plan

    def _adapts(self, task: ShardingTask, model: CostModel | None, plan: Plan) -> bool:
        """Whether to adapt before planning `task`: asked to (`adapt` seconds), or, with `refine` given, where it pays:
        the tables lie outside the model's training, on 2 ranks or more, and the plan's predicted slowest rank is
        `ADAPT_MIN_OVERHEADS` times a lone table's fixed cost or more (below it, the step is the kernels' overhead
        whatever the plan, and minutes of measuring cannot pay back)."""
        if self.adapt is not None or self.refine is None or model is None:  # no refine=: `defers` decides
            return bool(self.adapt) and model is not None
        if task.num_devices == 1 or frozenset(task.tables) in self._adapted_to or not (
                isinstance(model, KnowsItsTraining) and model.outside_training(task.tables, model.batch_size)):
            return False
        predicted = float(plan.extra.get("predicted", {}).get("max_cost_ms", 0.0))
        overhead = float(ShardCostCache(model).compute_ms([[OVERHEAD_TABLE]]).sum())
        return predicted >= ADAPT_MIN_OVERHEADS * overhead

    def _adapted_cost_model(self, task: ShardingTask, model: CostModel) -> CostModel:
        """`model` adapted on this machine to `task`'s tables (for `adapt` seconds, or `DEFAULT_ADAPT_S`); `model` where
        this machine is not its hardware and adaptation was not asked for."""
        # the measuring stack (fbgemm's kernels, the cost dataset, training) loads only where adaptation may run
        from shardwise.evaluation.adapt import AdaptError, adapt_cost_model, cannot_adapt_here

        reason = cannot_adapt_here(model, self.device_type)
        if reason and self.adapt is None:
            log.info("ShardwisePlanner: not adapting (%s)", reason)
            return model
        if reason:
            raise PlannerError(f"ShardwisePlanner(adapt={self.adapt:g}): {reason}")
        assert isinstance(model, NeuralCostModel)  # cannot_adapt_here refuses the others
        started = time.perf_counter()
        try:
            adapted, self.last_adaptation = adapt_cost_model(
                task, model, self.adapt or DEFAULT_ADAPT_S, seed=self.seed,
                measurement=MeasurementSettings(device=self.device_type), dataset=self.adapt_dataset)
        except AdaptError as err:
            raise PlannerError(f"ShardwisePlanner: {err}") from None
        self.last_seconds["adaptation"] = time.perf_counter() - started
        self.cost_model = adapted  # the next plan of these tables needs no adaptation
        self._adapted_to.add(frozenset(task.tables))  # nor where fine-tuning did not help: it would not again
        return adapted

    def _refined(self, task: ShardingTask, plan: Plan, model: CostModel | None) -> Plan:
        """`plan` refined on this machine's kernels and all-to-alls for `refine` seconds (by default, where adaptation
        ran: its plans are measured here), from the fastest of it, the greedy on measured single-table costs and
        TorchRec's planner's plan of the same task, measured side by side."""
        budget = self.refine if self.refine is not None else DEFAULT_REFINE_S if self.last_adaptation else 0.0
        self.last_refinement = None
        if not budget or model is None:
            return plan
        # the measuring stack loads only where refinement runs
        from shardwise.evaluation.adapt import cannot_adapt_here
        from shardwise.evaluation.refine import measured_greedy_start, refine_plan, search_resplit

        reason = cannot_adapt_here(model, self.device_type)  # the same condition: this machine is the model's hardware
        if reason:
            raise PlannerError(f"ShardwisePlanner(refine={budget:g}): {reason.replace('adaptation', 'refinement')}")
        started = time.perf_counter()
        measurement = MeasurementSettings(device=self.device_type, timing_rounds=REFINE_TIMING_ROUNDS).for_cost_model(
            getattr(model, "reference_ms", None), model.batch_size)
        starts = measured_greedy_start(task, measurement)
        # TorchRec's planner's plan of the same task: refinement never returns one measured slower than it (none
        # where it finds no plan within this memory: its estimate counts more than shardwise's)
        with contextlib.suppress(PlanError):
            starts.append(make_searcher("torchrec").search(task, None, self.seed))
        assert self.searcher is not None  # set in __post_init__
        refined, self.last_refinement = refine_plan(
            task, plan, model, measurement, rounds=REFINE_ROUNDS, starts=starts, progress=False,
            time_budget_s=max(budget - (time.perf_counter() - started), 1.0),
            resplit=search_resplit(self.searcher, task, model, self.seed))
        self.last_seconds["refinement"] = time.perf_counter() - started
        return refined
