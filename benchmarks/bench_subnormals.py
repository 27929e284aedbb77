"""What subnormal floats cost the search on this CPU: NeuroShard with the cost model as shardwise runs it
(subnormal weights zeroed, subnormal results flushed to zero) next to the same search with the weights as
trained and flushing off (what shardwise did before), on the same tasks in one run.

Weight decay leaves thousands of weights below float32's normal range; CPUs that handle such operands in
microcode pay for each one. This 2-core AMD EPYC barely does; a GPU node's Intel CPU may not.

    python benchmarks/bench_subnormals.py --model MODEL_DIR
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from unittest import mock

import torch
from record import record

from shardwise.cli import quiet_libraries
from shardwise.costmodel import NeuralCostModel
from shardwise.costmodel.networks import load_checked_state, subnormal
from shardwise.profiling.hardware import device_name
from shardwise.search import make_searcher
from shardwise.workload.synthetic import synthesize_tables
from shardwise.workload.tableset import sample_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="cost model directory")
    parser.add_argument("--sizes", default="100x8,1000x64", help="tables x devices, comma separated")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/subnormals.json")
    args = parser.parse_args()
    quiet_libraries(verbose=False)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    tableset = synthesize_tables(max(n for n, _ in sizes), seed=0, batch_size=4096)
    model = NeuralCostModel.load(args.model)  # subnormal weights zeroed on load
    as_trained = NeuralCostModel.load(args.model)  # then given its stored weights back
    weights = torch.load(Path(args.model) / "weights.pt", map_location="cpu", weights_only=True)
    load_checked_state(as_trained.compute_net, weights, "compute.")
    if as_trained.comm_net is not None:
        load_checked_state(as_trained.comm_net, weights, "comm.")
    count = sum(int(subnormal(v).sum()) for v in weights.values())
    print(f"CPU: {device_name('cpu')}; cost model {args.model}: {count} subnormal weights of "
          f"{sum(v.numel() for v in weights.values())}")
    print(f"{'task':>10}  {'as run s':>9}  {'before s':>9}  {'before/as run':>13}  {'same plan cost':>14}")
    rows = []
    for num_tables, num_devices in sizes:
        task = sample_task(tableset, num_tables, num_devices, seed=0)
        started = time.perf_counter()
        plan = make_searcher("neuroshard").search(task, model, 0)
        now_s = time.perf_counter() - started
        with mock.patch.object(torch, "set_flush_denormal", lambda mode: False):  # flushing off, as before
            started = time.perf_counter()
            before = make_searcher("neuroshard").search(task, as_trained, 0)
            before_s = time.perf_counter() - started
        ratio = before.extra["predicted"]["max_cost_ms"] / plan.extra["predicted"]["max_cost_ms"]
        rows.append({"task": f"{num_tables}x{num_devices}", "as_run_s": round(now_s, 2),
                     "before_s": round(before_s, 2), "before_over_as_run": round(before_s / now_s, 2),
                     "predicted_cost_before_over_as_run": round(ratio, 6)})
        print(f"{num_tables}x{num_devices:<5}  {now_s:>9.2f}  {before_s:>9.2f}  {before_s / now_s:>12.2f}x  "
              f"{ratio:>14.6f}")
    print("as run = subnormal weights zeroed and results flushed (shardwise now); before = weights as trained, "
          "no flushing; same plan cost = the before plan's predicted cost over the as-run one's (1: no change)")
    if args.record:
        record("subnormals", "Subnormal floats in the search: time with and without them", rows,
               notes=f"CPU: {device_name('cpu')}; cost model {args.model} ({count} subnormal weights); NeuroShard, one "
                     "thread, synthetic DLRM tables at full size, batch 4096")


if __name__ == "__main__":
    main()
