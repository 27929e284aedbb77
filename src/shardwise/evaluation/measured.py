"""Measured plan cost: each device's shard on the real fbgemm kernel plus the real all-to-all."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from shardwise.profiling.kernel import ShardTiming, TimingProtocol
from shardwise.search.plan import Plan, device_specs, plan_memory_bytes, validate_plan
from shardwise.workload import Optimizer, ShardingTask, TableSpec

MEASURED_FORMAT = "shardwise.measured/v1"
# All-to-all timing: per device, the median of COMM_ROUNDS x COMM_ITERS exchanges. On a shared CPU one
# exchange swings by 2x with scheduling, and the medians of fewer samples differed by 30% for a symmetric one.
COMM_ITERS = 20
COMM_ROUNDS = 5
# Kernel timing: per device, the median of COMPUTE_ROUNDS timings (each the protocol's median of its iterations)
# taken in interleaved rounds; one timing of the same shard differed by up to 25% within one session.
COMPUTE_ROUNDS = 3
COMPARISON_FORMAT = "shardwise.comparison/v1"


class DeviceCost(BaseModel):
    """One device's measured cost for one training iteration, and the memory its shard holds."""

    model_config = ConfigDict(frozen=True)

    device: int
    shards: tuple[str, ...]  # shard names ("t3", "t7[0:32]")
    width: int  # pooled output width on this device (sum of shard dims)
    fwd_ms: float
    bwd_ms: float
    comm_fwd_ms: float
    comm_bwd_ms: float
    memory_bytes: int

    @property
    def compute_ms(self) -> float:
        """Forward plus backward kernel time."""
        return self.fwd_ms + self.bwd_ms

    @property
    def comm_ms(self) -> float:
        """Forward plus backward all-to-all time."""
        return self.comm_fwd_ms + self.comm_bwd_ms

    @property
    def total_ms(self) -> float:
        """Forward + backward + forward all-to-all + backward all-to-all."""
        return self.compute_ms + self.comm_ms


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
    def max_memory_bytes(self) -> int:
        """The fullest device's memory."""
        return max(d.memory_bytes for d in self.devices)

    @property
    def memory_headroom(self) -> float:
        """Fraction of the per-device cap left free on the fullest device."""
        return 1.0 - self.max_memory_bytes / self.device_memory_bytes

    def to_json(self) -> dict[str, Any]:
        """The `shardwise.measured/v1` document, with the derived totals for readers."""
        doc = self.model_dump(mode="json")
        doc.update(
            max_cost_ms=self.max_cost_ms,
            max_compute_ms=self.max_compute_ms,
            mean_cost_ms=self.mean_cost_ms,
            imbalance=self.imbalance,
            memory_headroom=self.memory_headroom,
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
        return "\n".join(lines)


def save_measured(cost: MeasuredPlanCost, path: str | Path) -> Path:
    """Write a measured plan cost as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cost.to_json(), indent=1))
    return path


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`None` or "auto" -> CUDA when present, else CPU; refuses devices this machine lacks."""
    from shardwise.profiling.hardware import resolve_device as _resolve

    return _resolve(None if device is None or str(device) == "auto" else device)


def resolve_protocol(
    device: torch.device, protocol: TimingProtocol | None, reference_ms: float | None
) -> TimingProtocol:
    """The protocol decided for `device` with its reference calibrated once (or pinned to `reference_ms`)."""
    from shardwise.profiling.kernel import calibrate_reference

    protocol = (protocol or TimingProtocol()).for_device(device)
    if reference_ms is not None:
        return protocol.model_copy(update={"reference_ms": reference_ms})
    if protocol.reference_normalised and protocol.reference_ms is None:
        # calibrate once for all plans, so every device of every plan is scaled by the same reference
        return protocol.model_copy(update={"reference_ms": calibrate_reference(device, protocol)})
    return protocol


def time_shards_in_rounds(
    shards: Sequence[tuple[Sequence[TableSpec], int, Optimizer]],
    rounds: int,
    *,
    device: torch.device,
    protocol: TimingProtocol,
    progress: bool = True,
) -> list[list[ShardTiming]]:
    """Each (tables, batch size, optimizer) shard timed once per round, `rounds` rounds interleaved over all of
    them, so machine drift during the run hits every shard alike; per shard, its timings in round order."""
    from shardwise.profiling.kernel import measure_shard

    timings: list[list[ShardTiming]] = [[] for _ in shards]
    with tqdm(total=rounds * len(shards), desc="measure shards", unit="shard", disable=not progress) as bar:
        for _ in range(rounds):
            for (tables, batch, optimizer), row in zip(shards, timings):
                row.append(measure_shard(tables, batch, device=device, protocol=protocol, optimizer=optimizer))
                bar.update()
    return timings


def _median_fwd_bwd(timings: Sequence[ShardTiming]) -> tuple[float, float]:
    return statistics.median(t.fwd_ms for t in timings), statistics.median(t.bwd_ms for t in timings)


def measure_plans(
    items: Sequence[tuple[ShardingTask, Plan]],
    *,
    device: str | torch.device | None = None,
    protocol: TimingProtocol | None = None,
    reference_ms: float | None = None,
    batch_size: int | None = None,
    compute_rounds: int = COMPUTE_ROUNDS,
    comm_iters: int = COMM_ITERS,
    comm_rounds: int = COMM_ROUNDS,
    comm_backend: str | None = None,
    progress: bool = True,
) -> list[MeasuredPlanCost]:
    """Measure several (task, plan) pairs in one session: one reference calibration for all, every shard timed
    in `compute_rounds` interleaved rounds, and all-to-alls of equal device counts in one process group,
    interleaved over `comm_rounds` rounds of `comm_iters` each; medians per device."""
    if compute_rounds < 1 or comm_rounds < 1 or comm_iters < 1:
        raise ValueError(
            f"compute_rounds, comm_rounds and comm_iters must be >= 1, got {compute_rounds}, {comm_rounds}, {comm_iters}"
        )
    from shardwise.profiling.comm import default_backend, measure_all_to_all_many
    from shardwise.profiling.hardware import hardware_kind

    for task, plan in items:
        validate_plan(plan, task)  # refuses columns covered twice, devices out of range, over memory
    dev = resolve_device(device)
    protocol = resolve_protocol(dev, protocol, reference_ms)
    batches = [batch_size or task.batch_size for task, _ in items]
    layouts = [device_specs(plan, task) for task, plan in items]  # column slices keep their source's data

    # every device's shard timed once per round, rounds interleaved over all plans, median per device: one
    # timing of a shard swings by 20% on a shared CPU (the reference normalises drift, not preemption)
    jobs = [
        (tables, batch, task.optimizer)
        for (task, _), devices, batch in zip(items, layouts, batches)
        for tables in devices
        if tables
    ]
    timed = iter(time_shards_in_rounds(jobs, compute_rounds, device=dev, protocol=protocol, progress=progress))
    compute = [[_median_fwd_bwd(next(timed)) if tables else (0.0, 0.0) for tables in devices] for devices in layouts]

    widths = [[sum(t.dim for t in tables) for tables in devices] for devices in layouts]
    comm: list[list[tuple[float, float]]] = [[(0.0, 0.0)] * len(w) for w in widths]  # one device: no exchange
    groups: dict[tuple[int, int], list[int]] = {}
    for k, (w, batch) in enumerate(zip(widths, batches)):
        if len(w) > 1:
            groups.setdefault((len(w), batch), []).append(k)
    backend = comm_backend or default_backend(dev.type)
    for (_, batch), members in groups.items():
        # every layout timed in `comm_rounds` interleaved rounds, median of all rounds' iterations per device:
        # machine drift during the run then hits all plans alike instead of whichever layout happened to run
        # during a slow spell
        exchanges = measure_all_to_all_many(
            [widths[k] for k in members] * comm_rounds, batch, backend=backend, iters=comm_iters
        )
        for j, k in enumerate(members):
            rounds = exchanges[j :: len(members)]
            comm[k] = [
                (
                    statistics.median(ms for r in rounds for ms in r[d].fwd_samples_ms),
                    statistics.median(ms for r in rounds for ms in r[d].bwd_samples_ms),
                )
                for d in range(len(widths[k]))
            ]

    kind = hardware_kind(dev)
    results = []
    for k, (task, plan) in enumerate(items):
        memory = plan_memory_bytes(plan, task)
        costs = tuple(
            DeviceCost(
                device=d,
                shards=tuple(t.name for t in tables),
                width=widths[k][d],
                fwd_ms=compute[k][d][0],
                bwd_ms=compute[k][d][1],
                comm_fwd_ms=comm[k][d][0],
                comm_bwd_ms=comm[k][d][1],
                memory_bytes=memory[d],
            )
            for d, tables in enumerate(layouts[k])
        )
        results.append(
            MeasuredPlanCost(
                method=plan.method,
                batch_size=batches[k],
                device_kind=dev.type,
                hardware_kind=kind,
                device_memory_bytes=task.device_memory_bytes,
                timing={
                    **protocol.model_dump(mode="json", exclude={"reference_ms"}),
                    "compute_rounds": compute_rounds, "comm_iters": comm_iters, "comm_rounds": comm_rounds,
                },
                reference_ms=protocol.reference_ms,
                devices=costs,
            )
        )
    return results


def measure_plan(
    task: ShardingTask,
    plan: Plan,
    *,
    device: str | torch.device | None = None,
    protocol: TimingProtocol | None = None,
    reference_ms: float | None = None,
    batch_size: int | None = None,
    compute_rounds: int = COMPUTE_ROUNDS,
    comm_iters: int = COMM_ITERS,
    comm_rounds: int = COMM_ROUNDS,
    comm_backend: str | None = None,
    progress: bool = True,
) -> MeasuredPlanCost:
    """Measure `plan` on real hardware: per device fwd + bwd kernel + fwd/bwd all-to-all; refuse invalid plans.

    `batch_size` overrides the task's (to match the batch a cost model was profiled at); `protocol` and
    `reference_ms` must be those the cost model's data was measured with for the two to be comparable.
    The all-to-all runs one process per device (`comm_backend`: NCCL on CUDA, gloo on CPU by default).
    """
    return measure_plans(
        [(task, plan)],
        device=device,
        protocol=protocol,
        reference_ms=reference_ms,
        batch_size=batch_size,
        compute_rounds=compute_rounds,
        comm_iters=comm_iters,
        comm_rounds=comm_rounds,
        comm_backend=comm_backend,
        progress=progress,
    )[0]


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
            f"{self.comm_iters} all-to-alls per device"
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
        plans=rows,
    )


def evaluate_plans(
    task: ShardingTask,
    plans: Sequence[tuple[str, Plan]],
    out_dir: str | Path,
    *,
    cost_model: Any = None,
    device: str | torch.device | None = None,
    protocol: TimingProtocol | None = None,
    reference_ms: float | None = None,
    batch_size: int | None = None,
    compute_rounds: int = COMPUTE_ROUNDS,
    comm_iters: int = COMM_ITERS,
    comm_rounds: int = COMM_ROUNDS,
    progress: bool = True,
) -> tuple[list[MeasuredPlanCost], PlanComparison, list[Path]]:
    """Measure named plans of `task` in one session; write `<name>.measured.json` and a report per plan, and
    `comparison.json` + `comparison.html` across them.

    One session: one reference calibration, one all-to-all process group with the plans' layouts interleaved,
    so machine drift hits every plan alike. With a cost model, time as its training data was (its
    reference_ms and batch size unless given) and show its predictions next to the measurement."""
    from shardwise.search.simulator import simulate

    from .report import write_comparison_report, write_plan_report

    names = [name for name, _ in plans]
    if len(set(names)) != len(names):
        raise ValueError(f"plans: names must be unique, got {names}")
    if reference_ms is None and cost_model is not None:
        reference_ms = getattr(cost_model, "reference_ms", None)
    if batch_size is None and cost_model is not None:
        batch_size = cost_model.batch_size
    costs = measure_plans(
        [(task, plan) for _, plan in plans], device=device, protocol=protocol, reference_ms=reference_ms,
        batch_size=batch_size, compute_rounds=compute_rounds, comm_iters=comm_iters, comm_rounds=comm_rounds,
        progress=progress,
    )
    predicted: list[list[float] | None] = [
        list(simulate(plan, task, cost_model).total_ms) if cost_model is not None else None for _, plan in plans
    ]
    out = Path(out_dir)
    paths: list[Path] = []
    for name, cost, pred in zip(names, costs, predicted):
        paths.append(save_measured(cost, out / f"{name}.measured.json"))
        paths += write_plan_report(cost, out, name=name, predicted_total_ms=pred)
    comparison = compare_measured(
        list(zip(names, costs)),
        predicted_max_ms=[max(p) if p else None for p in predicted],
    )
    if len(plans) > 1:
        path = out / "comparison.json"
        path.write_text(json.dumps(comparison.model_dump(mode="json"), indent=1))
        paths.append(path)
        paths += write_comparison_report(comparison, out)
    return costs, comparison, paths
