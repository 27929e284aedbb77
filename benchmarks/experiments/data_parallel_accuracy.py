"""How well data-parallel and row-wise tables are priced, on the tables --preset's pipeline run keeps out of the cost
model's training (its held-out tables): --shards sets of 1..--max-tables of them.

--per-type: each set's tables laid out as each type over every --devices count, measured twice
(the kernels, and the collectives in a process group per pass) and priced as the search prices them, on the first
device: table-wise, the set's fused kernel at the batch (its all-to-all is the comm network's, which `pretrain`
reports); data-parallel, TorchRec's dense kernel at the local batch plus the all-reduce of its gradients
(`data_parallel_cost`; sets whose gradients are within the profiled all-reduce sizes, where the search replicates);
row-wise, the first device's row blocks at the batch plus the outputs' reduce-scatter, their gradients' all-gather and
the ids' all-to-all (`row_wise_cost`). Per type: the MAPE against the two passes' mean, beside TorchRec's estimator of
the same layout (scaled by the median measured / estimate of the other sets, leave one out: TorchRec prices a GPU),
the noise floor (median deviation of a pass from the passes' mean), the collectives' share of the measured cost, the
MAPE of the kernel and of the collectives alone, and of one pass's collectives on the other's (each pass its own
process groups: how far one process group's collectives, as the profile's, predict another's on this machine); for
data-parallel, also the compute network's price of the dense kernel (what a model without the line uses).

--row-blocks [--compare-model URI ...]: the compute network's held-out error on row blocks, the kernels row-wise
tables leave a device: the same shards whole and as their first device's row blocks over each of --devices, each
timed once at the model's batch and priced by every model given (MAPE and the median price / measured).

    python -m benchmarks data_parallel_accuracy --model URI --per-type [--preset local] [--shards 24] [--record]
    python -m benchmarks data_parallel_accuracy --model URI --row-blocks [--compare-model URI] [--devices 2 4 8]

Recorded as sharding_type_accuracy (--per-type) and row_block_accuracy (--row-blocks).
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np
from pydantic import Field

from benchmarks import harness
from shardwise.costmodel.data_parallel import data_parallel_cost, gradient_bytes, local_batch_table
from shardwise.costmodel.row_wise import ids_bytes, output_bytes, row_wise_cost
from shardwise.profiling import AllToAllSession, MeasurementSettings, measure_shard, resolve_timing
from shardwise.workload import local_batch, row_blocks


def kernel_ms(tables: list[Any], batch_size: int, device: Any, protocol: Any, compute_kernel: str = "fused") -> float:
    """Measured forward + backward ms of one fused (or `compute_kernel`) kernel over `tables` at `batch_size`."""
    timing = measure_shard(tables, batch_size, device=device, protocol=protocol, compute_kernel=compute_kernel)
    return timing.fwd_ms + timing.bwd_ms


#: the sharding types priced per table, in TorchRec's words
TYPES = ("table_wise", "data_parallel", "row_wise")


def _one_pass(model: Any, shards: list[list[Any]], devices: list[int], iters: int) -> dict[tuple[str, int], np.ndarray]:
    """Per (type, devices), each shard's measured ms on the first device with its tables laid out as that type (NaN:
    a data-parallel shard whose gradients are beyond the profiled all-reduces); per ("<type>_comm", devices), the
    collectives' part of it."""
    settings = MeasurementSettings(reference_ms=model.reference_ms, batch_size=model.batch_size)
    device, protocol = resolve_timing(settings)
    batch = model.batch_size
    largest = max(size for _, size, _ in model.all_reduce.points)
    out = {("table_wise", devices[0]): np.array([kernel_ms(shard, batch, device, protocol) for shard in shards])}
    for count in devices:
        replicable = [gradient_bytes(shard) <= largest for shard in shards]
        with AllToAllSession(count) as session:
            def timed(op: str, sizes: list[int]) -> np.ndarray:
                """Median ms of each size's collective (none, 0 ms, for nothing to send: tables of no lookups)."""
                ms = np.zeros(len(sizes))
                sent = [k for k, size in enumerate(sizes) if size > 0]
                ms[sent] = [statistics.median(samples) for samples in
                            session.measure_collective(op, [sizes[k] for k in sent], iters=iters)]
                return ms
            reduce = timed("all_reduce", [gradient_bytes(s) for s, ok in zip(shards, replicable) if ok])
            outputs = [output_bytes(shard, batch) for shard in shards]
            row_comm = (timed("reduce_scatter", outputs) + timed("all_gather", outputs)
                        + timed("all_to_all", [ids_bytes(shard, batch, count) for shard in shards]))
        local = local_batch(batch, count)
        dp_comm = np.full(len(shards), np.nan)
        dp_comm[np.flatnonzero(replicable)] = reduce
        out["data_parallel_comm", count] = dp_comm
        out["data_parallel", count] = dp_comm + [kernel_ms(shard, local, device, protocol, "dense") if ok else np.nan
                                                 for shard, ok in zip(shards, replicable)]
        out["row_wise_comm", count] = row_comm
        out["row_wise", count] = row_comm + [kernel_ms(row_blocks(shard, count)[0], batch, device, protocol)
                                                        for shard in shards]
    return out


def _priced(model: Any, shards: list[list[Any]], kind: str, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Each shard's kernel and collectives ms on the first device as the search prices its tables laid out as `kind`
    over `count` devices."""
    if kind == "table_wise":
        kernel = np.asarray(model.predict_compute(shards)).sum(axis=1)
        return kernel, np.zeros_like(kernel)
    if kind == "data_parallel":
        costs = [data_parallel_cost(model, shard, count) for shard in shards]
        return np.array([c.fwd_ms + c.bwd_ms for c in costs]), np.array([c.all_reduce_ms for c in costs])
    rows = [row_wise_cost(model, shard, count, model.batch_size) for shard in shards]
    return np.array([float(r.fwd_ms[0] + r.bwd_ms[0]) for r in rows]), np.array([r.comm_ms for r in rows])


def _pass_mape(passes: list[dict[tuple[str, int], np.ndarray]], kind: str, count: int,
               keep: np.ndarray) -> float | None:
    """MAPE (%) of the first pass's collectives against the second's (both ways, averaged), where both sent any."""
    if kind == "table_wise":
        return None
    first, second = (p[f"{kind}_comm", count][keep] for p in passes)
    sent = (first > 0) & (second > 0)
    if not sent.any():
        return None
    both = np.abs(first[sent] - second[sent]) * (1 / first[sent] + 1 / second[sent]) / 2
    return round(float(np.mean(both) * 100), 1)


def row_block_rows(models: dict[str, Any], shards: list[list[Any]], devices: list[int]) -> list[dict[str, Any]]:
    """One row per (layout, model): the held-out MAPE and median price / measured of the compute network on the whole
    shards and on their first device's row blocks over each of `devices`, all timed once at the first model's
    batch."""
    first = next(iter(models.values()))
    if any(m.batch_size != first.batch_size for m in models.values()):
        raise harness.BenchmarkError("--row-blocks: the models were trained at different batches: "
                             f"{[m.batch_size for m in models.values()]}")
    device, protocol = resolve_timing(MeasurementSettings(reference_ms=first.reference_ms,
                                                          batch_size=first.batch_size))
    rows = []
    for layout, layout_shards in [("whole", shards)] + [(f"row blocks of {d}", [row_blocks(s, d)[0] for s in shards])
                                                         for d in devices]:
        measured = np.array([kernel_ms(s, first.batch_size, device, protocol) for s in layout_shards])
        for model_dir, model in models.items():
            priced = np.asarray(model.predict_compute(layout_shards)).sum(axis=1)
            rows.append({"layout": layout, "model": model_dir, "shards": len(layout_shards),
                         "mape_pct": _mape(priced, measured),
                         "median_price_over_measured": round(float(np.median(priced / measured)), 3)})
            print(", ".join(f"{k} {v}" for k, v in rows[-1].items()), flush=True)
    return rows


def _mape(priced: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error, in % to one decimal."""
    return round(float(np.mean(np.abs(priced - measured) / measured) * 100), 1)


def _loo_scaled(estimate: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """`estimate` scaled per shard by the median measured / estimate over the other shards."""
    ratio = measured / estimate
    return np.array([estimate[i] * np.median(np.delete(ratio, i)) for i in range(len(ratio))])


def held_out_shards(preset: str, num_shards: int, max_tables: int, seed: int) -> list[list[Any]]:
    """`num_shards` sets of 1..`max_tables` distinct tables drawn with `seed` from the tables `preset`'s pipeline run
    holds out of the cost model's training (`profiles.split_workload`), as its profile draws held-out shards."""
    from benchmarks.profiles import split_workload
    from shardwise.pipelines.params import pipeline_params

    pool = list(split_workload(pipeline_params({}, preset_name=preset))[1].tables)
    rng = np.random.default_rng(seed)
    return [[pool[k] for k in rng.choice(len(pool), size=int(rng.integers(1, max_tables + 1)), replace=False)]
            for _ in range(num_shards)]


def per_type_rows(model: Any, model_dir: str, shards: list[list[Any]], devices: list[int],
                  iters: int) -> list[dict[str, Any]]:
    """One row per (sharding type, devices): held-out MAPE of the search's price, TorchRec's, the noise floor."""
    from shardwise.costmodel.evaluate import torchrec_estimates

    if model.all_reduce is None or getattr(model, "reduce_scatter", None) is None:
        raise harness.BenchmarkError(f"--model {model_dir}: the model has no measured all-reduce or reduce-scatter (profile "
                             "with --comm-layouts): data-parallel and row-wise tables cannot be priced")
    passes = [_one_pass(model, shards, devices, iters) for _ in range(2)]
    rows = []
    for kind, count in [("table_wise", devices[0])] + [(k, d) for d in devices for k in TYPES[1:]]:
        first, second = passes[0][kind, count], passes[1][kind, count]
        keep = np.isfinite(first)
        measured = (first[keep] + second[keep]) / 2
        chosen = [shard for shard, k in zip(shards, keep) if k]
        kernel, collectives = _priced(model, chosen, kind, count)
        priced = kernel + collectives
        estimate = torchrec_estimates(chosen, model.batch_size, sharding_type=kind, world_size=max(count, 2),
                                      comms=kind != "table_wise").sum(axis=1)
        comm = (np.zeros_like(measured) if kind == "table_wise"
                else ((passes[0][f"{kind}_comm", count] + passes[1][f"{kind}_comm", count]) / 2)[keep])
        rows.append({
            "sharding_type": kind, "devices": count if kind != "table_wise" else "any", "shards": int(keep.sum()),
            "shardwise_mape_pct": _mape(priced, measured),
            "torchrec_estimator_mape_pct": _mape(_loo_scaled(estimate, measured), measured),
            "noise_floor_pct": round(float(np.median(np.abs(first[keep] - measured) / measured) * 100), 1),
            "collectives_share_pct": round(float(np.sum(comm) / np.sum(measured) * 100), 1),
            # the two parts' own errors: where the type's error comes from
            "kernel_mape_pct": _mape(kernel, measured - comm),
            "collectives_mape_pct": _mape(collectives[comm > 0], comm[comm > 0]) if (comm > 0).any() else None,
            # the collectives of one pass's process groups priced as the other pass measured them: the floor of any
            # price fitted in one process group (the profile's) on this machine
            "collectives_pass_mape_pct": _pass_mape(passes, kind, count, keep),
            # data-parallel: the dense kernel priced by the compute network instead (pooling / D at the batch: how a
            # model profiled without dense kernels prices it)
            "kernel_mape_network_pct": _mape(np.asarray(model.predict_compute(
                [[local_batch_table(t, count) for t in shard] for shard in chosen])).sum(axis=1), measured - comm)
            if kind == "data_parallel" else None,
        })
        print(", ".join(f"{k} {v}" for k, v in rows[-1].items()), flush=True)
    return rows


class DataParallelAccuracySettings(harness.ExperimentSettings):
    """Which model, which held-out shards, which comparison."""

    model: str = Field(description="the cost model (a directory, models:/ or runs:/ URI)")
    devices: tuple[int, ...] = Field(default=(2, 4), json_schema_extra={"nargs": "+"})
    iters: int = Field(default=20, ge=1, description="timed iterations of each collective")
    seed: int = 0
    preset: str = Field(default="local", description="the pipeline preset whose held-out tables (those its run keeps "
                        "out of the cost model's training) make the shards")
    shards: int = Field(default=24, ge=1, description="held-out shards")
    max_tables: int = Field(default=8, ge=1, description="tables a shard at most")
    per_type: bool = Field(default=False, description="the held-out accuracy per sharding type (table-wise, "
                           "data-parallel, row-wise)")
    row_blocks: bool = Field(default=False, description="the compute network's held-out error on row blocks "
                             "(row-wise tables' kernels) and whole shards, one measurement for every model")
    compare_model: tuple[str, ...] = Field(default=(), description="with --row-blocks: another model to price the "
                                           "same measurements (repeatable)")


def run(args: DataParallelAccuracySettings, context: harness.Context) -> harness.Outcome:
    """Per sharding type, or the row blocks; recorded under the comparison's name."""
    if args.per_type == args.row_blocks:
        raise harness.BenchmarkError("name one comparison: --per-type or --row-blocks")
    shards = held_out_shards(args.preset, args.shards, args.max_tables, args.seed)
    what = f"{args.shards} shards of 1-{args.max_tables} of preset {args.preset}'s held-out tables, seed {args.seed}"
    if args.row_blocks:
        models = {uri: context.cost_model(uri, required=True) for uri in (args.model, *args.compare_model)}
        return harness.Outcome(row_block_rows(models, shards, list(args.devices)), record_name="row_block_accuracy",
                       title=f"The compute network on row blocks ({what})")
    per_type = per_type_rows(context.cost_model(args.model, required=True), args.model, shards, list(args.devices),
                             args.iters)
    table_wise = per_type[0]["shardwise_mape_pct"]
    gaps = ", ".join(f"{r['sharding_type']} on {r['devices']} {r['shardwise_mape_pct'] - table_wise:+.1f}"
                     for r in per_type[1:])
    return harness.Outcome(per_type, notes=[f"held-out MAPE against table-wise's {table_wise}%, in points: {gaps}"],
                   record_name="sharding_type_accuracy",
                   title=f"Held-out accuracy per sharding type ({what}, model {args.model})")


harness.register(harness.Experiment(
    name="data_parallel_accuracy",
    title="How well data-parallel and row-wise tables are priced",
    settings=DataParallelAccuracySettings,
    run=run,
    # the headline's per-type figures (recorded as sharding_type_accuracy)
    suites={"claims": (harness.SuiteRun({"model": "models:/shardwise-cost-cpu-x86_64-2c@champion", "per_type": True,
                                 "shards": 48}),)},
))
