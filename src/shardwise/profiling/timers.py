"""How one forward + backward of a shard's kernel is timed (`Timer`), with a cache flush before every call: on CPU
the protocol's clock; on CUDA events on the stream, timed one of four ways (`TimingProtocol.cuda_timer`):
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
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import torch

from .protocol import CudaTimer, TimingProtocol
from .tbe import ShardKernel

#: the timers log as the kernel benchmark they serve (`kernel.py`): one logger to raise or silence
log = logging.getLogger("shardwise.profiling.kernel")


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
MIN_HOLD_MS, MAX_HOLD_MS = 0.2, 50.0
#: the hold is this many times the host's last launch time (launch times vary from call to call)
_HOLD_MARGIN = 2.0
#: a queue's hold: this many times the launch lead it must cover, plus one call's launch (a sum of launches varies
#: less, relatively, than one launch)
_QUEUE_MARGIN = 1.25
#: calls retried with a longer hold when the host was still launching as the GPU reached the start event
_HOLD_RETRIES = 2
#: a timer's first hold, before it has seen the host launch (a shard's call launches in 1.0-1.2 ms on H100 hosts)
FIRST_HOLD_MS = 1.0
#: torch.cuda._sleep's cycles for the calibration of its speed (about 1 ms on a 1-2 GHz GPU)
_CALIBRATION_CYCLES = 1_500_000


def cuda_sleep_available() -> bool:
    """Whether this torch has the device-side wait the held timer queues (`torch.cuda._sleep`, private)."""
    return callable(getattr(torch.cuda, "_sleep", None))


@lru_cache(maxsize=8)
def sleep_cycles_per_ms(device: torch.device) -> float:
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


class Timer:
    """Forward/backward time of one kernel iteration: on CUDA the device's (`TimingProtocol.cuda_timer`), on CPU
    the protocol's clock; a cache flush before every call."""

    def __init__(self, device: torch.device, protocol: TimingProtocol, hold_ms: float = FIRST_HOLD_MS) -> None:
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

    def successor(self) -> Timer:
        """A timer for the next shard, starting from the hold this one learned (a new one would start from
        FIRST_HOLD_MS, shorter than an H100 host's launch of a call, and time its first call twice); its own
        fallbacks (a queue timed call by call, a futile hold) start afresh."""
        return type(self)(self.device, self.protocol, FIRST_HOLD_MS if self.hold_futile else self.hold_ms)

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
                self.hold_ms = min(max(_HOLD_MARGIN * host_ms, MIN_HOLD_MS), MAX_HOLD_MS)
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
                self.hold_futile, self.hold_ms = True, MIN_HOLD_MS
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
            hold = min(max(hold, MIN_HOLD_MS), MAX_HOLD_MS * n)
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
            torch.cuda._sleep(max(1, int(ms * sleep_cycles_per_ms(self.device))))
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
