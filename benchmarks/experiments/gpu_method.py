"""The whole method on one device, with the figures that say whether its ground truth holds there: the CUDA timers
compared, the profile's noise floor, speed and cost-versus-work correlation (at the preset's batch and at a small
one), the cost model on held-out tables next to TorchRec's estimator and the additive baseline, and each plan's
measured kernel cost over TorchRec's.

Steps, at a pipeline preset's sizes (presets.yaml; `gpu-check` on a GPU, `smoke` to prove the path on a CPU):
synthesize the tables, split off the held-out ones, augment the rest; time a few shards with every timer, in turns
(CUDA: held, graph, events; a CPU has its clock alone); profile the training tables and, apart, the held-out tables,
with repeats for the noise floor, and a small probe at `--probe-batch`; pre-train on the device; plan two tasks of
held-out tables (half the preset's devices and tables, and the preset's) with neuroshard, measured_greedy,
size_lookup_greedy, torchrec and torchrec_cw, and NeuroShard's plan refined on the device's kernels as `plan
--refine` refines (neuroshard_refined); measure every plan's device shards on the device's kernels in
interleaved rounds. One GPU holds no NCCL group of several ranks, so plans are compared on their kernels alone
(the slowest device's forward + backward): no all-to-all is measured. No MLflow: everything stays in `--out`.
Figures are written to `--out`/gpu_method.json after every step (a run cut short keeps what it measured), and with
`--record` to benchmarks/results/<record name>/.

    python -m benchmarks --suite gpu --record                                # benchmarks/gpu_check.sh
    python -m benchmarks gpu_method --device cpu --preset smoke --probe-shards 0    # the path, on a CPU
    python -m benchmarks gpu_method --reread benchmarks/results/gpu/profiles_2026-11-27_h100_run5.tar.gz
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field
from scipy.stats import spearmanr

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, SuiteRun, register
from benchmarks.profiles import extracted, split_workload
from shardwise.costmodel import TrainConfig, train_cost_model
from shardwise.evaluation import KernelShard, time_shards_in_rounds
from shardwise.evaluation.refine import refine_plan, search_resplit
from shardwise.pipelines.params import pipeline_params
from shardwise.profiling import MeasurementSettings, TimingProtocol, resolve_timing
from shardwise.profiling.dataset import load_costs, noise_floor
from shardwise.profiling.hardware import device_name, resolve_device
from shardwise.profiling.kernel import Timer, build_shard_kernel, time_kernel, time_with
from shardwise.profiling.protocol import CudaTimer
from shardwise.profiling.runner import ProfileSettings, profile
from shardwise.profiling.sampling import sample_shard_configs
from shardwise.search import make_searcher
from shardwise.search.plan import Plan, device_specs
from shardwise.workload import (
    ShardingTask,
    TableSpec,
    augment_tables,
    sample_task,
    synthesize_tables,
)

METHODS = ("neuroshard", "measured_greedy", "size_lookup_greedy", "torchrec", "torchrec_cw")
BASELINE = "torchrec"
#: NeuroShard's plan refined on the device's kernels (the planning_s of its row: the refinement's), in rounds
REFINED, REFINE_ROUNDS = "neuroshard_refined", 3
#: the method's bars on a GPU: noise floor at the small batch and at 65536, widest spread, work correlation,
#: held-out MAPE and Spearman, shards/s at 65536, NeuroShard's plan over TorchRec's
TARGETS = {"noise_small_batch": 0.02, "noise_large_batch": 0.01, "max_spread": 0.10, "work_correlation": 0.6,
           "mape_pct": 6.0, "spearman": 0.98, "shards_per_s": 20.0, "plan_over_torchrec": 0.9}


class Figures:
    """The run's figures, written to `out`/gpu_method.json after every step."""

    def __init__(self, out: Path, header: dict[str, Any]) -> None:
        self.path = out / "gpu_method.json"
        self.doc: dict[str, Any] = {**header, "steps": {}}

    def add(self, step: str, figures: Any, seconds: float) -> None:
        self.doc["steps"][step] = {"seconds": round(seconds, 1), "figures": figures}
        self.path.write_text(json.dumps(self.doc, indent=1, default=float) + "\n")
        print(f"[{step}: {seconds:.0f} s]", flush=True)


def _correlation(x: list[float], y: list[float]) -> float | None:
    return float(np.corrcoef(x, y)[0, 1]) if len(x) > 2 and np.ptp(x) > 0 and np.ptp(y) > 0 else None


def _rank_correlation(x: list[float], y: list[float]) -> float | None:
    return float(spearmanr(x, y).statistic) if len(x) > 2 and np.ptp(x) > 0 and np.ptp(y) > 0 else None


#: the CUDA timers compared, the first the one the others are read against
CUDA_TIMERS = ("held", "queued", "graph", "events")
#: the queued timer as the profiler runs it (`measure_shards`): not new to the host's launch time at every shard
HOLD_CARRIED = "queued, hold carried"


def compare_timers(shards: list[list[TableSpec]], batch: int, device: torch.device, rounds: int,
                   protocol: TimingProtocol) -> list[dict[str, Any]]:
    """Each shard timed `rounds` times by every timer, the timers taking turns on one built kernel: per timer, the
    median spread of a shard's repeats, its median ratio to the held timer, the correlation of cost with tables,
    the median host launch ms, the median wall ms a shard's timing took (warm-up and timed calls), what actually
    timed (graphs fall back to held, a queue's first call is held) and calls a hold did not cover."""
    names = list(CUDA_TIMERS) if device.type == "cuda" else [str(protocol.for_device(device).clock)]
    # the protocol's warm-up on CUDA (one call) against the 3 calls it used before, both queued
    updates: dict[str, dict[str, Any]] = {n: {"cuda_timer": n if device.type == "cuda" else None} for n in names}
    if device.type == "cuda" and protocol.warmup_calls != 3:
        names.append("queued, 3 warm-up")
        updates[names[-1]] = {"cuda_timer": "queued", "warmup_iters": 3}
    if device.type == "cuda":  # as the profiler times: each shard's timer starts from the hold the last one learned
        names.append(HOLD_CARRIED)
        updates[HOLD_CARRIED] = {"cuda_timer": "queued"}
    carried: Timer | None = None  # the profiler's timer, shard after shard
    totals: dict[str, list[list[float]]] = {n: [[] for _ in shards] for n in names}
    launches: dict[str, list[float]] = {n: [] for n in names}
    walls: dict[str, list[float]] = {n: [] for n in names}
    used: dict[str, set[str]] = {n: set() for n in names}
    uncovered, retried = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
    for s, tables in enumerate(shards):
        kernel = build_shard_kernel(tables, batch, device=device)
        for _ in range(rounds):
            for name in names:
                timed = protocol.model_copy(update=updates[name])
                began = time.perf_counter()
                if name == HOLD_CARRIED:
                    carried = carried.successor() if carried else Timer(device, timed.for_device(device))
                    timing = time_with(carried, kernel, timed.for_device(device), None)
                else:
                    timing = time_kernel(kernel, device, timed.for_device(device))
                walls[name].append((time.perf_counter() - began) * 1e3)
                totals[name][s].append(timing.total_ms)
                used[name].add(str(timing.timer))
                if timing.launch_ms is not None:
                    launches[name].append(timing.launch_ms)
        if device.type == "cuda":  # calls a hold did not cover, counted on one timing per shard
            for name in ("held", "queued"):
                probe = Timer(device, protocol.model_copy(update={"cuda_timer": name}).for_device(device))
                probe.calls(kernel, protocol.warmup_calls + protocol.iters)
                uncovered[name] += probe.uncovered + (probe.cuda_timer != name)  # a queue that fell back
                retried[name] += probe.retried
    medians = {n: [statistics.median(t) for t in totals[n]] for n in names}
    counts = [float(len(t)) for t in shards]
    rows = []
    for name in names:
        spreads = [max(t) / min(t) - 1 for t in totals[name]]
        ratio = [m / h for m, h in zip(medians[name], medians[names[0]])]
        rows.append({
            "timer": name, "timed_by": ",".join(sorted(used[name])),
            "median_spread": round(statistics.median(spreads), 4), "max_spread": round(max(spreads), 4),
            "median_ratio_to_first": round(statistics.median(ratio), 4),
            "work_correlation": _round(_correlation(counts, medians[name])),
            "median_ms": round(statistics.median(medians[name]), 4),
            "median_launch_ms": round(statistics.median(launches[name]), 4) if launches[name] else None,
            "median_wall_ms_a_shard": round(statistics.median(walls[name]), 2),
            "uncovered_calls": uncovered[name] if name in ("held", "queued") and device.type == "cuda" else None,
            # calls launched again behind a longer hold by a timer new to the host (its first hold FIRST_HOLD_MS)
            "retried_calls": retried[name] if name in ("held", "queued") and device.type == "cuda" else None,
        })
    return rows


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def profile_figures(costs: Path, seconds: float | None, measured: int) -> dict[str, Any]:
    """What a profile says about the ground truth: speed (None without `seconds`), noise floor, cost against work,
    launch-bound shards."""
    df = load_costs(costs)
    compute = df[df["kind"] == "compute"]
    first = compute[compute["repeat"] == 0]
    totals = (first["fwd_ms"] + first["bwd_ms"]).to_numpy()
    noise = noise_floor(compute)
    launch = first["launch_ms"].to_numpy(dtype=float)
    known = ~np.isnan(launch)
    # per shard, each table's pooled lookups per sample times their width (pooling factor x dim)
    widths = [[t["pooling_factor"] * t["dim"] for t in json.loads(j)] for j in first["tables_json"]]
    return {
        "shards": int(len(first)), "measured": measured, "shards_per_s": round(measured / seconds, 2) if seconds else None,
        "noise_median_rel_dev": _round(noise["median_rel_dev"]), "noise_median_spread": _round(noise["median_spread"]),
        "noise_max_spread": _round(noise["max_spread"]), "repeated_configs": int(noise["configs"]),
        "work_correlation": _round(_correlation(first["num_tables"].astype(float).tolist(), totals.tolist())),
        # the same in ranks (Spearman): whether cost grows with the tables, whatever the tables' sizes
        "work_rank_correlation": _round(_rank_correlation(first["num_tables"].astype(float).tolist(),
                                                          totals.tolist())),
        # the work in the lookups (the tables' pooling x dim summed): what a shard's cost follows where the number
        # of tables does not
        "lookup_correlation": _round(_correlation([sum(w) for w in widths], totals.tolist())),
        # the heaviest table's alone: what the cost follows where the device runs all the shard's bags in one wave
        "heaviest_correlation": _round(_correlation([max(w) for w in widths], totals.tolist())),
        "median_total_ms": round(float(np.median(totals)), 4),
        "median_launch_ms": round(float(np.median(launch[known])), 4) if known.any() else None,
        "launch_bound_share": round(float((launch[known] > totals[known]).mean()), 4) if known.any() else None,
        "timers": sorted(str(t) for t in first["timer"].dropna().unique()),
    }


def reread(archive: Path) -> list[dict[str, Any]]:
    """The profile figures (all but the speed) of the datasets in a gpu_check.sh archive, read again."""
    with extracted(archive) as folder:
        return [{"dataset": f"{archive.name} {name}", **profile_figures(folder / name, None, 0)}
                for name in ("costs", "probe_costs") if (folder / name).exists()]


#: shards profiled first to learn the device's speed, when the profile has a time budget
PILOT_SHARDS = 40


def run_profile(tables: list[TableSpec], holdout: list[TableSpec], out: Path, settings: ProfileSettings,
                holdout_shards: int, budget_s: float | None = None) -> tuple[float, int, int, int]:
    """The training tables' shards and, apart (no shard mixes the two), the held-out tables' shards, into `out`.
    With `budget_s`, a pilot of PILOT_SHARDS training shards first, then as many more of both (at most the asked
    numbers, in their proportion) as the pilot's speed fits in the budget: the run resumes the pilot's shards (a
    config's id is its content, and the sampled configs of a smaller run are the first of a larger one).
    Returns seconds, measurements, training and held-out shards."""
    start = time.perf_counter()
    measured, scale = 0, 1.0
    if budget_s is not None and settings.num_shards > PILOT_SHARDS:
        pilot = settings.model_copy(update={"num_shards": PILOT_SHARDS, "repeats": 0})
        measured += profile(tables, out, pilot, progress=False).measured
        elapsed = time.perf_counter() - start
        rest = settings.num_shards - PILOT_SHARDS + holdout_shards + settings.repeats * settings.repeat_shards
        scale = min(1.0, measured / elapsed * max(budget_s - elapsed, 0.0) / rest)
        if scale < 1.0:
            print(f"profile: {measured / elapsed:.1f} shards/s in the pilot: {scale:.0%} of the shards fit in "
                  f"{budget_s:.0f} s")
    shards = max(min(settings.num_shards, PILOT_SHARDS), round(settings.num_shards * scale))
    held_out = round(holdout_shards * scale)
    measured += profile(tables, out, settings.model_copy(update={"num_shards": shards}), progress=False).measured
    if held_out:
        apart = settings.model_copy(update={"num_shards": held_out, "seed": settings.seed + 1, "repeats": 0})
        measured += profile(holdout, out, apart, progress=False).measured
    return time.perf_counter() - start, measured, shards, held_out


def plan_and_measure(tasks: list[ShardingTask], model: Any, measurement: MeasurementSettings, device: torch.device,
                     protocol: TimingProtocol) -> list[dict[str, Any]]:
    """Every method's plan of every task, each plan's device shards timed in interleaved rounds on `device`; per
    plan its slowest device's kernel ms (compute alone) and that over TorchRec's table-wise plan's."""
    rows: list[dict[str, Any]] = []
    for index, task in enumerate(tasks):
        plans: dict[str, Plan] = {}
        for method in METHODS:
            options: dict[str, Any] = {"measurement": measurement} if method == "measured_greedy" else {}
            started = time.perf_counter()
            try:
                plans[method] = make_searcher(method, **options).search(task, model, 0)
            except Exception as err:  # noqa: BLE001 - a method that finds no plan is reported, the rest go on
                print(f"task {index}: {method} found no plan ({str(err).splitlines()[0][:160]})")
                rows.append({"task": index, "devices": task.num_devices, "tables": len(task.tables),
                             "method": method, "kernel_ms": None, "over_torchrec": None, "planning_s": None})
                continue
            rows.append({"task": index, "devices": task.num_devices, "tables": len(task.tables), "method": method,
                         "planning_s": round(time.perf_counter() - started, 2)})
        if "neuroshard" in plans:
            # as `shardwise plan --refine` does (from the measured greedy's plan too, tables re-split where the
            # measurements say), on the kernels alone: one GPU hosts no all-to-all of several ranks
            started = time.perf_counter()
            starts = [plans["measured_greedy"]] if "measured_greedy" in plans else []
            plans[REFINED], _ = refine_plan(task, plans["neuroshard"], model, measurement, rounds=REFINE_ROUNDS,
                                            starts=starts, progress=False, exchange=False,
                                            resplit=search_resplit(make_searcher("neuroshard"), task, model, 0))
            rows.append({"task": index, "devices": task.num_devices, "tables": len(task.tables), "method": REFINED,
                         "planning_s": round(time.perf_counter() - started, 2)})
        layouts = {m: device_specs(p, task) for m, p in plans.items()}
        shards = [KernelShard(tables, task.batch_size, task.optimizer, task.weights_precision)
                  for devices in layouts.values() for tables in devices if tables]
        timed = iter(time_shards_in_rounds(shards, measurement.timing_rounds, device=device, protocol=protocol,
                                           progress=False))
        cost = {m: max((statistics.median(t.total_ms for t in next(timed)) if tables else 0.0) for tables in devices)
                for m, devices in layouts.items()}
        for row in rows:
            if row["task"] == index and row["method"] in cost:
                row["kernel_ms"] = round(cost[row["method"]], 4)
                row["over_torchrec"] = round(cost[row["method"]] / cost[BASELINE], 4) if BASELINE in cost else None
    return rows


class GpuMethodSettings(ExperimentSettings):
    """Which device and preset, how much of it to profile, which timers."""

    device: str | None = Field(default=None, description="cpu or cuda (default: cuda when present)")
    preset: str = Field(default="gpu-check", description="presets.yaml's sizes (gpu-check; smoke on a CPU)")
    out: str = "runs/bench_gpu_method"
    timer_shards: int = Field(default=6, ge=0, description="shards every timer times (0: no comparison)")
    timer_rounds: int = Field(default=3, ge=1, description="timings of each shard by each timer")
    num_shards: int | None = Field(default=None, ge=1, description="training shards (default: the preset's)")
    holdout_shards: int | None = Field(default=None, ge=0, description="held-out shards (default: the preset's)")
    profile_budget_s: float | None = Field(default=None, gt=0, description="fit the main profile in this many "
                                           "seconds: a pilot's speed decides how many of the preset's shards are "
                                           "measured (default: all of them)")
    repeat_shards: int = Field(default=30, ge=0, description="profiled shards measured again (noise floor)")
    reread: str | None = Field(default=None, description="the profile figures of a run's datasets (gpu_check.sh's "
                               "datasets.tar.gz), read again instead of a run")
    probe_batch: int = Field(default=2048, ge=1, description="the small batch of the probe profile")
    probe_shards: int = Field(default=120, ge=0, description="shards of the probe profile (0: none)")
    cuda_timer: CudaTimer | None = Field(
        default=None, description="the profile's and the plans' CUDA timer (default: the protocol's)")


def run(args: GpuMethodSettings, context: Context) -> Outcome:
    """Every step in turn, its figures written as it ends; one row per figure with its bar."""
    if args.reread:
        return Outcome(reread(Path(args.reread)), record_name="gpu_method_reread",
                       title="Profile figures of a gpu_check.sh archive, read again")
    device = resolve_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # as the profiler times a CPU: the timers below call time_kernel directly
    overrides = {"profile_num_shards": args.num_shards, "profile_holdout_shards": args.holdout_shards}
    preset = pipeline_params({k: v for k, v in overrides.items() if v is not None}, preset_name=args.preset)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batch, seed = preset.batch_size, preset.seed
    cuda_timer = args.cuda_timer if device.type == "cuda" else None
    figures = Figures(out, {"device": device_name(device), "torch": torch.__version__, "preset": args.preset,
                            "batch_size": batch, "row_scale": preset.row_scale, "targets": TARGETS,
                            "cuda_timer": TimingProtocol(cuda_timer=cuda_timer).for_device(device).cuda_timer})
    started = time.perf_counter()

    t0 = time.perf_counter()
    train, holdout = split_workload(preset)
    train = augment_tables(train, seed)
    figures.add("workload", {"train_tables": len(train.tables), "holdout_tables": len(holdout.tables)},
                time.perf_counter() - t0)

    protocol = TimingProtocol(iters=preset.profile_timing_iters, cuda_timer=cuda_timer)
    # how plans are measured, and the timers compared: as the profile times (a CPU's reference calibrated once)
    measurement = MeasurementSettings(device=str(device), timing_iters=preset.profile_timing_iters,
                                      timing_rounds=preset.evaluate_timing_rounds, cuda_timer=cuda_timer)
    timing_device, timing_protocol = resolve_timing(measurement)
    # the tables at the probe's batch (their reuse bins are measured at the batch they are synthesized for)
    probe_tables = synthesize_tables(preset.num_tables, seed=seed, row_scale=preset.row_scale,
                                     batch_size=args.probe_batch, progress=False) if args.probe_shards else None
    if args.timer_shards:
        # at both batches: where the host's launches outlast the kernels (the small one) events and held part ways
        for step, pool, at in (("timers", train.tables, batch),
                               ("probe_timers", probe_tables.tables if probe_tables else (), args.probe_batch)):
            if not pool:
                continue
            t0 = time.perf_counter()
            shards = sample_shard_configs(pool, args.timer_shards, batch_size=at, seed=seed + 7,
                                          max_tables=preset.profile_max_tables)
            timers = compare_timers(shards, at, timing_device, args.timer_rounds, timing_protocol)
            figures.add(step, timers, time.perf_counter() - t0)
            for row in timers:
                print(f"batch {at}: timer {row['timer']:>7} (timed by {row['timed_by']}): median spread "
                      f"{row['median_spread']:.1%}, max {row['max_spread']:.1%}, over {timers[0]['timer']} "
                      f"{row['median_ratio_to_first']:.3f}, cost~tables r={row['work_correlation']}, median "
                      f"{row['median_ms']:.3f} ms, launch {row['median_launch_ms']} ms, "
                      f"{row['median_wall_ms_a_shard']} ms a shard's timing, uncovered {row['uncovered_calls']}, "
                      f"retried {row['retried_calls']}")

    settings = ProfileSettings(num_shards=preset.profile_num_shards, max_tables=preset.profile_max_tables,
                               repeats=max(preset.profile_repeats, 1), repeat_shards=args.repeat_shards, seed=seed,
                               device=str(device), batch_size=batch, protocol=protocol)
    costs = out / "costs"
    seconds, measured, shards_run, held_out_run = run_profile(
        list(train.tables), list(holdout.tables), costs, settings, preset.profile_holdout_shards, args.profile_budget_s)
    main_profile = {"training_shards": shards_run, "held_out_shards": held_out_run,
                    **profile_figures(costs, seconds, measured)}
    figures.add("profile", main_profile, seconds)
    print(f"profile at batch {batch}: {main_profile}")
    if probe_tables is not None:
        probe = settings.model_copy(update={"num_shards": args.probe_shards, "batch_size": args.probe_batch})
        seconds, measured, _, _ = run_profile(list(probe_tables.tables), [], out / "probe_costs", probe, 0)
        probe_profile = profile_figures(out / "probe_costs", seconds, measured)
        figures.add("probe_profile", probe_profile, seconds)
        print(f"profile at batch {args.probe_batch}: {probe_profile}")

    t0 = time.perf_counter()
    sources = tuple(sorted({t.source or t.name for t in holdout.tables}))
    config = TrainConfig(device=str(device), holdout_sources=sources, progress=False,
                         **{k: v for k, v in {"epochs": preset.pretrain_epochs,
                                              "patience": preset.pretrain_patience}.items() if v})
    model, report = train_cost_model(load_costs(costs), seed, config)
    model.save(out / "model")
    context.name_model(f"{out / 'model'}, trained in this run")
    m = report.metrics
    accuracy = {name: {"mape_pct": _round(m.get(f"{stem}_mape_pct"), 2), "spearman": _round(m.get(f"{stem}_spearman"))}
                for name, stem in (("neural", "neural_heldout_tables_total"),
                                   ("torchrec_estimator", "torchrec_estimator_heldout_tables_total"),
                                   ("additive", "additive_heldout_tables_total"),
                                   ("noise_floor", "noise_floor_repeats_total"))}
    accuracy["sizes"] = report.sizes
    figures.add("pretrain", accuracy, time.perf_counter() - t0)
    print(f"held-out tables (fwd+bwd), trained on {report.sizes}: " + ", ".join(
        f"{k} MAPE {v['mape_pct']}% Spearman {v['spearman']}" for k, v in accuracy.items() if k != "sizes"))

    t0 = time.perf_counter()
    tasks = [sample_task(holdout, num_tables, num_devices, seed, memory_slack=preset.memory_slack)
             for num_devices, num_tables in ((max(preset.num_devices // 2, 2), preset.task_num_tables // 2),
                                             (preset.num_devices, preset.task_num_tables))]
    plans = plan_and_measure(tasks, model, measurement, timing_device, timing_protocol)
    figures.add("plans", plans, time.perf_counter() - t0)
    for row in plans:
        print(f"task {row['task']} ({row['tables']} tables, {row['devices']} devices) {row['method']:>18}: "
              f"kernels {row.get('kernel_ms')} ms, over torchrec {row.get('over_torchrec')}")

    total_s = time.perf_counter() - started
    figures.add("total", {"seconds": round(total_s, 1)}, total_s)
    return outcome(args, device, figures.doc, summary_rows(args, figures.doc), total_s)


def summary_rows(args: GpuMethodSettings, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: what it is, its value, the issue's bar where it sets one, and whether it is met."""
    steps = doc["steps"]
    rows: list[dict[str, Any]] = []

    def add(figure: str, value: Any, bar: tuple[str, float] | None = None) -> None:
        met = None
        if bar is not None and isinstance(value, int | float):
            met = value <= bar[1] if bar[0] == "<=" else value >= bar[1]
        rows.append({"figure": figure, "value": value, "target": f"{bar[0]} {bar[1]}" if bar else "", "met": met})

    for name, key in (("profile", f"batch {doc['batch_size']}"), ("probe_profile", f"batch {args.probe_batch}")):
        if name not in steps:
            continue
        f = steps[name]["figures"]
        noise = TARGETS["noise_large_batch"] if name == "profile" else TARGETS["noise_small_batch"]
        add(f"{key}: noise floor (median deviation of repeats)", f["noise_median_rel_dev"], ("<=", noise))
        add(f"{key}: widest spread of a repeated shard", f["noise_max_spread"], ("<=", TARGETS["max_spread"]))
        add(f"{key}: cost ~ number of tables (Pearson)", f["work_correlation"], (">=", TARGETS["work_correlation"]))
        add(f"{key}: cost ~ number of tables (Spearman)", f.get("work_rank_correlation"))
        add(f"{key}: cost ~ pooling x dim of its tables (Pearson)", f.get("lookup_correlation"))
        add(f"{key}: cost ~ pooling x dim of its heaviest table (Pearson)", f.get("heaviest_correlation"))
        add(f"{key}: shards/s", f["shards_per_s"], (">=", TARGETS["shards_per_s"]) if name == "profile" else None)
        add(f"{key}: median host launch ms of a shard (fwd+bwd)", f["median_launch_ms"])
        add(f"{key}: share of shards whose launch outlasts their kernels", f["launch_bound_share"])
    accuracy = steps.get("pretrain", {}).get("figures", {})
    for predictor, f in accuracy.items():
        if predictor == "sizes":
            continue
        neural = predictor == "neural"
        add(f"held-out tables: {predictor} MAPE %", f["mape_pct"], ("<=", TARGETS["mape_pct"]) if neural else None)
        add(f"held-out tables: {predictor} Spearman", f["spearman"], (">=", TARGETS["spearman"]) if neural else None)
    plans = steps.get("plans", {}).get("figures", [])
    for row in plans:
        task = f"task {row['task']} ({row['tables']} tables, {row['devices']} devices)"
        add(f"{task}: {row['method']} kernels over torchrec", row.get("over_torchrec"),
            ("<=", TARGETS["plan_over_torchrec"]) if row["method"] in ("neuroshard", REFINED) else None)
    for index in sorted({row["task"] for row in plans}):
        ms = {row["method"]: row.get("kernel_ms") for row in plans if row["task"] == index}
        for method in ("neuroshard", REFINED):
            if ms.get(method) and ms.get("measured_greedy"):
                add(f"task {index}: {method} kernels over measured_greedy",
                    round(ms[method] / ms["measured_greedy"], 4), ("<=", 1.0))
    for step, at in (("timers", doc["batch_size"]), ("probe_timers", args.probe_batch)):
        for row in steps.get(step, {}).get("figures", []):
            add(f"batch {at}: timer {row['timer']} (timed by {row['timed_by']}): median spread / over "
                f"{steps[step]['figures'][0]['timer']} / cost ~ tables / launch ms / wall ms a shard / uncovered calls / "
                "retried calls",
                f"{row['median_spread']} / {row['median_ratio_to_first']} / {row['work_correlation']} / "
                f"{row['median_launch_ms']} / {row.get('median_wall_ms_a_shard')} / {row['uncovered_calls']} / "
                f"{row.get('retried_calls')}")
    return rows


def outcome(args: GpuMethodSettings, device: torch.device, doc: dict[str, Any], rows: list[dict[str, Any]],
            total_s: float) -> Outcome:
    """The figures as a record: named by the timer on CUDA (gpu_method_<timer>), by the preset off it."""
    name = "gpu_method" if args.cuda_timer is None else f"gpu_method_{args.cuda_timer}"
    if device.type != "cuda":
        name = f"gpu_method_{args.preset.replace('-', '_')}"
    return Outcome(rows, record_name=name, title=f"The whole method on one {device.type.upper()} ({doc['device']}), "
                   f"preset {args.preset}", notes=[
        f"torch {doc['torch']}; CUDA timer {doc['cuda_timer']}; batch {doc['batch_size']}, row scale "
        f"{doc['row_scale']}; plans compared on their kernels alone (one device holds no NCCL group); {total_s:.0f} s "
        "in all; targets: the method's bars on a GPU"
        + ("" if device.type == "cuda" else "; off a GPU this proves the path, its figures are not the GPU's")])


register(Experiment(
    name="gpu_method",
    title="The whole method on one GPU: timers, profile, cost model, plans",
    settings=GpuMethodSettings,
    run=run,
    threads=None,  # one on a CPU, set by run(): the timers below call time_kernel directly
    # benchmarks/gpu_check.sh: the queued timer, the default since it agreed with the held one on an H200, named so
    # the record says which timer its figures are
    # quick: the same path on a CPU at the smoke preset's sizes (half a minute), which proves it, not the GPU's figures
    suites={"quick": (SuiteRun({"device": "cpu", "preset": "smoke", "timer_shards": 2, "probe_shards": 0,
                                "out": "runs/bench/gpu_method_smoke"}),),
            "gpu": (SuiteRun({"device": "cuda", "preset": "gpu-check", "cuda_timer": "queued",
                              "profile_budget_s": 120.0, "out": "/tmp/gpu_check_method"}),)},
))
