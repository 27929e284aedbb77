"""What a returned plan carries and shows: validity checked, memory and predicted costs per device."""

from __future__ import annotations

import datetime as dt
from typing import Any

from shardwise.costmodel.types import CostModel, KnowsItsTraining
from shardwise.version import __version__
from shardwise.workload import ShardingTask

from .bottleneck import bottleneck_line, slowest_alone
from .plan import GIB, Plan, plan_host_memory_bytes, plan_memory_bytes, validate_plan
from .simulator import ShardCostCache, balance_bound, simulate


def finish_plan(
    plan: Plan,
    task: ShardingTask,
    cost_model: CostModel | None,
    *,
    planning_time_s: float,
    seed: int,
    options: dict[str, Any] | None = None,
    cache: ShardCostCache | None = None,
) -> Plan:
    """Validate `plan` (never hand out one over memory) and record method, memory, predicted costs,
    planning time and provenance in its `extra` keys."""
    validate_plan(plan, task)
    memory = plan_memory_bytes(plan, task)
    dims = {t.name: t.dim for t in task.tables}
    devices: list[dict[str, Any]] = [
        {"device": d, "shards": [], "dim": 0, "memory_bytes": memory[d]} for d in range(plan.num_devices)
    ]
    for s in plan.shards:
        row = devices[s.device]
        row["shards"].append(s.table if s.dim == dims[s.table] else f"{s.table}[{s.col_offset}:{s.col_offset + s.dim}]")
        row["dim"] += s.dim
    extra: dict[str, Any] = {
        **{k: v for k, v in plan.extra.items() if k != "bottleneck"},  # a refined or reloaded plan's is found again
        "method": plan.method,
        "seed": seed,
        "planning_time_s": round(planning_time_s, 4),
        "memory_bytes": memory,
        "memory_cap_bytes": task.device_memory_bytes,
        "devices": devices,
        "sharding_types": plan.sharding_types(),
        **({"host_memory_bytes": plan_host_memory_bytes(plan, task), "host_memory_cap_bytes": task.host_memory_bytes}
           if plan.kernels else {}),
        "provenance": {
            "shardwise_version": __version__,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "num_tables": len(task.tables),
            "batch_size": task.batch_size,
            "options": options or {},
            **plan.extra.get("provenance", {}),
        },
    }
    if cost_model is not None:
        cost = simulate(plan, task, cost_model, cache)
        predicted = cost.to_json()
        extra["predicted"] = predicted
        extra["balance_bound"] = balance_bound(plan, task, cost_model, cost).to_json()
        extra["provenance"]["cost_model"] = {
            "hardware_kind": cost_model.hardware_kind,
            "batch_size": cost_model.batch_size,
        }
        for d, row in enumerate(devices):
            row.update({k: predicted[k][d] for k in ("fwd_ms", "bwd_ms", "comm_fwd_ms", "comm_bwd_ms", "total_ms")})
        bottleneck = slowest_alone([row["shards"] for row in devices], predicted["total_ms"])
        if bottleneck:
            extra["bottleneck"] = bottleneck
        if isinstance(cost_model, KnowsItsTraining):
            outside = cost_model.outside_training(task.tables, task.batch_size, [len(row["shards"]) for row in devices])
            if outside:
                extra["outside_training"] = outside
    return plan.model_copy(update={"extra": extra})


def sharding_types_line(plan: Plan) -> str:
    """Which sharding type each table got, in TorchRec's words: counts, and the names where they are few."""
    by_type: dict[str, list[str]] = {}
    for table, kind in plan.sharding_types().items():
        by_type.setdefault(kind, []).append(table)
    parts = []
    for kind in ("table_wise", "column_wise", "data_parallel", "row_wise"):
        names = by_type.get(kind, [])
        if names:
            shown = f" ({', '.join(names)})" if kind != "table_wise" and len(names) <= 12 else ""
            parts.append(f"{len(names)} {kind}{shown}")
    return "sharding types: " + ", ".join(parts)


def format_plan(plan: Plan) -> str:
    """A per-device table (shards, dims, memory against the cap, predicted ms), the imbalance and the sharding type
    of each table."""
    extra = plan.extra
    cap = extra.get("memory_cap_bytes")
    predicted = extra.get("predicted")
    rows = extra.get("devices") or []
    head = f"{'device':>6}  {'shards':>6}  {'dim':>6}  {'memory GiB':>16}"
    if predicted:
        head += f"  {'fwd ms':>8}  {'bwd ms':>8}  {'comm ms':>8}  {'total ms':>9}"
    lines = [f"plan: {plan.method}, {len(plan.shards)} shards on {plan.num_devices} devices", sharding_types_line(plan),
             head]
    for row in rows:
        memory = row["memory_bytes"] / GIB
        share = f"{memory:.2f}/{cap / GIB:.2f}" if cap else f"{memory:.2f}"
        line = f"{row['device']:>6}  {len(row['shards']):>6}  {row['dim']:>6}  {share:>16}"
        if predicted:
            comm = row["comm_fwd_ms"] + row["comm_bwd_ms"]
            line += f"  {row['fwd_ms']:>8.3f}  {row['bwd_ms']:>8.3f}  {comm:>8.3f}  {row['total_ms']:>9.3f}"
        lines.append(line)
    if plan.data_parallel:
        reduce = f", all-reduce {predicted['all_reduce_ms'][0]:.3f} ms" if predicted and "all_reduce_ms" in predicted else ""
        lines.append(f"data-parallel on every device (not counted in shards and dim; their kernel on the local batch is "
                     f"in fwd/bwd ms{reduce}, in total ms): {', '.join(plan.data_parallel)}")
    if plan.row_wise:
        collectives = (f", their collectives {predicted['row_wise_comm_ms'][0]:.3f} ms"
                       if predicted and "row_wise_comm_ms" in predicted else "")
        lines.append(f"row-wise over every device (not counted in shards and dim; the kernel on each device's row blocks "
                     f"is in fwd/bwd ms{collectives}, in total ms): {', '.join(plan.row_wise)}")
    if plan.kernels:
        host = extra.get("host_memory_bytes") or []
        cap_host = extra.get("host_memory_cap_bytes")
        lines.append("in host memory (memory GiB above is HBM, with their caches): " + ", ".join(
            f"{name} {k.kernel}" + (f" (cache_load_factor {k.cache_load_factor:g})" if k.cache_load_factor else "")
            for name, k in plan.kernels.items())
            + (f"; host memory per device {max(host) / GIB:.2f}/{cap_host / GIB:.2f} GiB at most" if host and cap_host
               else ""))
    if predicted:
        lines.append(
            f"predicted plan cost (slowest device) {predicted['max_cost_ms']:.3f} ms, "
            f"imbalance (max/mean) {predicted['imbalance']:.3f}"
        )
        bound = extra.get("balance_bound")
        if bound:
            lines.append(
                f"balance bound {bound['bound_ms']:.3f} ms (the shards dealt evenly over the devices, or the largest one): the "
                f"slowest device's compute is {bound['compute_over_bound']:.3f}x it"
            )
        if "bottleneck" in extra:
            lines.append(bottleneck_line(extra["bottleneck"]))
    else:
        lines.append("no cost model: predicted costs not shown")
    if "planning_time_s" in extra:
        lines.append(f"planning time {extra['planning_time_s']:.3f} s")
    return "\n".join(lines)
