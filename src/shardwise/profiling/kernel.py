"""The measured cost of one shard on one device: fbgemm's fused table-batched embedding kernel (TBE), or for
data-parallel tables TorchRec's dense one (`ComputeKernel`).

Forward and backward (optimizer fused into backward) are timed separately, with warm-up and the median of
N iterations after a cache flush. On CPU: a fixed thread count and the timing thread's CPU time (or
`time.perf_counter` with several threads); shared CPUs drift in speed by up to 1.5x within seconds, so each timed
iteration is paired with one iteration of a fixed reference kernel and the ratio is kept (reference normalisation,
see TimingProtocol). On CUDA: events on the stream, timed one of four ways (`TimingProtocol.cuda_timer`, in
`timers.py`). The kernel timed is built in `tbe.py`; its names are importable from here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from shardwise.workload import Optimizer, TableSpec, WeightsPrecision

from .batches import IndexData, host_shard_batch
from .caching import in_host_memory
from .hardware import resolve_device
from .protocol import MeasurementSettings, TimingProtocol
from .tbe import COMPUTE_KERNELS, ComputeKernel, ShardKernel, build_shard_kernel
from .timers import CallTiming, Timer, cuda_sleep_available

#: the names callers import from here: this module's own, and the kernel's and timers' they use beside them
__all__ = [
    "COMPUTE_KERNELS",
    "CallTiming",
    "ComputeKernel",
    "MeasurementSettings",
    "ShardKernel",
    "ShardTiming",
    "TimingProtocol",
    "Timer",
    "_reference_kernel",
    "build_shard_kernel",
    "calibrate_reference",
    "cuda_sleep_available",
    "measure_shard",
    "measure_shards",
    "resolve_device",
    "resolve_timing",
    "shard_timing",
    "time_kernel",
    "time_with",
]


@dataclass(frozen=True)
class ShardTiming:
    """Median forward and backward ms of one shard; `raw_*` are the unnormalised medians."""

    fwd_ms: float
    bwd_ms: float
    raw_fwd_ms: float
    raw_bwd_ms: float
    reference_ms: float | None  # what normalised ratios were scaled by (None: not normalised)
    #: median host ms to launch forward + backward (CUDA; None on CPU, where the host runs the kernel itself)
    launch_ms: float | None = None
    #: what timed it: the CUDA timer ("queued", "held", "graph", "events"; "held" where a graph could not be
    #: captured or the queue's hold did not cover its launches) or
    #: the CPU clock ("thread", "wall"); None where not known
    timer: str | None = None
    #: a shard with cached tables: its cache's hit rate over the distinct ids of a cycle of batches, once warm
    cache_hit_rate: float | None = None

    @property
    def total_ms(self) -> float:
        """Forward plus backward ms."""
        return self.fwd_ms + self.bwd_ms


# The reference kernel: fixed forever (changing it changes what `reference_ms` means in stored datasets).
_REFERENCE_TABLES = tuple(
    TableSpec(name=f"reference{i}", rows=20_000, dim=32, pooling_factor=8.0, zipf_alpha=1.05) for i in range(4)
)
_REFERENCE_BATCH_SIZE = 1024


@lru_cache(maxsize=4)
def _reference_kernel(device: torch.device) -> ShardKernel:
    kernel = build_shard_kernel(_REFERENCE_TABLES, _REFERENCE_BATCH_SIZE, device=device, seed=12345)
    # its batch as numpy's sampler drew it when reference times were first stored (the device sampler draws the
    # same distribution, not the same ids): a reference that changed would rescale every normalised timing
    indices, offsets = host_shard_batch(_REFERENCE_TABLES, _REFERENCE_BATCH_SIZE, device)
    return dataclasses.replace(kernel, indices=indices, offsets=offsets)


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
        timer = Timer(dev, protocol)
        for _ in range(max(protocol.warmup_calls, 3)):
            timer.run(kernel)
        return statistics.median(sum(timer.run(kernel)) for _ in range(protocol.calibration_runs))


def time_kernel(kernel: ShardKernel, device: torch.device, protocol: TimingProtocol,
                meanwhile: Callable[[], None] | None = None) -> ShardTiming:
    """Time a built kernel under `protocol` (`reference_ms` set when normalised). `meanwhile` runs once, while the
    device runs the timed calls where it can (CUDA's queued timer), else after them."""
    protocol = protocol.for_device(device)
    return time_with(timer=Timer(device, protocol), kernel=kernel, protocol=protocol, meanwhile=meanwhile)


def time_with(timer: Timer, kernel: ShardKernel, protocol: TimingProtocol,
              meanwhile: Callable[[], None] | None) -> ShardTiming:
    """`time_kernel` with `timer` (on its device, `protocol` decided for it)."""
    device = timer.device
    normalised = bool(protocol.reference_normalised)
    if normalised and protocol.reference_ms is None:
        raise ValueError("protocol.reference_ms: calibrate it (calibrate_reference) before timing normalised")
    if not normalised:
        calls = timer.calls(kernel, protocol.warmup_calls + protocol.iters, meanwhile)[protocol.warmup_calls :]
        return shard_timing([c.fwd_ms for c in calls], [c.bwd_ms for c in calls], [1.0] * len(calls), None,
                            calls=calls)
    reference = _reference_kernel(device)
    calls, ref = [], []
    for i in range(protocol.warmup_calls + protocol.iters):
        timed = timer.call(kernel)
        # the reference runs right after the shard, so both see the same machine speed; each after its own flush:
        # one flush per pair timed shards faster than training runs them (record `shard_timing_pairing`)
        ref_ms = sum(timer.run(reference))
        if i >= protocol.warmup_calls:
            calls.append(timed)
            ref.append(ref_ms)
    if meanwhile is not None:
        meanwhile()
    return shard_timing([c.fwd_ms for c in calls], [c.bwd_ms for c in calls], ref, protocol.reference_ms,
                        calls=calls)


def shard_timing(
    fwd: Sequence[float], bwd: Sequence[float], ref: Sequence[float], reference_ms: float | None,
    calls: Sequence[CallTiming] = (),
) -> ShardTiming:
    """The medians of timed iterations; with `reference_ms`, each iteration over its paired reference's ms, scaled
    by it (reference normalisation). `calls` give the median launch ms and the timer most of them used."""
    launches = [c.launch_ms for c in calls if c.launch_ms is not None]
    extra: dict[str, Any] = {
        "launch_ms": statistics.median(launches) if launches else None,
        "timer": Counter(c.timer for c in calls).most_common(1)[0][0] if calls else None,
    }
    raw_fwd, raw_bwd = statistics.median(fwd), statistics.median(bwd)
    if reference_ms is None:
        return ShardTiming(raw_fwd, raw_bwd, raw_fwd, raw_bwd, None, **extra)
    return ShardTiming(
        fwd_ms=statistics.median(f / r for f, r in zip(fwd, ref)) * reference_ms,
        bwd_ms=statistics.median(b / r for b, r in zip(bwd, ref)) * reference_ms,
        raw_fwd_ms=raw_fwd,
        raw_bwd_ms=raw_bwd,
        reference_ms=reference_ms,
        **extra,
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


def measure_shards(
    shards: Sequence[Sequence[TableSpec]],
    batch_size: int,
    *,
    device: str | torch.device | None = None,
    protocol: TimingProtocol | None = None,
    optimizer: Optimizer = "rowwise_adagrad",
    weights_precision: WeightsPrecision = "fp32",
    index_data: IndexData | None = None,
    compute_kernel: ComputeKernel = "fused",
) -> Iterator[ShardTiming]:
    """`measure_shard` of each of `shards` in turn, yielded as each is timed. On CUDA the next shard's kernel is
    built while the device runs this one's queued calls, so the host's part of building it (fbgemm's module, the
    batch's launches) hides behind them; two shards' kernels are alive at once there. On a CPU one at a time."""
    dev = resolve_device(device)
    protocol = (protocol or TimingProtocol()).for_device(dev)
    threads = protocol.num_threads if dev.type == "cpu" else None
    with _threads(threads):
        if protocol.reference_normalised and protocol.reference_ms is None:
            protocol = protocol.model_copy(update={"reference_ms": calibrate_reference(dev, protocol)})

    def build(tables: Sequence[TableSpec]) -> ShardKernel:
        return build_shard_kernel(tables, batch_size, device=dev, optimizer=optimizer,
                                  weights_precision=weights_precision, index_data=index_data,
                                  compute_kernel=compute_kernel)

    upcoming: ShardKernel | None = None
    failed: Exception | None = None  # building the next shard's kernel failed: raised at that shard's turn
    timer = Timer(dev, protocol)  # each shard its own, from the last one's hold (`successor`)
    for i, tables in enumerate(shards):
        if failed is not None:
            raise failed
        with _threads(threads):
            kernel = upcoming if upcoming is not None else build(tables)
            upcoming = None

            def build_next(after: int = i) -> None:
                nonlocal upcoming, failed
                try:
                    upcoming = build(shards[after + 1])
                except Exception as err:  # noqa: BLE001 - this shard's timing is kept; the error comes at its turn
                    failed = err

            # a cache is warmed as its kernel is built, waiting on the device: not while this shard's calls are timed
            overlap = dev.type == "cuda" and i + 1 < len(shards) and not in_host_memory(shards[i + 1])
            timer = timer.successor() if i else timer
            timing = time_with(timer, kernel, protocol, meanwhile=build_next if overlap else None)
            hit_rate = getattr(kernel, "cache_hit_rate", None)  # a ShardKernel's; stand-ins may have none
            if hit_rate is not None:
                timing = dataclasses.replace(timing, cache_hit_rate=hit_rate)
            del kernel
        yield timing


def measure_shard(
    tables: Sequence[TableSpec],
    batch_size: int,
    *,
    device: str | torch.device | None = None,
    protocol: TimingProtocol | None = None,
    optimizer: Optimizer = "rowwise_adagrad",
    weights_precision: WeightsPrecision = "fp32",
    index_data: IndexData | None = None,
    compute_kernel: ComputeKernel = "fused",
) -> ShardTiming:
    """Median forward and backward ms of the fused TBE (or the `compute_kernel`) over `tables` on `device` (CUDA or
    CPU)."""
    return next(measure_shards([tables], batch_size, device=device, protocol=protocol, optimizer=optimizer,
                               weights_precision=weights_precision, index_data=index_data,
                               compute_kernel=compute_kernel))
