"""How far a measured comparison of two plans moves between measurement sessions, per measurement protocol.

Refinement, the benchmark and `shardwise evaluate` judge plans by their measured cost ratio. A gain is only
real when it is larger than that ratio's noise. This benchmark takes the first tasks of the paper task sets,
plans them once (NeuroShard, the measured-cost greedy, TorchRec's planner), then measures the same plans again
and again, each time in a fresh session (new reference calibration, new all-to-all process group), under each
protocol in turn. The protocols are interleaved session by session, so machine drift hits them alike. It prints,
per protocol:
  - ratio moved: how far two plans' cost ratio (NeuroShard over the greedy, NeuroShard over TorchRec) moved
    between two sessions, the median and the largest over all pairs of sessions and tasks;
  - compute only: the same for the slowest device's kernel time alone (without the all-to-all);
  - against first: how far its ratio is from the first protocol's in the same session (a protocol that measures
    the same thing moves against another by about as much as within itself; one that is biased, by more);
  - s/session: the time one session takes.
Each protocol measured by `measure_plans` has a twin computed from the same sessions (", all-to-all by width
line"): each device's all-to-all priced by a straight line in its pooled width, fitted over every device of the
task's plans in that session (record comm_estimator: the part of a device's figure that repeats between sessions).
The protocol "9 timings in refinement's session" measures the plans as refinement measures its starts
(`measure_side_by_side`), so refinement's decisions can be checked against the benchmark's measurements.

    python benchmarks/bench_measurement_noise.py --model models:/shardwise-cost-cpu-x86_64-2c@champion
    python benchmarks/bench_measurement_noise.py --model ... --sets 8dev-80to120 --tasks 2 --sessions 5 --record
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

import torch
from plan_runs import paper_tasks, priced_by_width
from record import record

from shardwise.cli import quiet_libraries
from shardwise.evaluation import measure_plans
from shardwise.evaluation.refine import measure_side_by_side
from shardwise.integrations.mlflow import MlflowService
from shardwise.profiling import MeasurementSettings
from shardwise.search import make_searcher

METHODS = ("neuroshard", "measured_greedy", "torchrec")
PAIRS = (("neuroshard", "measured_greedy"), ("neuroshard", "torchrec"))
#: the default protocol, the plans measured as refinement measures the plans it can start from
#: (`measure_side_by_side`: the all-to-all process group open while kernels are timed, 3 plans where the benchmark
#: measures 6) instead of by `measure_plans`
REFINEMENT_SESSION = "9 timings in refinement's session"
#: the protocols compared: name -> MeasurementSettings fields, kernel timings named in each so that a protocol
#: means the same when the defaults change (the rest are the defaults)
#: each protocol prices each device's all-to-all as measured (its own median), as measurement did until 2026-11-26;
#: its twin below prices it by a line in width, as measurement has by default since (`price_comm` over one task's
#: plans fits the twin's line)
AS_MEASURED = {"comm_pricing": "measured"}
PROTOCOLS: dict[str, dict[str, Any]] = {
    "3 timings comm 5x5": {**AS_MEASURED, "timing_rounds": 3, "comm_iters": 5},  # bench_plan_quality's until 11-25
    "3 timings": {**AS_MEASURED, "timing_rounds": 3},  # the default until 2026-11-25
    "3 timings comm 20x20": {**AS_MEASURED, "timing_rounds": 3, "comm_rounds": 20, "comm_iters": 20},
    "9 timings": {**AS_MEASURED, "timing_rounds": 9},  # the default since
    "9 timings comm 20x20": {**AS_MEASURED, "timing_rounds": 9, "comm_rounds": 20, "comm_iters": 20},
    REFINEMENT_SESSION: {**AS_MEASURED, "timing_rounds": 9},
}


#: suffix of a protocol's twin: the same sessions, each device's all-to-all priced by a line in its pooled width
#: fitted over every device of the task's plans in the session (record comm_estimator: the part that repeats)
BY_WIDTH = ", all-to-all by width line"


def moved(ratios: list[float]) -> list[float]:
    """|r_i / r_j - 1| for every pair of sessions (in %)."""
    return [abs(a / b - 1) * 100 for a, b in itertools.combinations(ratios, 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="cost model directory or URI")
    parser.add_argument("--tasks", type=int, default=2, help="tasks per paper task set")
    parser.add_argument("--sets", default=None, help="only these paper task sets (comma separated names)")
    parser.add_argument("--sessions", type=int, default=4, help="measurement sessions per protocol")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma separated, of: " + ", ".join(PROTOCOLS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/measurement_noise.json")
    parser.add_argument("--record-name", default="measurement_noise", metavar="NAME",
                        help="record as benchmarks/results/NAME.json instead")
    args = parser.parse_args()
    quiet_libraries(verbose=False)  # MLflow's download bars and INFO logs, as the CLI without -v
    if args.sessions < 2:
        raise SystemExit(f"--sessions: at least 2 (a ratio moves between sessions), got {args.sessions}")
    protocols = args.protocols.split(",")
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown:
        raise SystemExit(f"--protocols: unknown {unknown}; known: {list(PROTOCOLS)}")
    torch.set_num_threads(1)
    started = time.perf_counter()
    model = MlflowService().load_cost_model(args.model)
    base = MeasurementSettings(device="cpu").for_cost_model(model.reference_ms, model.batch_size)
    tasks = paper_tasks(args.tasks, args.seed, model.batch_size)
    if args.sets:
        tasks = [(name, task) for name, task in tasks if name in args.sets.split(",")]
    planned = [(name, task, {m: make_searcher(m, **({"measurement": base} if m == "measured_greedy" else {}))
                             .search(task, model, args.seed) for m in METHODS}) for name, task in tasks]
    # ratios[protocol][(task, pair, "total"/"compute")] -> one ratio per session
    ratios: dict[str, dict[tuple[int, str, str], list[float]]] = {p: {} for p in protocols}
    seconds: dict[str, list[float]] = {p: [] for p in protocols}
    for protocol in [p for p in protocols if p != REFINEMENT_SESSION]:  # their twins, from the same sessions
        ratios[protocol + BY_WIDTH] = {}
    for session in range(args.sessions):
        for protocol in protocols:
            settings = base.model_copy(update=PROTOCOLS[protocol])
            for t, (_, task, plans) in enumerate(planned):
                began = time.perf_counter()
                if protocol == REFINEMENT_SESSION:
                    figures = measure_side_by_side(task, [plans[m] for m in METHODS], model, settings)
                else:
                    costs = measure_plans([(task, plans[m]) for m in METHODS], settings, progress=False)
                    figures = [(m.max_cost_ms, m.max_compute_ms) for m in costs]
                    twin = [(total, m.max_compute_ms) for total, m in zip(priced_by_width(costs), costs, strict=True)]
                    for (a, b), i in itertools.product(PAIRS, range(2)):
                        key = (t, f"{a}/{b}", ("total", "compute")[i])
                        ratios[protocol + BY_WIDTH].setdefault(key, []).append(
                            twin[METHODS.index(a)][i] / twin[METHODS.index(b)][i])
                measured = dict(zip(METHODS, figures, strict=True))
                seconds[protocol].append(time.perf_counter() - began)
                for a, b in PAIRS:
                    for i, part in enumerate(("total", "compute")):
                        ratios[protocol].setdefault((t, f"{a}/{b}", part), []).append(measured[a][i] / measured[b][i])
        print(f"session {session + 1} of {args.sessions} done ({time.perf_counter() - started:.0f} s)", flush=True)

    rows: list[dict[str, Any]] = []
    print(f"\n{len(planned)} task(s) ({', '.join(sorted({n for n, _, _ in planned}))}), {args.sessions} sessions "
          f"per protocol; ratio moved = |r_i/r_j - 1| over all pairs of sessions, in %")
    first = protocols[0]
    print(f"against {first}: how far each protocol's ratio is from {first}'s of the same session (in %)")
    print(f"{'protocol':<48}{'ratio moved median':>19}{'max':>7}{'compute only median':>21}{'max':>7}"
          f"{'against first median':>22}{'max':>7}{'s/session':>11}")
    for protocol in ratios:  # each protocol, then the twins priced by width
        base = protocol.removesuffix(BY_WIDTH)
        total = [m for (_, _, part), r in ratios[protocol].items() if part == "total" for m in moved(r)]
        compute = [m for (_, _, part), r in ratios[protocol].items() if part == "compute" for m in moved(r)]
        against = [abs(r / q - 1) * 100 for key, rs in ratios[protocol].items() if key[2] == "total"
                   for r, q in zip(rs, ratios[first][key], strict=True)]
        row = {"protocol": protocol, **PROTOCOLS[base],
               "ratio_moved_median_pct": round(statistics.median(total), 2),
               "ratio_moved_max_pct": round(max(total), 2),
               "compute_moved_median_pct": round(statistics.median(compute), 2),
               "compute_moved_max_pct": round(max(compute), 2),
               "against_first_median_pct": round(statistics.median(against), 2),
               "against_first_max_pct": round(max(against), 2),
               "seconds_per_session": round(statistics.fmean(seconds[base]), 1)}
        rows.append(row)
        print(f"{protocol:<48}{row['ratio_moved_median_pct']:>19.2f}{row['ratio_moved_max_pct']:>7.2f}"
              f"{row['compute_moved_median_pct']:>21.2f}{row['compute_moved_max_pct']:>7.2f}"
              f"{row['against_first_median_pct']:>22.2f}{row['against_first_max_pct']:>7.2f}"
              f"{row['seconds_per_session']:>11.1f}")
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.record:
        record(args.record_name, "How far two plans' measured cost ratio moves between sessions, per protocol",
               rows, notes=f"{len(planned)} task(s) of {args.sets or 'each paper set'} (first {args.tasks}), "
               f"{args.sessions} sessions per protocol, plans NeuroShard, measured greedy, TorchRec measured together; "
               f"pairs {', '.join(f'{a}/{b}' for a, b in PAIRS)}, CPU")


if __name__ == "__main__":
    main()
