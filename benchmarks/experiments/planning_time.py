"""Planning time: NeuroShard next to TorchRec's planner on the same task, from 100 tables / 8 devices to 5,000 /
1,024 (the scaling curve: seconds and the process's peak memory).

Targets: NeuroShard plans 100 tables on 8 devices in under 2 s, 1,000 tables on 64 devices in at most 5 s and 5,000
tables on 1,024 devices in at most 60 s (column splits allowed), in at most 4 GiB. Tables are synthetic DLRM tables
at full size; memory per device is 1.5x an even share. Peak memory is the process's peak resident set after each
NeuroShard search (sizes run smallest first), torch and the tables included. Without --model: the champion, else an
untrained network of the default size (the search's time is the same).

    python -m benchmarks planning_time --model MODEL_DIR --with-cw
    python -m benchmarks planning_time --devices cpu,cuda --record-name planning_time_cuda --record
        # the cost model on the GPU too (a GPU node's `shardwise plan` default), timed beside the CPU
"""

from __future__ import annotations

import resource
import time
from typing import Any

import numpy as np
from pydantic import Field

from benchmarks import harness

TARGET_S = {(100, 8): 2.0, (1000, 64): 5.0, (5000, 1024): 60.0}
GIB = 2**30


class PlanningTimeSettings(harness.ExperimentSettings):
    """Which tasks, which cost model where, which baselines."""

    model: str | None = Field(default=None, description="cost model directory or models:/ URI (default: the "
                              "champion, else an untrained network)")
    with_cw: bool = Field(default=False, description="also time TorchRec's column-wise variant (minutes at 1,000 "
                          "tables)")
    seed: int = 0
    sizes: tuple[str, ...] = Field(default=("100x8", "1000x64", "5000x1024"), description="tables x devices, comma "
                                   "separated", json_schema_extra={"sep": ","})
    quality_max_tables: int = Field(default=1000, ge=0, description="on tasks up to this many tables, also plan "
                                    "pricing every device (device_candidates = devices) and give the predicted cost "
                                    "ratio: what the device shortlist costs in quality")
    torchrec_max_tables: int = Field(default=1000, ge=0, description="run TorchRec's planner on tasks up to this "
                                     "many tables (it takes many minutes beyond)")
    batch_size: int = Field(default=4096, ge=1, description="the tasks' batch size (reuse bins are measured at it: "
                            "larger batches make synthesizing 1,000 tables slow, not planning)")
    devices: tuple[str, ...] = Field(default=("cpu",), description="where the cost model runs during the search, "
                                     "comma separated: the first is the row's NeuroShard time, each other one is "
                                     "timed beside it", json_schema_extra={"sep": ","})


def stand_in(tables: list[Any], batch_size: int) -> Any:
    """An untrained cost model of the default size: the search's time is the same as a trained one's."""
    import torch

    from shardwise.costmodel.coverage import FeatureRanges
    from shardwise.costmodel.features import (
        COMM_FEATURE_NAMES,
        NUM_COMM_FEATURES,
        TABLE_FEATURE_NAMES,
        FeatureNormaliser,
        comm_features,
        transformed_table_features,
    )
    from shardwise.costmodel.model import ModelMeta, NetworkConfig, NeuralCostModel
    from shardwise.costmodel.networks import CommNet, ComputeNet
    from shardwise.workload import NUM_FEATURES

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    feats = np.stack([transformed_table_features(t, batch_size) for t in tables])
    widths = rng.integers(0, 4096, size=(64, 16)).astype(float)
    comm = comm_features(widths, rng.random((64, 16))).reshape(-1, NUM_COMM_FEATURES)
    config = NetworkConfig()
    return NeuralCostModel(
        ComputeNet(NUM_FEATURES, config.hidden, config.layers, config.head_layers),
        FeatureNormaliser.fit(feats, TABLE_FEATURE_NAMES),
        ModelMeta("untrained", batch_size, FeatureRanges.of_training(feats, [1], batch_size)),
        config,
        CommNet(NUM_COMM_FEATURES, config.comm_hidden, config.comm_layers),
        FeatureNormaliser.fit(comm, COMM_FEATURE_NAMES),
    )


def run(settings: PlanningTimeSettings, context: harness.Context) -> harness.Outcome:
    """Per size: NeuroShard's time (and pricing every device, and without data-parallel roots), the cost model on
    each other device, TorchRec's planner."""
    from shardwise.search import PlanError, make_searcher
    from shardwise.workload.synthetic import synthesize_tables
    from shardwise.workload.tableset import sample_task

    try:
        sizes = [tuple(int(x) for x in s.split("x")) for s in settings.sizes]
    except ValueError:
        raise harness.BenchmarkError(f"--sizes {','.join(settings.sizes)}: give TABLESxDEVICES, e.g. 100x8,1000x64") from None
    tableset = synthesize_tables(max(n for n, _ in sizes), seed=settings.seed, batch_size=settings.batch_size)
    devices = list(settings.devices)
    models = {}
    for device in devices:
        loaded = context.cost_model(settings.model)
        models[device] = (loaded or stand_in(tableset.tables, settings.batch_size)).to(device)
    if context.model is None:
        context.name_model("untrained network of the default size (timing only: no registered champion)")
    model, first = models[devices[0]], devices[0]
    baselines = ["torchrec", "torchrec_cw"] if settings.with_cw else ["torchrec"]
    rows: list[dict[str, Any]] = []
    for num_tables, num_devices in sizes:
        print(f"{num_tables}x{num_devices}", flush=True)
        task = sample_task(tableset, num_tables, num_devices, seed=settings.seed)
        started, cpu_started = time.perf_counter(), time.process_time()
        plan = make_searcher("neuroshard").search(task, model, settings.seed)
        neuro_s = time.perf_counter() - started
        neuro_cpu_s = time.process_time() - cpu_started
        peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux: kilobytes
        quality = all_s = no_dp_s = None
        if num_tables <= settings.quality_max_tables:
            started = time.perf_counter()
            everywhere = make_searcher("neuroshard", device_candidates=num_devices).search(task, model, settings.seed)
            all_s = time.perf_counter() - started
            quality = plan.extra["predicted"]["max_cost_ms"] / everywhere.extra["predicted"]["max_cost_ms"]
            # the same search without data-parallel roots (priced only where the model has a measured all-reduce)
            started = time.perf_counter()
            make_searcher("neuroshard", data_parallel=False).search(task, model, settings.seed)
            no_dp_s = time.perf_counter() - started
        row: dict[str, Any] = {
            "task": f"{num_tables}x{num_devices}", "neuroshard_s": round(neuro_s, 2),
            "neuroshard_cpu_s": round(neuro_cpu_s, 2), "peak_gib": round(peak_gib, 2),
            "every_device_priced_s": all_s and round(all_s, 2),
            "predicted_cost_over_every_device_priced": quality and round(quality, 4),
            "without_data_parallel_s": no_dp_s and round(no_dp_s, 2)}
        for device in devices[1:]:
            started = time.perf_counter()
            other = make_searcher("neuroshard").search(task, models[device], settings.seed)
            other_s = time.perf_counter() - started
            # the same search with the same weights: its plan costs the same, up to float32 rounding
            same = other.extra["predicted"]["max_cost_ms"] / plan.extra["predicted"]["max_cost_ms"]
            row |= {f"neuroshard_on_{device}_s": round(other_s, 2),
                    f"{device}_over_{first}": round(other_s / neuro_s, 2),
                    f"predicted_cost_on_{device}_over_{first}": round(same, 4)}
        for method in baselines:
            if num_tables > settings.torchrec_max_tables:
                row |= {f"{method}_s": None, f"{method}_over_neuroshard": None}
                continue
            started = time.perf_counter()
            try:
                make_searcher(method).search(task, None, settings.seed)
                base_s = time.perf_counter() - started
                row |= {f"{method}_s": round(base_s, 2), f"{method}_over_neuroshard": round(base_s / neuro_s, 2)}
            except PlanError as err:
                row |= {f"{method}_s": "failed", f"{method}_over_neuroshard": None}
                print(f"  {method}: {err}")
        target = TARGET_S.get((num_tables, num_devices))
        rows.append(row | {"target_s": target, "neuroshard_within_target": None if target is None else neuro_s < target})
    title = EXPERIMENT.title
    if len(devices) > 1:
        title = f"Planning time: NeuroShard with the cost model on {' and on '.join(devices)}"
    return harness.Outcome(rows, title=title, notes=[
        f"cost model: {context.model}, on {' and '.join(devices)} (neuroshard_s: on {first}); synthetic DLRM tables at full "
        f"size, batch {settings.batch_size}, memory per device 1.5x an even share; *_over_neuroshard = TorchRec's "
        "time / NeuroShard's on the same task; neuroshard_cpu_s = NeuroShard's process CPU time (far below wall time "
        "where the machine is busy with others); peak_gib = the process's peak resident memory after the search; "
        "every_device_priced_s and predicted_cost_over_every_device_priced = the search pricing every device for "
        "every shard (without the shortlist of least-loaded devices): its seconds, and the predicted plan cost over "
        "its plan's (1.0: the shortlist costs nothing); without_data_parallel_s = the same search without "
        f"data-parallel roots; TorchRec's planner run up to {settings.torchrec_max_tables} tables"])


EXPERIMENT = harness.register(harness.Experiment(
    name="planning_time",
    title="Planning time: NeuroShard next to TorchRec's planner",
    settings=PlanningTimeSettings,
    run=run,
    suites={"quick": (harness.SuiteRun({"sizes": ("100x8",)}),),
            "claims": (harness.SuiteRun({"model": "models:/shardwise-cost-cpu-x86_64-2c@champion"}),)},
))
