"""TorchRec's search space in shardwise's terms: the enumerator's sharding options, one table at a time, as the
tables of a shardwise task with the plan space its sharders and constraints allow; and back: a shardwise plan as
one enumerated option per table, its shards on the plan's ranks.

The options TorchRec's `EmbeddingEnumerator` yields are exactly what the sharders offer and the constraints allow
(sharding types, compute kernels, `min_partition`, pooling factors, batch sizes, fused parameters). A table is
searched by shardwise where its options include table-wise or column-wise sharding on fbgemm's fused kernel (the
kernel the cost model measured); row-wise (fused) and data-parallel (dense) options widen its plan space. Every other
table (other kernels: UVM, key-value and virtual tables; other sharding types) keeps one of its own options, chosen as
TorchRec's greedy proposer chooses, priced by TorchRec's estimator and placed by TorchRec's partitioner.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from pydantic import ValidationError
from torchrec.distributed.planner.types import (
    Enumerator,
    Perf,
    PlannerErrorType,
    Shard,
    ShardingOption,
    Topology,
)

from shardwise.search import Plan
from shardwise.search import Shard as PlanShard
from shardwise.workload import Optimizer, ShardingTask, TableSpec, WeightsPrecision

from .errors import PlannerError

#: the kernel shardwise's cost model measured (fbgemm's fused table-batched kernel); data-parallel runs the dense one
FUSED = "fused"
DENSE = "dense"
#: (sharding type, compute kernel) pairs shardwise searches and prices
SEARCHED = {("table_wise", FUSED): "table_wise", ("column_wise", FUSED): "column_wise",
            ("row_wise", FUSED): "row_wise", ("data_parallel", DENSE): "data_parallel"}


@dataclass
class SpaceTable:
    """One embedding table of the search space: its options, and its shardwise form where shardwise searches it."""

    fqn: str  #: TorchRec's name for it: the collection's module path and the table's name
    name: str  #: its name in the collection (what constraints and the plan key on)
    key: str  #: its name in the shardwise task: `name`, or `fqn` where two collections share a name
    rows: int
    dim: int
    options: list[ShardingOption]
    #: the table as the cost model prices it (None: shardwise cannot describe it, `why`)
    priced: TableSpec | None = None
    #: the table with the plan space its options allow, where shardwise searches it (None: outside, `why`)
    spec: TableSpec | None = None
    why: str = ""

    def option(self, sharding_type: str) -> ShardingOption:
        """This table's enumerated option of `sharding_type` on the kernel shardwise plans it with."""
        return next(o for o in self.options if SEARCHED.get((o.sharding_type, o.compute_kernel)) == sharding_type)

    def kept_option(self) -> ShardingOption:
        """The option a table outside the search keeps: row-wise or data-parallel where offered (they lie on every
        rank, as shardwise prices them), else the one TorchRec's greedy proposer tries first."""
        for wanted in ("row_wise", "data_parallel"):
            if any(SEARCHED.get((o.sharding_type, o.compute_kernel)) == wanted for o in self.options):
                return self.option(wanted)
        return min(self.options, key=_greedy_score)


class PlanSpace:
    """The tables of a TorchRec search space, and the shardwise task of those shardwise searches."""

    def __init__(self, search_space: Sequence[ShardingOption], *, constraints: Mapping[str, Any] | None,
                 known: ShardingTask | None, optimizer: Optimizer, weights_precision: WeightsPrecision,
                 world_size: int) -> None:
        self.world_size = world_size
        self.optimizer: Optimizer = optimizer
        self.weights_precision: WeightsPrecision = weights_precision
        by_fqn: dict[str, list[ShardingOption]] = {}
        for option in search_space:
            by_fqn.setdefault(option.fqn, []).append(option)
        names = [options[0].name for options in by_fqn.values()]
        given = {t.name: t for t in known.tables} if known is not None else {}
        self.tables: list[SpaceTable] = []
        for fqn, options in by_fqn.items():
            first = options[0]
            key = first.name if names.count(first.name) == 1 else fqn
            rows, dim = int(first.tensor.shape[0]), int(first.tensor.shape[1])
            table = SpaceTable(fqn=fqn, name=first.name, key=key, rows=rows, dim=dim, options=options)
            try:
                table.priced = self._described(table, first, given.get(key))
            except ValidationError as err:
                reason = err.errors()[0]
                table.why = f"{'.'.join(str(p) for p in reason['loc'])} {reason['input']!r}: {reason['msg']}"
            types = {SEARCHED[pair] for o in options if (pair := (o.sharding_type, o.compute_kernel)) in SEARCHED}
            if table.priced is not None and not types & {"table_wise", "column_wise"}:
                table.why = "no table-wise or column-wise option on the fused kernel"
            elif table.priced is not None:
                min_partition = getattr((constraints or {}).get(first.name), "min_partition", None)
                table.spec = table.priced.model_copy(
                    update={"sharding_types": tuple(sorted(types)), "min_partition": min_partition})
            self.tables.append(table)
        #: the global batch: samples per rank (TorchRec's `batch_size`) over every rank, or a given task's own
        batch = max(o.batch_size for o in search_space) * world_size
        self.batch_size = known.batch_size if known is not None and known.num_devices == world_size else batch

    @staticmethod
    def _described(table: SpaceTable, option: ShardingOption, given: TableSpec | None) -> TableSpec:
        """The table as shardwise describes it: a given task's description (its access skew), else the option's
        lookups per sample (TorchRec's pooling factors, summed over the features the table serves)."""
        if given is not None:
            if (given.rows, given.dim) != (table.rows, table.dim):
                raise PlannerError(f"table {table.key!r}: the module has {table.rows} rows x dim {table.dim}, the "
                                   f"task says {given.rows} x {given.dim}", PlannerErrorType.INPUT_VALIDATION)
            return given.model_copy(update={"name": table.key})
        pooling = float(sum(option.input_lengths)) if option.input_lengths else 1.0
        return TableSpec.model_validate({"name": table.key, "rows": table.rows, "dim": table.dim,
                                         "pooling_factor": pooling})

    @property
    def searched(self) -> list[SpaceTable]:
        return [t for t in self.tables if t.spec is not None]

    @property
    def described(self) -> list[TableSpec]:
        """Every table shardwise can describe, as the cost model prices it (`ShardwiseSearch.defers` asks of them)."""
        return [t.priced for t in self.tables if t.priced is not None]

    @property
    def kept(self) -> list[SpaceTable]:
        return [t for t in self.tables if t.spec is None]

    def task(self, device_memory_bytes: int) -> ShardingTask:
        """The shardwise task of the searched tables, each rank holding `device_memory_bytes` for them."""
        return ShardingTask(num_devices=self.world_size, device_memory_bytes=max(device_memory_bytes, 1),
                            batch_size=self.batch_size, tables=tuple(t.spec for t in self.searched if t.spec),
                            optimizer=self.optimizer, weights_precision=self.weights_precision)

    def kept_bytes(self, tier: str) -> int:
        """What the tables outside the search take of each rank's `tier` ("hbm" or "ddr") at most: row-wise and
        data-parallel shards lie on every rank, others spread over the ranks."""
        reserved = 0
        for table in self.kept:
            shards = table.kept_option().shards
            sizes = [getattr(s.storage, tier) for s in shards if s.storage is not None]
            if not sizes:
                continue
            uniform = len(shards) == self.world_size
            reserved += max(sizes) if uniform else math.ceil(sum(sizes) / self.world_size) + max(sizes)
        return reserved

    # -- a shardwise plan as TorchRec's options, and back --------------------------------------------------------
    def proposal(self, plan: Plan, enumerator: Enumerator | None) -> list[ShardingOption]:
        """One option per table: the searched tables' options with `plan`'s shards on `plan`'s ranks (column slices
        re-estimated by the enumerator's estimators), the others' kept options with no rank (the partitioner places
        them)."""
        shards: dict[str, list[PlanShard]] = {}
        for s in plan.shards:
            shards.setdefault(s.table, []).append(s)
        proposal: list[ShardingOption] = []
        for table in self.tables:
            if table.spec is None:
                proposal.append(copy.deepcopy(table.kept_option()))
                continue
            if table.key in plan.data_parallel or table.key in plan.row_wise:
                option = copy.deepcopy(table.option("data_parallel" if table.key in plan.data_parallel else "row_wise"))
                for rank, shard in enumerate(option.shards):
                    shard.rank = rank
                proposal.append(option)
                continue
            mine = sorted(shards[table.key], key=lambda s: s.col_offset)
            if len(mine) == 1 and "table_wise" in (table.spec.sharding_types or ("table_wise",)):
                option = copy.deepcopy(table.option("table_wise"))
                option.shards[0].rank = mine[0].device
            else:  # column slices (a single one where only column-wise is allowed)
                option = copy.deepcopy(next(
                    (o for o in table.options if SEARCHED.get((o.sharding_type, o.compute_kernel)) == "column_wise"
                     and [s.size[1] for s in o.shards] == [s.dim for s in mine]), None) or table.option("column_wise"))
                if [s.size[1] for s in option.shards] != [s.dim for s in mine]:  # an enumerator without these slices
                    option.shards = [Shard(size=[table.rows, s.dim], offset=[0, s.col_offset]) for s in mine]
                    if enumerator is not None:
                        enumerator.populate_estimates([option])  # their storage and perf, by TorchRec's estimators
                for shard, placed in zip(option.shards, mine, strict=True):
                    shard.rank = placed.device
            proposal.append(option)
        return proposal

    def priced(self, options: Sequence[ShardingOption], kinds: frozenset[str]
               ) -> tuple[Plan, ShardingTask | None, list[float], list[str]]:
        """A placed proposal as what the cost model prices (a shardwise plan of its shards of the sharding `kinds` it
        has measured, on the fused and dense kernels, and its task), the ms TorchRec's estimator gives each rank for
        the rest, and the tables so priced."""
        tables = {t.fqn: t for t in self.tables}
        shards: list[PlanShard] = []
        replicated: list[str] = []
        by_rows: list[str] = []
        specs: list[TableSpec] = []
        unpriced: list[ShardingOption] = []
        by_torchrec: list[str] = []
        for option in options:
            table = tables[option.fqn]
            kind = SEARCHED.get((option.sharding_type, option.compute_kernel))
            if table.priced is None or kind not in kinds:
                by_torchrec.append(f"{table.key} ({option.sharding_type}, {option.compute_kernel})")
                unpriced.append(option)
                continue
            specs.append(table.priced)
            if kind == "data_parallel":
                replicated.append(table.key)
            elif kind == "row_wise":
                by_rows.append(table.key)
            else:
                shards += [PlanShard(table=table.key, col_offset=s.offset[1], dim=s.size[1], device=s.rank or 0)
                           for s in option.shards]
        plan = Plan(num_devices=self.world_size, shards=tuple(shards), data_parallel=tuple(replicated),
                    row_wise=tuple(by_rows), method="proposal")
        task = ShardingTask(num_devices=self.world_size, device_memory_bytes=2**49, batch_size=self.batch_size,
                            tables=tuple(specs), optimizer=self.optimizer,
                            weights_precision=self.weights_precision) if specs else None
        return plan, task, torchrec_ms(unpriced, self.world_size), by_torchrec


def torchrec_ms(options: Sequence[ShardingOption], world_size: int) -> list[float]:
    """Each rank's ms by TorchRec's estimator for the placed shards of `options`."""
    ms = [0.0] * world_size
    for option in options:
        for shard in option.shards:
            if shard.rank is not None and shard.perf is not None:
                ms[shard.rank] += shard.perf.total
    return ms


def _greedy_score(option: ShardingOption) -> float:
    """An option's score as TorchRec's greedy proposer orders them (its depth): its slowest shard's estimated ms."""
    return max(cast(Perf, shard.perf).total for shard in option.shards)


def device_tier(topology: Topology) -> str:
    """Where a rank's tables live in TorchRec's accounting: HBM on GPUs, DDR on a CPU topology (no HBM there)."""
    return "ddr" if topology.compute_device == "cpu" else "hbm"


def rank_capacity(topology: Topology, tier: str) -> int:
    """The smallest rank's `tier` storage in `topology` (after TorchRec's storage reservation, where it is the
    planner's storage constraint)."""
    return int(min(getattr(d.storage, tier) for d in topology.devices))
