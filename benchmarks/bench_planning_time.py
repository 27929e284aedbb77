"""Planning time: NeuroShard next to TorchRec's planner on the same task, from 100 tables / 8 devices to 5,000 /
1,024 (the scaling curve: seconds and the process's peak memory).

Targets (issue 16): NeuroShard plans 100 tables on 8 devices in under 2 s, 1,000 tables on 64 devices in at
most 5 s and 5,000 tables on 1,024 devices in at most 60 s (column splits allowed), in at most 4 GiB. Tables are
synthetic DLRM tables at full size; memory per device is 1.5x an even share. Peak memory is the process's peak
resident set after each NeuroShard search (sizes run smallest first), torch and the tables included.

    python benchmarks/bench_planning_time.py                       # champion cost model, else an untrained one
    python benchmarks/bench_planning_time.py --model MODEL_DIR --with-cw
    python benchmarks/bench_planning_time.py --record               # + benchmarks/results/planning_time.json
    python benchmarks/bench_planning_time.py --devices cpu,cuda     # the cost model on the GPU too (a GPU node's
                                                                    # `shardwise plan` default), timed beside the CPU
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
from record import record

from shardwise.cli import quiet_libraries
from shardwise.search import PlanError, make_searcher
from shardwise.workload.synthetic import synthesize_tables
from shardwise.workload.tableset import sample_task

TARGET_S = {(100, 8): 2.0, (1000, 64): 5.0, (5000, 1024): 60.0}
GIB = 2**30


def cost_model_for(uri: str | None, tables, batch_size: int, device: str = "cpu"):  # type: ignore[no-untyped-def]
    """The given or champion cost model on `device`; else an untrained network of the default size (timing is the
    same)."""
    from shardwise.integrations.mlflow import MlflowService, RegistryError, champion_uri, cost_model_name
    from shardwise.profiling.hardware import hardware_kind

    service = MlflowService()
    if uri:
        try:
            return service.load_cost_model(uri, device=device), uri
        except (RegistryError, OSError, ValueError) as err:
            raise SystemExit(f"--model {uri}: {err}") from None
    # an embedded registry that does not exist is not created just to find it empty
    if service.store_exists():
        champion = champion_uri(cost_model_name(hardware_kind("cpu")))
        try:
            return service.load_cost_model(champion, device=device), champion
        except (RegistryError, OSError, ValueError):  # no usable champion: fall through to the stand-in
            pass
    import torch

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
    model = NeuralCostModel(
        ComputeNet(NUM_FEATURES, config.hidden, config.layers, config.head_layers),
        FeatureNormaliser.fit(feats, TABLE_FEATURE_NAMES),
        ModelMeta("untrained", batch_size),
        config,
        CommNet(NUM_COMM_FEATURES, config.comm_hidden, config.comm_layers),
        FeatureNormaliser.fit(comm, COMM_FEATURE_NAMES),
    )
    return model.to(device), "untrained network of the default size (timing only: no registered champion)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="cost model directory or models:/ URI")
    parser.add_argument("--with-cw", action="store_true", help="also time TorchRec's column-wise variant "
                        "(minutes at 1,000 tables)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", default="100x8,1000x64,5000x1024", help="tables x devices, comma separated")
    parser.add_argument("--quality-max-tables", type=int, default=1000,
                        help="on tasks up to this many tables, also plan pricing every device (device_candidates = "
                             "devices) and print the predicted cost ratio: what the device shortlist costs in quality")
    parser.add_argument("--torchrec-max-tables", type=int, default=1000,
                        help="run TorchRec's planner on tasks up to this many tables (it takes many minutes beyond)")
    parser.add_argument("--batch-size", type=int, default=4096, help="the tasks' batch size (reuse bins are "
                        "measured at it: larger batches make synthesizing 1,000 tables slow, not planning)")
    parser.add_argument("--devices", default="cpu", help="where the cost model runs during the search, comma "
                        "separated: the first is the row's NeuroShard time, each other one is timed beside it "
                        "(cpu,cuda: what a GPU node's `shardwise plan` does by default, next to the CPU)")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/<record-name>.json")
    parser.add_argument("--record-name", default="planning_time", help="the result's name (default planning_time)")
    args = parser.parse_args()
    quiet_libraries(verbose=False)  # MLflow's download bars and INFO logs, as the CLI without -v
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]

    batch_size = args.batch_size
    tableset = synthesize_tables(max(n for n, _ in sizes), seed=args.seed, batch_size=batch_size)
    devices = args.devices.split(",")
    models = {}
    for device in devices:
        models[device], source = cost_model_for(args.model, tableset.tables, batch_size, device)
    model, first = models[devices[0]], devices[0]
    print(f"cost model: {source}, on {' and '.join(devices)}")
    baselines = ["torchrec", "torchrec_cw"] if args.with_cw else ["torchrec"]
    header = (f"{'task':>12}  {'neuroshard s':>12}  {'(cpu s)':>8}  {'peak GiB':>8}  {'all s':>7}  {'cost/all':>8}  {'no dp s':>7}  "
              + "".join(f"{'on ' + d + ' s':>12}  {d + '/' + first:>10}  " for d in devices[1:])
              + "  ".join(f"{b + ' s':>14}  {'ratio':>6}" for b in baselines))
    print(header + f"  {'target':>8}")
    rows = []
    for num_tables, num_devices in sizes:
        task = sample_task(tableset, num_tables, num_devices, seed=args.seed)
        started, cpu_started = time.perf_counter(), time.process_time()
        plan = make_searcher("neuroshard").search(task, model, args.seed)
        neuro_s = time.perf_counter() - started
        neuro_cpu_s = time.process_time() - cpu_started
        peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux: kilobytes
        quality = all_s = None
        if num_tables <= args.quality_max_tables:
            started = time.perf_counter()
            everywhere = make_searcher("neuroshard", device_candidates=num_devices).search(task, model, args.seed)
            all_s = time.perf_counter() - started
            quality = plan.extra["predicted"]["max_cost_ms"] / everywhere.extra["predicted"]["max_cost_ms"]
        # the same search without data-parallel roots (priced only where the model has a measured all-reduce)
        no_dp_s = None
        if num_tables <= args.quality_max_tables:
            started = time.perf_counter()
            make_searcher("neuroshard", data_parallel=False).search(task, model, args.seed)
            no_dp_s = time.perf_counter() - started
        cells = [f"{all_s:>7.2f}  {quality:>8.4f}" if quality and all_s else f"{'-':>7}  {'-':>8}"]
        cells[0] += f"  {no_dp_s:>7.2f}" if no_dp_s is not None else f"  {'-':>7}"
        row = {"task": f"{num_tables}x{num_devices}", "neuroshard_s": round(neuro_s, 2),
               "neuroshard_cpu_s": round(neuro_cpu_s, 2), "peak_gib": round(peak_gib, 2),
               "every_device_priced_s": all_s and round(all_s, 2),
               "predicted_cost_over_every_device_priced": quality and round(quality, 4),
               "without_data_parallel_s": no_dp_s and round(no_dp_s, 2)}
        for device in devices[1:]:
            started = time.perf_counter()
            other = make_searcher("neuroshard").search(task, models[device], args.seed)
            other_s = time.perf_counter() - started
            # the same search with the same weights: its plan costs the same, up to float32 rounding
            same = other.extra["predicted"]["max_cost_ms"] / plan.extra["predicted"]["max_cost_ms"]
            cells[0] += f"  {other_s:>12.2f}  {other_s / neuro_s:>9.2f}x"
            row |= {f"neuroshard_on_{device}_s": round(other_s, 2),
                    f"{device}_over_{first}": round(other_s / neuro_s, 2),
                    f"predicted_cost_on_{device}_over_{first}": round(same, 4)}
        for method in baselines:
            if num_tables > args.torchrec_max_tables:
                cells.append(f"{'not run':>14}  {'-':>6}")
                row |= {f"{method}_s": None, f"{method}_over_neuroshard": None}
                continue
            started = time.perf_counter()
            try:
                make_searcher(method).search(task, None, args.seed)
                base_s = time.perf_counter() - started
                cells.append(f"{base_s:>14.2f}  {base_s / neuro_s:>5.2f}x")
                row |= {f"{method}_s": round(base_s, 2),
                        f"{method}_over_neuroshard": round(base_s / neuro_s, 2)}
            except PlanError as err:
                cells.append(f"{'failed':>14}  {'-':>6}")
                row |= {f"{method}_s": "failed", f"{method}_over_neuroshard": None}
                print(f"  {method}: {err}")
        target = TARGET_S.get((num_tables, num_devices))
        verdict = "" if target is None else f"{'<' if neuro_s < target else '>='} {target:.0f} s"
        within = None if target is None else neuro_s < target
        rows.append(row | {"target_s": target, "neuroshard_within_target": within})
        print(
            f"{f'{num_tables}x{num_devices}':>12}  {neuro_s:>12.2f}  {neuro_cpu_s:>8.2f}  {peak_gib:>8.2f}  "
            + "  ".join(cells)
            + f"  {verdict:>8}"
        )
    print("ratio = TorchRec's planner time / NeuroShard's time on the same task (same process, same run);")
    print("cpu s = NeuroShard's process CPU time: far below wall time means the machine was busy with others")
    print("peak GiB = the process's peak resident memory after the search (torch and the tables included)")
    print("all s, cost/all = the search pricing every device for every shard (device_candidates = devices: the "
          "search without the shortlist): its seconds, and the predicted plan cost over its plan (1.0: the shortlist of "
          "least-loaded devices costs nothing)")
    print("no dp s = the same search without data-parallel roots (they are priced where the model has a measured "
          "all-reduce)")
    for device in devices[1:]:
        print(f"on {device} s, {device}/{first} = the same search with the cost model on {device}: its seconds, and "
              f"its time over the {first} one (above 1: slower on {device})")
    if args.record:
        title = "Planning time: NeuroShard next to TorchRec's planner"
        if len(devices) > 1:
            title = f"Planning time: NeuroShard with the cost model on {' and on '.join(devices)}"
        record(args.record_name, title, rows,
               notes=f"cost model: {source}, on {' and '.join(devices)} (neuroshard_s: on {first}); synthetic DLRM tables at full size, batch {batch_size}, memory "
                     "per device 1.5x an even share; *_over_neuroshard = TorchRec's time / NeuroShard's on "
                     "the same task; neuroshard_cpu_s = NeuroShard's process CPU time (far below wall time where "
                     "the machine is busy with others); peak_gib = the process's peak resident memory after the "
                     f"search; TorchRec's planner run up to {args.torchrec_max_tables} tables")


if __name__ == "__main__":
    main()
