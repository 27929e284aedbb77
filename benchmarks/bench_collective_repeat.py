"""How far one process group's collectives repeat in another: the floor of any price fitted in the profile's group.

The profiler times each collective (all-reduce, reduce-scatter, all-gather, even all-to-all) at 4 KiB, 16 KiB, ...
16 MiB in one process group per device count and `pretrain` fits a line to those medians; plans are then measured, and
run, in other groups. This benchmark opens --groups fresh groups per device count, times every collective at sizes
from 4 KiB to 16 MiB in steps of 2x (--iters each, sizes taking turns as the profiler's do), and prints per device
count and collective:

- for several statistics of a size's samples (median, the profiler's; mean; min; 10th and 25th percentile; the mean
  without the top and bottom tenth), the MAPE of one group's statistic against another's, over every ordered pair
  of groups and every size: how well that statistic repeats between groups;
- the line the cost model stores (`fit_all_reduce`, this count's own latency + bandwidth line) fitted to the first
  group's medians at the profiled sizes (4x steps), and a log-log interpolation through the same points, each priced
  against the other groups' medians at every size: whether a different form would price the next group better.

    python benchmarks/bench_collective_repeat.py [--devices 2 4] [--groups 4] [--iters 40] [--record]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import numpy as np
from record import record

from shardwise.costmodel.data_parallel import fit_all_reduce
from shardwise.costmodel.evaluate import regression_metrics
from shardwise.profiling import AllToAllSession
from shardwise.profiling.comm import COLLECTIVES
from shardwise.profiling.sampling import all_reduce_sizes

#: the profiler's sizes (4 KiB .. 16 MiB, x4) and the ones between them
PROFILED = all_reduce_sizes(16 * 2**20)
SIZES = sorted({s for p in PROFILED for s in (p, 2 * p)} - {2 * PROFILED[-1]})

STATISTICS: dict[str, Callable[[np.ndarray], float]] = {
    "median": lambda x: float(np.median(x)),
    "mean": lambda x: float(np.mean(x)),
    "min": lambda x: float(np.min(x)),
    "q10": lambda x: float(np.quantile(x, 0.10)),
    "q25": lambda x: float(np.quantile(x, 0.25)),
    "trimmed_mean": lambda x: float(np.mean(np.sort(x)[len(x) // 10: len(x) - len(x) // 10])),
}


def _mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return regression_metrics(predicted, measured)["mape_pct"]


def groups_samples(count: int, groups: int, iters: int) -> list[dict[str, list[np.ndarray]]]:
    """Per fresh process group of `count` ranks: per collective, each size's timed samples (ms)."""
    out = []
    for _ in range(groups):
        with AllToAllSession(count) as session:
            out.append({op: [np.asarray(ms) for ms in session.measure_collective(op, SIZES, iters=iters)]
                        for op in COLLECTIVES})
    return out


def rows_for(count: int, samples: list[dict[str, list[np.ndarray]]]) -> list[dict[str, object]]:
    """One row per collective: each statistic's MAPE between groups; the line's and the interpolation's on the
    other groups, both fitted to the first group's medians at the profiled sizes."""
    rows = []
    profiled = [SIZES.index(s) for s in PROFILED]
    for op in COLLECTIVES:
        row: dict[str, object] = {"devices": count, "collective": op, "groups": len(samples)}
        for name, statistic in STATISTICS.items():
            values = np.array([[statistic(x) for x in group[op]] for group in samples])  # [groups, sizes]
            row[f"{name}_between_groups_pct"] = round(float(np.mean(
                [_mape(values[a], values[b]) for a, b in itertools.permutations(range(len(samples)), 2)])), 1)
        medians = np.array([[float(np.median(x)) for x in group[op]] for group in samples])
        sizes = np.asarray(SIZES, dtype=np.float64)
        line = fit_all_reduce([(count, SIZES[k], medians[0, k]) for k in profiled], collective=op)
        by_line = np.asarray(line.predict_ms(sizes, count))
        by_interpolation = np.exp(np.interp(np.log(sizes), np.log(sizes[profiled]), np.log(medians[0, profiled])))
        row["line_on_other_groups_pct"] = round(float(np.mean([_mape(by_line, m) for m in medians[1:]])), 1)
        row["interpolation_on_other_groups_pct"] = round(
            float(np.mean([_mape(by_interpolation, m) for m in medians[1:]])), 1)
        rows.append(row)
        print(", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--groups", type=int, default=4, help="fresh process groups per device count (2 or more)")
    parser.add_argument("--iters", type=int, default=40, help="timed collectives per size and group")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/collective_repeat.json")
    args = parser.parse_args()
    if args.groups < 2:
        parser.error("--groups must be 2 or more: repeating is between groups")
    rows = [row for count in args.devices for row in rows_for(count, groups_samples(count, args.groups, args.iters))]
    if args.record:
        record("collective_repeat", f"Collectives in {args.groups} fresh process groups per device count "
               f"({args.iters} timed each size): how far one group's repeat in another", rows)


if __name__ == "__main__":
    main()
