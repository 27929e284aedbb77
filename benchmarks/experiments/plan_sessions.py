"""A finished plan_quality run's plans measured again in fresh sessions: each task judged on the median.

plan_quality measures each task's plans once, together, in one session. On a shared CPU two plans' measured ratio
moves by 2-3% from one session to the next (its noise line; record measurement_noise), so a task where refinement is
that close to the measured greedy can land on either side of it by chance. This experiment re-plans and refines
nothing: it takes the plan files of the run in --run and measures each task's plans together again, in --sessions
fresh sessions under the run's protocol (`measure_plans`, as the run measured them). Session 1 goes over every task,
then session 2, and so on, so drift on the machine spreads over all tasks. Per task set:
  - per task: the refined plan over the measured greedy's, in the run and in each session, and the median;
  - on how many tasks the refined plan is at or below the greedy, in the run and on the median of the sessions;
  - the mean ratios to TorchRec's planner and to the greedy on the medians;
  - how far that ratio moved between two sessions (median and most over tasks);
  - the same verdict on each device's all-to-all as measured (its own median, kept in every measured file), when
    the run prices it by a line in width: whether the two rulers agree on fresh sessions.

    python -m benchmarks plan_sessions --run runs/bench_pq_large4 --sessions 3
    python -m benchmarks plan_sessions --run RUN --sets 8dev-80to120 --resume --record --record-name NAME
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from benchmarks.harness import BenchmarkError, Context, Experiment, ExperimentSettings, Outcome, register
from benchmarks.plan_runs import at_or_below, finished_run, moved
from shardwise.evaluation import PlanResult, cost_ratio, measure_plans
from shardwise.profiling import MeasurementSettings
from shardwise.search import Plan, load_plan
from shardwise.workload import ShardingTask, load_task

REFINED, GREEDY, TORCHREC = "neuroshard+refine", "measured_greedy", "torchrec"
#: the plans measured again in each session (the verdicts need the first two; TorchRec's for the headline ratio)
METHODS = (REFINED, GREEDY, "neuroshard", TORCHREC)


def _tasks(run: Path, sets: list[str] | None) -> list[tuple[str, int, ShardingTask, list[Plan]]]:
    """(task set, task index, task, its plans in METHODS' order) of every task of the run with a plan file for
    each method, read once."""
    found = []
    for task_dir in sorted(run.glob("*/task*")):
        name, index = task_dir.parent.name, int(task_dir.name.removeprefix("task"))
        if (sets is None or name in sets) and all((task_dir / f"{m}.plan.json").is_file() for m in METHODS):
            found.append((name, index, load_task(task_dir / "task.json"),
                          [load_plan(task_dir / f"{m}.plan.json") for m in METHODS]))
    return found


def _median_ratio(figures: dict[str, list[float]], a: str, b: str) -> float:
    """The median over sessions of `a`'s figure over `b`'s in the same session (a paired ratio: a slow session
    slows both)."""
    return statistics.median(x / y for x, y in zip(figures[a], figures[b], strict=True))


class PlanSessionsSettings(ExperimentSettings):
    """Which run's plans, in how many sessions, kept where."""

    run: str = Field(description="a plan_quality experiment's --out directory (with results.json)")
    sessions: int = Field(default=3, ge=2, description="fresh measurement sessions per task (a ratio moves between "
                          "sessions: at least 2)")
    sets: tuple[str, ...] | None = Field(default=None, description="only these task sets (comma separated names)",
                                         json_schema_extra={"sep": ","})
    out: str | None = Field(default=None, description="where each session's figures are kept (default: "
                            "<run>/sessions.json)")
    resume: bool = Field(default=False, description="keep the sessions already in --out and go on")


def run(args: PlanSessionsSettings, context: Context) -> Outcome:
    """Every task's plans measured together in each fresh session; one row per task."""
    run, original = finished_run(args.run)
    # the run's protocol, its reference pinned; a run that names no pricing priced each device's all-to-all as measured
    measurement = MeasurementSettings(**{"comm_pricing": "measured", **original["measurement"]})
    tasks = _tasks(run, list(args.sets) if args.sets else None)
    if not tasks:
        raise BenchmarkError(f"--run {run}: no task there has plan files for {', '.join(METHODS)}")
    out = Path(args.out) if args.out else run / "sessions.json"
    # (session, task set, task index) -> method -> (plan cost ms, slowest device's kernels ms, plan cost ms with each
    # device's all-to-all its own median; absent in older files)
    done: dict[str, dict[str, list[float]]] = json.loads(out.read_text()) if args.resume and out.is_file() else {}
    started = time.perf_counter()
    for session in range(args.sessions):
        for name, index, task, plans in tasks:
            key = f"{session}/{name}/{index}"
            if key in done:
                continue
            measured = measure_plans([(task, p) for p in plans], measurement, progress=False)
            done[key] = {m: [c.max_cost_ms, c.max_compute_ms, c.own_comm_max_cost_ms]
                         for m, c in zip(METHODS, measured, strict=True)}
            # an interrupted run keeps its sessions (--resume): the file is replaced whole, never left half-written
            partial = out.with_name(f".{out.name}.tmp")
            partial.write_text(json.dumps(done, indent=1) + "\n")
            partial.replace(out)
            print(f"session {session + 1} of {args.sessions}, {name} task {index}: {REFINED} / {GREEDY} "
                  f"{done[key][REFINED][0] / done[key][GREEDY][0]:.3f} ({time.perf_counter() - started:.0f} s)",
                  flush=True)

    in_run = [PlanResult.model_validate(p) for p in original["plans"] if p["method"] in METHODS]
    rows: list[dict[str, Any]] = []
    headlines: list[str] = []
    for name in dict.fromkeys(t[0] for t in tasks):
        run_set = [r for r in in_run if r.task_set == name]
        run_ms = {(r.task_index, r.method): r.measured_ms for r in run_set}
        per_task, at_median = [], []
        for index in (t[1] for t in tasks if t[0] == name):
            sessions = [done[f"{s}/{name}/{index}"] for s in range(args.sessions)]
            figures = {m: [s[m][0] for s in sessions] for m in METHODS}
            kernels = {m: [s[m][1] for s in sessions] for m in METHODS}
            ratios = [r / g for r, g in zip(figures[REFINED], figures[GREEDY], strict=True)]
            # the same sessions judged on each device's own all-to-all median (when every session kept it)
            own = [x[REFINED][2] / x[GREEDY][2] for x in sessions] if all(len(x[REFINED]) > 2 for x in sessions) else []
            row = {"task_set": name, "task": index,
                   "run": round(run_ms[index, REFINED] / run_ms[index, GREEDY], 4),
                   "sessions": [round(r, 4) for r in ratios],
                   "median": round(statistics.median(ratios), 4),
                   "kernels_median": round(_median_ratio(kernels, REFINED, GREEDY), 4),
                   "to_torchrec_median": round(_median_ratio(figures, REFINED, TORCHREC), 4),
                   "neuroshard_to_torchrec_median": round(_median_ratio(figures, "neuroshard", TORCHREC), 4),
                   "moved_max_pct": round(max(moved(ratios)), 2),
                   "own_median_all_to_all_median": round(statistics.median(own), 4) if own else None}
            rows.append(row)
            per_task.append(row)
            # each plan's cost as its median over the sessions, for the mean-cost ratios the run prints
            at_median += [r.model_copy(update={"measured_ms": statistics.median(figures[r.method])})
                          for r in run_set if r.task_index == index]
        medians = [r["median"] for r in per_task]
        # the verdict on each task's paired median (the same sessions' ratios), not on the ratio of two medians
        headlines += [f"{name}: {at_or_below(run_set, REFINED, GREEDY, lambda r: r.measured_ms)} in the run",
                      f"{name}: {REFINED} at or below {GREEDY} on the median of {args.sessions} fresh sessions on "
                      f"{sum(v <= 1 for v in medians)} of {len(medians)} tasks (worst {max(medians):.3f}, mean "
                      f"{statistics.fmean(medians):.3f})"]
        own_medians = [r["own_median_all_to_all_median"] for r in per_task]
        if measurement.comm_pricing != "measured" and None not in own_medians:
            headlines.append(f"{name}: the same sessions with each device's all-to-all its own median: at or below on "
                             f"{sum(v <= 1 for v in own_medians)} of {len(own_medians)} tasks (worst "
                             f"{max(own_medians):.3f}, mean {statistics.fmean(own_medians):.3f})")
        spread = [m for r in per_task for m in moved(r["sessions"])]
        pairs = ((REFINED, TORCHREC), ("neuroshard", TORCHREC), (REFINED, GREEDY))
        headlines.append(
            f"{name}: mean cost over mean cost, the sessions' medians (the run's): " + ", ".join(
                f"{a} / {b} {cost_ratio(at_median, a, b):.3f} ({cost_ratio(run_set, a, b):.3f})" for a, b in pairs)
            + f"; {REFINED} / {GREEDY} moved {statistics.median(spread):.1f}% between two sessions (median, at most "
            f"{max(spread):.1f}%)")
    return Outcome(rows, notes=[
        f"plans of {run} ({len(tasks)} tasks), {args.sessions} fresh sessions each, measured as the run measured them "
        f"({measurement.timing_rounds} kernel timings, {measurement.comm_rounds} x {measurement.comm_iters} "
        f"all-to-alls priced {measurement.comm_pricing!r}, reference {measurement.reference_ms:.4f} ms); rows: "
        f"{REFINED} / {GREEDY}, plan cost, in the run, each fresh session and their median "
        f"({time.perf_counter() - started:.0f} s)", *headlines])


register(Experiment(
    name="plan_sessions",
    title="A plan-quality run's plans measured again in fresh sessions: each task on the median",
    settings=PlanSessionsSettings,
    run=run,
))
