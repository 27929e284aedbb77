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
  - for the plans of --run, refinement's plan against the measured greedy's, task by task, under three ways to
    price a device's all-to-all: as measured (today's), its layout's mean, and the line in width fitted over every
    plan of the task in that session.

    python benchmarks/bench_comm_estimator.py --run runs/bench_pq_large4 --against runs/bench_pq_inter [--record]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from record import record

from shardwise.evaluation import MeasuredPlanCost

REFINED, GREEDY = "neuroshard+refine", "measured_greedy"
#: plans of a task that do not depend on the cost model, so two runs on the same tasks hold the same ones
MODEL_FREE = ("torchrec", "torchrec_cw", "size_lookup_greedy", GREEDY)


def _measured(task_dir: Path, method: str) -> MeasuredPlanCost | None:
    path = task_dir / f"{method}.measured.json"
    return MeasuredPlanCost.model_validate_json(path.read_text()) if path.is_file() else None


def _shards(task_dir: Path, method: str) -> Any:
    path = task_dir / f"{method}.plan.json"
    return json.loads(path.read_text())["shards"] if path.is_file() else None


def _residual(deviation: np.ndarray, width: np.ndarray) -> np.ndarray:
    """What a straight line in width leaves of the deviations."""
    design = np.c_[width, np.ones_like(width)]
    return deviation - design @ np.linalg.lstsq(design, deviation, rcond=None)[0]


def repeatability(run: Path, against: Path, task_set: str) -> dict[str, Any] | None:
    """The per-device all-to-all deviation from its layout's mean, over plans identical in both runs."""
    mine, theirs, widths = [], [], []
    for task_dir in sorted((run / task_set).glob("task*")):
        other = against / task_set / task_dir.name
        if not (other / "task.json").is_file() or (task_dir / "task.json").read_text() != (other / "task.json").read_text():
            continue
        for method in MODEL_FREE:
            a, b = _measured(task_dir, method), _measured(other, method)
            if a is None or b is None or _shards(task_dir, method) != _shards(other, method):
                continue
            for cost, out in ((a, mine), (b, theirs)):
                comm = np.array([d.comm_ms for d in cost.devices])
                out += list(comm / comm.mean() - 1)
            width = np.array([d.width for d in a.devices], dtype=float)
            widths += list(width / width.mean() - 1)
    if len(mine) < 3:
        return None
    x, y, w = np.array(mine), np.array(theirs), np.array(widths)
    rx, ry = _residual(x, w), _residual(y, w)
    return {"task_set": task_set, "devices": len(x), "deviation_sd_pct": round(float(x.std()) * 100, 2),
            "corr_with_width": round(float(np.corrcoef(x, w)[0, 1]), 3),
            "repeats_raw_corr": round(float(np.corrcoef(x, y)[0, 1]), 3),
            "residual_sd_pct": round(float(rx.std()) * 100, 2),
            "repeats_residual_corr": round(float(np.corrcoef(rx, ry)[0, 1]), 3)}


def priced_by_width(costs: Sequence[MeasuredPlanCost]) -> list[float]:
    """Each plan's slowest device (kernels + all-to-all), every device's all-to-all priced by a straight line in its
    pooled width fitted over every device of `costs` (plans measured together); widths all alike: their mean."""
    widths = np.array([d.width for c in costs for d in c.devices], dtype=float)
    comm = np.array([d.comm_ms for c in costs for d in c.devices])
    slope, intercept = np.polyfit(widths, comm, 1) if np.ptp(widths) > 0 else (0.0, float(comm.mean()))
    return [max(d.compute_ms + intercept + slope * d.width for d in c.devices) for c in costs]


def verdicts(run: Path, task_set: str) -> dict[str, list[float]]:
    """Refined over greedy per task, with each device's all-to-all priced three ways."""
    out: dict[str, list[float]] = {"as measured": [], "layout mean": [], "line in width": []}
    for task_dir in sorted((run / task_set).glob("task*")):
        paths = sorted(task_dir.glob("*.measured.json"))
        methods = [p.name.removesuffix(".measured.json") for p in paths]
        if REFINED not in methods or GREEDY not in methods:
            continue
        costs = [MeasuredPlanCost.model_validate_json(p.read_text()) for p in paths]
        refined, greedy = methods.index(REFINED), methods.index(GREEDY)
        by_line = priced_by_width(costs)
        by_mean = [max(d.compute_ms for d in c.devices) + statistics.fmean(d.comm_ms for d in c.devices)
                   for c in costs]
        for way, figures in (("as measured", [c.max_cost_ms for c in costs]), ("layout mean", by_mean),
                             ("line in width", by_line)):
            out[way].append(figures[refined] / figures[greedy])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a bench_plan_quality.py --out directory")
    parser.add_argument("--against", required=True, help="another run on the same tasks (another cost model)")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/comm_estimator.json")
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
        row = dict(found)
        for way, ratios in verdicts(run, task_set).items():
            key = way.replace(" ", "_")
            row[f"{key}_at_or_below"] = f"{sum(r <= 1 for r in ratios)} of {len(ratios)}"
            row[f"{key}_worst"] = round(max(ratios), 4)
            row[f"{key}_mean"] = round(statistics.fmean(ratios), 4)
            print(f"  {REFINED} / {GREEDY}, all-to-all {way}: at or below on {row[f'{key}_at_or_below']} tasks "
                  f"(worst {max(ratios):.3f}, mean {statistics.fmean(ratios):.3f})")
        rows.append(row)
    if args.record:
        record("comm_estimator", "A device's all-to-all: what repeats between sessions, and pricing it without the rest",
               rows, notes=f"plans of {run}, repeatability against {against} on the plans identical in both "
                           f"({', '.join(MODEL_FREE)}); deviations relative to each layout's mean; the line in width "
                           "fitted per run (repeatability) or per task over every plan measured in its session "
                           "(verdicts); nothing measured by this script")


if __name__ == "__main__":
    main()
