"""TorchRec's `EmbeddingStats`, followed by what shardwise did for the plan: per rank its shards, storage and
predicted ms; which tables TorchRec's estimator priced and why; whether the plan is shardwise's or TorchRec's greedy
proposal; which tables run in host memory (their kernel and cache); what adaptation and refinement did and how long
each stage took."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from torchrec.distributed.planner.stats import EmbeddingStats
from torchrec.distributed.planner.types import PlanLoader, ShardingOption, Storage

from shardwise.costmodel.types import KnowsItsTraining
from shardwise.search.bottleneck import bottleneck_line, slowest_alone

from .errors import PlannerError
from .perf_model import RankCosts, ShardwisePerfModel
from .proposer import proposal_key
from .search import ShardwiseSearch
from .space import torchrec_ms

log = logging.getLogger("shardwise.torchrec")
GIB = 2**30


class ShardwiseStats(EmbeddingStats):
    """TorchRec's stats table, then shardwise's account of the best plan at INFO (its caveats at WARNING), kept in
    `last`: the plan under way as `search` holds it, priced by its cost model; `plan_loader` names a loaded plan."""

    def __init__(self, search: ShardwiseSearch, plan_loader: PlanLoader | None = None) -> None:
        super().__init__()
        self.search = search
        self.plan_loader = plan_loader
        self.perf_model = ShardwisePerfModel(search)  # its own: the planner's may be another
        #: the last plan's account (None before the first plan)
        self.last: str | None = None
        #: its caveats: what the cost model did not see or price
        self.notes: list[str] = []

    def log(self, sharding_plan: Any, topology: Any, batch_size: int, storage_reservation: Any, num_proposals: int,
            num_plans: int, run_time: float, best_plan: list[ShardingOption], *args: Any, **kwargs: Any) -> None:
        super().log(sharding_plan, topology, batch_size, storage_reservation, num_proposals, num_plans, run_time,
                    best_plan, *args, **kwargs)
        if not best_plan or any(s.rank is None or s.rank < 0 for o in best_plan for s in o.shards):
            return  # no plan: TorchRec's planner raises its PlannerError next
        search = self.search
        loaded = num_proposals == 0  # no proposal ran: TorchRec's planner took the plan loader's plan
        costs = self._loaded_costs(best_plan) if loaded else self.perf_model.costs(best_plan)
        space = None if loaded else search.space
        proposed = space is not None and {o.fqn for o in best_plan} <= {t.fqn for t in space.tables}
        deferred = proposed and space is not None and search.defers(space.described) is not None
        ours = proposed and space is not None and search.last_plan is not None and proposal_key(
            space.proposal(search.last_plan, None)) <= proposal_key(best_plan)
        loader = f" ({_plan_id(self.plan_loader)})" if self.plan_loader is not None else ""
        source = (f"loaded by the plan loader{loader}" if loaded else
                  "the planner's proposers' (no ShardwiseProposer among them)" if not proposed else
                  "TorchRec's planner's own (its proposers and estimates: the cost model has not learned these "
                  "tables), predicted ms by TorchRec's estimates" if deferred else
                  f"shardwise's {search.method} search" if ours else
                  "TorchRec's greedy proposal (shardwise's search found no plan that fits)"
                  if search.last_error or search.last_plan is None else
                  "TorchRec's greedy proposal (the cost model rates it at least as fast as the search's)")
        lines = [f"ShardwisePlanner: {len(best_plan)} tables on {topology.world_size} ranks ({topology.local_world_size}"
                 f" per host), batch {batch_size} per rank, {num_plans} of {num_proposals} proposals placed in "
                 f"{run_time:.2f} s; the plan: {source}",
                 f"{'rank':>5}  {'shards':>6}  {'HBM GiB':>9}  {'DDR GiB':>9}  {'predicted ms':>12}"]
        shards: Counter[int] = Counter()
        storage = [Storage(0, 0, 0) for _ in range(topology.world_size)]
        for option in best_plan:
            for shard in option.shards:
                shards[shard.rank] += 1
                if shard.storage is not None:
                    storage[shard.rank] = storage[shard.rank] + shard.storage
        for rank in range(topology.world_size):
            lines.append(f"{rank:>5}  {shards[rank]:>6}  {storage[rank].hbm / GIB:>9.3f}  {storage[rank].ddr / GIB:>9.3f}"
                         f"  {costs.ms[rank]:>12.3f}")
        kinds = Counter(f"{o.sharding_type} ({o.compute_kernel})" for o in best_plan)
        lines.append("sharding: " + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common()))
        alone = slowest_alone_line(best_plan, costs.ms)
        if alone:
            lines.append(alone)
        in_host = host_memory_line(best_plan)
        if in_host:
            lines.append(in_host)
        # where TorchRec's planner planned, the proposer's one warning says why and how to get a learned plan
        self.notes = [] if deferred else self._notes(best_plan, costs.by_torchrec, ours, proposed)
        lines += self.notes
        if search.last_adaptation is not None:
            lines.append(search.last_adaptation.line())
        if search.last_refinement is not None:
            lines.append(f"refined on this machine: {search.last_refinement.outcome()}")
        if search.last_seconds:
            lines.append("seconds: " + ", ".join(f"{stage} {s:.2f}" for stage, s in search.last_seconds.items()))
        self.last = "\n".join(lines)
        log.info("%s", self.last)
        for note in self.notes:
            log.warning("ShardwisePlanner: %s", note)

    def _loaded_costs(self, best_plan: list[ShardingOption]) -> RankCosts:
        """A loaded plan's predicted ms: the cost model's where one resolves (a training job loading its plan need
        not have one), else TorchRec's estimates."""
        try:
            return self.perf_model.costs(best_plan)
        except PlannerError:
            space = self.search.space_of(best_plan)
            return RankCosts(tuple(torchrec_ms(best_plan, space.world_size)), tuple(t.key for t in space.tables))

    def _notes(self, best_plan: list[ShardingOption], by_torchrec: tuple[str, ...], ours: bool,
               proposed: bool) -> list[str]:
        """What the plan's figures rest on beyond the cost model's measurements."""
        search = self.search
        space = search.space if proposed else None
        notes: list[str] = []
        if by_torchrec:
            notes.append(f"priced by TorchRec's estimator (the cost model has not measured them): "
                         f"{', '.join(by_torchrec)}")
        if space is not None and space.kept:
            notes.append("not searched by shardwise, their own option kept: "
                         + "; ".join(f"{t.key} ({t.why})" for t in space.kept))
        sequence = [o.name for o in best_plan if not o.is_pooled]
        if sequence:
            notes.append(f"sequence tables (EmbeddingCollection), costed as pooled lookups: {', '.join(sequence)}")
        if proposed and search.last_error and not ours:
            notes.append(f"shardwise's search found no plan: {search.last_error}")
        model = search.resolved_cost_model() if ours else None
        if isinstance(model, KnowsItsTraining) and search.last_task is not None:
            outside = model.outside_training(search.last_task.tables, model.batch_size)  # type: ignore[attr-defined]
            if outside:
                notes.append(outside)
        return notes


def _plan_id(loader: PlanLoader | None) -> str:
    get = getattr(loader, "get_plan_id", None)  # TorchRec's planner calls it too, though PlanLoader does not declare it
    return str(get()) if get is not None else type(loader).__name__


def slowest_alone_line(best_plan: list[ShardingOption], ms: Sequence[float]) -> str | None:
    """`search.bottleneck`'s line where the slowest rank holds one shard alone (data-parallel and row-wise tables,
    on every rank, not counted); None otherwise."""
    placed: list[list[str]] = [[] for _ in ms]
    for option in best_plan:
        if option.sharding_type in ("data_parallel", "row_wise"):
            continue
        for shard in option.shards:
            lo, width = shard.offset[1], shard.size[1]
            whole = width == option.tensor.shape[1]
            placed[shard.rank].append(option.name if whole else f"{option.name}[{lo}:{lo + width}]")
    found = slowest_alone(placed, ms)
    return bottleneck_line(found) if found else None


#: the cache TorchRec gives a "fused_uvm_caching" table whose option names no load factor (its UVM_CACHING_RATIO)
TORCHREC_CACHE_LOAD_FACTOR = 0.2


def host_memory_line(best_plan: list[ShardingOption]) -> str | None:
    """The tables a UVM kernel keeps in host memory, each with its kernel and, for "fused_uvm_caching", its cache's
    load factor and the rows it holds in HBM; None where every table is in HBM."""
    parts = []
    for option in best_plan:
        if option.compute_kernel == "fused_uvm":
            parts.append(f"{option.name} fused_uvm (no cache)")
        elif option.compute_kernel == "fused_uvm_caching":
            load_factor = option.cache_load_factor or TORCHREC_CACHE_LOAD_FACTOR
            rows = int(option.tensor.shape[0])
            parts.append(f"{option.name} fused_uvm_caching (cache_load_factor {load_factor:g}: "
                         f"{round(rows * load_factor)} of {rows} rows cached in HBM)")
    return "in host memory: " + ", ".join(parts) if parts else None
