"""How well data-parallel and row-wise tables are priced: the held-out error of the lines of each collective (the
all-reduce of data-parallel gradients; the reduce-scatter, all-gather and ids' all-to-all of row-wise tables), and
(with --model) the compute model's error on a table's kernel at the local batch and on a row block's kernel at the
whole batch.

1. All-reduces of fp32 gradients measured on this machine (gloo on CPU, NCCL on GPUs) over 2 and 4 processes at
   sizes from 4 KiB to 16 MiB (`AllToAllSession.measure_all_reduce`, the median of --iters each); the latency +
   bandwidth line (`fit_all_reduce`) fitted with each size left out in turn predicts that size: its MAPE is the
   held-out error, for one line per device count (what `pretrain` stores as a cost model's `all_reduce`) and for
   one line over every device count. The lines fitted to every size are printed. The same for reduce-scatters
   (each device's `size` in, its 1 / D of the sum out: row-wise tables' pooled outputs), all-gathers (their
   gradients) and even all-to-alls (their ids), each `pretrain`'s line of that name; and the MAPE of the
   reduce-scatter lines on all-gathers and all-to-alls, what prices them for a model profiled without them.
2. With --model DIR: --tables synthetic tables timed alone on the fused kernel at the local batch (batch / devices) and
   predicted as the model prices them (`local_batch_table`: pooling factor / devices at the model's batch); MAPE,
   beside the naive price (the table at the full batch, divided by the devices). And each table's first row block
   over the devices (`TableSpec.row_block`) timed at the model's batch, against the model's price of the block.

3. With --model DIR --per-type: the held-out accuracy per sharding type. --shards sets of 1..--max-tables of the
   tables --preset's pipeline run keeps out of the cost model's training (its held-out tables), each set's tables
   laid out as each type over every --devices count, measured twice (the kernels, and the collectives in a process
   group per pass) and priced as the search prices them, on the first device: table-wise, the set's fused kernel at
   the batch (its all-to-all is the comm network's, which `pretrain` reports); data-parallel, TorchRec's dense kernel
   at the local batch (measured as `measure_plans` and refinement time it) plus the all-reduce of its gradients
   (`data_parallel_cost`: the model's dense-kernel line, or for a model profiled before, the compute network; sets
   whose gradients are within the profiled all-reduce sizes, where the search replicates); row-wise, the first
   device's row blocks at the batch plus the outputs' reduce-scatter, their gradients' all-gather and the ids'
   all-to-all (`row_wise_cost`). Per type: the
   MAPE against the two passes' mean, beside TorchRec's estimator of the same layout (its compute and comms, scaled
   by the median measured / estimate of the other sets, leave one out: TorchRec prices a GPU), the noise floor
   (median deviation of a pass from the passes' mean), the collectives' share of the measured cost, and the MAPE of
   the kernel and of the collectives alone (where the type's error comes from), beside the MAPE of one pass's
   collectives on the other's (each pass its own process groups: how far the collectives of one process group, as
   the profile's, can predict another's on this machine); for data-parallel, also the compute
   network's price of the dense kernel (pooling / D at the batch, what a model without the line uses).

4. With --model DIR --row-blocks [--compare-model DIR ...]: the compute network's held-out error on row blocks, the
   kernels row-wise tables leave a device. The same held-out shards as --per-type, whole and as their first
   device's row blocks over each of --devices (`row_blocks`: rows / D, lookups / D), each timed once at the model's
   batch and priced by every model given: MAPE and the median price / measured, per model, on one measurement (a
   model profiled with `--row-wise-shards` has seen such blocks; one profiled without has not).

5. With --retime DATASET: how far the machine drifted since a profile, per kernel: --retime-kernels of the
   dataset's dense kernels (kind "data_parallel") and of its fused shards (kind "compute") timed again now with the
   profile's reference, each now / stored (1: as profiled). The reference kernel normalises the CPU's speed; where
   the dense kernels (memory-bound: the whole table's gradient and optimizer step) drift more than the fused ones,
   it does not normalise what slows them, and lines fitted to them are off by that much.

    python -m benchmarks data_parallel_accuracy [--model DIR [--row-scale 0.01] [--skip-collectives]] [--devices 2 4]
        [--iters 20]
    python -m benchmarks data_parallel_accuracy --model DIR --per-type [--preset local] [--shards 24] [--record]
    python -m benchmarks data_parallel_accuracy --model DIR --row-blocks [--compare-model DIR] [--devices 2 4 8]
    python -m benchmarks data_parallel_accuracy --retime DATASET [--retime-kernels 24]

Recorded as sharding_type_accuracy (--per-type), row_block_accuracy (--row-blocks), collective_accuracy (the
collectives' lines) and machine_drift (--retime).
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from benchmarks.harness import (
    BenchmarkError,
    Context,
    Experiment,
    ExperimentSettings,
    Outcome,
    SuiteRun,
    register,
)
from shardwise.costmodel.data_parallel import (
    data_parallel_cost,
    fit_all_reduce,
    gradient_bytes,
    heldout_all_reduce_errors,
    local_batch_table,
)
from shardwise.costmodel.evaluate import regression_metrics
from shardwise.costmodel.row_wise import ids_bytes, output_bytes, row_wise_cost
from shardwise.profiling import AllToAllSession, MeasurementSettings, measure_shard, resolve_timing
from shardwise.workload import local_batch, row_blocks

SIZES_BYTES = tuple(4096 * 4**k for k in range(7))  # 4 KiB .. 16 MiB


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def collective_points(devices: list[int], iters: int) -> dict[str, list[tuple[int, int, float]]]:
    """Per collective, (devices, bytes, median ms) of every measured one (one process group per device count)."""
    points: dict[str, list[tuple[int, int, float]]] = {op: [] for op in COLLECTIVES}
    for count in devices:
        with AllToAllSession(count) as session:
            for op in COLLECTIVES:
                timed = session.measure_collective(op, SIZES_BYTES, iters=iters)
                points[op] += [(count, size, statistics.median(ms)) for size, ms in zip(SIZES_BYTES, timed, strict=True)]
    return points


def kernel_ms(tables: list[Any], batch_size: int, device: Any, protocol: Any, compute_kernel: str = "fused") -> float:
    """Measured forward + backward ms of one fused (or `compute_kernel`) kernel over `tables` at `batch_size`."""
    timing = measure_shard(tables, batch_size, device=device, protocol=protocol, compute_kernel=compute_kernel)
    return timing.fwd_ms + timing.bwd_ms


def kernel_errors(model_dir: str, num_tables: int, devices: int, seed: int,
                  row_scale: float) -> tuple[float, float, float, float]:
    """MAPE (%) of the local-batch price and of the naive full-batch / devices price, on `num_tables` tables, of the
    price of their first row blocks over `devices` at the model's batch, and of the whole tables' at it (the model's
    own error on these tables, what the other three compare with)."""
    from shardwise.costmodel import NeuralCostModel
    from shardwise.workload import synthesize_tables

    model = NeuralCostModel.load(model_dir)
    tables = synthesize_tables(num_tables, seed=seed, row_scale=row_scale, progress=False).tables
    settings = MeasurementSettings(reference_ms=model.reference_ms, batch_size=model.batch_size)
    device, protocol = resolve_timing(settings)
    measured = np.array([kernel_ms([t], local_batch(model.batch_size, devices), device, protocol) for t in tables])
    local = model.predict_compute([[local_batch_table(t, devices)] for t in tables]).sum(axis=1)
    naive = model.predict_compute([[t] for t in tables]).sum(axis=1) / devices
    blocks = [t.row_block(0, devices) for t in tables]
    block_ms = np.array([kernel_ms([b], model.batch_size, device, protocol) for b in blocks])
    block_price = model.predict_compute([[b] for b in blocks]).sum(axis=1)
    whole_ms = np.array([kernel_ms([t], model.batch_size, device, protocol) for t in tables])
    whole = model.predict_compute([[t] for t in tables]).sum(axis=1)
    return (float(np.mean(np.abs(local - measured) / measured) * 100),
            float(np.mean(np.abs(naive - measured) / measured) * 100),
            float(np.mean(np.abs(block_price - block_ms) / block_ms) * 100),
            float(np.mean(np.abs(whole - whole_ms) / whole_ms) * 100))


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


def row_block_rows(model_dirs: list[str], shards: list[list[Any]], devices: list[int]) -> list[dict[str, Any]]:
    """One row per (layout, model): the held-out MAPE and median price / measured of the compute network on the whole
    shards and on their first device's row blocks over each of `devices`, all timed once at the first model's
    batch."""
    from shardwise.costmodel import NeuralCostModel

    models = [NeuralCostModel.load(d) for d in model_dirs]
    first = models[0]
    if any(m.batch_size != first.batch_size for m in models):
        raise BenchmarkError("--row-blocks: the models were trained at different batches: "
                         f"{[m.batch_size for m in models]}")
    device, protocol = resolve_timing(MeasurementSettings(reference_ms=first.reference_ms,
                                                          batch_size=first.batch_size))
    rows = []
    for layout, layout_shards in [("whole", shards)] + [(f"row blocks of {d}", [row_blocks(s, d)[0] for s in shards])
                                                         for d in devices]:
        measured = np.array([kernel_ms(s, first.batch_size, device, protocol) for s in layout_shards])
        for model_dir, model in zip(model_dirs, models, strict=True):
            priced = np.asarray(model.predict_compute(layout_shards)).sum(axis=1)
            rows.append({"layout": layout, "model": model_dir, "shards": len(layout_shards),
                         "mape_pct": round(regression_metrics(priced, measured)["mape_pct"], 1),
                         "median_price_over_measured": round(float(np.median(priced / measured)), 3)})
            print(", ".join(f"{k} {v}" for k, v in rows[-1].items()), flush=True)
    return rows


def _network_kernel_mape(model: Any, shards: list[list[Any]], count: int, measured: np.ndarray) -> float:
    """MAPE (%) of the compute network's price of data-parallel kernels (`local_batch_table`) against `measured`."""
    network = np.asarray(model.predict_compute([[local_batch_table(t, count) for t in shard] for shard in shards]))
    return round(float(np.mean(np.abs(network.sum(axis=1) - measured) / measured) * 100), 1)


def _loo_scaled(estimate: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """`estimate` scaled per shard by the median measured / estimate over the other shards."""
    ratio = measured / estimate
    return np.array([estimate[i] * np.median(np.delete(ratio, i)) for i in range(len(ratio))])


def held_out_shards(preset: str, num_shards: int, max_tables: int, seed: int) -> list[list[Any]]:
    """`num_shards` sets of 1..`max_tables` distinct tables drawn with `seed` from the tables `preset`'s pipeline run
    holds out of the cost model's training (`profiles.split_workload`), as its profile draws held-out shards."""
    from profiles import split_workload

    from shardwise.pipelines.params import pipeline_params

    pool = list(split_workload(pipeline_params({}, preset_name=preset))[1].tables)
    rng = np.random.default_rng(seed)
    return [[pool[k] for k in rng.choice(len(pool), size=int(rng.integers(1, max_tables + 1)), replace=False)]
            for _ in range(num_shards)]


def per_type_rows(model_dir: str, shards: list[list[Any]], devices: list[int], iters: int) -> list[dict[str, Any]]:
    """One row per (sharding type, devices): held-out MAPE of the search's price, TorchRec's, the noise floor."""
    from shardwise.costmodel import NeuralCostModel
    from shardwise.costmodel.evaluate import torchrec_estimates

    model = NeuralCostModel.load(model_dir)
    if model.all_reduce is None or getattr(model, "reduce_scatter", None) is None:
        raise BenchmarkError(f"--model {model_dir}: the model has no measured all-reduce or reduce-scatter (profile with "
                         "--comm-layouts): data-parallel and row-wise tables cannot be priced")
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
            "shardwise_mape_pct": round(float(np.mean(np.abs(priced - measured) / measured) * 100), 1),
            "torchrec_estimator_mape_pct": round(
                float(np.mean(np.abs(_loo_scaled(estimate, measured) - measured) / measured) * 100), 1),
            "noise_floor_pct": round(float(np.median(np.abs(first[keep] - measured) / measured) * 100), 1),
            "collectives_share_pct": round(float(np.sum(comm) / np.sum(measured) * 100), 1),
            # the two parts' own errors: where the type's error comes from
            "kernel_mape_pct": round(float(np.mean(np.abs(kernel - (measured - comm)) / (measured - comm)) * 100), 1),
            "collectives_mape_pct": (round(float(np.mean(np.abs(collectives - comm)[comm > 0] / comm[comm > 0]) * 100), 1)
                                     if (comm > 0).any() else None),
            # the collectives of one pass's process groups priced as the other pass measured them: the floor of any
            # price fitted in one process group (the profile's) on this machine
            "collectives_pass_mape_pct": _pass_mape(passes, kind, count, keep),
            # data-parallel: the dense kernel priced by the compute network instead (pooling / D at the batch: what
            # models profiled before dense kernels were price it with)
            "kernel_mape_network_pct": _network_kernel_mape(model, chosen, count, measured - comm)
            if kind == "data_parallel" else None,
        })
        print(", ".join(f"{k} {v}" for k, v in rows[-1].items()), flush=True)
    return rows


def retime(dataset: str, kernels: int) -> list[dict[str, Any]]:
    """Now / stored of `kernels` of the dataset's dense kernels and as many of its fused shards, timed again with the
    profile's reference (`--retime`)."""
    from shardwise.costmodel.train import compute_samples, dense_kernel_samples
    from shardwise.profiling import load_costs

    df = load_costs(dataset)
    reference_ms = float(df["reference_ms"].dropna().iloc[0])
    batch = int(df["batch_size"].iloc[0])
    device, protocol = resolve_timing(MeasurementSettings(reference_ms=reference_ms, batch_size=batch))
    dense = dense_kernel_samples(df)
    if not dense:
        raise BenchmarkError(f"--retime {dataset}: no dense kernels (kind 'data_parallel'): profile with "
                         "--data-parallel-shards")
    dense = dense[:: max(1, len(dense) // kernels)][:kernels]
    fused = compute_samples(df)
    picked = list(range(0, len(fused.shards), max(1, len(fused.shards) // kernels)))[:kernels]
    rows = []
    for label, now, stored in (
        ("dense kernels", [kernel_ms(list(tables), local_batch(batch, d), device, protocol, "dense")
                           for tables, d, _, _ in dense], [fwd + bwd for *_, fwd, bwd in dense]),
        ("fused shards", [kernel_ms(list(fused.shards[k]), batch, device, protocol) for k in picked],
         fused.costs_ms[picked].sum(axis=1)),
    ):
        ratio = np.asarray(now) / np.asarray(stored)
        rows.append({"kernels": label, "timed_again": len(ratio), "now_over_profiled_median": round(float(
            np.median(ratio)), 3), "quartiles": f"{np.quantile(ratio, 0.25):.3f}-{np.quantile(ratio, 0.75):.3f}"})
    return rows


def mape_by_count(errors: list[tuple[int, int, float, float]], devices: list[int]) -> str:
    """'2 devices x%, 4 devices y%; all z%' of (devices, bytes, measured, predicted) rows."""
    by_count = {c: 100 * float(np.mean([abs(p - ms) / ms for d, _, ms, p in errors if d == c])) for c in devices}
    return (", ".join(f"{c} devices {v:.1f}%" for c, v in by_count.items())
            + f"; all {100 * float(np.mean([abs(p - ms) / ms for *_, ms, p in errors])):.1f}%")


class DataParallelAccuracySettings(ExperimentSettings):
    """Which mode (the collectives' lines by default), which model, which shards."""

    devices: tuple[int, ...] = Field(default=(2, 4), json_schema_extra={"nargs": "+"})
    iters: int = Field(default=20, ge=1)
    model: str | None = Field(default=None, description="a saved cost model directory: also price tables' kernels "
                              "at the local batch")
    tables: int = Field(default=20, ge=1)
    seed: int = 0
    row_scale: float = Field(default=0.01, gt=0, description="scale of the synthetic tables' rows (as "
                             "plan_quality's; 1.0 is far outside a CPU-profiled model's tables)")
    skip_collectives: bool = Field(default=False, description="with --model: the kernels only")
    preset: str = Field(default="local", description="with --per-type: the pipeline preset whose held-out tables "
                        "(those its run keeps out of the cost model's training) make the shards")
    shards: int = Field(default=24, ge=1, description="with --per-type: held-out shards")
    max_tables: int = Field(default=8, ge=1, description="with --per-type: tables a shard at most")
    per_type: bool = Field(default=False, description="with --model: the held-out accuracy per sharding type only "
                           "(table-wise, data-parallel, row-wise)")
    row_blocks: bool = Field(default=False, description="with --model: the compute network's held-out error on row "
                             "blocks (row-wise tables' kernels) and whole shards, one measurement for every model")
    compare_model: tuple[str, ...] = Field(default=(), description="with --row-blocks: another model to price the "
                                           "same measurements (repeatable)")
    retime: str | None = Field(default=None, description="a cost dataset: time some of its dense kernels and fused "
                               "shards again, now / profiled (the machine's drift since)")
    retime_kernels: int = Field(default=24, ge=1, description="with --retime: kernels of each kind")

    @model_validator(mode="after")
    def _model_where_needed(self) -> DataParallelAccuracySettings:
        if (self.per_type or self.row_blocks) and not self.model:
            raise ValueError(f"{'--per-type' if self.per_type else '--row-blocks'} needs --model")
        return self


def run(args: DataParallelAccuracySettings, context: Context) -> Outcome:
    """One of the modes above; its rows, recorded under the mode's name."""
    devices = list(args.devices)
    if args.retime:
        return Outcome(retime(args.retime, args.retime_kernels), record_name="machine_drift",
                       title=f"How far this machine drifted since a profile ({args.retime})")
    if args.row_blocks:
        shards = held_out_shards(args.preset, args.shards, args.max_tables, args.seed)
        return Outcome(row_block_rows([str(args.model), *args.compare_model], shards, devices),
                       record_name="row_block_accuracy", title=f"The compute network on row blocks ({args.shards} "
                       f"shards of 1-{args.max_tables} of preset {args.preset}'s held-out tables, seed {args.seed})")
    if args.per_type:
        shards = held_out_shards(args.preset, args.shards, args.max_tables, args.seed)
        per_type = per_type_rows(str(args.model), shards, devices, args.iters)
        table_wise = per_type[0]["shardwise_mape_pct"]
        gaps = ", ".join(f"{r['sharding_type']} on {r['devices']} {r['shardwise_mape_pct'] - table_wise:+.1f}"
                         for r in per_type[1:])
        return Outcome(per_type, notes=[f"held-out MAPE against table-wise's {table_wise}%, in points: {gaps}"],
                       record_name="sharding_type_accuracy", title=f"Held-out accuracy per sharding type ({args.shards} "
                       f"shards of 1-{args.max_tables} of preset {args.preset}'s held-out tables, seed {args.seed}, "
                       f"model {args.model})")

    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    measured = {op: [] for op in COLLECTIVES} if args.skip_collectives else collective_points(devices, args.iters)
    for op in COLLECTIVES if measured["all_reduce"] else ():  # the collectives `pretrain` fits a line to
        points = measured[op]
        fitted = fit_all_reduce(points, collective=op)
        rows.append({"collective": op, "devices": "every count", "latency_ms": round(fitted.latency_ms, 4),
                     "hop_ms": round(fitted.hop_ms, 4), "ms_per_mib": round(fitted.ms_per_mib, 4)})
        rows += [{"collective": op, "devices": count, "latency_ms": round(latency_ms, 4), "hop_ms": None,
                  "ms_per_mib": round(ms_per_mib, 4)} for count, latency_ms, ms_per_mib in fitted.by_devices]
        # held out (each size left out): what the model stores (one line per device count) and one line over all
        for label, per_count in (("per device count", True), ("one line over every count", False)):
            errors = heldout_all_reduce_errors(points, per_device_count=per_count, collective=op)
            notes.append(f"{op} held-out MAPE, {label}: {mape_by_count(errors, devices)}")
    for op in ("all_gather", "all_to_all") if measured["all_reduce"] else ():  # how a model without them prices them
        scatter = fit_all_reduce(measured["reduce_scatter"], collective="reduce_scatter")
        errors = [(d, b, ms, float(scatter.predict_ms(b, d))) for d, b, ms in measured[op]]
        notes.append(f"{op} priced by the reduce-scatter lines, MAPE: {mape_by_count(errors, devices)}")
    if args.model:
        for count in devices:
            local, naive, block, whole = kernel_errors(args.model, args.tables, count, args.seed, args.row_scale)
            notes.append(f"kernel at the local batch, {count} devices, {args.tables} tables (row scale "
                         f"{args.row_scale}): MAPE {local:.1f}% (full batch / devices: {naive:.1f}%); a row block of "
                         f"1/{count} at the batch: MAPE {block:.1f}%; the whole tables at the batch: MAPE {whole:.1f}%")
    notes.insert(0, "lines: latency_ms + hop_ms x (D - 1) + ms_per_mib x volume x MiB (volume 2 (D-1)/D for the "
                 f"all-reduce, (D-1)/D for the others); sizes 4 KiB-16 MiB, the median of {args.iters} each")
    return Outcome(rows, notes, record_name="collective_accuracy",
                   title="The collectives' lines on this machine, and their held-out error")


register(Experiment(
    name="data_parallel_accuracy",
    title="How well data-parallel and row-wise tables are priced",
    settings=DataParallelAccuracySettings,
    run=run,
    # the headline's per-type figures (recorded as sharding_type_accuracy)
    suites={"claims": (SuiteRun({"model": "models:/shardwise-cost-cpu-x86_64-2c@champion", "per_type": True,
                                 "shards": 48}),)},
))
