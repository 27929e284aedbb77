"""Measured plan records: each device's measured cost, the plan's (`shardwise.measured/v2`), plans measured
together compared (`shardwise.comparison/v1`), and their JSON; a plan's DLRM training throughput (`dlrm` measures it).
Apart from the measuring (torch): a job's results are declared without it."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shardwise.profiling import CommPricing

#: v2: each device's own all-to-all medians before pricing are required
MEASURED_FORMAT = "shardwise.measured/v2"
COMPARISON_FORMAT = "shardwise.comparison/v1"


class DeviceCost(BaseModel):
    """One device's measured cost for one training iteration, and the memory its shard holds."""

    model_config = ConfigDict(frozen=True)

    device: int
    shards: tuple[str, ...]  # shard names ("t3", "t7[0:32]")
    width: int  # pooled output width on this device (sum of shard dims)
    fwd_ms: float
    bwd_ms: float
    comm_fwd_ms: float  # as priced (the measurement's `timing["comm_pricing"]`)
    comm_bwd_ms: float
    memory_bytes: int
    #: the device's own median all-to-all ms, before pricing (equal to comm_fwd_ms, comm_bwd_ms when unpriced)
    comm_fwd_measured_ms: float
    comm_bwd_measured_ms: float
    #: the host's median ms to launch the shard's forward and backward (CUDA; None on CPU)
    launch_ms: float | None = None
    #: the plan's data-parallel tables' gradient all-reduce, the same on every device (their kernel on the local
    #: batch is in fwd_ms and bwd_ms, their names in `shards`); 0 without data-parallel tables
    all_reduce_ms: float = 0.0
    #: the plan's row-wise tables' collectives, the same on every device: their outputs' reduce-scatter, their
    #: gradients' all-gather and their ids' all-to-all (their kernel on the device's row blocks is in fwd_ms and
    #: bwd_ms, the blocks' names in `shards`); 0 without row-wise tables
    row_wise_comm_ms: float = 0.0

    @property
    def compute_ms(self) -> float:
        """Forward plus backward kernel time."""
        return self.fwd_ms + self.bwd_ms

    @property
    def launch_bound(self) -> bool:
        """Whether the host takes longer to launch the device's kernels than the device takes to run them: a
        training step on it then waits for the host, whatever the plan puts there."""
        return self.launch_ms is not None and self.launch_ms > self.compute_ms

    @property
    def comm_ms(self) -> float:
        """Forward plus backward all-to-all time."""
        return self.comm_fwd_ms + self.comm_bwd_ms

    @property
    def total_ms(self) -> float:
        """Forward + backward + forward all-to-all + backward all-to-all (+ the data-parallel all-reduce)."""
        return self.compute_ms + self.comm_ms + self.all_reduce_ms + self.row_wise_comm_ms

    @property
    def own_comm_fwd_bwd_ms(self) -> tuple[float, float]:
        """The device's own median forward and backward all-to-all ms, before any pricing."""
        return self.comm_fwd_measured_ms, self.comm_bwd_measured_ms


class MeasuredPlanCost(BaseModel):
    """A plan's measured per-device costs; the plan costs what its slowest device costs."""

    model_config = ConfigDict(frozen=True)

    format: str = MEASURED_FORMAT
    method: str
    batch_size: int
    device_kind: str  # "cpu" / "cuda"
    hardware_kind: str
    device_memory_bytes: int
    timing: dict[str, Any] = Field(default_factory=dict)
    reference_ms: float | None = None
    devices: tuple[DeviceCost, ...]
    #: the tables replicated on every device
    data_parallel: tuple[str, ...] = ()
    #: the tables split by rows over every device
    row_wise: tuple[str, ...] = ()

    @field_validator("format")
    @classmethod
    def _current_format(cls, value: str) -> str:
        if value != MEASURED_FORMAT:
            raise ValueError(f"field 'format' must be {MEASURED_FORMAT!r}, got {value!r} (a measurement by another "
                             "shardwise version: measure the plan again with `shardwise evaluate`)")
        return value

    @property
    def max_cost_ms(self) -> float:
        """The plan's cost: the slowest device's total."""
        return max(d.total_ms for d in self.devices)

    @property
    def max_compute_ms(self) -> float:
        """The slowest device's kernel time alone (fwd + bwd), without the all-to-all."""
        return max(d.compute_ms for d in self.devices)

    @property
    def mean_cost_ms(self) -> float:
        """Mean per-device total."""
        return sum(d.total_ms for d in self.devices) / len(self.devices)

    @property
    def imbalance(self) -> float:
        """max / mean of the per-device totals (1.0 is perfectly balanced)."""
        mean = self.mean_cost_ms
        return self.max_cost_ms / mean if mean > 0 else 1.0

    @property
    def comm_pricing(self) -> CommPricing:
        """How each device's all-to-all was priced (a timing that names no pricing priced none: each device's own
        median)."""
        return "width" if self.timing.get("comm_pricing") == "width" else "measured"

    @property
    def max_memory_bytes(self) -> int:
        """The fullest device's memory."""
        return max(d.memory_bytes for d in self.devices)

    @property
    def own_comm_max_cost_ms(self) -> float:
        """The plan cost with each device's all-to-all its own median, before any pricing."""
        return max(d.compute_ms + sum(d.own_comm_fwd_bwd_ms) + d.all_reduce_ms + d.row_wise_comm_ms
                   for d in self.devices)

    @property
    def memory_headroom(self) -> float:
        """Fraction of the per-device cap left free on the fullest device."""
        return 1.0 - self.max_memory_bytes / self.device_memory_bytes

    @property
    def launch_bound_devices(self) -> tuple[int, ...]:
        """The devices whose kernels the host launches slower than they run (CUDA measurements only)."""
        return tuple(d.device for d in self.devices if d.launch_bound)

    def to_json(self) -> dict[str, Any]:
        """The `shardwise.measured/v2` document, with the derived totals for readers."""
        doc = self.model_dump(mode="json")
        doc.update(
            max_cost_ms=self.max_cost_ms,
            max_compute_ms=self.max_compute_ms,
            mean_cost_ms=self.mean_cost_ms,
            imbalance=self.imbalance,
            memory_headroom=self.memory_headroom,
            launch_bound_devices=list(self.launch_bound_devices),
        )
        for dev, row in zip(self.devices, doc["devices"]):
            row["total_ms"] = dev.total_ms
        return doc

    def table(self) -> str:
        """A per-device text table (what `shardwise evaluate` prints)."""
        head = f"{'device':>6} {'shards':>6} {'width':>6} {'fwd_ms':>9} {'bwd_ms':>9} {'a2a_fwd':>9} {'a2a_bwd':>9} {'total_ms':>9} {'mem_GiB':>8}"
        lines = [head]
        for d in self.devices:
            lines.append(
                f"{d.device:>6} {len(d.shards):>6} {d.width:>6} {d.fwd_ms:>9.3f} {d.bwd_ms:>9.3f} "
                f"{d.comm_fwd_ms:>9.3f} {d.comm_bwd_ms:>9.3f} {d.total_ms:>9.3f} {d.memory_bytes / 2**30:>8.3f}"
            )
        lines.append(
            f"plan ({self.method}): max {self.max_cost_ms:.3f} ms, mean {self.mean_cost_ms:.3f} ms, "
            f"imbalance {self.imbalance:.3f}, memory headroom {self.memory_headroom:.1%} "
            f"(batch {self.batch_size}, {self.hardware_kind})"
        )
        if self.data_parallel:
            lines.append(
                f"data-parallel on every device: {', '.join(self.data_parallel)} (their kernel on the local batch in "
                f"fwd_ms / bwd_ms, their gradient all-reduce {self.devices[0].all_reduce_ms:.3f} ms in total_ms)"
            )
        if self.row_wise:
            lines.append(
                f"row-wise over every device: {', '.join(self.row_wise)} (the kernel on each device's row blocks in "
                f"fwd_ms / bwd_ms, their collectives {self.devices[0].row_wise_comm_ms:.3f} ms in total_ms)"
            )
        if self.launch_bound_devices:
            worst = max((d for d in self.devices if d.launch_bound), key=lambda d: d.launch_ms or 0.0)
            lines.append(
                f"launch-bound: device(s) {', '.join(map(str, self.launch_bound_devices))}: the host takes longer to "
                f"launch their kernels than the device runs them (device {worst.device}: {worst.launch_ms:.3f} ms "
                f"to launch, {worst.compute_ms:.3f} ms to run); a larger per-device batch, not another plan, "
                "speeds them up"
            )
        return "\n".join(lines)


def save_measured(cost: MeasuredPlanCost, path: str | Path) -> Path:
    """Write a measured plan cost as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cost.to_json(), indent=1))
    return path


def describe_comm_pricing(pricing: CommPricing) -> str:
    """How each device's all-to-all was priced, in words (reports and tables)."""
    if pricing == "width":
        return "each device's all-to-all priced by a line in its pooled width fitted over the devices measured together"
    return "each device's all-to-all its own median"


class PlanComparisonRow(BaseModel):
    """One plan's line in a comparison of plans measured in the same session."""

    model_config = ConfigDict(frozen=True)

    name: str
    method: str
    max_cost_ms: float
    max_compute_ms: float
    max_comm_ms: float
    mean_cost_ms: float
    imbalance: float
    memory_headroom: float
    ratio_to_first: float  # max_cost_ms / the first plan's (below 1: cheaper than the first plan)
    predicted_max_cost_ms: float | None = None


class PlanComparison(BaseModel):
    """Plans of one task measured in one session (same reference timing, same all-to-all process group)."""

    model_config = ConfigDict(frozen=True)

    format: str = COMPARISON_FORMAT
    batch_size: int
    hardware_kind: str
    reference_ms: float | None
    compute_rounds: int
    comm_iters: int
    comm_rounds: int
    comm_pricing: CommPricing = "measured"
    plans: tuple[PlanComparisonRow, ...]

    def row(self, name: str) -> PlanComparisonRow:
        """The row of plan `name`."""
        for r in self.plans:
            if r.name == name:
                return r
        raise KeyError(f"no plan named {name!r} in the comparison; plans: {[r.name for r in self.plans]}")

    def table(self) -> str:
        """A text table, one line per plan (what `shardwise evaluate` prints for several plans)."""
        lines = [
            f"{'plan':<20} {'method':<14} {'max_ms':>9} {'compute':>9} {'a2a':>9} {'imbal':>7} {'headroom':>8} "
            f"{'vs_first':>8} {'predicted':>9}"
        ]
        for r in self.plans:
            predicted = "-" if r.predicted_max_cost_ms is None else f"{r.predicted_max_cost_ms:.3f}"
            lines.append(
                f"{r.name:<20} {r.method:<14} {r.max_cost_ms:>9.3f} {r.max_compute_ms:>9.3f} {r.max_comm_ms:>9.3f} "
                f"{r.imbalance:>7.3f} {r.memory_headroom:>8.1%} {r.ratio_to_first:>8.3f} {predicted:>9}"
            )
        lines.append(
            f"measured in one session: batch {self.batch_size}, {self.hardware_kind}, reference_ms "
            f"{'-' if self.reference_ms is None else format(self.reference_ms, '.4f')}; medians of "
            f"{self.compute_rounds} interleaved kernel timings and {self.comm_rounds} interleaved rounds x "
            f"{self.comm_iters} all-to-alls per device, {describe_comm_pricing(self.comm_pricing)}"
        )
        return "\n".join(lines)


def compare_measured(
    named: Sequence[tuple[str, MeasuredPlanCost]],
    *,
    predicted_max_ms: Sequence[float | None] | None = None,
) -> PlanComparison:
    """The comparison of plans measured together (`measure_plans`); ratios are to the first plan."""
    if not named:
        raise ValueError("plans: nothing to compare")
    first = named[0][1].max_cost_ms
    predicted = list(predicted_max_ms) if predicted_max_ms is not None else [None] * len(named)
    rows = tuple(
        PlanComparisonRow(
            name=name,
            method=cost.method,
            max_cost_ms=cost.max_cost_ms,
            max_compute_ms=cost.max_compute_ms,
            max_comm_ms=max(d.comm_ms for d in cost.devices),
            mean_cost_ms=cost.mean_cost_ms,
            imbalance=cost.imbalance,
            memory_headroom=cost.memory_headroom,
            ratio_to_first=cost.max_cost_ms / first if first > 0 else float("nan"),
            predicted_max_cost_ms=p,
        )
        for (name, cost), p in zip(named, predicted)
    )
    ref = named[0][1]
    return PlanComparison(
        batch_size=ref.batch_size,
        hardware_kind=ref.hardware_kind,
        reference_ms=ref.reference_ms,
        compute_rounds=int(ref.timing.get("compute_rounds", 1)),
        comm_iters=int(ref.timing.get("comm_iters", 0)),
        comm_rounds=int(ref.timing.get("comm_rounds", 1)),
        comm_pricing=ref.comm_pricing,
        plans=rows,
    )


class DLRMThroughput(BaseModel):
    """Training throughput of the DLRM under one plan; warm-up iterations excluded."""

    model_config = ConfigDict(frozen=True)

    method: str
    world_size: int
    backend: str
    device_kind: str
    global_batch_size: int  # samples per iteration over all ranks
    iters: int
    warmup: int
    iter_ms: tuple[float, ...]  # per timed iteration, slowest rank
    samples_per_s: float

    @property
    def median_iter_ms(self) -> float:
        """Median iteration time (slowest rank)."""
        return statistics.median(self.iter_ms)

    @property
    def mean_iter_ms(self) -> float:
        """Mean iteration time (slowest rank)."""
        return statistics.fmean(self.iter_ms)

    def to_json(self) -> dict[str, Any]:
        """JSON document with the derived times."""
        doc = self.model_dump(mode="json")
        doc.update(median_iter_ms=self.median_iter_ms, mean_iter_ms=self.mean_iter_ms)
        return doc

    def summary(self) -> str:
        """One line for the terminal."""
        return (
            f"{self.method}: {self.samples_per_s:,.0f} samples/s, median iteration {self.median_iter_ms:.2f} ms "
            f"({self.world_size} x {self.backend}, global batch {self.global_batch_size}, "
            f"{self.iters} iterations after {self.warmup} warm-up)"
        )
