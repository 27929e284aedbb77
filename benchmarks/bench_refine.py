"""Refinement on hardware: NeuroShard's plan before and after refinement, next to the measured-cost greedy and
TorchRec's planner, all measured in one session on this machine's kernels and all-to-alls.

Tasks: the first N of each paper task set (bench_plan_quality.py's, from held-out synthetic tables, at the cost
model's batch). Per task it prints each plan's measured slowest device, the refined plan over NeuroShard's and
over the measured greedy's, and the refinement's rounds (measured gain per round) and extra time.

Refinement goes on from the faster, measured, of NeuroShard's plan and the measured greedy's (as `evaluate` and
`benchmark` do); `--searched-only` refines NeuroShard's plan alone. `--method` refines another method's plan in
NeuroShard's place: `torchrec_rw`, TorchRec's planner offered row-wise, gives plans with row-wise tables, whose
blocks and collectives refinement keeps and moves the other shards around (recorded as `refine_<method>`).

    python benchmarks/bench_refine.py --model MODEL_DIR [--tasks 3] [--rounds 4] [--searched-only]
        [--method torchrec_rw] [--record]
    python benchmarks/bench_refine.py --model MODEL_DIR --task my_task.json --rounds 3 --record \
        --record-name refine_readme_example      # tasks of your own (README's example) instead of the paper sets
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from plan_runs import paper_tasks
from record import record

from shardwise.cli import quiet_libraries
from shardwise.evaluation import measure_plans
from shardwise.evaluation.refine import refine_plan
from shardwise.integrations.mlflow import MlflowService
from shardwise.profiling import MeasurementSettings
from shardwise.search import make_searcher
from shardwise.workload import load_task

BASELINES = ("measured_greedy", "torchrec")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="cost model directory or URI")
    parser.add_argument("--tasks", type=int, default=3, help="tasks per paper task set")
    parser.add_argument("--rounds", type=int, default=4, help="refinement rounds per plan")
    parser.add_argument("--sets", default=None, help="only these paper task sets (comma separated names)")
    parser.add_argument("--searched-only", action="store_true",
                        help="refine NeuroShard's plan only (not also from the measured greedy's)")
    parser.add_argument("--method", default="neuroshard",
                        help="the method whose plan is refined (default neuroshard; torchrec_rw: plans with row-wise "
                             "tables)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", action="append", default=None, metavar="FILE",
                        help="a shardwise.task/v1 file to refine instead of the paper tasks (repeatable)")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/refine.json")
    parser.add_argument("--record-name", default=None, metavar="NAME",
                        help="record as benchmarks/results/NAME.json instead")
    args = parser.parse_args()
    quiet_libraries(verbose=False)  # MLflow's download bars and INFO logs, as the CLI without -v
    torch.set_num_threads(1)
    model = MlflowService().load_cost_model(args.model)
    measurement = MeasurementSettings(device="cpu").for_cost_model(model.reference_ms, model.batch_size)
    rows = []
    searched = args.method
    methods = (searched, *BASELINES)
    header = (f"{'task':<18}{searched[:11]:>11}{'refined':>9}{'meas.greedy':>12}{'torchrec':>9}{'ref/srch':>9}"
              f"{'ref/greedy':>11}{'ref/torchrec':>13}{'ref imbal':>10}{'refine s':>9}  start: measured slowest device per round")
    lines = []
    tasks = ([(Path(f).stem, load_task(f)) for f in args.task] if args.task
             else paper_tasks(args.tasks, args.seed, model.batch_size))
    if args.sets:
        tasks = [(name, task) for name, task in tasks if name in args.sets.split(",")]
    for index, (name, task) in enumerate(tasks):
        plans = {m: make_searcher(m, **({"measurement": measurement} if m == "measured_greedy" else {}))
                 .search(task, model, args.seed) for m in methods}
        started = time.perf_counter()
        starts = [] if args.searched_only else [plans["measured_greedy"]]
        refined, refinement = refine_plan(task, plans[searched], model, measurement, rounds=args.rounds,
                                          starts=starts, progress=False)
        refine_s = time.perf_counter() - started
        order = [*methods, "refined"]
        measured = dict(zip(order, measure_plans([(task, plans[m]) for m in methods] + [(task, refined)],
                                                 measurement, progress=False)))
        ms = {m: measured[m].max_cost_ms for m in order}
        per_round = " ".join(f"{r.measured_max_ms:.2f}{'*' if r.kept else ''}" for r in refinement.rounds)
        label = name if args.task else f"{name} #{index % args.tasks + 1}"
        lines.append(f"{label:<18}{ms[searched]:>11.3f}{ms['refined']:>9.3f}{ms['measured_greedy']:>12.3f}"
                     f"{ms['torchrec']:>9.3f}{ms['refined'] / ms[searched]:>9.3f}"
                     f"{ms['refined'] / ms['measured_greedy']:>11.3f}{ms['refined'] / ms['torchrec']:>13.3f}"
                     f"{measured['refined'].imbalance:>10.3f}{refine_s:>9.1f}  {refinement.start}: {per_round} -> {refinement.after_ms:.2f}")
        print(lines[-1] if len(lines) > 1 else f"{header}\n{lines[-1]}", flush=True)
        rows.append({"task": label, "tables": len(task.tables), "devices": task.num_devices,
                     **{f"{m}_ms": round(ms[m], 3) for m in order},
                     f"refined_over_{searched}": round(ms["refined"] / ms[searched], 3),
                     "refined_over_measured_greedy": round(ms["refined"] / ms["measured_greedy"], 3),
                     "refined_over_torchrec": round(ms["refined"] / ms["torchrec"], 3),
                     # the refined plan's slowest device over its own mean device: what balance alone could still gain
                     "refined_imbalance": round(measured["refined"].imbalance, 3),
                     "row_wise_tables": len(refined.row_wise), "start": refinement.start, "rounds_kept": sum(r.kept for r in refinement.rounds),
                     "refine_s": round(refine_s, 1)})
    for key in (f"refined_over_{searched}", "refined_over_measured_greedy", "refined_over_torchrec"):
        print(f"mean {key}: {statistics.fmean(r[key] for r in rows):.3f}")
    for devices in sorted({r["devices"] for r in rows}):
        on = [r for r in rows if r["devices"] == devices]
        print(f"{devices} devices: refined / torchrec {statistics.fmean(r['refined_over_torchrec'] for r in on):.3f} "
              f"on average; at or below the measured greedy on "
              f"{sum(r['refined_over_measured_greedy'] <= 1.0 for r in on)} of {len(on)} tasks")
    print("ref imbal: the refined plan's measured slowest device over its mean device (what balance could still "
          "gain); per round: the measured slowest device (kernels + all-to-all, both measured) "
          "before it; * = its change was kept")
    if args.record:
        name = args.record_name or ("refine" if searched == "neuroshard" else f"refine_{searched}")
        what = ", ".join(args.task) if args.task else f"first {args.tasks} task(s) of {args.sets or 'each paper set'}"
        record(name, f"Refinement on hardware: {searched} before and after, the measured greedy, TorchRec",
               rows, notes=f"{what}, {args.rounds} rounds, "
               f"{'from the searched plan only' if args.searched_only else f'from the faster of {searched} and the measured greedy'}, CPU")


if __name__ == "__main__":
    main()
