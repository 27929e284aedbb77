"""A sharding plan: which column slice of which table sits on which device, which tables are replicated on every
device (data-parallel), which are split by rows over every device (row-wise) and which a UVM kernel keeps in host
memory; `shardwise.plan/v1` JSON IO."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shardwise.errors import ShardwiseError
from shardwise.plan_readers import PLAN_READERS, uri_scheme
from shardwise.workload import (
    ShardingTask,
    TableSpec,
    data_parallel_memory_bytes,
    local_batch,
    row_blocks,
    shard_host_memory_bytes,
    shard_memory_bytes,
)
from shardwise.workload.documents import (
    FiniteFloat,
    describe_validation_error,
    read_json_document,
    write_json_document,
)
from shardwise.workload.tables import DIM_ALIGNMENT, ComputeKernel, ShardingType

PLAN_FORMAT = "shardwise.plan/v1"


class PlanError(ShardwiseError, ValueError):
    """A plan that is malformed, invalid for its task, or over a device's memory."""


class HostMemoryError(PlanError):
    """A plan whose tables in host memory are over a device's `host_memory_bytes`."""


class Shard(BaseModel):
    """Columns [col_offset, col_offset + dim) of `table`, placed on `device`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    # strict: a plan file saying "dim": "16" or "device": true is wrong, not a number to guess at
    table: str = Field(strict=True)
    col_offset: int = Field(ge=0, strict=True)
    dim: int = Field(ge=1, strict=True)
    device: int = Field(ge=0, strict=True)

    def spec(self, table: TableSpec) -> TableSpec:
        """The column slice as a table of its own (whole tables keep their name)."""
        if self.col_offset == 0 and self.dim == table.dim:
            return table
        return table.with_dim(self.dim, name=f"{table.name}[{self.col_offset}:{self.col_offset + self.dim}]")


class TableKernel(BaseModel):
    """The kernel a plan gives one table, in TorchRec's words, and for "fused_uvm_caching" its cache's share of the
    table's rows (TorchRec's `CacheParams.load_factor`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kernel: ComputeKernel
    cache_load_factor: FiniteFloat | None = Field(default=None, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _cache_with_its_kernel(self) -> TableKernel:
        if (self.kernel == "fused_uvm_caching") != (self.cache_load_factor is not None):
            raise ValueError(f"kernel {self.kernel!r} with cache_load_factor {self.cache_load_factor}: a "
                             "cache_load_factor in (0, 1] goes with 'fused_uvm_caching' and only with it")
        return self

    def on(self, table: TableSpec) -> TableSpec:
        """`table` run by this kernel (`TableSpec.compute_kernel`, `cache_load_factor`)."""
        return table.on_kernel(self.kernel, self.cache_load_factor)


class Plan(BaseModel):
    """Shards over `num_devices` devices, the tables replicated on every device (`data_parallel`: each device
    looks up its own samples, the gradients are all-reduced) and the tables split by rows over every device
    (`row_wise`: blocks of ceil(rows / devices) as TorchRec lays them out, the pooled outputs reduce-scattered);
    `extra` holds method, predicted costs, memory, provenance."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    format: str = PLAN_FORMAT
    num_devices: int = Field(ge=1, strict=True)
    shards: tuple[Shard, ...]
    #: tables sharded data-parallel (no shard entries): a replica on every device
    data_parallel: tuple[str, ...] = ()
    #: tables sharded row-wise (no shard entries): a block of rows on every device
    row_wise: tuple[str, ...] = ()
    #: tables a UVM kernel keeps in host memory (each a TableKernel); a table not listed runs "fused", in HBM
    kernels: dict[str, TableKernel] = Field(default_factory=dict)
    method: str = "unknown"
    extra: dict[str, Any] = Field(default_factory=dict)

    def device_shards(self, device: int) -> list[Shard]:
        """The shards on `device`."""
        return [s for s in self.shards if s.device == device]

    def sharding_types(self) -> dict[str, str]:
        """Each table's sharding type in TorchRec's words: "table_wise", "column_wise", "data_parallel" or
        "row_wise"."""
        pieces: dict[str, int] = {}
        for s in self.shards:
            pieces[s.table] = pieces.get(s.table, 0) + 1
        types = {name: "table_wise" if n == 1 else "column_wise" for name, n in pieces.items()}
        return types | dict.fromkeys(self.data_parallel, "data_parallel") | dict.fromkeys(self.row_wise, "row_wise")

    def compute_kernel(self, table: str) -> str:
        """The kernel `table` runs, in TorchRec's words ("fused" where the plan lists none; data-parallel tables run
        "dense")."""
        if table in self.kernels:
            return self.kernels[table].kernel
        return "dense" if table in self.data_parallel else "fused"

    def to_json(self) -> dict[str, Any]:
        """The `shardwise.plan/v1` document (extra keys at the top level; `data_parallel`, `row_wise` and `kernels`
        only where there are any, so a plan all in HBM reads as before)."""
        empty = {key for key in ("data_parallel", "row_wise", "kernels") if not getattr(self, key)}
        doc = self.model_dump(mode="json", exclude={"extra"} | empty)
        for entry in doc.get("kernels", {}).values():
            if entry["cache_load_factor"] is None:
                del entry["cache_load_factor"]
        doc.update(self.extra)
        return doc


def plan_from_json(doc: Any, source: str = "plan") -> Plan:
    """Parse a `shardwise.plan/v1` document; unknown top-level keys go to `extra`."""
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise PlanError(f"{source}: field 'format' must be {PLAN_FORMAT!r}")
    known = {"format", "num_devices", "shards", "data_parallel", "row_wise", "kernels", "method"}
    try:
        return Plan.model_validate(
            {**{k: v for k, v in doc.items() if k in known}, "extra": {k: v for k, v in doc.items() if k not in known}}
        )
    except ValidationError as err:
        raise PlanError(f"{source}: {describe_validation_error(err)}") from None


def load_plan(path: str | Path, *, tracking_uri: str | None = None) -> Plan:
    """Read a `shardwise.plan/v1` JSON file, or the plan registered at "models:/shardwise-plan-<task>@champion"
    (a version, an alias; MLflow's store at `tracking_uri`, else $MLFLOW_TRACKING_URI, else ./mlflow.db). A URI is
    read by the reader registered for its scheme (`shardwise.plan_readers`); another scheme is refused."""
    scheme = uri_scheme(str(path))
    if scheme is None:
        return plan_from_json(read_json_document(path, PlanError, "plan"), source=str(path))
    reader = PLAN_READERS.get(scheme)
    if reader is None:
        known = ", ".join(f"{s}:/" for s in sorted(PLAN_READERS)) or "none"
        raise PlanError(f"{path}: no reader of {scheme}:/ URIs (known: {known}); a plan is a shardwise.plan/v1 JSON "
                        "file or a URI of those")
    plan: Plan = reader(str(path), tracking_uri=tracking_uri)
    return plan


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write `plan` as `shardwise.plan/v1` JSON."""
    return write_json_document(plan.to_json(), path, PlanError)


# --- validity and memory -------------------------------------------------------------------------------

GIB = 2**30


def shard_state_bytes(spec: TableSpec, task: ShardingTask) -> int:
    """What one shard adds to its device: weights, optimizer state and its share of the kernel buffers.

    `shard_memory_bytes` is additive over a device's shards, so search can account memory incrementally."""
    return shard_memory_bytes([spec], task.batch_size, task.optimizer, task.weights_precision)


def kernel_tables(plan: Plan, task: ShardingTask) -> dict[str, TableSpec]:
    """The task's tables by name, each on the kernel the plan gives it (`TableSpec.compute_kernel`)."""
    return {t.name: plan.kernels[t.name].on(t) if t.name in plan.kernels else t for t in task.tables}


def device_specs(plan: Plan, task: ShardingTask) -> list[list[TableSpec]]:
    """Per device, the shards as tables (column slices named `t[lo:hi]`) on their kernels, in plan order."""
    by_name = kernel_tables(plan, task)
    devices: list[list[TableSpec]] = [[] for _ in range(plan.num_devices)]
    for s in plan.shards:
        devices[s.device].append(s.spec(by_name[s.table]))
    return devices


def data_parallel_specs(plan: Plan, task: ShardingTask) -> list[TableSpec]:
    """The data-parallel tables of `plan`, in plan order."""
    return [task.table(name) for name in plan.data_parallel]


def row_wise_specs(plan: Plan, task: ShardingTask) -> list[TableSpec]:
    """The row-wise tables of `plan`, in plan order."""
    return [task.table(name) for name in plan.row_wise]


def row_block_specs(plan: Plan, task: ShardingTask) -> list[list[TableSpec]]:
    """Per device, its row blocks of `plan`'s row-wise tables (`TableSpec.row_block`: `t[rows lo:hi]`)."""
    return row_blocks(row_wise_specs(plan, task), plan.num_devices)


def local_batch_size(task: ShardingTask) -> int:
    """The most samples one device looks up for a data-parallel table: ceil(batch / devices)."""
    return local_batch(task.batch_size, task.num_devices)


def data_parallel_bytes(tables: list[TableSpec], task: ShardingTask) -> int:
    """What data-parallel `tables` take on every device (replica, optimizer state, dense gradient, buffers)."""
    return data_parallel_memory_bytes(tables, local_batch_size(task), task.optimizer, task.weights_precision)


def plan_memory_bytes(plan: Plan, task: ShardingTask) -> list[int]:
    """HBM each device holds under `plan` (weights + optimizer state + kernel buffers, or for a table in host memory
    its cache and the cache's bookkeeping; the data-parallel tables' replicas, and its row blocks with their
    optimizer state and their partial outputs for the whole batch), in bytes."""
    replicated = data_parallel_bytes(data_parallel_specs(plan, task), task)
    return [
        shard_memory_bytes([*specs, *blocks], task.batch_size, task.optimizer, task.weights_precision) + replicated
        for specs, blocks in zip(device_specs(plan, task), row_block_specs(plan, task), strict=True)
    ]


def plan_host_memory_bytes(plan: Plan, task: ShardingTask) -> list[int]:
    """Host memory each device holds under `plan`: the weights and optimizer state of its shards on a UVM kernel."""
    return [shard_host_memory_bytes(specs, task.optimizer, task.weights_precision)
            for specs in device_specs(plan, task)]


def validate_plan(plan: Plan, task: ShardingTask) -> None:
    """Raise PlanError naming the first problem: unknown table, device out of range, columns not tiled
    exactly once or off the 4-column grid, a sharding type, slice or kernel its table's plan space forbids, a device
    over `task.device_memory_bytes` of HBM or over `task.host_memory_bytes` of host memory."""
    if plan.num_devices != task.num_devices:
        raise PlanError(f"plan has num_devices {plan.num_devices}, the task has {task.num_devices}")
    by_name = {t.name: t for t in task.tables}
    everywhere: dict[str, str] = {}  # data-parallel and row-wise tables: on every device, no shard entries
    kinds: tuple[tuple[ShardingType, tuple[str, ...]], ...] = (("data_parallel", plan.data_parallel),
                                                               ("row_wise", plan.row_wise))
    for kind, names in kinds:
        for name in names:
            if name not in by_name:
                raise PlanError(f"{kind} table {name!r}: no such table in the task")
            if name in everywhere:
                again = "listed twice" if everywhere[name] == kind else f"also {everywhere[name]}"
                raise PlanError(f"{kind} table {name!r} is {again} (a table has one sharding type)")
            everywhere[name] = kind
            if not by_name[name].allows(kind):
                raise PlanError(f"{kind} table {name!r}: its plan space ({by_name[name].plan_space()}) does not allow "
                                f"{kind}")
    columns: dict[str, list[tuple[int, int]]] = {name: [] for name in by_name if name not in everywhere}
    for s in plan.shards:
        if s.table in everywhere:
            what = "data-parallel" if everywhere[s.table] == "data_parallel" else "row-wise"
            raise PlanError(f"table {s.table!r} is {what} and also has a shard on device {s.device}")
        if s.table not in by_name:
            raise PlanError(f"shard of table {s.table!r}: no such table in the task")
        if not 0 <= s.device < task.num_devices:
            raise PlanError(
                f"shard {s.table}[{s.col_offset}:{s.col_offset + s.dim}]: device {s.device} is out of range "
                f"0..{task.num_devices - 1}"
            )
        if s.col_offset % DIM_ALIGNMENT or s.dim % DIM_ALIGNMENT:
            raise PlanError(
                f"shard {s.table}[{s.col_offset}:{s.col_offset + s.dim}]: column split not on a multiple of "
                f"{DIM_ALIGNMENT} (fbgemm needs it)"
            )
        columns[s.table].append((s.col_offset, s.col_offset + s.dim))
    for name, spans in columns.items():
        dim = by_name[name].dim
        if not spans:
            raise PlanError(f"table {name!r} is not placed on any device")
        covered = 0
        for lo, hi in sorted(spans):
            if lo < covered:
                raise PlanError(f"table {name!r}: columns {lo}..{min(hi, covered) - 1} are covered more than once")
            if lo > covered:
                raise PlanError(f"table {name!r}: columns {covered}..{lo - 1} are not covered")
            covered = hi
        if covered != dim:
            if covered > dim:
                raise PlanError(f"table {name!r}: shards reach column {covered}, the table has dim {dim}")
            raise PlanError(f"table {name!r}: columns {covered}..{dim - 1} are not covered")
        _check_plan_space(by_name[name], spans)
    _check_kernels(plan, task, everywhere)
    cap = task.device_memory_bytes
    for device, used in enumerate(plan_memory_bytes(plan, task)):
        if used > cap:
            raise PlanError(
                f"device {device} needs {used / GIB:.3f} GiB, over its cap of {cap / GIB:.3f} GiB of device memory "
                f"by {(used - cap) / GIB:.3f} GiB"
            )
    host = plan_host_memory_bytes(plan, task)
    host_cap = task.host_memory_bytes
    for device, used in enumerate(host):
        if used and host_cap is None:
            raise HostMemoryError(f"device {device} keeps {used / GIB:.3f} GiB of tables in host memory, and the task sets "
                            "no host_memory_bytes (give each device's host memory in bytes)")
        if host_cap is not None and used > host_cap:
            raise HostMemoryError(
                f"device {device} needs {used / GIB:.3f} GiB of host memory, over its host_memory_bytes of "
                f"{host_cap / GIB:.3f} GiB by {(used - host_cap) / GIB:.3f} GiB"
            )


def _check_kernels(plan: Plan, task: ShardingTask, everywhere: dict[str, str]) -> None:
    """Raise PlanError where a table's kernel is one its plan space forbids, or is given to a data-parallel or
    row-wise table (the plan keeps those in HBM)."""
    by_name = {t.name: t for t in task.tables}
    for name, choice in plan.kernels.items():
        if name not in by_name:
            raise PlanError(f"kernels: table {name!r}: no such table in the task")
        if name in everywhere and choice.kernel != "fused":
            raise PlanError(f"kernels: table {name!r} is {everywhere[name]} and runs {choice.kernel!r} (a plan keeps "
                            "data-parallel and row-wise tables in HBM: 'fused')")
        if not by_name[name].allows_kernel(choice.kernel):
            raise PlanError(f"kernels: table {name!r} runs {choice.kernel!r}; its plan space "
                            f"({by_name[name].plan_space()}) does not allow it (compute_kernels)")


def _check_plan_space(table: TableSpec, spans: list[tuple[int, int]]) -> None:
    """Raise PlanError where `table`'s column slices `spans` (tiling it) are a split its plan space forbids."""
    if len(spans) == 1:
        return  # the whole table on one device: table-wise, or column-wise with one shard
    if not table.allows("column_wise"):
        raise PlanError(f"table {table.name!r} is split into {len(spans)} column slices; its plan space "
                        f"({table.plan_space()}) does not allow column_wise")
    narrowest = min(spans, key=lambda span: span[1] - span[0])
    if table.min_partition is not None and narrowest[1] - narrowest[0] < table.min_partition:
        lo, hi = narrowest
        raise PlanError(f"table {table.name!r}: column slice [{lo}:{hi}] is {hi - lo} columns, narrower than its "
                        f"min_partition {table.min_partition}")


def check_memory_bounds(task: ShardingTask, *, column_split: bool, row_wise: bool = False) -> None:
    """Raise PlanError saying how much memory is missing when no plan can fit, whatever the search.

    Two bounds: all tables together against the total capacity, and the largest unit a method cannot
    split further (a whole table, or its narrowest slice spread over all devices, or with `row_wise` its largest
    block of rows with the outputs for the whole batch, if that is smaller) against one device; each table only in
    the splits its plan space allows (`TableSpec.sharding_types`, `min_partition`)."""
    cap = task.device_memory_bytes
    total = sum(shard_state_bytes(t, task) for t in task.tables)
    capacity = cap * task.num_devices
    if total > capacity:
        raise PlanError(
            f"no plan fits: the tables need {total / GIB:.3f} GiB in all, {task.num_devices} devices x "
            f"{cap / GIB:.3f} GiB hold {capacity / GIB:.3f} GiB: {(total - capacity) / GIB:.3f} GiB missing"
        )
    for t in task.tables:
        widest = t.widest_slice_dim(task.num_devices) if column_split else t.dim
        need = shard_state_bytes(t.with_dim(widest), task)
        what = f"its widest slice ({widest} of {t.dim} columns)" if widest < t.dim else "the table alone"
        rows_split = row_wise and task.num_devices > 1 and t.allows("row_wise")
        block = t.row_block(0, task.num_devices) if rows_split else None
        if block is not None and (block_need := shard_state_bytes(block, task)) < need:
            need, what = block_need, f"its largest block of rows ({block.rows} of {t.rows})"
        if need > cap:
            raise PlanError(
                f"no plan fits: table {t.name!r}: {what} needs {need / GIB:.3f} GiB, over the device cap of "
                f"{cap / GIB:.3f} GiB by {(need - cap) / GIB:.3f} GiB"
            )
