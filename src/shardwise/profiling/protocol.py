"""How shards are timed: the TimingProtocol the profiler, the evaluator and the benchmarks share, and
MeasurementSettings, the one value that says how a plan is measured (device, protocol, rounds, batch)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from .devices import DeviceName

if TYPE_CHECKING:
    import torch

# Defaults of a plan measurement, each tied to what it was measured against:
#: interleaved kernel timings per device shard, median per device: one timing swings on a shared CPU, and 9
#: keep two plans' cost ratio steady between sessions where 3 let the slowest device's unlucky median move it
#: (record `measurement_noise`)
COMPUTE_ROUNDS = 9
#: timed all-to-all iterations per round, and interleaved rounds (per device: median of rounds x iterations)
COMM_ITERS = 20
COMM_ROUNDS = 5
#: how each device's all-to-all is priced from the exchanges measured together: "width", a straight line in the
#: device's pooled width fitted over every device of the layouts measured together; "measured", each device's own
#: median. The part that follows the width repeats between sessions and the rest mostly does not, so the line
#: steadies two plans' cost ratio (records `comm_estimator`, `measurement_noise`)
CommPricing = Literal["width", "measured"]
#: the largest cache flush on a CPU: twice the last-level cache up to a 32 MiB one (a GPU's flush is twice its
#: L2). A server CPU reports the whole socket's L3 to a process that gets a few cores' share of it, and
#: flushing twice that made timing slow for little change in the figures (records `shard_timing_flush`,
#: `newcomer`). The profiler, the evaluator and refinement all time with the same flush
MAX_CPU_FLUSH_BYTES = 64 * 2**20
#: how a CUDA device times a call (kernel.py's Timer): "events" around the host's launches (the GPU reaches the
#: start event before the host has launched the work, so where launching is slower than running, as for a TBE at
#: batch 2048, they time the launches), "held" (the stream held behind a device-side wait that covers the host's
#: launches, so the events time the kernels), "queued" (a shard's calls launched back to back behind one such wait
#: that covers all their launches: the same device time without an idle hold per call), "graph" (the call captured
#: as CUDA graphs and replayed, behind the same hold; a kernel that cannot be captured, fbgemm's TBE among them, is
#: timed held, and says so in its timings' `timer`)
CudaTimer = Literal["events", "held", "queued", "graph"]
#: the CUDA timer where the protocol names none: "events" time the host's launch at small batches, and "queued"
#: reads as "held" in about half the wall time (records `gpu_method`, `gpu_method_queued`)
DEFAULT_CUDA_TIMER: CudaTimer = "queued"
#: warm-up calls per shard where the protocol names none: a CPU's caches, thread pool and clock settle over a few;
#: on CUDA the first call (timed held on its own: it allocates the call's buffers) is the one warm-up needed
#: (record `gpu_method_queued`: 3 read as 1)
DEFAULT_WARMUP_ITERS = {"cpu": 3, "cuda": 1}

#: the option's help, where a command offers the choice
CUDA_TIMER_HELP = (f"how a GPU times a kernel call (default {DEFAULT_CUDA_TIMER}): held (the stream held behind a "
                   "device-side wait while the host launches the call), queued (a shard's calls launched together "
                   "behind one wait), graph, or events (around the launches: times the host where it launches "
                   "slower than the GPU runs); not used on a CPU")


class TimingProtocol(BaseModel):
    """How a shard is timed; the profiler, the evaluator and the benchmarks must use the same one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: None: DEFAULT_WARMUP_ITERS of the device
    warmup_iters: int | None = Field(default=None, ge=0)
    iters: int = Field(default=10, ge=1)
    #: pair each timed iteration with the reference kernel and keep the ratio; None: on for CPU, off for CUDA
    reference_normalised: bool | None = None
    #: CPU threads while timing (one device = `num_threads` cores); None keeps torch's current setting
    num_threads: int | None = Field(default=1, ge=1)
    #: CPU clock: "wall" (time.perf_counter) or "thread" (time.thread_time: the CPU time of the timing thread,
    #: which excludes time the scheduler gave to other processes on a shared machine; exact for a kernel that
    #: runs in this thread, i.e. num_threads == 1). None: "thread" when num_threads == 1, else "wall".
    #: CUDA times with events on the device (`cuda_timer`).
    clock: Literal["wall", "thread"] | None = None
    #: how CUDA times a call (see CudaTimer); None: DEFAULT_CUDA_TIMER on CUDA, and nothing on CPU (which times
    #: with `clock`, so a CPU dataset's stored settings carry no CUDA timer)
    cuda_timer: CudaTimer | None = None
    #: overwrite a buffer before every timed kernel call, so each call starts cold as in training (where dense
    #: layers and communication run in between) and the reference kernel sees the same cache state when
    #: calibrated as when paired with a shard
    flush_cache: bool = True
    #: the flush's size; None: twice the last-level cache (GPU L2; CPU L3, at most MAX_CPU_FLUSH_BYTES)
    flush_bytes: int | None = Field(default=None, ge=0)
    #: the reference kernel's calibrated fwd+bwd ms; None: calibrate once on first use (then reuse it)
    reference_ms: float | None = Field(default=None, gt=0)
    calibration_runs: int = Field(default=60, ge=1)

    def for_device(self, device: str | torch.device | None) -> TimingProtocol:
        """This protocol with its automatic choices made for `device` (warm-up calls; normalisation: CPU on, CUDA
        off; the clock; the flush's size)."""
        # torch loads where a device is asked about: the settings alone (a command's options) do without it
        from .hardware import last_level_cache_bytes, resolve_device

        on_cpu = resolve_device(device).type == "cpu"
        update: dict[str, object] = {}
        if self.warmup_iters is None:
            update["warmup_iters"] = DEFAULT_WARMUP_ITERS["cpu" if on_cpu else "cuda"]
        if self.reference_normalised is None:
            update["reference_normalised"] = on_cpu
        if self.clock is None:
            update["clock"] = "thread" if on_cpu and self.num_threads == 1 else "wall"
        if self.flush_bytes is None:
            twice = 2 * last_level_cache_bytes(device)
            update["flush_bytes"] = min(twice, MAX_CPU_FLUSH_BYTES) if on_cpu else twice
        if on_cpu and self.cuda_timer is not None:
            update["cuda_timer"] = None
        elif not on_cpu and self.cuda_timer is None:
            update["cuda_timer"] = DEFAULT_CUDA_TIMER
        return self.model_copy(update=update) if update else self

    @property
    def warmup_calls(self) -> int:
        """Warm-up calls per shard, as decided for a device (`for_device`)."""
        if self.warmup_iters is None:
            raise ValueError("warmup_iters: decide it for a device first (TimingProtocol.for_device)")
        return self.warmup_iters

    def settings_json(self) -> str:
        """The settings stored with every row (without the calibrated `reference_ms`, stored on its own; without
        `cuda_timer` where none applies)."""
        exclude = {"reference_ms"} | ({"cuda_timer"} if self.cuda_timer is None else set())
        return json.dumps(self.model_dump(exclude=exclude), sort_keys=True)


class MeasurementSettings(BaseModel):
    """How plans are measured on hardware: one frozen value for `evaluate`, `benchmark`, the measured-cost
    greedy and the pipeline's evaluate step (the only home of these defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: DeviceName = Field(default=None, description="cpu, cuda, cuda:N (default: cuda when present)")
    batch_size: int | None = Field(
        default=None, ge=1, description="measure at this batch (default: the cost model's, else the task's)"
    )
    warmup_iters: int | None = Field(
        default=None, ge=0,
        description=f"kernel warm-up iterations per shard (default: {DEFAULT_WARMUP_ITERS['cpu']} on a CPU, "
        f"{DEFAULT_WARMUP_ITERS['cuda']} on a GPU)",
    )
    timing_iters: int = Field(
        default=TimingProtocol.model_fields["iters"].default, ge=1, description="timed kernel iterations per shard"
    )
    timing_rounds: int = Field(
        default=COMPUTE_ROUNDS, ge=1, description="interleaved kernel timings per shard (per device: their median)"
    )
    comm_iters: int = Field(default=COMM_ITERS, ge=1, description="timed all-to-all iterations per round")
    comm_rounds: int = Field(
        default=COMM_ROUNDS, ge=1,
        description="interleaved all-to-all rounds (per device: median of rounds x iterations)",
    )
    comm_pricing: CommPricing = Field(
        default="width",
        description="each device's all-to-all: a line in its pooled width fitted over the devices measured "
        "together (width), or its own median (measured)",
    )
    reference_ms: float | None = Field(
        default=None, gt=0, description="reference kernel ms to normalise by (default: the model's, else calibrate)"
    )
    cuda_timer: CudaTimer | None = Field(default=None, description=CUDA_TIMER_HELP)
    flush_mib: int | None = Field(
        default=None, ge=0,
        description=f"MiB overwritten before every timed kernel call (0: none; default: twice the last-level "
        f"cache, at most {MAX_CPU_FLUSH_BYTES // 2**20} on a CPU)",
    )

    def protocol(self) -> TimingProtocol:
        """The kernel timing protocol these settings ask for (reference pinned when `reference_ms` is set)."""
        protocol = TimingProtocol(warmup_iters=self.warmup_iters, iters=self.timing_iters,
                                  reference_ms=self.reference_ms, cuda_timer=self.cuda_timer)
        if self.flush_mib is None:
            return protocol
        return protocol.model_copy(update={"flush_cache": self.flush_mib > 0, "flush_bytes": self.flush_mib * 2**20})

    def for_cost_model(self, reference_ms: float | None, batch_size: int | None) -> MeasurementSettings:
        """Time as a cost model's training data was: its reference and batch, unless set here."""
        return self.model_copy(update={
            "reference_ms": self.reference_ms if self.reference_ms is not None else reference_ms,
            "batch_size": self.batch_size if self.batch_size is not None else batch_size,
        })
