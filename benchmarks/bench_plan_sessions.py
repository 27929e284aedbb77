"""A finished bench_plan_quality run's plans measured again in fresh sessions: each task judged on the median.

bench_plan_quality measures each task's plans once, together, in one session. On a shared CPU two plans' measured
ratio moves by 2-3% from one session to the next (its noise line; bench_measurement_noise.py), so a task where
refinement is that close to the measured greedy can land on either side of it by chance. This benchmark re-plans
and refines nothing: it takes the plan files of the run in --run and measures each task's plans together again,
in --sessions fresh sessions under the run's protocol (`measure_plans`, as the run measured them). Session 1 goes
over every task, then session 2, and so on, so drift on the machine spreads over all tasks. It prints, per task set:
  - per task: the refined plan over the measured greedy's, in the run and in each session, and the median;
  - on how many tasks the refined plan is at or below the greedy, in the run and on the median of the sessions;
  - the mean ratios to TorchRec's planner and to the greedy on the medians;
  - how far that ratio moved between two sessions (median and most over tasks).

    python benchmarks/bench_plan_sessions.py --run runs/bench_pq_large4 --sessions 3
    python benchmarks/bench_plan_sessions.py --run ... --sets 8dev-80to120 --resume --record --record-name NAME
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from record import record

from shardwise.cli import quiet_libraries
from shardwise.evaluation import measure_plans
from shardwise.profiling import MeasurementSettings
from shardwise.search import load_plan
from shardwise.workload import load_task

REFINED, GREEDY, TORCHREC = "neuroshard+refine", "measured_greedy", "torchrec"
#: the plans measured again in each session (the verdicts need the first two; TorchRec's for the headline ratio)
METHODS = (REFINED, GREEDY, "neuroshard", TORCHREC)


def _tasks(run: Path, sets: list[str] | None) -> list[tuple[str, int, Path]]:
    """(task set, task index, task directory) of every task of the run with a plan file for each method."""
    found = []
    for task_dir in sorted(run.glob("*/task*")):
        name, index = task_dir.parent.name, int(task_dir.name.removeprefix("task"))
        if (sets is None or name in sets) and all((task_dir / f"{m}.plan.json").is_file() for m in METHODS):
            found.append((name, index, task_dir))
    return found


def _median_ratio(figures: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(figures[a], figures[b], strict=True))


def _mean_ratio(cost: dict[tuple[str, int], float], a: str, b: str) -> float:
    """Mean cost of method `a` over mean cost of `b` over the tasks in `cost` ((method, task) -> ms)."""
    tasks = {i for _, i in cost}
    return sum(cost[a, i] for i in tasks) / sum(cost[b, i] for i in tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a bench_plan_quality.py --out directory (with results.json)")
    parser.add_argument("--sessions", type=int, default=3, help="fresh measurement sessions per task")
    parser.add_argument("--sets", default=None, help="only these task sets (comma separated names)")
    parser.add_argument("--out", default=None, help="where each session's figures are kept (default: <run>/sessions.json)")
    parser.add_argument("--resume", action="store_true", help="keep the sessions already in --out and go on")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/plan_sessions.json")
    parser.add_argument("--record-name", default="plan_sessions", metavar="NAME",
                        help="record as benchmarks/results/NAME.json instead")
    args = parser.parse_args()
    quiet_libraries(verbose=False)
    run = Path(args.run)
    if not (run / "results.json").is_file():
        parser.error(f"--run: {run} has no results.json (a bench_plan_quality.py --out directory)")
    if args.sessions < 2:
        parser.error(f"--sessions: at least 2 (a ratio moves between sessions), got {args.sessions}")
    original = json.loads((run / "results.json").read_text())
    measurement = MeasurementSettings(**original["measurement"])  # the run's protocol, its reference pinned
    tasks = _tasks(run, args.sets.split(",") if args.sets else None)
    if not tasks:
        parser.error(f"--run: no task in {run} has plan files for {', '.join(METHODS)}")
    out = Path(args.out) if args.out else run / "sessions.json"
    # (session, task set, task index) -> method -> (plan cost ms, slowest device's kernels ms)
    done: dict[str, dict[str, list[float]]] = json.loads(out.read_text()) if args.resume and out.is_file() else {}
    torch.set_num_threads(1)
    started = time.perf_counter()
    for session in range(args.sessions):
        for name, index, task_dir in tasks:
            key = f"{session}/{name}/{index}"
            if key in done:
                continue
            task = load_task(task_dir / "task.json")
            plans = [load_plan(task_dir / f"{m}.plan.json") for m in METHODS]
            measured = measure_plans([(task, p) for p in plans], measurement, progress=False)
            done[key] = {m: [c.max_cost_ms, c.max_compute_ms] for m, c in zip(METHODS, measured, strict=True)}
            # an interrupted run keeps its sessions (--resume): the file is replaced whole, never left half-written
            partial = out.with_name(f".{out.name}.tmp")
            partial.write_text(json.dumps(done, indent=1) + "\n")
            partial.replace(out)
            print(f"session {session + 1} of {args.sessions}, {name} task {index}: {REFINED} / {GREEDY} "
                  f"{done[key][REFINED][0] / done[key][GREEDY][0]:.3f} ({time.perf_counter() - started:.0f} s)",
                  flush=True)

    in_run = {(p["task_set"], p["task_index"], p["method"]): p["measured_ms"] for p in original["plans"]}
    rows: list[dict[str, Any]] = []
    headlines: list[str] = []
    for name in dict.fromkeys(n for n, _, _ in tasks):
        print(f"\n{name}: {REFINED} / {GREEDY}, plan cost (the run, then each fresh session, then their median)")
        per_task = []
        for _, index, _ in (t for t in tasks if t[0] == name):
            sessions = [done[f"{s}/{name}/{index}"] for s in range(args.sessions)]
            figures = {m: [s[m][0] for s in sessions] for m in METHODS}
            kernels = {m: [s[m][1] for s in sessions] for m in METHODS}
            ratios = [r / g for r, g in zip(figures[REFINED], figures[GREEDY], strict=True)]
            row = {"task_set": name, "task": index,
                   "run": round(in_run[name, index, REFINED] / in_run[name, index, GREEDY], 4),
                   "sessions": [round(r, 4) for r in ratios],
                   "median": round(statistics.median(ratios), 4),
                   "kernels_median": round(_median_ratio(kernels, REFINED, GREEDY), 4),
                   "to_torchrec_median": round(_median_ratio(figures, REFINED, TORCHREC), 4),
                   "neuroshard_to_torchrec_median": round(_median_ratio(figures, "neuroshard", TORCHREC), 4),
                   "moved_max_pct": round(max(abs(a / b - 1) * 100 for a, b in itertools.permutations(ratios, 2)), 2)}
            rows.append(row)
            per_task.append(row)
            print(f"  task {index}: run {row['run']:.3f}; sessions " + " ".join(f"{r:.3f}" for r in ratios)
                  + f"; median {row['median']:.3f} (kernels alone {row['kernels_median']:.3f})")
        for label, field in (("in the run", "run"), (f"on the median of {args.sessions} fresh sessions", "median")):
            values = [r[field] for r in per_task]
            headlines.append(f"{name}: {REFINED} at or below {GREEDY} {label} on {sum(v <= 1 for v in values)} of "
                             f"{len(values)} tasks (worst {max(values):.3f}, mean {statistics.fmean(values):.3f})")
        moved = [m for r in per_task for m in
                 (abs(a / b - 1) * 100 for a, b in itertools.combinations(r["sessions"], 2))]
        # as bench_plan_quality.py aggregates: mean cost over mean cost, here each plan's cost its median over sessions
        tasks_in = [index for n, index, _ in tasks if n == name]
        median_ms = {(m, i): statistics.median(done[f"{s}/{name}/{i}"][m][0] for s in range(args.sessions))
                     for m in METHODS for i in tasks_in}

        run_ms = {(m, i): in_run[name, i, m] for m in METHODS for i in tasks_in}
        headlines.append(
            f"{name}: mean cost over mean cost, the sessions' medians (the run's): {REFINED} / {TORCHREC} "
            f"{_mean_ratio(median_ms, REFINED, TORCHREC):.3f} ({_mean_ratio(run_ms, REFINED, TORCHREC):.3f}), "
            f"neuroshard / {TORCHREC} {_mean_ratio(median_ms, 'neuroshard', TORCHREC):.3f} "
            f"({_mean_ratio(run_ms, 'neuroshard', TORCHREC):.3f}), {REFINED} / {GREEDY} "
            f"{_mean_ratio(median_ms, REFINED, GREEDY):.3f} ({_mean_ratio(run_ms, REFINED, GREEDY):.3f}); "
            f"{REFINED} / {GREEDY} moved {statistics.median(moved):.1f}% between two sessions (median, at most "
            f"{max(moved):.1f}%)")
    print()
    for line in headlines:
        print(line)
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.record:
        record(args.record_name, "A plan-quality run's plans measured again in fresh sessions: each task on the median",
               rows, notes=f"plans of {run} ({len(tasks)} tasks), {args.sessions} fresh sessions each, measured as "
                           f"the run measured them ({measurement.timing_rounds} kernel timings, "
                           f"{measurement.comm_rounds} x {measurement.comm_iters} all-to-alls, reference "
                           f"{measurement.reference_ms:.4f} ms); " + "; ".join(headlines))


if __name__ == "__main__":
    main()
