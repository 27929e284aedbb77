"""Which part of a device's measured all-to-all repeats between sessions, and what judging plans without the rest
would change. Reads two finished bench_plan_quality runs; measures nothing.

A plan's measured cost is its slowest device's kernels plus that device's all-to-all (`measure_plans`). Each
device's all-to-all figure is the median of its exchanges, and on a shared CPU it strays from its layout's mean by
a few percent. Part of that is the device's pooled width (it sends more), which any session sees again; part is
noise, which lands on whichever device it lands on, and can make a balanced plan's slowest device look slower than
it is. This benchmark takes the plans that are identical in both runs (TorchRec's, the greedy baselines': the same
tasks, planned without a cost model) and, per task set, prints:
  - how far a device's all-to-all strays from its layout's mean (sd), how much of that follows its width
    (correlation), and how much repeats in the other run: the raw deviation, and what is left after a line in width
    (fitted per run over every device of those plans) is taken out;
  - the same residual's mean per rank in each run, and how those means agree (a per-rank effect would repeat);
  - for the plans of --run, refinement's plan against the measured greedy's, task by task, under three ways to
    price a device's all-to-all: as measured (its own median, measurement's pricing until 2026-11-26), its
    layout's mean, and the line in width fitted over every plan of the task in that session (measurement's pricing
    since, `price_comm`).
The "as measured" figures are each device's own medians, kept in every measured file (`comm_*_measured_ms`).

    python benchmarks/bench_comm_estimator.py --run runs/bench_pq_large4 --against runs/bench_pq_inter [--record]
    python benchmarks/bench_comm_estimator.py --run runs/bench_pq_inter --against runs/bench_pq_large4 \
        --record --record-name comm_estimator_make_run
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from plan_runs import at_or_below
from record import record

from shardwise.evaluation import DeviceCost, MeasuredPlanCost, PlanResult
from shardwise.evaluation.measured import price_comm
from shardwise.search import Shard, load_plan

REFINED, GREEDY = "neuroshard+refine", "measured_greedy"
#: plans of a task that do not depend on the cost model, so two runs on the same tasks hold the same ones
MODEL_FREE = ("torchrec", "torchrec_cw", "size_lookup_greedy", GREEDY)


def _measured(task_dir: Path, method: str) -> MeasuredPlanCost | None:
    path = task_dir / f"{method}.measured.json"
    return MeasuredPlanCost.model_validate_json(path.read_text()) if path.is_file() else None


def _shards(task_dir: Path, method: str) -> tuple[Shard, ...] | None:
    path = task_dir / f"{method}.plan.json"
    return load_plan(path).shards if path.is_file() else None


def _residual(deviation: np.ndarray, width: np.ndarray) -> np.ndarray:
    """What a straight line in width leaves of the deviations."""
    design = np.c_[width, np.ones_like(width)]
    return deviation - design @ np.linalg.lstsq(design, deviation, rcond=None)[0]


def repeatability(run: Path, against: Path, task_set: str) -> dict[str, Any] | None:
    """The per-device all-to-all deviation from its layout's mean, over plans identical in both runs."""
    mine, theirs, widths, ranks = [], [], [], []
    for task_dir in sorted((run / task_set).glob("task*")):
        other = against / task_set / task_dir.name
        if not (other / "task.json").is_file() or (task_dir / "task.json").read_text() != (other / "task.json").read_text():
            continue
        for method in MODEL_FREE:
            a, b = _measured(task_dir, method), _measured(other, method)
            if a is None or b is None or _shards(task_dir, method) != _shards(other, method):
                continue
            for cost, out in ((a, mine), (b, theirs)):
                comm = np.array([measured_comm_ms(d) for d in cost.devices])
                out += list(comm / comm.mean() - 1)
            width = np.array([d.width for d in a.devices], dtype=float)
            widths += list(width / width.mean() - 1)
            ranks += range(len(a.devices))
    if len(mine) < 3:
        return None
    x, y, w = np.array(mine), np.array(theirs), np.array(widths)
    rx, ry = _residual(x, w), _residual(y, w)
    rank = np.array(ranks)
    by_rank = [(rx[rank == r].mean(), ry[rank == r].mean()) for r in range(rank.max() + 1)]
    return {"task_set": task_set, "devices": len(x), "deviation_sd_pct": round(float(x.std()) * 100, 2),
            "corr_with_width": round(float(np.corrcoef(x, w)[0, 1]), 3),
            "repeats_raw_corr": round(float(np.corrcoef(x, y)[0, 1]), 3),
            "residual_sd_pct": round(float(rx.std()) * 100, 2),
            "repeats_residual_corr": round(float(np.corrcoef(rx, ry)[0, 1]), 3),
            # a per-rank effect (rank 0 slower, say) would show as the same rank means in both runs
            "rank_residual_pct": [round(float(m) * 100, 2) for m, _ in by_rank],
            "rank_residual_pct_against": [round(float(m) * 100, 2) for _, m in by_rank],
            "rank_residual_corr": round(float(np.corrcoef(*zip(*by_rank, strict=True))[0, 1]), 3)}


def measured_comm_ms(device: DeviceCost) -> float:
    """A device's own median all-to-all ms (fwd + bwd), before any pricing."""
    return sum(device.own_comm_fwd_bwd_ms)


def priced_by_width(costs: Sequence[MeasuredPlanCost]) -> list[float]:
    """Each plan's slowest device (kernels + all-to-all), every device's all-to-all priced as measurement prices it
    by default (`price_comm`, "width") from each device's own medians, over every device of `costs` (plans measured
    together)."""
    widths = [[d.width for d in c.devices] for c in costs]
    raw = [[d.own_comm_fwd_bwd_ms for d in c.devices] for c in costs]
    priced = price_comm(widths, raw, "width")
    return [max(d.compute_ms + fwd + bwd for d, (fwd, bwd) in zip(c.devices, p, strict=True))
            for c, p in zip(costs, priced, strict=True)]


def verdicts(run: Path, task_set: str) -> dict[str, str]:
    """Refined against the greedy, task by task (bench_plan_quality.py's verdict), each device's all-to-all priced
    three ways: as measured, its layout's mean, the line in width over the task's plans in their session."""
    results = [PlanResult.model_validate(p) for p in json.loads((run / "results.json").read_text())["plans"]
               if p["task_set"] == task_set]
    priced: dict[str, list[PlanResult]] = {"as measured": [], "layout mean": [], "line in width": []}
    for index in sorted({r.task_index for r in results}):
        task_dir = run / task_set / f"task{index:02d}"
        mine = [r for r in results if r.task_index == index]
        costs = [MeasuredPlanCost.model_validate_json((task_dir / f"{r.method}.measured.json").read_text())
                 for r in mine]
        by_mean = [max(d.compute_ms for d in c.devices) + statistics.fmean(measured_comm_ms(d) for d in c.devices)
                   for c in costs]
        raw = [c.own_comm_max_cost_ms for c in costs]
        for way, figures in (("as measured", raw), ("layout mean", by_mean),
                             ("line in width", priced_by_width(costs))):
            priced[way] += [r.model_copy(update={"measured_ms": ms}) for r, ms in zip(mine, figures, strict=True)]
    return {way: at_or_below(plans, REFINED, GREEDY, lambda r: r.measured_ms) for way, plans in priced.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a bench_plan_quality.py --out directory")
    parser.add_argument("--against", required=True, help="another run on the same tasks (another cost model)")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/comm_estimator.json")
    parser.add_argument("--record-name", default="comm_estimator", metavar="NAME",
                        help="record as benchmarks/results/NAME.json instead (another run, say)")
    args = parser.parse_args()
    run, against = Path(args.run), Path(args.against)
    for path in (run, against):
        if not (path / "results.json").is_file():
            parser.error(f"{path} has no results.json (a bench_plan_quality.py --out directory)")
    rows: list[dict[str, Any]] = []
    for task_set in sorted(p.name for p in run.iterdir() if p.is_dir()):
        found = repeatability(run, against, task_set)
        if found is None:
            continue
        print(f"{task_set}: a device's all-to-all strays {found['deviation_sd_pct']:.1f}% (sd) from its layout's mean "
              f"over {found['devices']} devices; correlation with its width {found['corr_with_width']:.2f}; repeats "
              f"in the other run with correlation {found['repeats_raw_corr']:.2f}; after a line in width, "
              f"{found['residual_sd_pct']:.1f}% is left, repeating with correlation "
              f"{found['repeats_residual_corr']:.2f}")
        print(f"  left after the line, mean per rank: {found['rank_residual_pct']} % here, "
              f"{found['rank_residual_pct_against']} % in the other run (correlation {found['rank_residual_corr']:.2f})")
        row = dict(found)
        for way, verdict in verdicts(run, task_set).items():
            row[f"all_to_all_{way.replace(' ', '_')}"] = verdict
            print(f"  all-to-all {way}: {verdict}")
        rows.append(row)
    if args.record:
        record(args.record_name, "A device's all-to-all: what repeats between sessions, and pricing it without the rest",
               rows, notes=f"plans of {run}, repeatability against {against} on the plans identical in both "
                           f"({', '.join(MODEL_FREE)}); deviations relative to each layout's mean; the line in width "
                           "fitted per run (repeatability) or per task over every plan measured in its session "
                           "(verdicts); nothing measured by this script")


if __name__ == "__main__":
    main()
