"""The kernel a shard runs (`ShardKernel`): fbgemm's fused table-batched embedding kernel (TBE) over its tables (those
in host memory on fbgemm's UVM, `caching.py`), or for data-parallel tables TorchRec's dense one (`ComputeKernel`),
with one batch of inputs (a cycle of them for a cache to settle on); built once, then timed (`kernel.py`,
`timers.py`)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from shardwise.workload import Optimizer, TableSpec, WeightsPrecision

from .batches import IndexData, shard_batch, split_batch
from .caching import cache_arguments, in_host_memory, locations, require_uvm, rotation_batches, warm_cache
from .hardware import import_fbgemm, resolve_device

_OPTIMIZERS = {"sgd": "EXACT_SGD", "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD", "adam": "ADAM"}
_PRECISIONS = {"fp32": "FP32", "fp16": "FP16"}

#: the kernel a shard runs, in TorchRec's words: "fused" (table-wise, column-wise and row-wise shards: fbgemm's
#: SplitTableBatchedEmbeddingBagsCodegen, the optimizer fused into its backward, touching the rows looked up) or
#: "dense" (data-parallel tables: DenseTableBatchedEmbeddingBagsCodegen, whose backward writes the whole tables' dense
#: gradient, which DDP all-reduces and the dense optimizer applies to every row: timed here with the SGD step the
#: validation DLRM's dense optimizer takes, in backward)
ComputeKernel = Literal["fused", "dense"]
COMPUTE_KERNELS: tuple[str, ...] = ("fused", "dense")
#: the dense kernel's SGD step size (any: the time does not depend on it)
_DENSE_LEARNING_RATE = 0.01


@dataclass(frozen=True, eq=False)
class ShardKernel:
    """A TBE over a shard's tables plus one batch of inputs, built once and then timed."""

    tbe: torch.nn.Module
    indices: torch.Tensor  # table-major, all tables concatenated
    offsets: torch.Tensor  # [T * B + 1]
    grad_output: torch.Tensor  # [B, sum(dims)], a fixed upstream gradient for backward
    num_tables: int = 1
    #: batches of one distribution the calls cycle through (tables in host memory: each call's ids new to its cache,
    #: as in training); empty: every call looks up `indices`
    rotation: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    #: the cache's hit rate over the distinct ids of a cycle once warm (None: no table cached)
    cache_hit_rate: float | None = None
    _calls: list[int] = field(default_factory=lambda: [0])

    def forward(self) -> torch.Tensor:
        """Pooled output [B, sum(dims)] (sum pooling)."""
        if not self.rotation:
            return self.tbe(self.indices, self.offsets)
        indices, offsets = self.rotation[self._calls[0] % len(self.rotation)]
        self._calls[0] += 1
        return self.tbe(indices, offsets)

    @property
    def per_table(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """(lengths, indices) per table, in its rows, as host arrays."""
        return split_batch(self.indices, self.offsets, self.num_tables)


@contextlib.contextmanager
def _tbe_configuration_logs_hidden() -> Iterator[None]:
    """fbgemm logs each kernel's configuration, a dozen INFO lines, through the root logger; profiling builds
    thousands of kernels, and where the root logger is at INFO (a pipeline step under KFP's executor) they filled
    the step's log (about 10 MB for `make run`'s profile step). Kept when the fbgemm_gpu logger is set to INFO
    (`shardwise -v`)."""
    fbgemm = logging.getLogger("fbgemm_gpu")
    if fbgemm.level != logging.NOTSET and fbgemm.level <= logging.INFO:
        yield
        return

    def hidden(record: logging.LogRecord) -> bool:
        return not (record.levelno <= logging.INFO and str(record.msg).startswith("[TBE="))

    root = logging.getLogger()
    root.addFilter(hidden)
    try:
        yield
    finally:
        root.removeFilter(hidden)


def build_shard_kernel(
    tables: Sequence[TableSpec],
    batch_size: int,
    *,
    device: str | torch.device | None = None,
    optimizer: Optimizer = "rowwise_adagrad",
    weights_precision: WeightsPrecision = "fp32",
    index_data: IndexData | None = None,
    seed: int = 0,
    compute_kernel: ComputeKernel = "fused",
) -> ShardKernel:
    """fbgemm's SplitTableBatchedEmbeddingBagsCodegen over `tables` with its inputs, on `device`; with
    `compute_kernel` "dense", DenseTableBatchedEmbeddingBagsCodegen (fp32) with an SGD step over the whole tables
    in its backward (`ComputeKernel`; `optimizer` and `weights_precision` are the fused kernel's). Tables in host
    memory (`TableSpec.compute_kernel`) on fbgemm's UVM, CUDA only (`caching.py`): their calls cycle through sampled
    batches of one distribution, the cache warmed on them before it is timed."""
    import_fbgemm()  # a clear error where this machine cannot load the installed build
    # fbgemm_gpu: heavy (registers its operators with torch), needed only when a kernel is built
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import ComputeDevice, EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen

    if not tables:
        raise ValueError("tables: a shard needs at least one table")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer {optimizer!r} is not one of {sorted(_OPTIMIZERS)}")
    if weights_precision not in _PRECISIONS:
        raise ValueError(f"weights_precision {weights_precision!r} is not one of {sorted(_PRECISIONS)}")
    if compute_kernel not in COMPUTE_KERNELS:
        raise ValueError(f"compute_kernel {compute_kernel!r} is not one of {list(COMPUTE_KERNELS)}")
    dev = resolve_device(device)
    require_uvm(tables, dev)
    uvm = in_host_memory(tables)
    if uvm and compute_kernel != "fused":
        raise ValueError(f"compute_kernel {compute_kernel!r}: tables in host memory run fbgemm's fused kernel on UVM")
    if dev.type == "cpu" and optimizer == "adam":
        raise ValueError("optimizer 'adam': fbgemm's CPU kernel does not support it (use sgd or rowwise_adagrad)")
    if dev.type == "cuda":
        where, compute = locations(tables), ComputeDevice.CUDA
    else:
        where, compute = [EmbeddingLocation.HOST] * len(tables), ComputeDevice.CPU
    cache = cache_arguments(tables)  # fbgemm sizes one cache over its cached tables' rows

    torch.manual_seed(seed)
    with _tbe_configuration_logs_hidden():
        tbe = _dense_kernel(tables, dev) if compute_kernel == "dense" else SplitTableBatchedEmbeddingBagsCodegen(
            [(t.rows, t.dim, location, compute) for t, location in zip(tables, where, strict=True)],
            optimizer=getattr(EmbOptimType, _OPTIMIZERS[optimizer]),
            weights_precision=getattr(SparseType, _PRECISIONS[weights_precision]),
            learning_rate=0.01,
            device=dev,
            **cache,
        )
    # a cache's hit rate needs many batches of one distribution, and read index data holds one per table: sampled
    rotation = rotation_batches(tables, batch_size, dev) if uvm else ()
    indices, offsets = rotation[0] if rotation else shard_batch(tables, batch_size, dev, index_data)
    # drawn on the device: at batch 65536 a 15-table shard's gradient is about 40M values, seconds on one CPU core
    generator = torch.Generator(device=dev).manual_seed(seed)
    grad = torch.randn(batch_size, sum(t.dim for t in tables), generator=generator, device=dev)
    if dev.type == "cuda":
        # fbgemm's first forward copies the table dims to the host, blocking until the device is idle: done here,
        # or a held timer's first call on the kernel waits out its own hold and is timed again behind a longer one
        # (tests/gpu checks a fresh kernel's first held call is covered by its first hold)
        with torch.no_grad():
            tbe(indices, offsets)
    kernel = ShardKernel(tbe=tbe, indices=indices, offsets=offsets, grad_output=grad, num_tables=len(tables),
                         rotation=rotation)
    if cache:
        kernel = dataclasses.replace(kernel, cache_hit_rate=warm_cache(kernel))
    return kernel


def _dense_kernel(tables: Sequence[TableSpec], device: torch.device) -> torch.nn.Module:
    """TorchRec's data-parallel kernel over `tables` (`ComputeKernel` "dense"): its backward leaves the tables'
    dense gradient, and a hook then takes the SGD step over every row and drops the gradient (as a training step's
    optimizer step and zero_grad(set_to_none=True) do), so the next backward writes a new one."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import DenseTableBatchedEmbeddingBagsCodegen

    # its lookup reaches autograd through a composite function: torch warns of a missing autograd kernel, yet the
    # gradient is nn.EmbeddingBag's (tests/integration/test_profiling_kernel.py checks it)
    warnings.filterwarnings("ignore", message="fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel")
    tbe = DenseTableBatchedEmbeddingBagsCodegen([(t.rows, t.dim) for t in tables], use_cpu=device.type == "cpu")
    if device.type == "cuda":
        tbe = tbe.to(device)

    def sgd_step(weights: torch.Tensor) -> None:
        if weights.grad is not None:
            with torch.no_grad():
                weights.add_(weights.grad, alpha=-_DENSE_LEARNING_RATE)
        weights.grad = None

    tbe.weights.register_post_accumulate_grad_hook(sgd_step)
    return tbe
