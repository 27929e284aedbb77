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

from shardwise.profiling.kernel import TimingProtocol
from shardwise.search.plan import Plan, device_specs, plan_memory_bytes, validate_plan
from shardwise.workload import ShardingTask

MEASURED_FORMAT = "shardwise.measured/v1"


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


def measure_plans(
    items: Sequence[tuple[ShardingTask, Plan]],
    *,
    device: str | torch.device | None = None,
    protocol: TimingProtocol | None = None,
    reference_ms: float | None = None,
    batch_size: int | None = None,
    comm_iters: int = 5,
    comm_rounds: int = 3,
    comm_backend: str | None = None,
    progress: bool = True,
) -> list[MeasuredPlanCost]:
    """Measure several (task, plan) pairs; all-to-alls of equal device counts share one process group."""
    from shardwise.profiling.comm import default_backend, measure_all_to_all_many
    from shardwise.profiling.hardware import hardware_kind
    from shardwise.profiling.kernel import measure_shard

    for task, plan in items:
        validate_plan(plan, task)  # refuses columns covered twice, devices out of range, over memory
    dev = resolve_device(device)
    protocol = resolve_protocol(dev, protocol, reference_ms)
    batches = [batch_size or task.batch_size for task, _ in items]
    layouts = [device_specs(plan, task) for task, plan in items]  # column slices keep their source's data

    compute: list[list[tuple[float, float]]] = []
    todo = sum(len(devices) for devices in layouts)
    with tqdm(total=todo, desc="measure shards", unit="device", disable=not progress) as bar:
        for (task, _), devices, batch in zip(items, layouts, batches):
            row = []
            for tables in devices:
                if tables:
                    t = measure_shard(tables, batch, device=dev, protocol=protocol, optimizer=task.optimizer)
                    row.append((float(t.fwd_ms), float(t.bwd_ms)))
                else:
                    row.append((0.0, 0.0))
                bar.update()
            compute.append(row)

    widths = [[sum(t.dim for t in tables) for tables in devices] for devices in layouts]
    comm: list[list[tuple[float, float]]] = [[(0.0, 0.0)] * len(w) for w in widths]  # one device: no exchange
    groups: dict[tuple[int, int], list[int]] = {}
    for k, (w, batch) in enumerate(zip(widths, batches)):
        if len(w) > 1:
            groups.setdefault((len(w), batch), []).append(k)
    backend = comm_backend or default_backend(dev.type)
    for (_, batch), members in groups.items():
        # every layout timed in `comm_rounds` interleaved rounds, median per device: machine drift during
        # the run then hits all plans alike instead of whichever layout happened to run during a slow spell
        timed = measure_all_to_all_many(
            [widths[k] for k in members] * comm_rounds, batch, backend=backend, iters=comm_iters
        )
        for j, k in enumerate(members):
            rounds = timed[j :: len(members)]
            comm[k] = [
                (
                    statistics.median(r[d].fwd_ms for r in rounds),
                    statistics.median(r[d].bwd_ms for r in rounds),
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
                timing=protocol.model_dump(mode="json", exclude={"reference_ms"}),
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
    comm_iters: int = 5,
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
        comm_iters=comm_iters,
        comm_backend=comm_backend,
        progress=progress,
    )[0]


def evaluate_plan(
    task: ShardingTask,
    plan: Plan,
    out_dir: str | Path,
    *,
    cost_model: Any = None,
    device: str | torch.device | None = None,
    protocol: TimingProtocol | None = None,
    reference_ms: float | None = None,
    batch_size: int | None = None,
    comm_iters: int = 5,
    name: str = "plan",
) -> tuple[MeasuredPlanCost, list[Path]]:
    """Measure `plan` and write `<name>.measured.json` plus the HTML/PNG report into `out_dir`.

    With a cost model, time as its training data was (its reference_ms and batch size unless given) and
    show its predictions next to the measurement."""
    from shardwise.search.simulator import simulate

    from .report import write_plan_report

    if reference_ms is None and cost_model is not None:
        reference_ms = getattr(cost_model, "reference_ms", None)
    if batch_size is None and cost_model is not None:
        batch_size = cost_model.batch_size
    cost = measure_plan(
        task, plan, device=device, protocol=protocol, reference_ms=reference_ms, batch_size=batch_size,
        comm_iters=comm_iters,
    )
    predicted = list(simulate(plan, task, cost_model).total_ms) if cost_model is not None else None
    out = Path(out_dir)
    paths = [save_measured(cost, out / f"{name}.measured.json")]
    paths += write_plan_report(cost, out, name=name, predicted_total_ms=predicted)
    return cost, paths
