"""Batched cost-model prediction: shards predicted per second, one batched call vs a per-shard loop.

Search scores thousands of candidate device groups per step, so it calls `predict_compute` once for all of them.
Throughput does not depend on the weights: with no --model the networks are freshly initialised (the normaliser is
fitted on the benchmark's own tables).

    python -m benchmarks costmodel_predict                      # 10,000 shards of 1-15 tables
    python -m benchmarks costmodel_predict --model models:/shardwise-cost-cpu-x86_64-2c@champion --record
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import Field

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, SuiteRun, register


class CostModelPredictSettings(ExperimentSettings):
    """Which model, how many shards, on how many threads."""

    model: str | None = Field(default=None, description="cost model URI or directory (default: untrained weights)")
    num_shards: int = Field(default=10_000, ge=1)
    loop_shards: int = Field(default=1_000, ge=1, description="shards timed in the per-shard loop")
    max_tables: int = Field(default=15, ge=1)
    threads: int = Field(default=1, ge=1)
    seed: int = 0


def _fresh_model(tables: list[Any], batch_size: int, seed: int) -> Any:
    import torch

    from shardwise.costmodel import ModelMeta, NetworkConfig, NeuralCostModel
    from shardwise.costmodel.features import TABLE_FEATURE_NAMES, FeatureNormaliser, TableFeatureCache
    from shardwise.costmodel.networks import ComputeNet
    from shardwise.workload import NUM_FEATURES

    torch.manual_seed(seed)
    config = NetworkConfig()
    norm = FeatureNormaliser.fit(TableFeatureCache(batch_size)(tables), TABLE_FEATURE_NAMES)
    net = ComputeNet(NUM_FEATURES, config.hidden, config.layers, config.head_layers)
    return NeuralCostModel(net, norm, ModelMeta(hardware_kind="untrained", batch_size=batch_size), config)


def _best_of(fn: Callable[[], Any], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run(settings: CostModelPredictSettings, context: Context) -> Outcome:
    """The batched call, the per-shard loop and the head alone on the same shards."""
    import torch

    from shardwise.workload.synthetic import synthesize_tables

    torch.set_num_threads(settings.threads)
    tableset = synthesize_tables(200, seed=settings.seed, row_scale=0.01, batch_size=2048, progress=False)
    tables = list(tableset.tables)
    model = (context.cost_model(settings.model, required=True) if settings.model
             else _fresh_model(tables, tableset.batch_size, settings.seed))
    rng = np.random.default_rng(settings.seed)
    shards = [[tables[i] for i in rng.choice(len(tables), size=rng.integers(1, settings.max_tables + 1), replace=False)]
              for _ in range(settings.num_shards)]
    model.predict_compute(shards[:10])  # warm the feature cache and the allocator, as search does
    batched_s = _best_of(lambda: model.predict_compute(shards))
    loop = shards[: settings.loop_shards]
    loop_s = _best_of(lambda: [model.predict_compute([s]) for s in loop], repeats=1)
    summed = np.stack([model.table_embeddings(s).sum(axis=0) for s in shards])
    head_s = _best_of(lambda: model.compute_from_embeddings(summed))
    loop_rate = len(loop) / loop_s
    timed = (("batched predict_compute", len(shards), batched_s), ("per-shard loop", len(loop), loop_s),
             ("compute_from_embeddings (head only)", len(shards), head_s))
    rows = [{"path": path, "shards": n, "seconds": round(s, 4), "shards_per_s": round(n / s),
             "vs_per_shard_loop": round(n / s / loop_rate, 1)} for path, n, s in timed]
    mean_tables = np.mean([len(s) for s in shards])
    return Outcome(rows, notes=[
        f"{len(shards)} shards of 1-{settings.max_tables} tables (mean {mean_tables:.1f}), {settings.threads} "
        f"thread(s), model {context.model or 'untrained (throughput does not depend on the weights)'}; batched and "
        f"head-only: best of 3 calls, per-shard loop: one pass over {len(loop)} shards"])


register(Experiment(
    name="costmodel_predict",
    title="Batched cost-model prediction",
    settings=CostModelPredictSettings,
    run=run,
    threads=None,  # --threads
    suites={"quick": (SuiteRun({"num_shards": 2000, "loop_shards": 200}),)},
))
