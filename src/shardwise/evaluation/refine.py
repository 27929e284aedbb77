"""Refinement on hardware: a searched plan made better by measuring it.

Search balances the cost model's predictions almost exactly, so the slowest device on hardware is the one whose
prediction was furthest off. Refinement measures every device's shard and all-to-all (the model's least accurate
part), scales the model's predictions by the measured residuals, and moves or swaps one shard off the slowest
device a round, leaving data-parallel and row-wise tables as the plan has them; a change is kept only when a paired
session of before and after measures the slowest device faster. Other plans of the task (`starts`) are measured
beside it, and the plan returned is never measured slower than the searched one or any start. Each round is
recorded in the plan's `extra["refinement"]`.

With a time budget, the clock is read between every two shard timings, not only between rounds: a round starts only
where it and the final check fit in what is left, a round the budget cuts short anyway is dropped (its change not
measured to the end, nor kept), a session of layouts side by side (the starts', the final check's) keeps the timings
done by then, at least one of every device shard, and the plan measured fastest so far is returned.

The refiner's measuring of a layout lives in `refine_measure`, the moves, swaps and splits a round can make in
`refine_moves`; the rounds, from the starts to the plan returned, here; their record (`Refinement`) in
`refine_record`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from shardwise.costmodel.types import CostModel
from shardwise.profiling import AllToAllSession, MeasurementSettings
from shardwise.profiling.comm import default_backend
from shardwise.profiling.dataset import prepare_dataset
from shardwise.profiling.kernel import resolve_timing
from shardwise.search import Searcher
from shardwise.search.baselines import MEASURED_KEY, GreedySearch
from shardwise.search.neuroshard import NeuroShardSearch
from shardwise.search.plan import Plan, PlanError, validate_plan
from shardwise.search.report import finish_plan
from shardwise.search.simulator import simulate
from shardwise.workload import ShardingTask

from .refine_measure import Clock, Layout, OutOfTime, Refiner, distinct_layouts, layout_key, side_by_side
from .refine_moves import Change as Change  # re-exported: a round's change, as callers build one
from .refine_moves import holding_up, plan_round, split_change
from .refine_record import Refinement, RefinementRound

#: a plan of the task with the named table split into this many column slices and the other tables placed around
#: them (None: none fits); refinement asks for one where a shard holds the measured slowest device up
Resplit = Callable[[str, int], "Plan | None"]
#: the most of refinement's budget the measured-cost greedy start may take (its tables timed one by one): the rest
#: is for measuring the starts side by side, the rounds and the final check
GREEDY_START_SHARE = 0.25


def search_resplit(searcher: Searcher, task: ShardingTask, cost_model: CostModel, seed: int = 0) -> Resplit | None:
    """The searcher's plans with a table split, for `refine_plan(resplit=...)`: NeuroShard's beam and greedy grid
    from a root with the table in that many slices (None: the searcher cannot be asked for one)."""
    if not isinstance(searcher, NeuroShardSearch):
        return None
    config = searcher.config

    def resplit(table: str, pieces: int) -> Plan | None:
        split = tuple((name, p) for name, p in config.split if name != table) + ((table, pieces),)
        try:
            return NeuroShardSearch(dataclasses.replace(config, split=split)).search(task, cost_model, seed)
        except PlanError:
            return None

    return resplit


def measured_greedy_start(task: ShardingTask, measurement: MeasurementSettings, *,
                          time_budget_s: float | None = None) -> list[Plan]:
    """The greedy on each table's measured single-table cost, as a start for refinement ([] when it finds no
    plan within memory, or, with `time_budget_s`, when timing its tables one by one would take longer: the searched
    plan is then the only start)."""
    return _greedy_start(task, measurement, Clock(time_budget_s))[0]


def _greedy_start(task: ShardingTask, measurement: MeasurementSettings, clock: Clock) -> tuple[list[Plan], str]:
    """The measured-cost greedy's plan within what is left on `clock`, and why there is none ("" where it found one
    and where no plan fits in memory, as without a budget)."""
    greedy = GreedySearch(MEASURED_KEY, measurement=measurement)
    assert greedy.timings is not None  # the measured key times its tables
    tables = len(task.tables)
    first_s = 0.0  # the first table's seconds: it also loads the kernels, so the estimate starts after it
    for i, table in enumerate(task.tables):
        # the tables are timed one by one (each cached for the search below), so a start that would not fit is
        # given up after its first tables instead of after all of them
        spent_s = clock.elapsed_s()
        if i >= 2 and (spent_s - first_s) / (i - 1) * (tables - i) > clock.left_s():
            need_s = first_s + (spent_s - first_s) / (i - 1) * (tables - 1)
            return [], (f"timing its {tables} tables alone would take about {need_s:.0f} s, more than the "
                        f"{clock.budget_s:g} s allowed it")
        greedy.timings.table_ms(task.model_copy(update={"tables": (table,)}))
        if i == 0:
            first_s = clock.elapsed_s()
    try:
        return [greedy.search(task, None, 0)], ""
    except PlanError:
        return [], ""


def refine_plan(task: ShardingTask, plan: Plan, cost_model: CostModel, measurement: MeasurementSettings | None = None,
                *, rounds: int = 3, time_budget_s: float | None = None, dataset: str | Path | None = None,
                starts: Sequence[Plan] = (), measured_greedy: bool = False, progress: bool = True,
                resplit: Resplit | None = None, exchange: bool = True) -> tuple[Plan, Refinement]:
    """`plan` refined on this machine's kernels (see the module docstring); the refinement record. With
    `time_budget_s`, it returns within about that many seconds (the module docstring says how). With
    `starts`, other plans of the task are measured too and refinement goes on from the fastest; `measured_greedy`
    adds the greedy on measured single-table costs, its tables timed within `GREEDY_START_SHARE` of the budget. With
    `resplit`
    (`search_resplit`), a table whose shard alone keeps the slowest device above the mean (predicted or measured)
    is tried split in a re-searched plan first. With `dataset`
    (a cost dataset directory or s3:// prefix), every device shard it times is appended there (`provenance`
    "refine"), so the next pre-training learns from the shards plans actually produce. `exchange=False` refines on
    the kernels alone, no all-to-all measured: where this machine cannot host the task's ranks (one GPU for a
    task of several devices: the gpu_method benchmark)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    for candidate in (plan, *starts):
        validate_plan(candidate, task)
        if candidate.kernels:
            # its moves and measurements are of tables in HBM: they would move a cache's table as the whole table
            raise PlanError(f"refinement keeps tables in HBM, and {candidate.method}'s plan puts "
                            f"{len(candidate.kernels)} in host memory ({', '.join(sorted(candidate.kernels)[:3])}"
                            f"{', ...' if len(candidate.kernels) > 3 else ''}): plan without --refine")
        if candidate.row_wise or candidate.data_parallel:
            simulate(candidate, task, cost_model)  # the refined plan is priced so: a model that cannot fails first
    clock = Clock(time_budget_s)
    if dataset is not None:
        prepare_dataset(dataset)  # a path that cannot hold the dataset fails before anything is measured
    left_out: dict[str, str] = {}
    if measured_greedy:
        share = Clock(None if time_budget_s is None else clock.left_s() * GREEDY_START_SHARE)
        greedy, why = _greedy_start(task, measurement or MeasurementSettings(), share)
        starts = [*starts, *greedy]
        if why:
            left_out[f"{MEASURED_KEY}_greedy"] = why
    with _open_refiner(task, cost_model, measurement, progress, dataset, exchange, clock) as refiner:
        return _refine(refiner, plan, starts, rounds, resplit, left_out)


def measure_side_by_side(task: ShardingTask, plans: Sequence[Plan], cost_model: CostModel,
                         measurement: MeasurementSettings | None = None, *,
                         progress: bool = False) -> list[tuple[float, float]]:
    """Each plan's measured slowest device, kernels + all-to-all and kernels alone (ms), measured as refinement
    measures the plans it can start from: one session, its all-to-all process group open while the kernels are
    timed, fwd + bwd per timing. For comparing refinement's measurements with `measure_plans`'
    (record measurement_noise)."""
    for plan in plans:
        validate_plan(plan, task)
    with _open_refiner(task, cost_model, measurement, progress, None) as refiner:
        kernels, _, totals = side_by_side(refiner, [Layout.of(plan) for plan in plans])
    return [(total, max(k)) for total, k in zip(totals, kernels, strict=True)]


@contextlib.contextmanager
def _open_refiner(task: ShardingTask, cost_model: CostModel, measurement: MeasurementSettings | None,
                  progress: bool, dataset: str | Path | None, exchange: bool = True,
                  clock: Clock | None = None) -> Iterator[Refiner]:
    """A refiner with its all-to-all process group open (none on one device, or without `exchange`), closed on
    the way out."""
    measurement = measurement or MeasurementSettings()
    clock = clock or Clock(None)
    with contextlib.ExitStack() as stack:
        session = None
        if task.num_devices > 1 and exchange:
            backend = default_backend(resolve_timing(measurement)[0].type)
            opening = time.perf_counter()
            session = stack.enter_context(AllToAllSession(task.num_devices, backend=backend))
            # its ranks leave the group in about half the time they took to join it (4 gloo ranks on 2 busy cores:
            # 12.8 s to join, 5.7 s to leave): the budget keeps that back, so refinement returns within it
            clock.closing_s = (time.perf_counter() - opening) / 2
        yield Refiner(task, cost_model, measurement, progress, dataset, session, clock)



def _start_candidates(refiner: Refiner, plan: Plan, starts: Sequence[Plan],
                      resplit: Resplit | None) -> tuple[list[tuple[str, Layout]], set[tuple[str, int]]]:
    """The plans refinement can start from, by method: the searched plan, the starts given and, with `resplit`,
    the searched plan with the table the model says holds its slowest device up split; the splits asked."""
    task = refiner.task
    candidates = [(c.method, Layout.of(c)) for c in (plan, *starts)]
    tried: set[tuple[str, int]] = set()  # the splits asked of `resplit`
    if resplit is not None:
        # a shard no move can balance, by the model: the search's plan with its table split is one more start
        searched = candidates[0][1]
        predicted = [float(ms) for ms in refiner.predicted([searched.on(d) for d in range(task.num_devices)])]
        split = holding_up(refiner, searched, predicted, int(np.argmax(predicted)))
        other = resplit(*split) if split is not None else None
        if split is not None:
            tried.add(split)
        if other is not None and split is not None:
            validate_plan(other, task)
            candidates.append((f"{plan.method} with {split[0]} in {split[1]}",
                               Layout.of(other)))
    return candidates, tried


def _try_split(refiner: Refiner, layout: Layout, measured: list[float], comm: np.ndarray, resplit: Resplit,
               tried: set[tuple[str, int]],
               history: list[RefinementRound]) -> tuple[Layout, list[float], np.ndarray]:
    """The first round where a table's shard holds the measured slowest device up: the search's plan with that
    table split, kept where measured faster beside the layout; the layout, its kernel ms and ms beside them after."""
    task = refiner.task
    slowest = int((np.array(measured) + comm).argmax())
    split = holding_up(refiner, layout, measured, slowest)
    if split is not None and split not in tried:
        # a shard no move can balance, measured (the model under-predicted it): the search's plan with its table
        # split, measured beside the layout in one session (paired)
        round_started = time.perf_counter()
        other = resplit(*split)
        if other is None:
            history.append(RefinementRound(round=1, measured_max_ms=float(max(np.array(measured) + comm)),
                                           slowest_device=slowest, change=f"{split_change(split)}: none fits",
                                           seconds=time.perf_counter() - round_started))
        else:
            validate_plan(other, task)
            trial = Layout.of(other)
            try:
                kernels, comms, paired = side_by_side(refiner, [layout, trial])
            except OutOfTime:  # the split is left unmeasured; the rounds see the clock spent and stop
                history.append(RefinementRound(round=1, measured_max_ms=float(max(np.array(measured) + comm)),
                                               slowest_device=slowest, change=f"{split_change(split)}: not measured",
                                               seconds=time.perf_counter() - round_started))
                return layout, measured, comm
            kept = paired[1] < paired[0]
            history.append(RefinementRound(round=1, measured_max_ms=paired[0], slowest_device=slowest,
                                           change=split_change(split),
                                           predicted_max_ms=other.extra.get("predicted", {}).get("max_cost_ms"),
                                           after_ms=paired[1], kept=kept, seconds=time.perf_counter() - round_started))
            if kept:
                layout, measured, comm = trial, kernels[1], comms[1]
                refiner.hold(layout)
    return layout, measured, comm


def _measure_change(refiner: Refiner, layout: Layout, trial: Layout, touched: Sequence[int],
                    measured: list[float], comm: np.ndarray) -> tuple[list[float], np.ndarray, float, float]:
    """A round's changed layout measured paired with the layout as it is: the changed layout's kernel ms and ms
    beside them, the slowest device now and after the change."""
    # the changed devices timed together with the same devices as they are now: a paired comparison. The
    # slowest device's earlier figure is the largest of several noisy ones, biased high: against it, a
    # change would look like a gain more often than it is one
    timed = refiner.measure([trial.on(d) for d in touched] + [layout.on(d) for d in touched])
    trial_measured, current = list(measured), list(measured)
    for d, new, old in zip(touched, timed[:len(touched)], timed[len(touched):], strict=True):
        trial_measured[d], current[d] = new, old
    trial_comm = comm
    now = float(max(np.array(current) + comm))
    after = float(max(np.array(trial_measured) + comm))
    if after < now:
        # the kernels gained: the exchanges decide, the changed layout's timed paired with the current one's
        # (a change the kernels refuse is refused without them: moving a shard keeps the total width, and
        # the exchange's change is small next to a kernel's)
        if refiner.clock.spent():
            raise OutOfTime
        trial_comm, current_comm = refiner.measure_comm([trial, layout])
        now = float(max(np.array(current) + current_comm))
        after = float(max(np.array(trial_measured) + trial_comm))
    return trial_measured, trial_comm, now, after


def _rounds(refiner: Refiner, layout: Layout, measured: list[float], comm: np.ndarray, rounds: int,
            reserve_s: float, history: list[RefinementRound]) -> tuple[Layout, list[float], np.ndarray, str]:
    """Up to `rounds` rounds of changes off the slowest devices, each kept where measured faster, none started where
    it and `reserve_s` (the final check's) would not fit in the budget; the layout, its kernel ms and ms beside them
    after, and why the rounds stopped."""
    clock = refiner.clock
    refused: set[str] = set()
    stopped = f"{rounds} round{'s' if rounds > 1 else ''} done"
    for _ in range(rounds):
        if clock.left_s() <= reserve_s:
            stopped = clock.why() if clock.spent() else f"the {clock.budget_s:g} s budget left no time for a round"
            break
        round_started = time.perf_counter()
        costs = np.array(measured) + comm
        slowest = int(costs.argmax())
        trial, changes, predicted_max = plan_round(refiner, layout, measured, comm, refused)
        if not changes or predicted_max >= costs.max():
            history.append(RefinementRound(round=len(history) + 1, measured_max_ms=float(costs.max()),
                                           slowest_device=slowest, change="",
                                           seconds=time.perf_counter() - round_started))
            stopped = "no change promised a gain"
            break
        change = "; ".join(c.description for c in changes)
        touched = sorted({d for c in changes for d in c.devices})
        if clock.budget_s is not None:
            # a round is started only where its measurement fits in what is left, at the seconds a device shard
            # has taken so far (sessions, exchanges and all): one run past the budget cost the drop-in 30 s
            need = (time.perf_counter() - refiner.opened) / max(refiner.devices_measured, 1) * 2 * len(touched)
            if need + reserve_s > clock.left_s():
                stopped = (f"the {clock.budget_s:g} s budget left no time for the next round: its "
                           f"{2 * len(touched)} device shards would take about {need:.0f} s")
                break
        try:
            trial_measured, trial_comm, now, after = _measure_change(refiner, layout, trial, touched, measured, comm)
        except OutOfTime:  # the round took longer than the rounds before: its change is dropped unmeasured
            history.append(RefinementRound(round=len(history) + 1, measured_max_ms=float(costs.max()),
                                           slowest_device=slowest, change=change, predicted_max_ms=predicted_max,
                                           seconds=time.perf_counter() - round_started))
            stopped = f"{clock.why()} in round {len(history)}: its change was not measured to the end, nor kept"
            break
        kept = after < now
        history.append(RefinementRound(round=len(history) + 1, measured_max_ms=now, slowest_device=slowest,
                                       change=change, predicted_max_ms=predicted_max, after_ms=after, kept=kept,
                                       seconds=time.perf_counter() - round_started))
        if kept:
            layout, measured, comm = trial, trial_measured, trial_comm
        else:
            # the layout keeps its earlier figures, so the next round starts from the same slowest device. Taking the
            # refused round's fresh figures instead (they replace a figure biased high by being the largest) mixes
            # sessions minutes apart on a drifting machine: measured, no gain and two 8-device tasks above the
            # greedy (record plan_quality_fresh_after_refusal against plan_quality_width)
            refused.add(changes[0].move)
    return layout, measured, comm, stopped


def _measured_again(refiner: Refiner, layout: Layout, candidates: Sequence[tuple[str, Layout]],
                    best: int) -> tuple[Layout, float, float, str]:
    """The refined layout measured once more beside every start, in one paired session: the fastest layout, the
    start's and the fastest's slowest device there, and what to add to why refinement stopped."""
    layouts = [layout, *(c for _, c in candidates)]
    final = side_by_side(refiner, layouts, first_round=True)[2]
    after_ms, before = final[0], final[1 + best]
    if (fastest := int(np.argmin(final))) > 0:
        return layouts[fastest], before, final[fastest], (
            f"; measured side by side at the end, {candidates[fastest - 1][0]}'s plan was faster than "
            "the refined one: it is returned")
    return layout, before, after_ms, ""


def _confirmed_beside_starts(refiner: Refiner, plan: Plan, starts: Sequence[Plan],
                             candidates: Sequence[tuple[str, Layout]], same_as: dict[str, str], best: int,
                             layout: Layout, before: float,
                             after_ms: float) -> tuple[Layout, float, float, str]:
    """Where the plan departs from the starts given, it measured again beside them (and the start `before` is of):
    the fastest layout there, the start's and the fastest's slowest device, and what to add to why refinement
    stopped; the layout and figures as they are otherwise."""
    task = refiner.task
    names = {same_as.get(s.method, s.method) for s in starts}  # a start given, or the candidate measured for it
    given = [(m, c) for m, c in candidates if m in names]
    session = [(f"{plan.method}+refine", layout), *given]
    keys = [layout_key(c, task.num_devices) for _, c in session]
    if not given or keys[0] in keys[1:]:
        return layout, before, after_ms, ""
    # the plan departs from the starts given (the measured greedy's, say) only where a second paired session
    # agrees that it is faster: one session's win within noise can measure slower in the next (record
    # `plan_quality_types`). The session has the start before_ms is of too, where it is neither; the fastest
    # there is returned, before_ms and after_ms both from it (so after <= before)
    start_key = layout_key(candidates[best][1], task.num_devices)
    if start_key not in keys:
        session.append(candidates[best])
        keys.append(start_key)
    if refiner.clock.spent():
        return layout, before, after_ms, "; no time was left for a second session to confirm it faster than the starts"
    confirm = side_by_side(refiner, [c for _, c in session], first_round=True)[2]
    before = confirm[keys.index(start_key)]
    fastest = int(np.argmin(confirm))
    (name, layout), after_ms = session[fastest], confirm[fastest]
    if fastest > 0:
        return layout, before, after_ms, (
            f"; measured again beside the starts, {name}'s plan was faster ({confirm[fastest]:.3f} ms "
            f"against {confirm[0]:.3f}): it is returned")
    return layout, before, after_ms, (
        f"; a second paired session confirmed it faster than {', '.join(m for m, _ in given)}'s "
        f"({confirm[0]:.3f} ms against {min(confirm[1:len(given) + 1]):.3f})")


def _refined_plan(refiner: Refiner, plan: Plan, layout: Layout, record: Refinement, rounds: int,
                  time_budget_s: float | None) -> tuple[Plan, Refinement]:
    """The returned layout as a plan, its refinement record in `extra["refinement"]`."""
    shards = tuple(sorted(layout.shards, key=lambda s: (s.table, s.col_offset)))
    refined = Plan(num_devices=plan.num_devices, shards=shards, data_parallel=layout.data_parallel,
                   row_wise=layout.row_wise,
                   method=f"{plan.method}+refine")
    # predicted costs, memory and provenance of the refined layout (validated: never over memory)
    refined = finish_plan(refined, refiner.task, refiner.model, planning_time_s=record.seconds, seed=0,
                          options={"rounds": rounds, "time_budget_s": time_budget_s}, cache=refiner.cache)
    return refined.model_copy(update={"extra": {**refined.extra, "refinement": record.model_dump()}}), record


def _refine(refiner: Refiner, plan: Plan, starts: Sequence[Plan], rounds: int, resplit: Resplit | None,
            left_out: dict[str, str]) -> tuple[Plan, Refinement]:
    """The phases of refinement: the starts measured side by side, a table split, the rounds, the refined layout
    measured again beside the starts, the plan returned and its record."""
    clock = refiner.clock
    candidates, tried = _start_candidates(refiner, plan, starts, resplit)
    # a start with another's layout (the measured greedy and TorchRec's planner often agree) is measured once
    candidates, same_as = distinct_layouts(candidates, refiner.task.num_devices)
    # the start and the slowest device are chosen on measured kernels and exchanges, every start's side by side
    measured_of, comm_of, totals = side_by_side(refiner, [layout for _, layout in candidates], first_round=True)
    # the final check measures the refined layout beside every start: the rounds leave it at least its first timing
    reserve_s = refiner.first_round_s(len(candidates) + 1)
    best = int(np.argmin(totals))
    start, layout = candidates[best]
    measured, comm, before = measured_of[best], comm_of[best], totals[best]
    refiner.hold(layout)
    history: list[RefinementRound] = []
    if resplit is not None and not clock.spent():
        layout, measured, comm = _try_split(refiner, layout, measured, comm, resplit, tried, history)
    layout, measured, comm, stopped = _rounds(refiner, layout, measured, comm, rounds, reserve_s, history)
    after_ms = before  # nothing kept: the start, as first measured (a refused round leaves its figures alone)
    if any(r.kept for r in history):
        # the rounds' figures come from sessions minutes apart, and a shared machine drifts between them: the
        # refined layout is measured once more beside every start, in one paired session, and the fastest of them
        # is returned (never a plan measured slower than the one searched)
        after_ms = [r.after_ms for r in history if r.kept and r.after_ms is not None][-1]
        if clock.spent():
            stopped += "; no time was left to measure the refined plan again beside the starts"
        else:
            layout, before, after_ms, note = _measured_again(refiner, layout, candidates, best)
            stopped += note
    layout, before, after_ms, note = _confirmed_beside_starts(refiner, plan, starts, candidates, same_as, best,
                                                              layout, before, after_ms)
    stopped += note
    starts_ms = {m: ms for (m, _), ms in zip(candidates, totals, strict=True)}
    record = Refinement(rounds=history, starts=starts_ms | {m: starts_ms[other] for m, other in same_as.items()},
                        start=start, left_out=left_out, before_ms=before, after_ms=after_ms,
                        seconds=clock.elapsed_s(), devices_measured=refiner.devices_measured, stopped=stopped)
    return _refined_plan(refiner, plan, layout, record, rounds, clock.budget_s)
