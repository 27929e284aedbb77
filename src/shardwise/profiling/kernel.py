"""The measured cost of one shard on one device: fbgemm's fused table-batched embedding kernel (TBE).

Forward and backward (optimizer fused into backward) are timed separately, with warm-up and the median of
N iterations after a cache flush: CUDA events on GPU; on CPU a fixed thread count and the timing thread's
CPU time (or `time.perf_counter` with several threads). Shared CPUs drift in speed by up to 1.5x within
seconds, so on CPU each timed iteration is paired with one iteration of a fixed reference kernel and the
ratio is kept (reference normalisation, see TimingProtocol).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from shardwise.workload import Optimizer, TableSpec, WeightsPrecision, sample_batch, stable_seed

from .hardware import import_fbgemm, resolve_device
from .protocol import MeasurementSettings, TimingProtocol

#: per source table: (lengths [B], indices [sum(lengths)]) int64 arrays
IndexData = Mapping[str, tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class ShardTiming:
    """Median forward and backward ms of one shard; `raw_*` are the unnormalised medians."""

    fwd_ms: float
    bwd_ms: float
    raw_fwd_ms: float
    raw_bwd_ms: float
    reference_ms: float | None  # what normalised ratios were scaled by (None: not normalised)

    @property
    def total_ms(self) -> float:
        """Forward plus backward ms."""
        return self.fwd_ms + self.bwd_ms


_OPTIMIZERS = {"sgd": "EXACT_SGD", "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD", "adam": "ADAM"}
_PRECISIONS = {"fp32": "FP32", "fp16": "FP16"}


@dataclass(frozen=True)
class ShardKernel:
    """A TBE over a shard's tables plus one batch of inputs, built once and then timed."""

    tbe: torch.nn.Module
    indices: torch.Tensor  # table-major, all tables concatenated
    offsets: torch.Tensor  # [T * B + 1]
    grad_output: torch.Tensor  # [B, sum(dims)], a fixed upstream gradient for backward
    per_table: tuple[tuple[np.ndarray, np.ndarray], ...]  # (lengths, indices) per table, in range

    def forward(self) -> torch.Tensor:
        """Pooled output [B, sum(dims)] (sum pooling)."""
        return self.tbe(self.indices, self.offsets)


def _fit_batch(lengths: np.ndarray, indices: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Index data for exactly `batch_size` bags: the first bags of a larger batch, or a smaller one tiled."""
    lengths = np.asarray(lengths, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    if lengths.sum() != indices.size:
        raise ValueError(f"index data: lengths sum to {int(lengths.sum())} but there are {indices.size} indices")
    if lengths.size == batch_size:
        return lengths, indices
    if lengths.size == 0:
        raise ValueError("index data: lengths is empty")
    if lengths.size > batch_size:
        return lengths[:batch_size], indices[: int(lengths[:batch_size].sum())]
    reps = -(-batch_size // lengths.size)
    return _fit_batch(np.tile(lengths, reps), np.tile(indices, reps), batch_size)


def table_index_data(
    table: TableSpec, batch_size: int, index_data: IndexData | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One batch of (lengths, indices) for `table`, indices folded into its rows (modulo)."""
    source = table.source or table.name
    if index_data is None:
        lengths, indices = sample_batch(table, batch_size, stable_seed(source))
    elif source in index_data:
        lengths, indices = index_data[source]
    else:
        raise ValueError(f"table {table.name!r}: no index data for its source {source!r}")
    lengths, indices = _fit_batch(lengths, indices, batch_size)
    # tables scaled down for CPU (or column slices of resampled tables) have fewer rows than the data's ids
    return lengths, np.mod(indices, table.rows)


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
) -> ShardKernel:
    """fbgemm's SplitTableBatchedEmbeddingBagsCodegen over `tables` with its inputs, on `device`."""
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
    dev = resolve_device(device)
    if dev.type == "cpu" and optimizer == "adam":
        raise ValueError("optimizer 'adam': fbgemm's CPU kernel does not support it (use sgd or rowwise_adagrad)")
    if dev.type == "cuda":
        location, compute = EmbeddingLocation.DEVICE, ComputeDevice.CUDA
    else:
        location, compute = EmbeddingLocation.HOST, ComputeDevice.CPU

    torch.manual_seed(seed)
    with _tbe_configuration_logs_hidden():
        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(t.rows, t.dim, location, compute) for t in tables],
            optimizer=getattr(EmbOptimType, _OPTIMIZERS[optimizer]),
            weights_precision=getattr(SparseType, _PRECISIONS[weights_precision]),
            learning_rate=0.01,
            device=dev,
        )
    per_table = tuple(table_index_data(t, batch_size, index_data) for t in tables)
    lengths = np.concatenate([lengths for lengths, _ in per_table])  # table-major, as TBE wants
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate([idx for _, idx in per_table])
    generator = torch.Generator().manual_seed(seed)
    grad = torch.randn(batch_size, sum(t.dim for t in tables), generator=generator)
    return ShardKernel(
        tbe=tbe,
        indices=torch.from_numpy(indices).to(dev),
        offsets=torch.from_numpy(offsets).to(dev),
        grad_output=grad.to(dev),
        per_table=per_table,
    )


# The reference kernel: fixed forever (changing it changes what `reference_ms` means in stored datasets).
_REFERENCE_TABLES = tuple(
    TableSpec(name=f"reference{i}", rows=20_000, dim=32, pooling_factor=8.0, zipf_alpha=1.05) for i in range(4)
)
_REFERENCE_BATCH_SIZE = 1024


@lru_cache(maxsize=4)
def _reference_kernel(device: torch.device) -> ShardKernel:
    return build_shard_kernel(_REFERENCE_TABLES, _REFERENCE_BATCH_SIZE, device=device, seed=12345)


@lru_cache(maxsize=4)
def _flush_buffer(device: torch.device, nbytes: int) -> torch.Tensor:
    """A buffer of `nbytes`, allocated once per device (overwriting it evicts the last kernel's data)."""
    return torch.zeros(nbytes // 4, dtype=torch.float32, device=device)


class _Timer:
    """Forward/backward wall time of one kernel iteration: CUDA events on GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device, protocol: TimingProtocol) -> None:
        """`protocol` as decided for `device` (`TimingProtocol.for_device`)."""
        self.device = device
        self.clock = time.thread_time if protocol.clock == "thread" else time.perf_counter
        self.flush_buffer: torch.Tensor | None = None
        if protocol.flush_cache and protocol.flush_bytes:
            self.flush_buffer = _flush_buffer(device, protocol.flush_bytes)

    def run(self, kernel: ShardKernel) -> tuple[float, float]:
        """(fwd_ms, bwd_ms) of one forward + backward (with the fused optimizer update)."""
        if self.flush_buffer is not None:
            self.flush_buffer.add_(1.0)
        if self.device.type == "cuda":
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record()
            out = kernel.forward()
            mid.record()
            out.backward(kernel.grad_output)
            end.record()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(mid), mid.elapsed_time(end)
        t0 = self.clock()
        out = kernel.forward()
        t1 = self.clock()
        out.backward(kernel.grad_output)
        t2 = self.clock()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3


@contextlib.contextmanager
def _threads(num_threads: int | None) -> Iterator[None]:
    """Fix torch's intra-op thread count for the duration (CPU timings depend on it)."""
    if num_threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def calibrate_reference(
    device: str | torch.device | None = None, protocol: TimingProtocol | None = None
) -> float:
    """The reference kernel's fwd+bwd ms on `device`: median over `protocol.calibration_runs` runs."""
    dev = resolve_device(device)
    protocol = (protocol or TimingProtocol()).for_device(dev)
    with _threads(protocol.num_threads):
        kernel = _reference_kernel(dev)
        timer = _Timer(dev, protocol)
        for _ in range(max(protocol.warmup_iters, 3)):
            timer.run(kernel)
        return statistics.median(sum(timer.run(kernel)) for _ in range(protocol.calibration_runs))


def time_kernel(kernel: ShardKernel, device: torch.device, protocol: TimingProtocol) -> ShardTiming:
    """Time a built kernel under `protocol` (`reference_ms` set when normalised)."""
    protocol = protocol.for_device(device)
    normalised = bool(protocol.reference_normalised)
    if normalised and protocol.reference_ms is None:
        raise ValueError("protocol.reference_ms: calibrate it (calibrate_reference) before timing normalised")
    timer = _Timer(device, protocol)
    reference = _reference_kernel(device) if normalised else None
    fwd, bwd, ref = [], [], []
    for i in range(protocol.warmup_iters + protocol.iters):
        fwd_ms, bwd_ms = timer.run(kernel)
        # the reference runs right after the shard, so both see the same machine speed; each after its own flush:
        # with one flush (256 MiB) per pair, shards timed 1.3% faster (median; 7.5% on one; bench_shard_timing
        # --pairing)
        ref_ms = sum(timer.run(reference)) if reference is not None else 1.0
        if i >= protocol.warmup_iters:
            fwd.append(fwd_ms)
            bwd.append(bwd_ms)
            ref.append(ref_ms)
    return shard_timing(fwd, bwd, ref, protocol.reference_ms if normalised else None)


def shard_timing(
    fwd: Sequence[float], bwd: Sequence[float], ref: Sequence[float], reference_ms: float | None
) -> ShardTiming:
    """The medians of timed iterations; with `reference_ms`, each iteration over its paired reference's ms, scaled
    by it (reference normalisation)."""
    raw_fwd, raw_bwd = statistics.median(fwd), statistics.median(bwd)
    if reference_ms is None:
        return ShardTiming(raw_fwd, raw_bwd, raw_fwd, raw_bwd, None)
    return ShardTiming(
        fwd_ms=statistics.median(f / r for f, r in zip(fwd, ref)) * reference_ms,
        bwd_ms=statistics.median(b / r for b, r in zip(bwd, ref)) * reference_ms,
        raw_fwd_ms=raw_fwd,
        raw_bwd_ms=raw_bwd,
        reference_ms=reference_ms,
    )


def resolve_timing(measurement: MeasurementSettings) -> tuple[torch.device, TimingProtocol]:
    """The device `measurement` names and its protocol decided for that device, with the reference kernel
    pinned to `measurement.reference_ms` or else calibrated once (when timings are normalised), so every shard
    timed with it is scaled by the same reference."""
    device = resolve_device(measurement.device)
    protocol = measurement.protocol().for_device(device)
    if protocol.reference_normalised and protocol.reference_ms is None:
        protocol = protocol.model_copy(update={"reference_ms": calibrate_reference(device, protocol)})
    return device, protocol


def measure_shard(
    tables: Sequence[TableSpec],
    batch_size: int,
    *,
    device: str | torch.device | None = None,
    protocol: TimingProtocol | None = None,
    optimizer: Optimizer = "rowwise_adagrad",
    weights_precision: WeightsPrecision = "fp32",
    index_data: IndexData | None = None,
) -> ShardTiming:
    """Median forward and backward ms of the fused TBE over `tables` on `device` (CUDA or CPU)."""
    dev = resolve_device(device)
    protocol = (protocol or TimingProtocol()).for_device(dev)
    with _threads(protocol.num_threads if dev.type == "cpu" else None):
        if protocol.reference_normalised and protocol.reference_ms is None:
            protocol = protocol.model_copy(update={"reference_ms": calibrate_reference(dev, protocol)})
        kernel = build_shard_kernel(
            tables,
            batch_size,
            device=dev,
            optimizer=optimizer,
            weights_precision=weights_precision,
            index_data=index_data,
        )
        return time_kernel(kernel, dev, protocol)
