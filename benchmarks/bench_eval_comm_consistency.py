"""How reproducible is the evaluator's all-to-all time within one session? Exchange by exchange against blocks.

The layouts here are one plan's per-device widths and its rotations (the same exchange with the devices renamed),
so every difference between their figures is measurement noise. They are timed in one process group, the two
schedules alternating rep by rep, so machine drift hits both alike:
  - blocks: each layout's exchanges one after another (the order until 2026-11-26, when `measure_comm` timed
    every layout for its own stretch of `comm_iters` exchanges per round);
  - exchange by exchange: the layouts take turns exchange by exchange (`AllToAllSession.measure` since).
Per schedule it prints the spread between the layouts (max/min of each layout's mean and slowest device's
all-to-all ms; 1.000 is perfect), the median and the largest over the reps. On 8 devices the all-to-all is over
40% of a paper task's plan cost on a 2-core CPU (bench_plan_quality.py), so its spread moves plan comparisons.

What is left of the spread, exchange by exchange? Two more rows split each layout's exchanges into the even and
the odd ones (half the exchanges each, alternating, so drift hits both alike) and compare, pair by pair:
  - one layout's even exchanges with its own odd ones: the spread that sampling single exchanges alone gives;
  - one layout's even exchanges with the next layout's odd ones: the same, plus whatever differs between layouts.
About equal: the rest is the spread of single exchanges, which more exchanges or another estimator can lower. The
second well above the first: the rotations themselves time apart (which rank runs where), and they cannot.
A last row tries a paired estimator on the same exchanges: each layout's figure relative to the first layout's,
as the median over turns of the ratio of their exchanges in that turn (each layout's mean and slowest device).

    .venv/bin/python benchmarks/bench_eval_comm_consistency.py [--devices 8] [--batch-size 2048] [--reps 4] [--record]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from record import record

from shardwise.evaluation.measured import measure_comm
from shardwise.profiling import AllToAllSession, CommTiming, MeasurementSettings

SAME = "even vs odd, one layout"
NEXT = "even vs odd, next layout"
PAIRED = "paired with the first"

#: per-device widths of the measured greedy's plan of the 8-device paper set's third task (batch 2048)
WIDTHS = (384, 532, 544, 424, 820, 552, 452, 564)


def _spread(values: list[float]) -> float:
    return max(values) / min(values) if min(values) > 0 else float("inf")


def _figures(timed: list[list[tuple[float, float]]]) -> tuple[float, float]:
    """Spread between the layouts of their mean device's and slowest device's fwd + bwd all-to-all ms."""
    totals = [[fwd + bwd for fwd, bwd in devices] for devices in timed]
    return _spread([statistics.mean(t) for t in totals]), _spread([max(t) for t in totals])


def _medians(timings: list[CommTiming], parity: int) -> list[tuple[float, float]]:
    """Each device's median fwd and bwd ms over its even (parity 0) or odd (1) exchanges."""
    return [(statistics.median(t.fwd_samples_ms[parity::2]), statistics.median(t.bwd_samples_ms[parity::2]))
            for t in timings]


def _halves(timed: list[list[CommTiming]]) -> dict[str, list[tuple[float, float]]]:
    """Per layout k, the spread between its even exchanges and the odd ones of layout k (itself) and k + 1."""
    pairs: dict[str, list[tuple[float, float]]] = {SAME: [], NEXT: []}
    for k, timings in enumerate(timed):
        even = _medians(timings, 0)
        pairs[SAME].append(_figures([even, _medians(timings, 1)]))
        pairs[NEXT].append(_figures([even, _medians(timed[(k + 1) % len(timed)], 1)]))
    return pairs


def _paired(timed: list[list[CommTiming]]) -> tuple[float, float]:
    """Spread between the layouts of each one's median, over turns, of its mean (and slowest) device's fwd + bwd
    ms over the first layout's in the same turn."""
    totals = [np.array([np.add(t.fwd_samples_ms, t.bwd_samples_ms) for t in timings]) for timings in timed]
    mean, slowest = ([float(np.median(reduce(x, axis=0) / reduce(totals[0], axis=0))) for x in totals]
                     for reduce in (np.mean, np.max))
    return _spread(mean), _spread(slowest)


class _Recorder:
    """The session, keeping the samples of the exchanges `measure_comm` times (the even/odd and paired rows)."""

    def __init__(self, session: AllToAllSession) -> None:
        self.session, self.timed = session, []

    def measure(self, layouts: list[list[int]], batch_size: int, **kwargs: int) -> list[list[CommTiming]]:
        self.timed = self.session.measure(layouts, batch_size, **kwargs)
        return self.timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--layouts", type=int, default=4, help="rotations of the plan's widths timed side by side")
    parser.add_argument("--reps", type=int, default=4, help="measurements per schedule, alternating")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/eval_comm_consistency.json")
    args = parser.parse_args()
    if args.reps < 1 or not 2 <= args.layouts <= args.devices:
        parser.error("--reps must be >= 1 and --layouts between 2 and --devices")
    torch.set_num_threads(1)
    widths = [WIDTHS[d % len(WIDTHS)] for d in range(args.devices)]
    layouts = [widths[r:] + widths[:r] for r in range(args.layouts)]
    settings = MeasurementSettings(device="cpu")
    rounds, iters = settings.comm_rounds, settings.comm_iters
    print(f"{args.devices} devices, batch {args.batch_size}, widths {widths} and {args.layouts - 1} rotations; "
          f"{rounds} rounds x {iters} exchanges per layout, median per device")

    def blocks(session: AllToAllSession) -> list[list[tuple[float, float]]]:
        per_call = [session.measure([layout], args.batch_size, iters=iters)[0]
                    for _ in range(rounds) for layout in layouts]
        return [[(statistics.median(ms for c in per_call[k::len(layouts)] for ms in c[d].fwd_samples_ms),
                  statistics.median(ms for c in per_call[k::len(layouts)] for ms in c[d].bwd_samples_ms))
                 for d in range(args.devices)] for k in range(len(layouts))]

    from_samples: dict[str, list[tuple[float, float]]] = {SAME: [], NEXT: [], PAIRED: []}

    def interleaved(session: AllToAllSession) -> list[list[tuple[float, float]]]:
        recorder = _Recorder(session)
        medians = measure_comm(layouts, args.batch_size, settings, backend="gloo", session=recorder)
        for name, pairs in _halves(recorder.timed).items():
            from_samples[name] += pairs
        from_samples[PAIRED].append(_paired(recorder.timed))
        return medians

    schedules = {"blocks": blocks, "exchange by exchange": interleaved}
    spreads: dict[str, list[tuple[float, float]]] = {name: [] for name in schedules}
    seconds: dict[str, float] = dict.fromkeys(schedules, 0.0)
    with AllToAllSession(args.devices, backend="gloo") as session:
        for rep in range(args.reps):
            for name, schedule in schedules.items():
                started = time.perf_counter()
                figures = _figures(schedule(session))
                seconds[name] += time.perf_counter() - started
                spreads[name].append(figures)
                print(f"  rep {rep + 1} {name:<21} spread of mean {figures[0]:.3f}, of slowest {figures[1]:.3f}",
                      flush=True)
    print(f"{'schedule':<24} {'mean: median':>12} {'max':>6} {'slowest: median':>15} {'max':>6} {'s/rep':>6}")
    rows = []
    for name, values in [*spreads.items(), *from_samples.items()]:
        mean_spread, slow_spread = [v[0] for v in values], [v[1] for v in values]
        row: dict[str, str | float] = {
            "schedule": name, "spread_mean_median": round(statistics.median(mean_spread), 3),
            "spread_mean_max": round(max(mean_spread), 3),
            "spread_slowest_median": round(statistics.median(slow_spread), 3),
            "spread_slowest_max": round(max(slow_spread), 3)}
        if name in seconds:
            row["seconds_per_rep"] = round(seconds[name] / args.reps, 1)
        rows.append(row)
        print(f"{name:<24} {row['spread_mean_median']:>12.3f} {row['spread_mean_max']:>6.3f} "
              f"{row['spread_slowest_median']:>15.3f} {row['spread_slowest_max']:>6.3f} "
              f"{row.get('seconds_per_rep', '-'):>6}")
    if args.record:
        record("eval_comm_consistency", "All-to-all timing within one session: exchange by exchange against blocks",
               rows, notes=f"{args.devices} devices, batch {args.batch_size}, {args.layouts} layouts (a plan's widths "
                           f"and rotations: the same exchange), {args.reps} reps per schedule in one gloo process "
                           "group; spread: max/min between the layouts of the mean device's and the slowest "
                           "device's fwd + bwd all-to-all ms (1.000 is perfect); the even/odd rows: "
                           "exchanges taking turns, per layout and rep, its even exchanges against the odd ones of "
                           "the same layout or the next (half the exchanges each); paired: each layout's median over "
                           "turns of its exchange's ms over the first layout's in the same turn")


if __name__ == "__main__":
    main()
