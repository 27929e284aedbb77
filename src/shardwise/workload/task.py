"""A sharding task: tables, devices, memory per device, batch size; `shardwise.task/v1` JSON IO."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from shardwise.errors import ShardwiseError

from .documents import StrictInt, describe_validation_error, read_json_document, write_json_document
from .memory import Optimizer, WeightsPrecision, shard_memory_bytes
from .tables import DIM_ALIGNMENT, HOST_KERNELS, TableCollection, TableSpec

TASK_FORMAT: Literal["shardwise.task/v1"] = "shardwise.task/v1"
GIB = 2**30
#: more devices than any training job uses; a plan lists every device, so 10**6 devices wrote an 86 MB plan
MAX_DEVICES = 2**16
#: 1 PiB per device, thousands of times today's largest accelerator memory; keeps byte sums far below 2**63
MAX_DEVICE_MEMORY_BYTES = 2**50
#: far above any training batch (the DLRM 2021 dataset's batches are 65536 samples); an int32 holds it
MAX_BATCH_SIZE = 2**31 - 1
#: what all the tables need together, bounded so that no sum of bytes in search overflows an int64 (2**63)
MAX_TASK_MEMORY_BYTES = 2**62


class TaskError(ShardwiseError, ValueError):
    """A task file or object that cannot be used; the message names the offending field."""


class ShardingTask(TableCollection):
    """Place `tables` on `num_devices` devices of `device_memory_bytes` each, for `batch_size` samples."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    format: Literal["shardwise.task/v1"] = TASK_FORMAT
    num_devices: StrictInt = Field(ge=1)
    device_memory_bytes: StrictInt = Field(ge=1)
    batch_size: StrictInt = Field(ge=1, le=MAX_BATCH_SIZE)
    tables: tuple[TableSpec, ...] = Field(min_length=1)
    optimizer: Optimizer = "rowwise_adagrad"
    weights_precision: WeightsPrecision = "fp32"
    #: host memory (DDR) per device for the tables a UVM kernel keeps there (None: no table leaves HBM)
    host_memory_bytes: StrictInt | None = Field(default=None, ge=1)

    @field_validator("num_devices")
    @classmethod
    def _devices_bounded(cls, num_devices: int) -> int:
        if num_devices > MAX_DEVICES:
            raise ValueError(f"{num_devices} devices is more than {MAX_DEVICES} (the most a task may describe)")
        return num_devices

    @field_validator("device_memory_bytes", "host_memory_bytes")
    @classmethod
    def _memory_bounded(cls, device_memory_bytes: int | None) -> int | None:
        if device_memory_bytes is not None and device_memory_bytes >= MAX_DEVICE_MEMORY_BYTES:
            raise ValueError(
                f"{device_memory_bytes} bytes per device is not below 2**50 (1 PiB); give the device's memory "
                "in bytes, e.g. 80 GiB = 85899345920"
            )
        return device_memory_bytes

    @model_validator(mode="after")
    def _memory_sum_bounded(self) -> ShardingTask:
        total = shard_memory_bytes(self.tables, self.batch_size, self.optimizer, self.weights_precision)
        if total >= MAX_TASK_MEMORY_BYTES:
            raise ValueError(f"the tables need {total} bytes in all, not below 2**62: not a real workload")
        return self

    def may_leave_hbm(self, table: TableSpec) -> bool:
        """Whether a plan may put `table` in host memory: its plan space allows a UVM kernel and the task gives the
        devices host memory."""
        return self.host_memory_bytes is not None and any(table.allows_kernel(k) for k in HOST_KERNELS)

    def least_hbm_table(self, table: TableSpec) -> TableSpec:
        """`table` on the kernel its plan space allows that keeps the least in HBM: "fused_uvm" (nothing), else
        "fused_uvm_caching" with the smallest cache (its bookkeeping), else itself."""
        if not self.may_leave_hbm(table):
            return table
        if table.allows_kernel("fused_uvm"):
            return table.on_kernel("fused_uvm")
        return table.on_kernel("fused_uvm_caching", SMALLEST_CACHE_LOAD_FACTOR)


#: a cache of one row in a billion: for bounds that no plan escapes, a cache's bookkeeping without its rows
SMALLEST_CACHE_LOAD_FACTOR = 1e-9


def task_fits(task: ShardingTask) -> str | None:
    """None when the task's memory does not rule out every plan; else why no plan can fit, with the GiB missing.

    Two bounds that no method escapes: all tables together (state plus kernel buffers; splitting columns only
    adds per-row optimizer state) against all devices, and each table's narrowest possible column slice (its
    columns spread over every device, 4 columns at least) against one device; a table the task lets leave HBM
    counts what it keeps there on its leanest UVM kernel."""
    cap = task.device_memory_bytes
    capacity = cap * task.num_devices
    tables = [task.least_hbm_table(t) for t in task.tables]
    total = shard_memory_bytes(tables, task.batch_size, task.optimizer, task.weights_precision)
    if total > capacity:
        return (
            f"no plan fits: the tables need {total / GIB:.3f} GiB in all, {task.num_devices} device(s) x "
            f"{cap / GIB:.3f} GiB hold {capacity / GIB:.3f} GiB ({(total - capacity) / GIB:.3f} GiB missing)"
        )
    for t in tables:
        pieces = max(1, min(task.num_devices, t.dim // DIM_ALIGNMENT))
        widest = -(-t.dim // pieces)
        widest += -widest % DIM_ALIGNMENT
        need = shard_memory_bytes([t.with_dim(widest)], task.batch_size, task.optimizer, task.weights_precision)
        if need > cap:
            what = f"its narrowest split ({widest} of {t.dim} columns per device)" if pieces > 1 else "it alone"
            return (
                f"no plan fits: table {t.name!r} needs {need / GIB:.3f} GiB for {what}, a device holds "
                f"{cap / GIB:.3f} GiB ({(need - cap) / GIB:.3f} GiB missing)"
            )
    return None


def task_from_json(doc: Any, source: str = "task") -> ShardingTask:
    """Validate a parsed task document; refuse it naming the field that is wrong."""
    if not isinstance(doc, dict):
        raise TaskError(f"{source}: expected a JSON object with format {TASK_FORMAT!r}")
    if "format" not in doc:
        raise TaskError(f"{source}: field 'format' is missing; expected \"format\": {TASK_FORMAT!r}")
    if doc["format"] != TASK_FORMAT:
        raise TaskError(f"{source}: field 'format' is {repr(doc['format'])[:60]}, expected {TASK_FORMAT!r}")
    try:
        return ShardingTask.model_validate(doc)
    except ValidationError as err:
        raise TaskError(f"{source}: {describe_validation_error(err)}") from None


def load_task(path: str | Path) -> ShardingTask:
    """Read and validate a `shardwise.task/v1` JSON file."""
    return task_from_json(read_json_document(path, TaskError, "task"), source=str(path))


def save_task(task: ShardingTask, path: str | Path) -> Path:
    """Write `task` as `shardwise.task/v1` JSON."""
    return write_json_document(task.to_json(), path, TaskError)
