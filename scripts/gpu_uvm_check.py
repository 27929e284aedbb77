"""The GPU check of tables larger than HBM, in one command on a machine with one CUDA GPU and fbgemm-gpu's CUDA
build (after `.gpu/on-device.sh`), from the repository root:

    source .gpu/on-device.sh && python3 scripts/gpu_uvm_check.py OUT

sized for a few minutes on one GPU (not yet run on one: the UVM shards, each warmed on 8 batches until its cache
settles, are most of it; `--caching-shards` scales them).

Four steps, each printing one line, then the verdict; OUT/uvm_check.json holds every figure:
  1. profile: shards of training tables and, apart, of held-out tables (Zipf 0 to 1.3, pooling 1 to 30) in HBM, and
     the first of them again on fbgemm's UVM (`profile --caching-shards`: all cached, half cached beside HBM tables,
     at load factors 0.1, 0.2, 0.5, and no cache), caches warmed to a steady hit rate, the queued timer;
  2. price: `shardwise pretrain` on it: the compute network trained on the HBM shards, a line per UVM kernel fitted
     to the training tables' UVM shards (`costmodel/caching.py`); held-out MAPE per kernel of shardwise, of the
     network's HBM price alone, and of TorchRec's estimator (scaled to this machine by its median ratio);
  3. plan: a task of held-out tables whose state is twice the devices' (scaled) HBM, planned by NeuroShard with that
     model and by TorchRec's planner (both offered fused and fused_uvm_caching, under the same HBM and host memory);
  4. measure: both plans' device kernels timed in one session (one GPU: each device's shards in turn, compute
     alone), interleaved rounds; the slowest device's ms of each and shardwise's over TorchRec's.

On a CPU (`--device cpu`, what tests/integration/test_gpu_uvm_check.py runs) every step that has a CPU path runs: the
profile without UVM shards (fbgemm's CPU build has none), the pricing on the rows it is given, the plans, and the
plans measured with their tables moved back to HBM. The calls only a GPU runs are the UVM profile and measurement
(`cuda_only`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from shardwise.costmodel import NeuralCostModel, TrainConfig, train_cost_model
from shardwise.costmodel.caching import UVM_KERNELS
from shardwise.evaluation import KernelShard, time_shards_in_rounds
from shardwise.profiling import ProfileSettings, TimingProtocol, load_costs, profile
from shardwise.profiling.run_settings import DEFAULT_CACHE_LOAD_FACTORS
from shardwise.search import NeuroShardSearch, Plan, PlanError, device_specs, validate_plan
from shardwise.search.plan import plan_host_memory_bytes, plan_memory_bytes
from shardwise.search.torchrec_plan import ebc_on_meta, plan_from_module_sharding
from shardwise.workload import ShardingTask, TableSpec, shard_memory_bytes

#: the kernels a table of the check's task may run (what both planners are offered)
TASK_KERNELS = ("fused", "fused_uvm_caching")
GIB = 2**30


def check_tables(prefix: str, count: int, seed: int, max_rows: int) -> list[TableSpec]:
    """`count` tables of varied size, width, pooling and skew (Zipf alpha 0 to 1.3: uniform to heavy-tailed)."""
    rng = np.random.default_rng(seed)
    return [TableSpec(name=f"{prefix}{i}", rows=int(10 ** rng.uniform(4.5, np.log10(max_rows))),
                      dim=int(rng.choice([16, 32, 64, 128])), pooling_factor=float(np.round(rng.uniform(1, 30), 1)),
                      zipf_alpha=float(np.round(rng.uniform(0.0, 1.3), 2)))
            for i in range(count)]


def cuda_only(device: torch.device, what: str) -> bool:
    """Whether `what` (a step's part that needs fbgemm's UVM) runs here; said once where it does not."""
    if device.type != "cuda":
        print(f"  ({what}: CUDA only, left out on {device.type})")
    return device.type == "cuda"


def profile_step(train: list[TableSpec], heldout: list[TableSpec], out: Path, device: torch.device, *,
                 batch_size: int, shards: int, heldout_shards: int, caching_shards: int, timing_iters: int,
                 seed: int = 0) -> pd.DataFrame:
    """The training tables' shards, then apart the held-out tables', each with its first `caching_shards` again on
    UVM where this is a GPU; the dataset's rows."""
    uvm = caching_shards if cuda_only(device, "shards on UVM") else 0
    settings = ProfileSettings(num_shards=shards, max_tables=4, seed=seed, device=str(device), batch_size=batch_size,
                               caching_shards=uvm, cache_load_factors=DEFAULT_CACHE_LOAD_FACTORS,
                               protocol=TimingProtocol(iters=timing_iters))
    profile(train, out, settings, progress=False)
    apart = settings.model_copy(update={"num_shards": heldout_shards, "seed": seed + 1,
                                        "caching_shards": -(-uvm * heldout_shards // max(shards, 1))})
    profile(heldout, out, apart, progress=False)
    return load_costs(out)


def price_step(frame: pd.DataFrame, heldout_sources: set[str], device: torch.device, *, epochs: int | None = None,
               seed: int = 0) -> tuple[NeuralCostModel, dict[str, Any]]:
    """`shardwise pretrain` on the profile, the held-out tables apart: the network trained on the HBM shards and a
    line per UVM kernel fitted to the training tables' UVM shards; per kernel, the held-out shards' MAPE (forward +
    backward) of shardwise, of the network's HBM price alone and of TorchRec's estimator (scaled to this machine)."""
    config = TrainConfig(device=str(device), holdout_sources=tuple(sorted(heldout_sources)), progress=False,
                         **({"epochs": epochs, "comm_epochs": epochs} if epochs else {}))
    model, report = train_cost_model(frame, seed, config)
    m = report.metrics
    accuracy: dict[str, Any] = {
        "lines": {k: line.to_json() for k, line in model.uvm_kernels.items()},
        "fused": {"shardwise_mape_pct": m.get("neural_heldout_tables_total_mape_pct"),
                  "torchrec_mape_pct": m.get("torchrec_estimator_heldout_tables_total_mape_pct")}}
    for kernel in UVM_KERNELS:
        stem = f"heldout_{kernel}_shards_total_mape_pct"
        if f"uvm_kernel_line_{stem}" in m:
            accuracy[kernel] = {"shardwise_mape_pct": m[f"uvm_kernel_line_{stem}"],
                                "network_in_hbm_mape_pct": m.get(f"network_in_hbm_{stem}"),
                                "torchrec_mape_pct": m.get(f"torchrec_estimator_{stem}")}
    return model, accuracy


def check_task(tables: list[TableSpec], num_devices: int, batch_size: int, hbm_share: float) -> ShardingTask:
    """`tables` (allowed in HBM or behind a cache) over `num_devices` devices whose HBM holds `hbm_share` of what they
    need in HBM, host memory for all of them on every device."""
    tables = [t.model_copy(update={"compute_kernels": TASK_KERNELS}) for t in tables]
    need = shard_memory_bytes(tables, batch_size)
    return ShardingTask(num_devices=num_devices, device_memory_bytes=int(hbm_share * need / num_devices),
                        batch_size=batch_size, tables=tuple(tables), host_memory_bytes=need)


def torchrec_plan(task: ShardingTask, replans: int = 4) -> Plan:
    """TorchRec's planner on the task, offered the same kernels, HBM and host memory (its default cache load factor
    and its estimator's fixed hit rate); planned again with less HBM while its plan is over shardwise's accounting."""
    # torchrec: heavy, and only this baseline plans with it
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    constraints = {t.name: ParameterConstraints(sharding_types=["table_wise", "column_wise"],
                                                compute_kernels=list(TASK_KERNELS), pooling_factors=[t.pooling_factor])
                   for t in task.tables}
    cap = task.device_memory_bytes
    for _ in range(replans + 1):
        topology = Topology(world_size=task.num_devices, compute_device="cuda", hbm_cap=cap,
                            ddr_cap=task.host_memory_bytes)
        planner = EmbeddingShardingPlanner(topology=topology, batch_size=-(-task.batch_size // task.num_devices),
                                           storage_reservation=FixedPercentageStorageReservation(0.0),
                                           constraints=constraints, debug=False)
        module_plan = planner.plan(ebc_on_meta(task), [EmbeddingBagCollectionSharder()]).plan[""]
        plan = plan_from_module_sharding(module_plan, task.num_devices, "torchrec")
        over = max(plan_memory_bytes(plan, task)) - task.device_memory_bytes
        if over <= 0:
            return plan
        cap -= over + task.device_memory_bytes // 1000
    validate_plan(plan, task)  # over shardwise's accounting after every replan: refused with the device and tier
    return plan


def plan_step(task: ShardingTask, model: NeuralCostModel) -> dict[str, Plan]:
    """NeuroShard's plan (the fitted model) and TorchRec's planner's, each valid for the task's HBM and host memory."""
    plans = {"neuroshard": NeuroShardSearch().search(task, model, 0)}
    try:
        plans["torchrec"] = torchrec_plan(task)
        validate_plan(plans["torchrec"], task)
    except (PlanError, Exception) as err:  # noqa: BLE001 - TorchRec's planner finding no plan is a result too
        print(f"  torchrec: no plan ({str(err).splitlines()[0][:160]})")
    return plans


def measure_step(task: ShardingTask, plans: dict[str, Plan], device: torch.device, rounds: int,
                 timing_iters: int) -> dict[str, float]:
    """Each plan's slowest device's kernel ms (compute alone), its devices' shards timed in interleaved rounds; on a
    CPU with every table back in HBM (what it can time of them)."""
    if not cuda_only(device, "tables on UVM timed"):
        plans = {name: plan.model_copy(update={"kernels": {}}) for name, plan in plans.items()}
    layouts = {name: device_specs(plan, task) for name, plan in plans.items()}
    shards = [KernelShard(tables, task.batch_size, task.optimizer, task.weights_precision)
              for devices in layouts.values() for tables in devices if tables]
    protocol = TimingProtocol(iters=timing_iters).for_device(device)
    if protocol.reference_normalised and protocol.reference_ms is None:
        from shardwise.profiling import calibrate_reference

        protocol = protocol.model_copy(update={"reference_ms": calibrate_reference(device, protocol)})
    timed = iter(time_shards_in_rounds(shards, rounds, device=device, protocol=protocol, progress=False))
    return {name: round(max((statistics.median(t.total_ms for t in next(timed)) if tables else 0.0)
                            for tables in devices), 4)
            for name, devices in layouts.items()}


def run_check(out: Path, device: torch.device, *, batch_size: int, tables: int, max_rows: int, shards: int,
              heldout_shards: int, caching_shards: int, task_tables: int, num_devices: int, hbm_share: float,
              timing_iters: int, rounds: int, epochs: int | None, seed: int = 0) -> dict[str, Any]:
    """The four steps; every figure in the returned document (also OUT/uvm_check.json)."""
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                           "batch_size": batch_size, "torch": torch.__version__}
    train = check_tables("a", tables, seed, max_rows)
    heldout = check_tables("h", max(task_tables, tables // 3), seed + 1, max_rows)

    started = time.perf_counter()
    frame = profile_step(train, heldout, out / "costs", device, batch_size=batch_size, shards=shards,
                         heldout_shards=heldout_shards, caching_shards=caching_shards, timing_iters=timing_iters,
                         seed=seed)
    compute = frame[frame["kind"] == "compute"]
    doc["profile"] = {"seconds": round(time.perf_counter() - started, 1),
                      "shards": compute.groupby("kernel")["config_id"].nunique().to_dict(),
                      "hit_rate_by_load_factor": compute[compute["kernel"] == "fused_uvm_caching"]
                      .groupby("cache_load_factor")["cache_hit_rate"].median().round(3).to_dict()}
    print(f"profile: {doc['profile']}")

    started = time.perf_counter()
    model, doc["accuracy"] = price_step(frame, {t.name for t in heldout}, device, epochs=epochs, seed=seed)
    doc["accuracy"]["seconds"] = round(time.perf_counter() - started, 1)
    print(f"price: {doc['accuracy']}")

    task = check_task(heldout[:task_tables], num_devices, batch_size, hbm_share)
    started = time.perf_counter()
    try:
        plans = plan_step(task, model)
    except PlanError as err:
        doc["plan"] = {"error": str(err)}
        print(f"plan: neuroshard found no plan: {err}")
        (out / "uvm_check.json").write_text(json.dumps(doc, indent=1))
        return doc
    doc["plan"] = {"seconds": round(time.perf_counter() - started, 1),
                   "hbm_gib": round(task.device_memory_bytes / GIB, 3),
                   **{name: {"cached": {t: k.cache_load_factor for t, k in p.kernels.items()},
                             "hbm_gib": [round(b / GIB, 3) for b in plan_memory_bytes(p, task)],
                             "host_gib": [round(b / GIB, 3) for b in plan_host_memory_bytes(p, task)]}
                      for name, p in plans.items()}}
    print(f"plan: {doc['plan']}")

    doc["measured_ms"] = measure_step(task, plans, device, rounds, timing_iters)
    ratio = doc["measured_ms"]["neuroshard"] / doc["measured_ms"]["torchrec"] if "torchrec" in plans else None
    doc["neuroshard_over_torchrec"] = round(ratio, 4) if ratio is not None else None
    print(f"measure: slowest device's kernels {doc['measured_ms']} ms; neuroshard / torchrec "
          f"{doc['neuroshard_over_torchrec']}")
    (out / "uvm_check.json").write_text(json.dumps(doc, indent=1))
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default=None, help="cuda (default where present) or cpu")
    parser.add_argument("--batch-size", type=int, default=16384)
    parser.add_argument("--tables", type=int, default=24, help="training tables")
    parser.add_argument("--max-rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=120, help="training shards in HBM")
    parser.add_argument("--heldout-shards", type=int, default=30)
    parser.add_argument("--caching-shards", type=int, default=12,
                        help="of the training shards, again on UVM (7 variants each at 3 load factors; the held-out "
                             "shards in the same proportion)")
    parser.add_argument("--task-tables", type=int, default=16)
    parser.add_argument("--num-devices", type=int, default=4)
    parser.add_argument("--hbm-share", type=float, default=0.5, help="the devices' HBM over the tables' state")
    parser.add_argument("--timing-iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=200, help="most pretrain epochs")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    doc = run_check(args.out, device, batch_size=args.batch_size, tables=args.tables, max_rows=args.max_rows,
                    shards=args.shards, heldout_shards=args.heldout_shards, caching_shards=args.caching_shards,
                    task_tables=args.task_tables, num_devices=args.num_devices, hbm_share=args.hbm_share,
                    timing_iters=args.timing_iters, rounds=args.rounds, epochs=args.epochs)
    return 0 if doc.get("measured_ms") else 1


if __name__ == "__main__":
    sys.exit(main())
