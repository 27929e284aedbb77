"""How far a measured comparison of two plans moves between measurement sessions, per measurement protocol.

Refinement, the benchmark and `shardwise evaluate` judge plans by their measured cost ratio. A gain is only
real when it is larger than that ratio's noise. This benchmark takes the first tasks of the paper task sets,
plans them once (NeuroShard, the measured-cost greedy, TorchRec's planner), then measures the same plans again
and again, each time in a fresh session (new reference calibration, new all-to-all process group), under each
protocol in turn. The protocols are interleaved session by session, so machine drift hits them alike. Per
protocol:
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

    python -m benchmarks measurement_noise --model models:/shardwise-cost-cpu-x86_64-2c@champion
    python -m benchmarks measurement_noise --model MODEL --sets 8dev-80to120 --tasks 2 --sessions 5 --record
"""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Any

from pydantic import Field, field_validator

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, register
from benchmarks.plan_runs import moved, paper_tasks, priced_by_width

METHODS = ("neuroshard", "measured_greedy", "torchrec")
PAIRS = (("neuroshard", "measured_greedy"), ("neuroshard", "torchrec"))
#: the default protocol, the plans measured as refinement measures the plans it can start from
#: (`measure_side_by_side`: the all-to-all process group open while kernels are timed, 3 plans where the benchmark
#: measures 6) instead of by `measure_plans`
REFINEMENT_SESSION = "9 timings in refinement's session"
#: each protocol prices each device's all-to-all as measured (its own median); its twin below prices it by a line in
#: width, as measurement does by default (`price_comm` over one task's plans fits the twin's line)
AS_MEASURED = {"comm_pricing": "measured"}
#: the protocols compared: name -> MeasurementSettings fields, kernel timings named in each so that a protocol means
#: the same when the defaults change (the rest are the defaults)
PROTOCOLS: dict[str, dict[str, Any]] = {
    "3 timings comm 5x5": {**AS_MEASURED, "timing_rounds": 3, "comm_iters": 5},
    "3 timings": {**AS_MEASURED, "timing_rounds": 3},
    "3 timings comm 20x20": {**AS_MEASURED, "timing_rounds": 3, "comm_rounds": 20, "comm_iters": 20},
    "9 timings": {**AS_MEASURED, "timing_rounds": 9},
    "9 timings comm 20x20": {**AS_MEASURED, "timing_rounds": 9, "comm_rounds": 20, "comm_iters": 20},
    REFINEMENT_SESSION: {**AS_MEASURED, "timing_rounds": 9},
}
#: suffix of a protocol's twin: the same sessions, each device's all-to-all priced by a line in its pooled width
#: fitted over every device of the task's plans in the session (record comm_estimator: the part that repeats)
BY_WIDTH = ", all-to-all by width line"


class MeasurementNoiseSettings(ExperimentSettings):
    """Which cost model plans, which tasks, how many sessions of which protocols."""

    model: str = Field(description="cost model directory or URI")
    tasks: int = Field(default=2, ge=1, description="tasks per paper task set")
    sets: tuple[str, ...] | None = Field(default=None, description="only these paper task sets (comma separated "
                                         "names)", json_schema_extra={"sep": ","})
    sessions: int = Field(default=4, ge=2, description="measurement sessions per protocol (a ratio moves between "
                          "sessions: at least 2)")
    protocols: tuple[str, ...] = Field(default=tuple(PROTOCOLS), description="comma separated, of: "
                                       + ", ".join(PROTOCOLS), json_schema_extra={"sep": ","})
    seed: int = 0

    @field_validator("protocols")
    @classmethod
    def _known(cls, protocols: tuple[str, ...]) -> tuple[str, ...]:
        if unknown := [p for p in protocols if p not in PROTOCOLS]:
            raise ValueError(f"unknown {unknown}; known: {list(PROTOCOLS)}")
        return protocols


def run(settings: MeasurementNoiseSettings, context: Context) -> Outcome:
    """Plan the tasks once, measure the plans in fresh sessions under each protocol in turn; one row per protocol."""
    from shardwise.evaluation import measure_plans
    from shardwise.evaluation.refine import measure_side_by_side
    from shardwise.profiling import MeasurementSettings
    from shardwise.search import make_searcher

    protocols = list(settings.protocols)
    started = time.perf_counter()
    model = context.cost_model(settings.model, required=True)
    base = MeasurementSettings(device="cpu").for_cost_model(model.reference_ms, model.batch_size)
    tasks = paper_tasks(settings.tasks, settings.seed, model.batch_size)
    if settings.sets:
        tasks = [(name, task) for name, task in tasks if name in settings.sets]
    planned = [(name, task, {m: make_searcher(m, **({"measurement": base} if m == "measured_greedy" else {}))
                             .search(task, model, settings.seed) for m in METHODS}) for name, task in tasks]
    # ratios[protocol][(task, pair, "total"/"compute")] -> one ratio per session
    ratios: dict[str, dict[tuple[int, str, str], list[float]]] = {p: {} for p in protocols}
    seconds: dict[str, list[float]] = {p: [] for p in protocols}
    for protocol in [p for p in protocols if p != REFINEMENT_SESSION]:  # their twins, from the same sessions
        ratios[protocol + BY_WIDTH] = {}
    for session in range(settings.sessions):
        for protocol in protocols:
            measurement = base.model_copy(update=PROTOCOLS[protocol])
            for t, (_, task, plans) in enumerate(planned):
                began = time.perf_counter()
                if protocol == REFINEMENT_SESSION:
                    figures = measure_side_by_side(task, [plans[m] for m in METHODS], model, measurement)
                else:
                    costs = measure_plans([(task, plans[m]) for m in METHODS], measurement, progress=False)
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
        print(f"session {session + 1} of {settings.sessions} done ({time.perf_counter() - started:.0f} s)", flush=True)

    rows: list[dict[str, Any]] = []
    first = protocols[0]
    for protocol in ratios:  # each protocol, then the twins priced by width
        own = protocol.removesuffix(BY_WIDTH)
        total = [m for (_, _, part), r in ratios[protocol].items() if part == "total" for m in moved(r)]
        compute = [m for (_, _, part), r in ratios[protocol].items() if part == "compute" for m in moved(r)]
        against = [abs(r / q - 1) * 100 for key, rs in ratios[protocol].items() if key[2] == "total"
                   for r, q in zip(rs, ratios[first][key], strict=True)]
        rows.append({"protocol": protocol, **PROTOCOLS[own],
                     "ratio_moved_median_pct": round(statistics.median(total), 2),
                     "ratio_moved_max_pct": round(max(total), 2),
                     "compute_moved_median_pct": round(statistics.median(compute), 2),
                     "compute_moved_max_pct": round(max(compute), 2),
                     "against_first_median_pct": round(statistics.median(against), 2),
                     "against_first_max_pct": round(max(against), 2),
                     "seconds_per_session": round(statistics.fmean(seconds[own]), 1)})
    sets = ",".join(settings.sets) if settings.sets else "each paper set"
    return Outcome(rows, notes=[
        f"{len(planned)} task(s) of {sets} (first {settings.tasks}), {settings.sessions} sessions per protocol, plans "
        f"NeuroShard, measured greedy, TorchRec measured together; pairs {', '.join(f'{a}/{b}' for a, b in PAIRS)}, "
        f"CPU; ratio moved = |r_i/r_j - 1| over all pairs of sessions, in %; against first: how far each protocol's "
        f"ratio is from {first}'s of the same session, in % ({time.perf_counter() - started:.0f} s)"])


register(Experiment(
    name="measurement_noise",
    title="How far two plans' measured cost ratio moves between sessions, per protocol",
    settings=MeasurementNoiseSettings,
    run=run,
))
