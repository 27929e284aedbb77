"""The drop-in planner against TorchRec's on the MLPerf DLRM-DCNv2 tables: measured plan cost and planning time.

The 26 tables of MLPerf training's DLRM-DCNv2 (Criteo 1TB, embedding dim 128, multi-hot pooling per table; rows
scaled down to fit CPU memory) planned two ways for the same `EmbeddingBagCollection` on meta:
`ShardwisePlanner(...).plan(module)` (the cost model: this hardware's champion or --model) and TorchRec's
`EmbeddingShardingPlanner` (the `torchrec` method: fused kernel, the same pooling factors and memory cap). Both
plans are measured in one session on this machine's fbgemm kernels and all-to-alls (evaluation.measure_plans).

    python benchmarks/bench_torchrec_dropin.py --model MODEL_DIR [--devices 4] [--row-scale 0.001] [--record]
"""

from __future__ import annotations

import argparse
import time

from record import record

from shardwise.evaluation import measure_plans
from shardwise.integrations.torchrec import ShardwisePlanner
from shardwise.profiling import MeasurementSettings
from shardwise.search import make_searcher
from shardwise.workload import TableSpec, shard_memory_bytes

#: MLPerf DLRM-DCNv2 (training v3.0 reference): rows per table (max_ind_range 40M) and multi-hot sizes
MLPERF_ROWS = (40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000, 3_067_956, 405_282, 10,
               2_209, 11_938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590_152, 12_973, 108, 36)
MLPERF_HOTNESS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
DIM = 128


def dcnv2_module(row_scale: float):  # noqa: ANN201 - a torch module holding the EmbeddingBagCollection
    """The DCNv2 embedding tables as an `EmbeddingBagCollection` on meta, and their ParameterConstraints."""
    import torch
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=max(2, int(rows * row_scale)),
                                  feature_names=[f"cat_{i}"]) for i, rows in enumerate(MLPERF_ROWS)]
    module = torch.nn.Module()
    module.sparse = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    constraints = {f"t{i}": ParameterConstraints(pooling_factors=[float(h)]) for i, h in enumerate(MLPERF_HOTNESS)}
    return module, constraints


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="cost model directory or URI (default: the champion)")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--row-scale", type=float, default=0.001, help="rows x this (CPU-sized tables)")
    parser.add_argument("--memory-slack", type=float, default=1.5, help="memory per device = slack x even share")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/torchrec_dropin.json")
    args = parser.parse_args()

    module, constraints = dcnv2_module(args.row_scale)
    tables = [TableSpec(name=c.name, rows=c.num_embeddings, dim=c.embedding_dim, pooling_factor=1.0)
              for c in module.sparse.embedding_bag_configs()]
    need = shard_memory_bytes(tables, 2048)
    planner = ShardwisePlanner(world_size=args.devices, batch_size=2048, constraints=constraints, device_type="cpu",
                               device_memory_bytes=int(args.memory_slack * need / args.devices),
                               storage_reservation=0.0, cost_model=args.model)
    start = time.perf_counter()
    planner.plan(module)
    shardwise_s = time.perf_counter() - start
    task, ours = planner.last_task, planner.last_plan
    start = time.perf_counter()
    theirs = make_searcher("torchrec").search(task, None, 0)
    torchrec_s = time.perf_counter() - start

    model = planner.resolved_cost_model()
    measurement = MeasurementSettings(device="cpu").for_cost_model(getattr(model, "reference_ms", None), task.batch_size)
    mine, baseline = measure_plans([(task, ours), (task, theirs)], measurement)
    ratio = mine.max_cost_ms / baseline.max_cost_ms
    print(f"MLPerf DLRM-DCNv2 tables (26, dim {DIM}, rows x {args.row_scale}) on {args.devices} devices, "
          f"batch {task.batch_size}")
    print(f"{'planner':<22}{'measured max ms':>16}{'planning s':>12}")
    print(f"{'ShardwisePlanner':<22}{mine.max_cost_ms:>16.3f}{shardwise_s:>12.2f}")
    print(f"{'TorchRec planner':<22}{baseline.max_cost_ms:>16.3f}{torchrec_s:>12.2f}")
    print(f"ShardwisePlanner / TorchRec = {ratio:.3f} (measured, lower is better)")
    if args.record:
        record("torchrec_dropin", "Drop-in planner vs TorchRec's on the MLPerf DLRM-DCNv2 tables (measured)", [
            {"planner": "ShardwisePlanner", "measured_max_ms": round(mine.max_cost_ms, 3),
             "planning_s": round(shardwise_s, 2), "ratio_to_torchrec": round(ratio, 3)},
            {"planner": "TorchRec EmbeddingShardingPlanner", "measured_max_ms": round(baseline.max_cost_ms, 3),
             "planning_s": round(torchrec_s, 2), "ratio_to_torchrec": 1.0},
        ], notes=f"{args.devices} devices, rows x {args.row_scale}, memory slack {args.memory_slack}")


if __name__ == "__main__":
    main()
