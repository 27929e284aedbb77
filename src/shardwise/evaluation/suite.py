"""The benchmark the papers report: seeded task sets, every method, plans measured on real hardware."""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from shardwise.costmodel.types import CostModel
from shardwise.profiling import MeasurementSettings, resolve_device
from shardwise.search.plan import Plan, PlanError, save_plan
from shardwise.search.simulator import balance_bound, simulate
from shardwise.search.types import Searcher
from shardwise.workload import ShardingTask, save_task
from shardwise.workload.documents import write_json_document
from shardwise.workload.tableset import TableSet, sample_task

from .dlrm import measure_dlrm_throughputs
from .measured import measure_plans, save_measured
from .measured_records import DLRMThroughput
from .report import write_benchmark_report, write_plan_report


class TaskSetSpec(BaseModel):
    """`num_tasks` tasks of `min_tables`..`max_tables` tables (drawn uniformly) on `num_devices` devices."""

    model_config = ConfigDict(frozen=True)

    name: str
    num_devices: int = Field(ge=1)
    min_tables: int = Field(ge=1)
    max_tables: int = Field(ge=1)
    num_tasks: int = Field(ge=1)
    # at 1.5x TorchRec's perf-first partitioner finds no plan for most 8-device tasks (it does not
    # backtrack on memory); 2.0x lets every method plan, so ratios compare the same tasks
    memory_slack: float = Field(default=2.0, gt=0)


#: the papers' settings: 10-60 tables on 4 devices, 80-120 tables on 8 devices
PAPER_TASK_SETS = (
    TaskSetSpec(name="4dev-10to60", num_devices=4, min_tables=10, max_tables=60, num_tasks=10),
    TaskSetSpec(name="8dev-80to120", num_devices=8, min_tables=80, max_tables=120, num_tasks=10),
)
#: the same shape at a size that runs in minutes on a 2-core CPU (smoke runs, CI)
SMALL_TASK_SETS = (
    TaskSetSpec(name="4dev-6to10", num_devices=4, min_tables=6, max_tables=10, num_tasks=2),
    TaskSetSpec(name="8dev-16to24", num_devices=8, min_tables=16, max_tables=24, num_tasks=1),
)
TASK_SETS = {"paper": PAPER_TASK_SETS, "small": SMALL_TASK_SETS}


def make_task_set(pool: TableSet, spec: TaskSetSpec, seed: int) -> list[ShardingTask]:
    """The seeded tasks of one set, tables drawn without replacement from `pool` (held-out tables)."""
    if spec.max_tables > len(pool.tables):
        raise ValueError(
            f"task set {spec.name!r}: max_tables {spec.max_tables} exceeds the {len(pool.tables)} tables in the pool"
        )
    rng = np.random.default_rng(seed)
    tasks = []
    for k in range(spec.num_tasks):
        num_tables = int(rng.integers(spec.min_tables, spec.max_tables + 1))
        tasks.append(
            sample_task(pool, num_tables, spec.num_devices, seed=seed * 1000 + k, memory_slack=spec.memory_slack)
        )
    return tasks


class PlanResult(BaseModel):
    """One method on one task: measured and predicted cost, memory, planning time."""

    model_config = ConfigDict(frozen=True)

    task_set: str
    task_index: int
    num_tables: int
    method: str
    measured_ms: float
    compute_ms: float  # the slowest device's kernel time alone (all-to-all left out)
    imbalance: float
    memory_headroom: float
    planning_time_s: float
    predicted_ms: float | None = None
    #: the cost model's even-spread compute for the plan's shards (search.simulator.balance_bound)
    bound_ms: float | None = None
    plan_path: str | None = None
    # end-to-end TorchRec DLRM training throughput under the plan (only on the first `throughput_tasks` tasks)
    samples_per_s: float | None = None

    @property
    def prediction_error(self) -> float | None:
        """|predicted - measured| / measured of the plan cost (None without a cost model)."""
        if self.predicted_ms is None:
            return None
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms


def _mean_ratio(
    results: Sequence[PlanResult], method: str, reference: str, value: Callable[[PlanResult], float | None]
) -> float | None:
    """Mean `value` of `method` over that of `reference`, on the tasks where both have one."""
    mine = {r.task_index: v for r in results if r.method == method and (v := value(r)) is not None}
    ref = {r.task_index: v for r in results if r.method == reference and (v := value(r)) is not None}
    common = sorted(mine.keys() & ref.keys())
    if not common:
        return None
    return statistics.fmean(mine[k] for k in common) / statistics.fmean(ref[k] for k in common)


def cost_ratio(results: Sequence[PlanResult], method: str, reference: str) -> float | None:
    """Mean cost of `method` over mean cost of `reference`, on the tasks both planned."""
    return _mean_ratio(results, method, reference, lambda r: r.measured_ms)


def throughput_ratio(results: Sequence[PlanResult], method: str, reference: str) -> float | None:
    """Mean DLRM samples/s of `method` over that of `reference`, on the tasks both were trained on (higher is better)."""
    return _mean_ratio(results, method, reference, lambda r: r.samples_per_s)


def summarize(
    results: Sequence[PlanResult],
    failures: Sequence[tuple[str, int, str, str]] = (),
    *,
    learned: Collection[str] = (),
    throughput: bool = False,
) -> list[dict[str, Any]]:
    """Per task set and method: mean measured cost, ratios to TorchRec and to the best baseline, and the rest.

    Ratios compare the tasks both methods planned; `failures` are (task set, task, method, reason); the best
    baseline is the cheapest method not in `learned` (those that learn from or search with a cost model). With
    `throughput`, each row also has the mean DLRM samples/s and its ratio to TorchRec's plan (tasks both trained)."""
    rows: list[dict[str, Any]] = []
    for task_set in dict.fromkeys([r.task_set for r in results] + [f[0] for f in failures]):
        in_set = [r for r in results if r.task_set == task_set]
        methods = list(dict.fromkeys([r.method for r in in_set] + [f[2] for f in failures if f[0] == task_set]))
        planned = {m: [r for r in in_set if r.method == m] for m in methods}
        mean_cost = {m: statistics.fmean(r.measured_ms for r in rs) for m, rs in planned.items() if rs}
        baselines = [m for m in mean_cost if m not in learned]
        best_baseline = min(baselines, key=mean_cost.__getitem__) if baselines else None
        for m in methods:
            mine = planned[m]
            errors = [e for e in (r.prediction_error for r in mine) if e is not None]
            failed = sum(1 for f in failures if f[0] == task_set and f[2] == m)
            row: dict[str, Any] = {
                "task_set": task_set,
                "method": m,
                "tasks": len(mine),
                "failed": failed,
                "mean_cost_ms": mean_cost.get(m),
                "mean_compute_ms": statistics.fmean(r.compute_ms for r in mine) if mine else None,
                "ratio_to_torchrec": cost_ratio(in_set, m, "torchrec"),
                "ratio_to_best_baseline": cost_ratio(in_set, m, best_baseline) if best_baseline else None,
                "best_baseline": best_baseline,
                "imbalance": statistics.fmean(r.imbalance for r in mine) if mine else None,
                "memory_headroom": min(r.memory_headroom for r in mine) if mine else None,
                "planning_time_s": statistics.fmean(r.planning_time_s for r in mine) if mine else None,
                "prediction_error": statistics.fmean(errors) if errors else None,
                # measured slowest compute over the model's even spread; `under_bound`: tasks where the measured
                # compute came in below it (the model's bound did not hold on hardware)
                "compute_over_bound": statistics.fmean(over) if (over := [
                    r.compute_ms / r.bound_ms for r in mine if r.bound_ms]) else None,
                "under_bound": sum(1 for r in mine if r.bound_ms and r.compute_ms < r.bound_ms) if mine else None,
            }
            if throughput:
                trained = [r.samples_per_s for r in mine if r.samples_per_s is not None]
                row["mean_samples_per_s"] = statistics.fmean(trained) if trained else None
                row["throughput_ratio_to_torchrec"] = throughput_ratio(in_set, m, "torchrec")
            rows.append(row)
    return rows


def format_summary(rows: Sequence[dict[str, Any]]) -> str:
    """The method comparison as a text table."""

    def f(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    # the throughput columns exist only when the benchmark trained the DLRM (summarize(..., throughput=True))
    throughput = any("mean_samples_per_s" in r for r in rows)
    lines = [
        f"{'task set':<14} {'method':<20} {'tasks':>5} {'failed':>6} {'cost ms':>9} {'comp ms':>8} {'/torchrec':>9} "
        f"{'/best base':>10} {'imbal':>6} {'headroom':>8} {'plan s':>7} {'pred err':>8} {'comp/bound':>10} "
        f"{'<bound':>6}" + (f" {'samples/s':>10} {'thru/torchrec':>13}" if throughput else "")
    ]
    for r in rows:
        lines.append(
            f"{r['task_set']:<14} {r['method']:<20} {r['tasks']:>5} {r['failed']:>6} {f(r['mean_cost_ms'], '.3f'):>9} "
            f"{f(r['mean_compute_ms'], '.3f'):>8} "
            f"{f(r['ratio_to_torchrec'], '.3f'):>9} {f(r['ratio_to_best_baseline'], '.3f'):>10} "
            f"{f(r['imbalance'], '.3f'):>6} {f(r['memory_headroom'], '.1%'):>8} {f(r['planning_time_s'], '.3f'):>7} "
            f"{f(r['prediction_error'], '.1%'):>8} {f(r.get('compute_over_bound'), '.3f'):>10} "
            f"{f(r.get('under_bound'), 'd'):>6}"
            + (
                f" {f(r.get('mean_samples_per_s'), ',.0f'):>10} {f(r.get('throughput_ratio_to_torchrec'), '.3f'):>13}"
                if throughput else ""
            )
        )
    best = {r["task_set"]: r["best_baseline"] for r in rows}
    lines.append("best baseline: " + ", ".join(f"{k}: {v}" for k, v in best.items()))
    lines.append("comp/bound: measured slowest compute over the cost model's even spread of the plan's shards; "
                 "<bound: tasks measured below it (the model's bound did not hold)")
    return "\n".join(lines)


def _train_dlrm(
    plans: Sequence[tuple[str, int, str, ShardingTask, Plan]],
    *,
    iters: int,
    warmup: int,
    batch_size: int | None,
    device: torch.device,
    seed: int,
) -> dict[tuple[str, int, str], DLRMThroughput]:
    """DLRM samples/s under each (task set, task, method, task, plan), keyed by (task set, task, method).

    A task's methods are trained back to back in the same ranks, with the same settings. A task the node
    refuses to train (fewer GPUs than devices) is reported and left out, not fatal."""
    by_task: dict[tuple[str, int], list[tuple[str, ShardingTask, Plan]]] = {}
    for set_name, k, method, task, plan in plans:
        by_task.setdefault((set_name, k), []).append((method, task, plan))
    measured: dict[tuple[str, int, str], DLRMThroughput] = {}
    for (set_name, k), runs in tqdm(by_task.items(), desc="train DLRM", unit="task", disable=not plans):
        methods = [method for method, _, _ in runs]
        try:
            results = measure_dlrm_throughputs(runs[0][1], [plan for _, _, plan in runs], iters=iters,
                                               warmup=warmup, batch_size=batch_size, device=device, seed=seed)
        except ValueError as err:
            print(f"benchmark: no DLRM throughput for {', '.join(methods)} on {set_name} task {k}: {err}")
            continue
        measured.update({(set_name, k, method): result for method, result in zip(methods, results, strict=True)})
    return measured


#: the baseline refinement also starts from (the strongest simple one: greedy on measured single-table costs)
REFINE_START = "measured_greedy"
#: each task's measured results, written as soon as the task is done (what `resume` picks up)
TASK_RESULTS = "results.json"
TASK_RESULTS_FORMAT = "shardwise.benchmark-task/v1"
_Planned = tuple[str, Plan, float]  # method, plan, planning seconds


class _TaskOutcome(BaseModel):
    """One task of the benchmark, planned by every method and measured in one session (its checkpoint)."""

    format: str = TASK_RESULTS_FORMAT
    key: str
    results: list[PlanResult]
    failures: list[tuple[str, int, str, str]]
    hardware_kind: str | None = None
    reference_ms: float | None = None
    timing: dict[str, Any] | None = None
    #: the task's planning, refinement and measurement, wall-clock (a resumed run's total counts it)
    seconds: float = 0.0


def _task_key(task: ShardingTask, methods: Sequence[str], cost_model: CostModel | None, **settings: Any) -> str:
    """What a task's results depend on, hashed: the task, the methods, the settings and the cost model (known by
    its predictions for the task's tables, so a retrained model under the same name is a different one)."""
    model = None
    if cost_model is not None:
        predicted = cost_model.predict_compute([[table] for table in task.tables])
        model = [cost_model.hardware_kind, cost_model.batch_size, getattr(cost_model, "reference_ms", None),
                 [float(f"{v:.6g}") for v in np.asarray(predicted, dtype=float).ravel()]]
    doc = {"task": task.model_dump(mode="json"), "methods": list(methods), "model": model, **settings}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _load_outcome(path: Path, key: str) -> _TaskOutcome | None:
    """The task's stored results when they were measured with these settings (None: measure it)."""
    try:
        outcome = _TaskOutcome.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None  # absent, or torn by an older writer: measured again
    return outcome if outcome.format == TASK_RESULTS_FORMAT and outcome.key == key else None


def _refine(task: ShardingTask, planned: Sequence[_Planned], learned: Collection[str], cost_model: CostModel,
            measurement: MeasurementSettings, rounds: int, budget_s: float | None) -> list[_Planned]:
    """Each learned method's plan of `task` refined on this machine, from the faster of it and the task's measured
    greedy plan (when benchmarked)."""
    from .refine import refine_plan  # the kernels' timing: only when refining

    starts = [plan for method, plan, _ in planned if method == REFINE_START]
    out: list[_Planned] = []
    for method, plan, planning_s in planned:
        if method in learned:
            refined, record = refine_plan(task, plan, cost_model, measurement, rounds=rounds,
                                          time_budget_s=budget_s, starts=starts, progress=False)
            out.append((f"{method}+refine", refined, planning_s + record.seconds))
    return out


def _benchmark_task(set_name: str, k: int, task: ShardingTask, searchers: Mapping[str, Searcher], *,
                    key: str, learned: Collection[str], cost_model: CostModel | None,
                    measurement: MeasurementSettings, seed: int, out: Path | None, plan_reports: bool,
                    refine_rounds: int, refine_budget_s: float | None, throughput: dict[str, int] | None,
                    device: torch.device, stage: Callable[[str], None]) -> _TaskOutcome:
    """Plan one task with every searcher (and refine), measure its plans in one session, save what it made."""
    began = time.perf_counter()
    failures: list[tuple[str, int, str, str]] = []
    planned: list[_Planned] = []
    stage("planning")
    for method, searcher in searchers.items():
        started = time.perf_counter()
        try:
            plan = searcher.search(task, cost_model, seed)
        except PlanError as err:  # a method that finds no feasible plan is reported, not fatal
            failures.append((set_name, k, method, str(err)))
            continue
        planned.append((method, plan, float(plan.extra.get("planning_time_s", time.perf_counter() - started))))
    if refine_rounds and cost_model is not None:
        stage("refining")
        planned += _refine(task, planned, learned, cost_model, measurement, refine_rounds, refine_budget_s)
    stage("measuring")
    measured = measure_plans([(task, plan) for _, plan, _ in planned], measurement, progress=False)
    trained: dict[str, DLRMThroughput] = {}
    if throughput is not None:
        stage("training DLRM")
        trained = {method: t for (_, _, method), t in _train_dlrm(
            [(set_name, k, method, task, plan) for method, plan, _ in planned], iters=throughput["iters"],
            warmup=throughput["warmup"], batch_size=measurement.batch_size, device=device, seed=seed).items()}

    results: list[PlanResult] = []
    task_dir = out / set_name / f"task{k:02d}" if out is not None else None
    for (method, plan, planning_s), cost in zip(planned, measured, strict=True):
        predicted = simulate(plan, task, cost_model) if cost_model is not None else None
        bound = balance_bound(plan, task, cost_model, predicted) if cost_model and predicted else None
        plan_path = None
        if task_dir is not None:
            plan_path = str(save_plan(plan, task_dir / f"{method}.plan.json"))
            save_measured(cost, task_dir / f"{method}.measured.json")
            if method in trained:
                (task_dir / f"{method}.throughput.json").write_text(json.dumps(trained[method].to_json(), indent=1))
            if plan_reports:
                write_plan_report(
                    cost, task_dir, name=method,
                    predicted_total_ms=list(predicted.total_ms) if predicted is not None else None,
                    throughput=list(trained.values()),  # every method's plan of this task, trained in the same run
                )
        results.append(PlanResult(
            task_set=set_name, task_index=k, num_tables=len(task.tables), method=method,
            measured_ms=cost.max_cost_ms, compute_ms=cost.max_compute_ms, imbalance=cost.imbalance,
            memory_headroom=cost.memory_headroom, planning_time_s=planning_s,
            predicted_ms=predicted.max_cost_ms if predicted is not None else None,
            bound_ms=bound.bound_ms if bound is not None else None, plan_path=plan_path,
            samples_per_s=trained[method].samples_per_s if method in trained else None,
        ))
    outcome = _TaskOutcome(key=key, results=results, failures=failures,
                           hardware_kind=measured[0].hardware_kind if measured else None,
                           reference_ms=measured[0].reference_ms if measured else None,
                           timing=measured[0].timing if measured else None,
                           seconds=time.perf_counter() - began)
    if task_dir is not None:
        save_task(task, task_dir / "task.json")  # for `shardwise evaluate --task`
        write_json_document(outcome.model_dump(mode="json"), task_dir / TASK_RESULTS)  # last: the task is done
    return outcome


def _benchmark_tasks(task_sets: Mapping[str, Sequence[ShardingTask]], searchers: Mapping[str, Searcher], *,
                     learned: Collection[str], cost_model: CostModel | None, measurement: MeasurementSettings,
                     seed: int, out: Path | None, plan_reports: bool, throughput_tasks: int, throughput_iters: int,
                     throughput_warmup: int, refine_rounds: int, refine_budget_s: float | None, resume: bool,
                     device: torch.device) -> list[_TaskOutcome]:
    """Every task's outcome, task by task: measured now, or with `resume` taken from its stored results."""
    outcomes: list[_TaskOutcome] = []
    todo = [(set_name, k, task) for set_name, tasks in task_sets.items() for k, task in enumerate(tasks)]
    resumed = 0
    with tqdm(total=len(todo), desc="benchmark", unit="task") as bar:
        for set_name, k, task in todo:
            throughput = {"iters": throughput_iters, "warmup": throughput_warmup} if k < throughput_tasks else None
            key = _task_key(task, list(searchers), cost_model, learned=sorted(learned), refine_rounds=refine_rounds,
                            refine_budget_s=refine_budget_s, measurement=measurement.model_dump(mode="json"), throughput=throughput, seed=seed,
                            plan_reports=plan_reports)
            outcome = _load_outcome(out / set_name / f"task{k:02d}" / TASK_RESULTS, key) if resume and out else None
            if outcome is not None:
                resumed += 1
            else:
                label = f"{set_name} task {k}"

                def stage(what: str, label: str = label) -> None:
                    bar.set_postfix_str(f"{label}: {what}")

                outcome = _benchmark_task(
                    set_name, k, task, searchers, key=key, learned=learned, cost_model=cost_model,
                    measurement=measurement, seed=seed, out=out, plan_reports=plan_reports,
                    refine_rounds=refine_rounds, refine_budget_s=refine_budget_s, throughput=throughput,
                    device=device, stage=stage,
                )
            outcomes.append(outcome)
            bar.update()
    if resumed:
        print(f"benchmark: {resumed} of {len(todo)} tasks taken from {out} (measured earlier with these settings)")
    return outcomes


def _write_benchmark(out: Path, rows: list[dict[str, Any]], results: Sequence[PlanResult],
                     failures: Sequence[tuple[str, int, str, str]], outcomes: Sequence[_TaskOutcome], *,
                     measurement: MeasurementSettings, seed: int, plan_reports: bool,
                     throughput: dict[str, int]) -> None:
    """The run's results (`out/results.json`) and its HTML report, linking each plan's report."""
    first = next((o for o in outcomes if o.results), None)
    write_json_document(
        {
            "summary": rows,
            "plans": [r.model_dump() | {"prediction_error": r.prediction_error} for r in results],
            "failures": [{"task_set": s, "task_index": k, "method": m, "reason": why} for s, k, m, why in failures],
            "hardware_kind": first.hardware_kind if first else None,
            # as calibrated (or pinned) for this run, and the protocol and rounds every plan was timed with
            "reference_ms": first.reference_ms if first else measurement.reference_ms,
            "timing": first.timing if first else None,
            "measurement": measurement.model_dump(mode="json"),
            "throughput": throughput,
            "seed": seed,
            # every task's planning, refinement and measurement, resumed ones included (their earlier run's)
            "seconds": round(sum(o.seconds for o in outcomes), 1),
        },
        out / "results.json",
    )
    links = [(f"{r.task_set} task {r.task_index} {r.method}", f"{r.task_set}/task{r.task_index:02d}/{r.method}.html")
             for r in results] if plan_reports else []
    write_benchmark_report(rows, out, plan_reports=links)


def run_benchmark(
    task_sets: Mapping[str, Sequence[ShardingTask]],
    searchers: Mapping[str, Searcher],
    *,
    learned: Collection[str] = (),
    cost_model: CostModel | None = None,
    measurement: MeasurementSettings | None = None,
    seed: int = 0,
    out_dir: str | Path | None = None,
    plan_reports: bool = True,
    throughput_tasks: int = 0,
    throughput_iters: int = 20,
    throughput_warmup: int = 5,
    refine_rounds: int = 0,
    refine_budget_s: float | None = None,
    resume: bool = False,
) -> tuple[list[PlanResult], list[dict[str, Any]]]:
    """Plan every task with every searcher and measure it, task by task; per-plan results and the summary.

    `searchers` maps a method name to its searcher, one instance for the whole run (so what it caches, such as
    the measured greedy's single-table timings, is shared by all tasks); `learned` names the methods that are
    not baselines. A task's plans are measured in one session, so they compare with each other; ratios over a
    set are means over its tasks. With a cost model, plans are timed as its training data was (its reference_ms
    and batch unless `measurement` sets them) and its predictions are reported. With `throughput_tasks` N > 0,
    the TorchRec DLRM is also trained under every method's plan of the first N tasks of each set
    (`throughput_iters` timed iterations after `throughput_warmup`, as `shardwise validate` does) and the rows
    get samples/s and its ratio to TorchRec's plan. With `refine_rounds` and a cost model, every learned
    method's plan is also refined on this machine (`refine_plan`, from the faster of it and the measured greedy's
    plan of the task, when that method is benchmarked) and reported as method "<method>+refine", its planning
    time including the refinement's (`refine_budget_s`: no new round after that many seconds). Plans, measurements and reports go under `out_dir` when given, each task's
    results (`<set>/taskNN/results.json`) as soon as it is measured; with `resume`, a task whose results there
    were measured with the same task, methods, settings and cost model is not measured again (a long run that
    was interrupted goes on where it stopped)."""
    if throughput_tasks < 0:
        raise ValueError(f"throughput_tasks must be >= 0 (0 = no DLRM training), got {throughput_tasks}")
    if throughput_tasks and (throughput_iters < 1 or throughput_warmup < 0):
        raise ValueError(
            f"throughput_iters must be >= 1 and throughput_warmup >= 0 (got {throughput_iters}, {throughput_warmup})"
        )
    if resume and out_dir is None:
        raise ValueError("resume needs out_dir: the results of the tasks already measured are read from there")
    measurement = measurement or MeasurementSettings()
    if cost_model is not None:
        measurement = measurement.for_cost_model(getattr(cost_model, "reference_ms", None), cost_model.batch_size)
    device = resolve_device(measurement.device)
    out = Path(out_dir) if out_dir is not None else None
    refine_rounds = refine_rounds if cost_model is not None else 0
    if refine_rounds:
        learned = [*learned, *(f"{m}+refine" for m in searchers if m in learned)]

    outcomes = _benchmark_tasks(
        task_sets, searchers, learned=learned, cost_model=cost_model, measurement=measurement, seed=seed, out=out,
        plan_reports=plan_reports, throughput_tasks=throughput_tasks, throughput_iters=throughput_iters,
        throughput_warmup=throughput_warmup, refine_rounds=refine_rounds, refine_budget_s=refine_budget_s,
        resume=resume, device=device,
    )
    results = [r for o in outcomes for r in o.results]
    failures = [f for o in outcomes for f in o.failures]
    for set_name, k, method, reason in failures:
        print(f"benchmark: {method} found no plan for {set_name} task {k}: {reason}")
    rows = summarize(results, failures, learned=learned, throughput=throughput_tasks > 0)
    if out is not None:
        _write_benchmark(out, rows, results, failures, outcomes, measurement=measurement, seed=seed,
                         plan_reports=plan_reports, throughput={"tasks": throughput_tasks, "iters": throughput_iters,
                                                                "warmup": throughput_warmup})
    return results, rows
