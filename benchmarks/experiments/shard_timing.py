"""Where one timing of a device shard goes: building fbgemm's kernel, the cache flush, the paired reference kernel.

Refinement and the evaluator time every device shard `timing_rounds` times (9 by default), and each timing is
`measure_shard`: build the kernel, then `time_kernel` under the profiler's protocol (warm-up and timed iterations,
a cache flush before each, each iteration paired with one of the reference kernel). This prints, per shard timing,
the seconds of the build and of the protocol's timing, and how much of the timing the flush and the reference
pairing take (the same built kernel timed with either turned off, in turn within each round). Shards: an 8-device
paper task's tables dealt round-robin over its devices (about 12 a device, as the plans there hold).

`--flush-mib 0,256,960` instead times the same kernels with each flush size in turn (0: none) and prints the
seconds of a timing and the shards' kernel times next to those of the largest size: what capping the flush
(`TimingProtocol.flush_bytes`) saves and what it changes, on a machine whose last-level cache is large.
`--pairing` times them as `time_kernel` does (a flush before the shard and another before its reference) next
to one flush per pair (the reference, then the shard right after it): what the second flush costs and what the
shard's times lose without it.

    python -m benchmarks shard_timing [--rounds 3] [--flush-mib 0,256,960 | --pairing] [--record]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
from pydantic import Field

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, register
from benchmarks.plan_runs import paper_tasks
from shardwise.profiling import MeasurementSettings, TimingProtocol
from shardwise.profiling.hardware import device_name, last_level_cache_bytes
from shardwise.profiling.kernel import (
    ShardKernel,
    ShardTiming,
    _reference_kernel,
    _Timer,
    build_shard_kernel,
    resolve_timing,
    shard_timing,
    time_kernel,
)
from shardwise.workload import ShardingTask, TableSpec


class ShardTimingSettings(ExperimentSettings):
    """How many rounds, and which comparison (the parts of a timing by default)."""

    rounds: int = Field(default=3, ge=1, description="rounds over the task's device shards")
    flush_mib: tuple[int, ...] | None = Field(default=None, description="compare these flush sizes in MiB (comma "
                                              "separated; 0: no flush; recorded as shard_timing_flush)",
                                              json_schema_extra={"sep": ","})
    pairing: bool = Field(default=False, description="compare one flush per pair with one per call (recorded as "
                          "shard_timing_pairing)")


def run(args: ShardTimingSettings, context: Context) -> Outcome:
    """The parts of one shard timing, or the flush sizes, or the flush pairings, compared."""
    measurement = MeasurementSettings()
    task = next(task for name, task in paper_tasks(1, seed=0, batch_size=2048) if name.startswith("8dev"))
    devices = task.num_devices
    shards = [list(task.tables[d::devices]) for d in range(devices)]
    device, protocol = resolve_timing(measurement)
    if args.flush_mib:
        return compare_flush_sizes(task, shards, device, protocol, list(args.flush_mib), args.rounds)
    if args.pairing:
        return compare_pairing(task, shards, device, protocol, args.rounds)
    variants = {"protocol": protocol, "no flush": protocol.model_copy(update={"flush_cache": False}),
                "no reference": protocol.model_copy(update={"reference_normalised": False})}
    seconds: dict[str, list[float]] = {"build": [], **{name: [] for name in variants}}
    for r in range(args.rounds):
        for tables in shards:
            started = time.perf_counter()
            kernel = build_shard_kernel(tables, task.batch_size, device=device, optimizer=task.optimizer,
                                        weights_precision=task.weights_precision)
            seconds["build"].append(time.perf_counter() - started)
            names = list(variants)
            for name in names[r % len(names):] + names[:r % len(names)]:  # each variant first in turn
                started = time.perf_counter()
                time_kernel(kernel, device, variants[name])
                seconds[name].append(time.perf_counter() - started)
        print(f"  round {r + 1} done", flush=True)
    build, timing = statistics.median(seconds["build"]), statistics.median(seconds["protocol"])
    total = build + timing
    parts = {"build the kernel": build,
             "cache flush": timing - statistics.median(seconds["no flush"]),
             "reference kernel, paired": timing - statistics.median(seconds["no reference"])}
    parts["the shard's own iterations"] = total - sum(parts.values())
    rows = [{"part": name, "seconds_per_timing": round(s, 4), "share": round(s / total, 3)}
            for name, s in parts.items()]
    rows.append({"part": "one timing (measure_shard)", "seconds_per_timing": round(total, 4), "share": 1.0})
    timings = devices * measurement.timing_rounds
    once = f"{devices} device shards x {measurement.timing_rounds} timings = {total * timings:.1f} s"
    return Outcome(rows, notes=[
        f"the first task of the 8-device paper set, its {len(task.tables)} tables dealt round-robin over {devices} "
        f"devices, batch {task.batch_size}; protocol: {protocol.warmup_calls} warm-up + {protocol.iters} timed "
        f"iterations; median over {args.rounds} rounds of each part; flush and reference: the protocol's timing less "
        f"the same kernel's timing with either turned off; a plan measured once: {once}"])


Way = Callable[[ShardKernel], ShardTiming]


def _time_in_turn(kernels: list[ShardKernel], ways: dict[str, Way], rounds: int
                  ) -> tuple[dict[str, float], dict[str, list[list[ShardTiming]]]]:
    """Each kernel timed every way in turn, each way first in turn within a round: per way, the median seconds of
    a timing, and per kernel its timings, one a round."""
    names = list(ways)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    timings: dict[str, list[list[ShardTiming]]] = {name: [[] for _ in kernels] for name in names}
    for r in range(rounds):
        for k, kernel in enumerate(kernels):
            for name in names[r % len(names):] + names[:r % len(names)]:
                started = time.perf_counter()
                timings[name][k].append(ways[name](kernel))
                seconds[name].append(time.perf_counter() - started)
        print(f"  round {r + 1} done", flush=True)
    return {name: statistics.median(seconds[name]) for name in names}, timings


def _raw_ms(timing: ShardTiming) -> float:
    return timing.raw_fwd_ms + timing.raw_bwd_ms


def _normalised_ms(timing: ShardTiming) -> float:
    return timing.fwd_ms + timing.bwd_ms


def _build(task: ShardingTask, shards: list[list[TableSpec]], device: torch.device) -> list[ShardKernel]:
    return [build_shard_kernel(tables, task.batch_size, device=device, optimizer=task.optimizer,
                               weights_precision=task.weights_precision) for tables in shards]


def compare_flush_sizes(task: ShardingTask, shards: list[list[TableSpec]], device: torch.device,
                        protocol: TimingProtocol, sizes_mib: list[int], rounds: int) -> Outcome:
    """Time each device shard's kernel under each flush size in turn."""
    kernels = _build(task, shards, device)
    cache_mib = last_level_cache_bytes(device) / 2**20
    ways: dict[str, Way] = {
        str(mib): partial(time_kernel, device=device,
                          protocol=protocol.model_copy(update={"flush_cache": mib > 0, "flush_bytes": mib * 2**20}))
        for mib in sizes_mib}
    seconds, timings = _time_in_turn(kernels, ways, rounds)
    kernel_ms = {name: [statistics.median(map(_raw_ms, ts)) for ts in per_kernel] for name, per_kernel in timings.items()}
    largest = str(max(sizes_mib))
    rows = []
    for name in ways:
        ratios = [a / b for a, b in zip(kernel_ms[name], kernel_ms[largest])]
        rows.append({"flush_mib": int(name), "seconds_per_timing": round(seconds[name], 3),
                     "kernel_ms_all_shards": round(sum(kernel_ms[name]), 1),
                     "kernel_vs_largest": round(sum(kernel_ms[name]) / sum(kernel_ms[largest]), 4),
                     "shard_vs_largest_min": round(min(ratios), 3), "shard_vs_largest_max": round(max(ratios), 3)})
    return Outcome(rows, record_name="shard_timing_flush",
                   title="What the cache flush's size costs a shard timing and changes in it", notes=[
        f"CPU: {device_name('cpu')}, last-level cache {cache_mib:.0f} MiB, the protocol flushes "
        f"{protocol.flush_bytes / 2**20:.0f} MiB; the first task of the 8-device paper set, its {len(task.tables)} "
        f"tables dealt round-robin over {len(kernels)} devices, batch {task.batch_size}; each shard's kernel timed "
        f"under each flush size in turn, {rounds} rounds; kernel ms: fwd+bwd, unnormalised, median over rounds, summed "
        "over the shards; per shard: the range over shards of its kernel ms over the largest flush's"])


def _time_kernel_one_flush(kernel: ShardKernel, device: torch.device, protocol: TimingProtocol) -> ShardTiming:
    """`time_kernel` with one flush per pair: the reference right after it, then the shard (not flushed)."""
    timer, reference = _Timer(device, protocol), _reference_kernel(device)
    unflushed = _Timer(device, protocol.model_copy(update={"flush_cache": False}))
    fwd, bwd, ref = [], [], []
    for i in range(protocol.warmup_calls + protocol.iters):
        ref_ms = sum(timer.run(reference))
        fwd_ms, bwd_ms = unflushed.run(kernel)
        if i >= protocol.warmup_calls:
            fwd.append(fwd_ms)
            bwd.append(bwd_ms)
            ref.append(ref_ms)
    return shard_timing(fwd, bwd, ref, protocol.reference_ms)


def compare_pairing(task: ShardingTask, shards: list[list[TableSpec]], device: torch.device,
                    protocol: TimingProtocol, rounds: int) -> Outcome:
    """Time each device shard's kernel both ways in turn."""
    kernels = _build(task, shards, device)
    protocol_way = "a flush per call (time_kernel)"
    ways: dict[str, Way] = {"one flush per pair": partial(_time_kernel_one_flush, device=device, protocol=protocol),
                            protocol_way: partial(time_kernel, device=device, protocol=protocol)}
    seconds, timings = _time_in_turn(kernels, ways, rounds)
    rows = []
    for name in ways:
        ratios = {kind: [statistics.median(map(ms, a)) / statistics.median(map(ms, b))
                         for a, b in zip(timings[name], timings[protocol_way])]
                  for kind, ms in (("raw", _raw_ms), ("normalised", _normalised_ms))}
        rows.append({"timing": name, "seconds_per_timing": round(seconds[name], 3),
                     **{f"{kind}_vs_protocol": round(statistics.median(r), 4) for kind, r in ratios.items()},
                     **{f"{kind}_vs_protocol_range": f"{min(r):.3f}-{max(r):.3f}" for kind, r in ratios.items()}})
    return Outcome(rows, record_name="shard_timing_pairing",
                   title="One cache flush per shard and reference pair, or one per call", notes=[
        f"CPU: {device_name('cpu')}, flush {protocol.flush_bytes / 2**20:.0f} MiB; the first task of the 8-device "
        f"paper set, its {len(task.tables)} tables dealt round-robin over {len(kernels)} devices, batch "
        f"{task.batch_size}; each shard's kernel timed both ways in turn, {rounds} rounds; per shard, its median over "
        "rounds over the median timed as time_kernel does; median and range over shards; raw: fwd+bwd ms; "
        "normalised: by the paired reference"])


register(Experiment(
    name="shard_timing",
    title="Where one timing of a device shard goes",
    settings=ShardTimingSettings,
    run=run,
))
