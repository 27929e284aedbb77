"""The measured cost of one shard on one device: fbgemm's fused table-batched embedding kernel (TBE), or for
data-parallel tables TorchRec's dense one (`ComputeKernel`).

Forward and backward (optimizer fused into backward) are timed separately, with warm-up and the median of
N iterations after a cache flush. On CPU: a fixed thread count and the timing thread's CPU time (or
`time.perf_counter` with several threads); shared CPUs drift in speed by up to 1.5x within seconds, so each timed
iteration is paired with one iteration of a fixed reference kernel and the ratio is kept (reference normalisation,
see TimingProtocol). On CUDA: events on the stream, timed one of four ways (`TimingProtocol.cuda_timer`):
"events" records them around the host's calls, so where the host launches slower than the GPU runs (a TBE's
Python and dispatch take a few hundred microseconds) they time the launches; "held" first queues a device-side wait
longer than the host takes to launch the call, so the GPU reaches the start event with the whole call queued
behind it and the events time the kernels alone; "queued" (the default) holds the stream once for all of a
shard's calls, launched back to back behind a wait long enough to cover all their launches, so the GPU runs them
without the idle gaps of one hold per call (as "held" in about half its time: record `gpu_method_queued`);
"graph" replays the call captured as CUDA graphs (one launch). Beside the device time, each call's host launch
time (the host's time to launch forward and backward, which a training step pays once per step) is kept: where it
exceeds the device time, the shard is launch-bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, NamedTuple

import numpy as np
import torch

from shardwise.workload import Optimizer, TableSpec, WeightsPrecision

from .batches import IndexData, host_shard_batch, shard_batch, split_batch
from .hardware import import_fbgemm, resolve_device
from .protocol import CudaTimer, MeasurementSettings, TimingProtocol

log = logging.getLogger(__name__)


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

    @property
    def total_ms(self) -> float:
        """Forward plus backward ms."""
        return self.fwd_ms + self.bwd_ms


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

    def forward(self) -> torch.Tensor:
        """Pooled output [B, sum(dims)] (sum pooling)."""
        return self.tbe(self.indices, self.offsets)

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
    in its backward (`ComputeKernel`; `optimizer` and `weights_precision` are the fused kernel's)."""
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
    if dev.type == "cpu" and optimizer == "adam":
        raise ValueError("optimizer 'adam': fbgemm's CPU kernel does not support it (use sgd or rowwise_adagrad)")
    if dev.type == "cuda":
        location, compute = EmbeddingLocation.DEVICE, ComputeDevice.CUDA
    else:
        location, compute = EmbeddingLocation.HOST, ComputeDevice.CPU

    torch.manual_seed(seed)
    with _tbe_configuration_logs_hidden():
        tbe = _dense_kernel(tables, dev) if compute_kernel == "dense" else SplitTableBatchedEmbeddingBagsCodegen(
            [(t.rows, t.dim, location, compute) for t in tables],
            optimizer=getattr(EmbOptimType, _OPTIMIZERS[optimizer]),
            weights_precision=getattr(SparseType, _PRECISIONS[weights_precision]),
            learning_rate=0.01,
            device=dev,
        )
    indices, offsets = shard_batch(tables, batch_size, dev, index_data)
    # drawn on the device: at batch 65536 a 15-table shard's gradient is about 40M values, seconds on one CPU core
    generator = torch.Generator(device=dev).manual_seed(seed)
    grad = torch.randn(batch_size, sum(t.dim for t in tables), generator=generator, device=dev)
    if dev.type == "cuda":
        # fbgemm's first forward copies the table dims to the host, blocking until the device is idle: done here,
        # or a held timer's first call on the kernel waits out its own hold and is timed again behind a longer one
        # (tests/gpu checks a fresh kernel's first held call is covered by its first hold)
        with torch.no_grad():
            tbe(indices, offsets)
    return ShardKernel(tbe=tbe, indices=indices, offsets=offsets, grad_output=grad, num_tables=len(tables))


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


@lru_cache(maxsize=4)
def _flush_buffer(device: torch.device, nbytes: int) -> torch.Tensor:
    """A buffer of `nbytes`, allocated once per device (overwriting it evicts the last kernel's data)."""
    return torch.zeros(nbytes // 4, dtype=torch.float32, device=device)


class CallTiming(NamedTuple):
    """One timed forward + backward: device (or CPU) ms of each, the host's launch ms, and what timed it."""

    fwd_ms: float
    bwd_ms: float
    launch_ms: float | None  # host ms from the forward's launch to the backward's return (CUDA only)
    timer: str


#: the shortest device-side hold, and the most it is grown to per call (a hold never covers a host that waits for
#: the GPU)
_MIN_HOLD_MS, _MAX_HOLD_MS = 0.2, 50.0
#: the hold is this many times the host's last launch time (launch times vary from call to call)
_HOLD_MARGIN = 2.0
#: a queue's hold: this many times the launch lead it must cover, plus one call's launch (a sum of launches varies
#: less, relatively, than one launch)
_QUEUE_MARGIN = 1.25
#: calls retried with a longer hold when the host was still launching as the GPU reached the start event
_HOLD_RETRIES = 2
#: a timer's first hold, before it has seen the host launch (a shard's call launches in 1.0-1.2 ms on H100 hosts)
_FIRST_HOLD_MS = 1.0
#: torch.cuda._sleep's cycles for the calibration of its speed (about 1 ms on a 1-2 GHz GPU)
_CALIBRATION_CYCLES = 1_500_000


def cuda_sleep_available() -> bool:
    """Whether this torch has the device-side wait the held timer queues (`torch.cuda._sleep`, private)."""
    return callable(getattr(torch.cuda, "_sleep", None))


@lru_cache(maxsize=8)
def _sleep_cycles_per_ms(device: torch.device) -> float:
    """How many `torch.cuda._sleep` cycles make a millisecond on `device` (median of 5 timed sleeps)."""
    with torch.cuda.device(device):
        per_ms = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(_CALIBRATION_CYCLES)
            end.record()
            end.synchronize()
            per_ms.append(_CALIBRATION_CYCLES / max(start.elapsed_time(end), 1e-3))
    return statistics.median(per_ms)


@dataclass
class _Graphs:
    """A kernel's forward and backward captured as CUDA graphs (backward from the forward's saved tensors)."""

    forward: Any  # torch.cuda.CUDAGraph
    backward: Any
    launch_ms: float  # the host's launch ms of the eager calls before the capture (what training pays)


class _Launch(NamedTuple):
    """One call as launched: its events (before forward, between, after backward) and the host's clock around the
    launches."""

    start: Any  # torch.cuda.Event
    mid: Any
    end: Any
    t0: float
    t1: float

    def timing(self, timer: str, launch_ms: float | None = None) -> CallTiming:
        """The call's device ms, once the device has passed `end`, and the host's launch ms (or `launch_ms`)."""
        launch = (self.t1 - self.t0) * 1e3 if launch_ms is None else launch_ms
        return CallTiming(self.start.elapsed_time(self.mid), self.mid.elapsed_time(self.end), launch, timer)


class _Timer:
    """Forward/backward time of one kernel iteration: on CUDA the device's (`TimingProtocol.cuda_timer`), on CPU
    the protocol's clock; a cache flush before every call."""

    def __init__(self, device: torch.device, protocol: TimingProtocol, hold_ms: float = _FIRST_HOLD_MS) -> None:
        """`protocol` as decided for `device` (`TimingProtocol.for_device`); `hold_ms` the first call's hold
        (`successor` carries a timer's over to the next shard's)."""
        self.device = device
        self.protocol = protocol
        self.clock = time.thread_time if protocol.clock == "thread" else time.perf_counter
        self.clock_name = protocol.clock or "wall"
        self.flush_buffer: torch.Tensor | None = None
        if protocol.flush_cache and protocol.flush_bytes:
            self.flush_buffer = _flush_buffer(device, protocol.flush_bytes)
        self.cuda_timer: CudaTimer = protocol.cuda_timer or "held"
        if device.type == "cuda" and self.cuda_timer != "events" and not cuda_sleep_available():
            log.warning("torch %s has no torch.cuda._sleep: timing with CUDA events around the launches "
                        "(cuda_timer 'events'), which time the host where it launches slower than the GPU runs",
                        torch.__version__)
            self.cuda_timer = "events"
        self.hold_ms = hold_ms  # grown or shrunk to the host's launch time, call by call
        self.hold_futile = False  # set when no hold covered a call: the host waits on the GPU inside it
        #: calls the hold did not cover even after its retries (the host waited on the GPU, or launched for longer)
        self.uncovered = 0
        self.held_calls = 0
        #: calls launched again behind a longer hold (each one more call on the device; a queue counts its calls)
        self.retried = 0
        # per kernel (by id, the kernel kept alive beside it): its graphs, or why they could not be captured
        self.graphs: dict[int, tuple[ShardKernel, _Graphs | str]] = {}

    def successor(self) -> _Timer:
        """A timer for the next shard, starting from the hold this one learned (a new one would start from
        _FIRST_HOLD_MS, shorter than an H100 host's launch of a call, and time its first call twice); its own
        fallbacks (a queue timed call by call, a futile hold) start afresh."""
        return _Timer(self.device, self.protocol, _FIRST_HOLD_MS if self.hold_futile else self.hold_ms)

    def run(self, kernel: ShardKernel) -> tuple[float, float]:
        """(fwd_ms, bwd_ms) of one forward + backward (with the fused optimizer update)."""
        timed = self.call(kernel)
        return timed.fwd_ms, timed.bwd_ms

    def call(self, kernel: ShardKernel) -> CallTiming:
        """One forward + backward (with the fused optimizer update), timed."""
        if self.device.type != "cuda":
            self._flush()
            t0 = self.clock()
            out = kernel.forward()
            t1 = self.clock()
            out.backward(kernel.grad_output)
            t2 = self.clock()
            return CallTiming((t1 - t0) * 1e3, (t2 - t1) * 1e3, None, self.clock_name)
        if self.cuda_timer == "events":
            return self._events(kernel)
        if self.cuda_timer == "graph":
            graphs = self._graphs(kernel)
            if isinstance(graphs, _Graphs):
                return self._held(kernel, graphs)
        return self._held(kernel, None)

    def calls(self, kernel: ShardKernel, n: int, meanwhile: Callable[[], None] | None = None) -> list[CallTiming]:
        """`n` forward + backward calls, timed in turn. With the queued timer on CUDA the first is timed held on
        its own (it allocates, and tells the host's launch time and the device's time of a call), the rest are
        launched back to back behind one hold (`_queued`); otherwise `call` n times. `meanwhile` runs once: while
        the device runs the queued calls, else after the calls."""
        if self.device.type != "cuda" or self.cuda_timer != "queued" or n < 2:
            timed = [self.call(kernel) for _ in range(n)]
        else:
            first = self._held(kernel, None)
            if self.cuda_timer != "queued":  # the hold failed: the timer fell back to events
                timed = [first, *(self.call(kernel) for _ in range(n - 1))]
            else:
                return [first, *self._queued(kernel, n - 1, first, meanwhile)]
        if meanwhile is not None:
            meanwhile()
        return timed

    def _flush(self) -> None:
        if self.flush_buffer is not None:
            self.flush_buffer.add_(1.0)

    def _launch(self, kernel: ShardKernel, graphs: _Graphs | None = None) -> _Launch:
        """Flush, then launch one forward + backward (eager, or the graphs' replays) between three events."""
        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        self._flush()
        start.record()
        t0 = time.perf_counter()
        if graphs is None:
            out = kernel.forward()
            mid.record()
            out.backward(kernel.grad_output)
        else:
            graphs.forward.replay()
            mid.record()
            graphs.backward.replay()
        t1 = time.perf_counter()
        end.record()
        return _Launch(start, mid, end, t0, t1)

    def _events(self, kernel: ShardKernel) -> CallTiming:
        """Events recorded around the host's calls: the GPU may reach `start` before the work is launched."""
        call = self._launch(kernel)
        torch.cuda.synchronize(self.device)
        return call.timing("events")

    def _held(self, kernel: ShardKernel, graphs: _Graphs | None) -> CallTiming:
        """The stream held behind a device-side wait while the host launches the call (eager, or the graphs'
        replays), so the events between the launches time the device's work alone. A call whose launches outlast
        the hold is timed again with a longer one."""
        for attempt in range(_HOLD_RETRIES + 1):
            held = torch.cuda.Event(enable_timing=True)
            t_hold = time.perf_counter()
            held.record()
            if not self._hold(self.hold_ms):
                return self._events(kernel)
            call = self._launch(kernel, graphs)
            torch.cuda.synchronize(self.device)
            # covered: the GPU was still in the hold (and flush) when the host had launched everything
            host_ms = (call.t1 - t_hold) * 1e3
            covered = host_ms <= held.elapsed_time(call.start)
            if not self.hold_futile:
                self.hold_ms = min(max(_HOLD_MARGIN * host_ms, _MIN_HOLD_MS), _MAX_HOLD_MS)
            if covered or self.hold_futile or attempt == _HOLD_RETRIES:
                break
            self.retried += 1
        self.held_calls += 1
        if not covered:
            self.uncovered += 1
            if not self.hold_futile:
                # a host that waits on the GPU within the call (a sync) outlasts any hold: holding only adds time
                log.warning("cuda_timer: the host's launches outlasted a %.1f ms device-side hold %d times in a row; "
                            "holding the stream no longer (a host sync inside the kernel's call?)", self.hold_ms,
                            _HOLD_RETRIES + 1)
                self.hold_futile, self.hold_ms = True, _MIN_HOLD_MS
        if graphs is not None:
            return call.timing("graph", graphs.launch_ms)
        return call.timing("held")

    def _queued(self, kernel: ShardKernel, n: int, first: CallTiming,
                meanwhile: Callable[[], None] | None = None) -> list[CallTiming]:
        """`n` calls launched back to back behind one device-side hold, each between its own flush and events.
        The hold covers the lead the host needs: one call's launch, and where launching a call takes longer than
        running it (`first` tells both), the gap that grows by their difference with every call. A call is covered
        when the GPU reached its start event after the host had launched it; where one is not, all are timed again
        behind a longer hold, and where even that fails (a host that waits on the GPU inside a call) call by call,
        held. `meanwhile` runs once, after the first launches and before waiting for the device: host work (and
        device work queued after the calls' last event) that does not touch the timings."""
        launch, work = first.launch_ms or 0.0, first.fwd_ms + first.bwd_ms
        hold = _QUEUE_MARGIN * (launch + max(0.0, (n - 1) * (launch - work))) + launch
        for _ in range(_HOLD_RETRIES + 1):
            hold = min(max(hold, _MIN_HOLD_MS), _MAX_HOLD_MS * n)
            used = hold
            held = torch.cuda.Event(enable_timing=True)
            t_hold = time.perf_counter()
            held.record()
            if not self._hold(hold):
                return [self._events(kernel) for _ in range(n)]
            calls = [self._launch(kernel) for _ in range(n)]
            if meanwhile is not None:
                meanwhile()
                meanwhile = None
            torch.cuda.synchronize(self.device)
            # how long before each call's start event the GPU would have been idle; the least of them, if negative,
            # is how much longer the hold had to be
            slack = min(held.elapsed_time(call.start) - (call.t1 - t_hold) * 1e3 for call in calls)
            if slack >= 0:
                self.held_calls += n
                return [call.timing("queued") for call in calls]
            hold = _HOLD_MARGIN * (hold - slack)
            self.retried += n
        log.warning("cuda_timer 'queued': the host's launches outlasted a %.1f ms hold of %d calls %d times in a row; "
                    "timing them call by call (cuda_timer 'held')", used, n, _HOLD_RETRIES + 1)
        self.cuda_timer = "held"
        return [self._held(kernel, None) for _ in range(n)]

    def _hold(self, ms: float) -> bool:
        """Queue a device-side wait of `ms`; where it fails (a private torch function), False, and this timer
        times with events from then on, saying so."""
        try:
            torch.cuda._sleep(max(1, int(ms * _sleep_cycles_per_ms(self.device))))
        except Exception as err:  # noqa: BLE001 - any failure of the wait: time as before, named in the rows
            log.warning("cuda_timer %r: the device-side wait failed (%s: %s); timing with CUDA events around the "
                        "launches instead", self.cuda_timer, type(err).__name__, _first_line(err))
            self.cuda_timer = "events"
            return False
        return True

    def _graphs(self, kernel: ShardKernel) -> _Graphs | str:
        """The kernel's captured graphs, captured on first use; where capture fails, the reason (logged once per
        kernel), and the held timer times it eagerly instead."""
        if id(kernel) not in self.graphs:
            captured = _capture(kernel, self.device)
            if isinstance(captured, str):
                log.warning("cuda_timer 'graph': %s; timing this kernel with the held stream instead", captured)
            self.graphs[id(kernel)] = (kernel, captured)
        return self.graphs[id(kernel)][1]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else "no message"


def _capture(kernel: ShardKernel, device: torch.device) -> _Graphs | str:
    """Forward and backward captured as two CUDA graphs sharing one memory pool (as make_graphed_callables
    does); the reason where this torch or kernel cannot be captured (fbgemm's fused optimizer, a host sync)."""
    graph_type = getattr(torch.cuda, "CUDAGraph", None)
    if graph_type is None or not hasattr(torch.cuda, "graph"):
        return f"torch {torch.__version__} has no CUDA graphs"
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        launches = []
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants
            for _ in range(3):
                t0 = time.perf_counter()
                out = kernel.forward()
                out.backward(kernel.grad_output)
                launches.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        forward, backward = graph_type(), graph_type()
        with torch.cuda.graph(forward):
            out = kernel.forward()
        with torch.cuda.graph(backward, pool=forward.pool()):
            out.backward(kernel.grad_output)
        torch.cuda.synchronize(device)
    except Exception as err:  # noqa: BLE001 - any capture failure falls back, naming it
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(device)
        return f"capture failed ({type(err).__name__}: {_first_line(err)})"
    return _Graphs(forward, backward, statistics.median(launches))


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
        for _ in range(max(protocol.warmup_calls, 3)):
            timer.run(kernel)
        return statistics.median(sum(timer.run(kernel)) for _ in range(protocol.calibration_runs))


def time_kernel(kernel: ShardKernel, device: torch.device, protocol: TimingProtocol,
                meanwhile: Callable[[], None] | None = None) -> ShardTiming:
    """Time a built kernel under `protocol` (`reference_ms` set when normalised). `meanwhile` runs once, while the
    device runs the timed calls where it can (CUDA's queued timer), else after them."""
    protocol = protocol.for_device(device)
    return _time_with(timer=_Timer(device, protocol), kernel=kernel, protocol=protocol, meanwhile=meanwhile)


def _time_with(timer: _Timer, kernel: ShardKernel, protocol: TimingProtocol,
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
    timer = _Timer(dev, protocol)  # each shard its own, from the last one's hold (`successor`)
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

            overlap = dev.type == "cuda" and i + 1 < len(shards)
            timer = timer.successor() if i else timer
            timing = _time_with(timer, kernel, protocol, meanwhile=build_next if overlap else None)
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
