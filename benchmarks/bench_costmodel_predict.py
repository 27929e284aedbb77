"""Batched cost-model prediction: shards predicted per second, one batched call vs a per-shard loop.

Search scores thousands of candidate device groups per step, so it calls `predict_compute` once for all of
them. Throughput does not depend on the weights: with no --model the networks are freshly initialised (the
normaliser is fitted on the benchmark's own tables).

    python benchmarks/bench_costmodel_predict.py                      # 10,000 shards of 1-15 tables
    python benchmarks/bench_costmodel_predict.py --model models:/shardwise-cost-cpu-x86_64-2c@champion
    python benchmarks/bench_costmodel_predict.py --record             # + results/costmodel_predict.json
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from record import record

from shardwise.cli import quiet_libraries
from shardwise.costmodel import ModelMeta, NetworkConfig, NeuralCostModel
from shardwise.costmodel.features import TABLE_FEATURE_NAMES, FeatureNormaliser, TableFeatureCache
from shardwise.costmodel.networks import ComputeNet
from shardwise.integrations.mlflow import MlflowService
from shardwise.workload import NUM_FEATURES
from shardwise.workload.synthetic import synthesize_tables


def _fresh_model(tables: list, batch_size: int, seed: int) -> NeuralCostModel:
    torch.manual_seed(seed)
    config = NetworkConfig()
    norm = FeatureNormaliser.fit(TableFeatureCache(batch_size)(tables), TABLE_FEATURE_NAMES)
    net = ComputeNet(NUM_FEATURES, config.hidden, config.layers, config.head_layers)
    return NeuralCostModel(net, norm, ModelMeta(hardware_kind="untrained", batch_size=batch_size), config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="cost model URI or directory (default: untrained weights)")
    parser.add_argument("--num-shards", type=int, default=10_000)
    parser.add_argument("--loop-shards", type=int, default=1_000, help="shards timed in the per-shard loop")
    parser.add_argument("--max-tables", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", action="store_true",
                        help="write benchmarks/results/costmodel_predict.json")
    args = parser.parse_args()
    quiet_libraries(verbose=False)  # MLflow's download bars and INFO logs, as the CLI without -v
    torch.set_num_threads(args.threads)

    tableset = synthesize_tables(200, seed=args.seed, row_scale=0.01, batch_size=2048, progress=False)
    tables = list(tableset.tables)
    if args.model:
        model = MlflowService().load_cost_model(args.model)
    else:
        model = _fresh_model(tables, tableset.batch_size, args.seed)
    rng = np.random.default_rng(args.seed)
    shards = [
        [tables[i] for i in rng.choice(len(tables), size=rng.integers(1, args.max_tables + 1), replace=False)]
        for _ in range(args.num_shards)
    ]
    model.predict_compute(shards[:10])  # warm the feature cache and the allocator, as search does

    def best_of(fn, repeats: int = 3) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    batched_s = best_of(lambda: model.predict_compute(shards))
    loop = shards[: args.loop_shards]
    loop_s = best_of(lambda: [model.predict_compute([s]) for s in loop], repeats=1)
    emb = [model.table_embeddings(s).sum(axis=0) for s in shards]
    summed = np.stack(emb)
    head_s = best_of(lambda: model.compute_from_embeddings(summed))

    batched_rate = len(shards) / batched_s
    loop_rate = len(loop) / loop_s
    mean_tables = np.mean([len(s) for s in shards])
    print(f"{len(shards)} shards, mean {mean_tables:.1f} tables, {args.threads} thread(s), model {args.model or 'untrained'}")
    print(f"batched predict_compute : {batched_rate:12,.0f} shards/s ({batched_s * 1e3:.1f} ms per call)")
    print(f"per-shard loop          : {loop_rate:12,.0f} shards/s ({len(loop)} shards)")
    print(f"compute_from_embeddings : {len(shards) / head_s:12,.0f} shards/s (head only, summed embeddings given)")
    print(f"batched / loop          : {batched_rate / loop_rate:12.1f}x")
    if args.record:
        timed = (("batched predict_compute", len(shards), batched_s),
                 ("per-shard loop", len(loop), loop_s),
                 ("compute_from_embeddings (head only)", len(shards), head_s))
        rows = [{"path": path, "shards": n, "seconds": round(s, 4), "shards_per_s": round(n / s),
                 "vs_per_shard_loop": round(n / s / loop_rate, 1)} for path, n, s in timed]
        model_note = args.model or "untrained (throughput does not depend on the weights)"
        record("costmodel_predict", "Batched cost-model prediction", rows,
               notes=f"{len(shards)} shards of 1-{args.max_tables} tables (mean {mean_tables:.1f}), "
                     f"{args.threads} thread(s), model {model_note}; batched and head-only: best of 3 calls, "
                     f"per-shard loop: one pass over {len(loop)} shards")


if __name__ == "__main__":
    main()
