"""The `shardwise` command: one verb per step of the method (profile, pretrain, plan, evaluate, ...)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from shardwise import __version__


class CliError(Exception):
    """A user-facing failure: printed without a traceback, exit status 2."""


def _cmd_task_check(args: argparse.Namespace) -> int:
    from shardwise.workload import load_task, shard_memory_bytes

    task = load_task(args.file)
    total = shard_memory_bytes(task.tables, task.batch_size, task.optimizer, task.weights_precision)
    capacity = task.num_devices * task.device_memory_bytes
    print(
        f"{args.file}: ok ({len(task.tables)} tables, {task.num_devices} devices, batch {task.batch_size}, "
        f"memory {total / 2**30:.2f} GiB of {capacity / 2**30:.2f} GiB)"
    )
    return 0


# --- pipeline: compile / run --local / submit / schedule (shardwise.integrations.kubeflow) ---------------

_PIPELINE_FLAGS = (  # (flag, pipeline parameter, type): the usual knobs; --arg NAME=VALUE sets any other
    ("--num-tables", "num_tables", int),
    ("--row-scale", "row_scale", float),
    ("--batch-size", "batch_size", int),
    ("--task-num-tables", "task_num_tables", int),
    ("--num-devices", "num_devices", int),
    ("--profile-num-shards", "profile_num_shards", int),
    ("--profile-holdout-shards", "profile_holdout_shards", int),
    ("--search-method", "search_method", str),
    ("--model-alias", "model_alias", str),
    ("--seed", "seed", int),
)


def _pipeline_arguments(args: argparse.Namespace) -> dict[str, object]:
    arguments: dict[str, object] = {}
    for item in args.arg or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CliError(f"--arg {item!r}: expected NAME=VALUE")
        arguments[name.strip()] = value
    for _flag, name, _type in _PIPELINE_FLAGS:
        value = getattr(args, name)
        if value is not None:
            arguments[name] = value
    return arguments


def _cmd_pipeline_compile(args: argparse.Namespace) -> int:
    from shardwise.integrations.kubeflow import compile_pipeline

    print(compile_pipeline(args.out, gpu_product=args.gpu_product))
    return 0


def _cmd_pipeline_run(args: argparse.Namespace) -> int:
    from shardwise.integrations.kubeflow import PipelineArgumentError, PipelineRunError, run_local

    if not args.local:
        raise CliError("only --local runs here; use `shardwise pipeline submit --host URL` for a cluster")
    try:
        result = run_local(args.workdir, _pipeline_arguments(args), tracking_uri=args.tracking_uri)
    except (PipelineArgumentError, PipelineRunError) as err:
        raise CliError(str(err)) from err
    from shardwise.search.plan import load_plan

    try:
        from shardwise.search.report import format_plan

        plan_text = format_plan(load_plan(result.plan_path))
    except ImportError:
        plan_text = result.plan_path.read_text()
    print(f"\nplan ({result.plan_path}):\n{plan_text}")
    print(f"report: {result.report_path}")
    c = result.comparison
    print(
        f"measured vs TorchRec's planner: {c.get('method_max_cost_ms', float('nan')):.3f} ms vs "
        f"{c.get('torchrec_max_cost_ms', float('nan')):.3f} ms per iteration "
        f"(ratio {c.get('ratio_to_torchrec', float('nan')):.3f}; below 1 is better)"
    )
    if "throughput_ratio_to_torchrec" in c:
        print(
            f"DLRM training throughput vs TorchRec's planner: {c['method_samples_per_s']:,.0f} vs "
            f"{c['torchrec_samples_per_s']:,.0f} samples/s (ratio {c['throughput_ratio_to_torchrec']:.3f}; "
            "above 1 is better)"
        )
    return 0


def _cmd_pipeline_submit(args: argparse.Namespace) -> int:
    from shardwise.integrations.kubeflow import PipelineArgumentError, schedule, submit

    common = dict(
        experiment=args.experiment,
        namespace=args.namespace,
        service_account=args.service_account,
        gpu_product=args.gpu_product,
    )
    try:
        if args.pipeline_verb == "schedule":
            done = schedule(args.host, args.cron, _pipeline_arguments(args), job_name=args.name, **common)
            print(f"recurring run {done.run_id} ({args.cron}) in experiment {done.experiment_id}")
        else:
            done = submit(args.host, _pipeline_arguments(args), run_name=args.name, **common)
            print(f"run {done.run_id} in experiment {done.experiment_id}")
    except PipelineArgumentError as err:
        raise CliError(str(err)) from err
    return 0


def _add_pipeline_verbs(verbs: argparse._SubParsersAction) -> None:
    pipeline = verbs.add_parser("pipeline", help="the Kubeflow pipeline: compile, run locally, submit, schedule")
    actions = pipeline.add_subparsers(dest="pipeline_verb", metavar="ACTION", required=True)

    compile_ = actions.add_parser("compile", help="write the compiled pipeline YAML")
    compile_.add_argument("--out", required=True, help="output YAML path")
    compile_.add_argument("--gpu-product", help="pin GPU steps to nodes labelled nvidia.com/gpu.product=VALUE")
    compile_.set_defaults(handler=_cmd_pipeline_compile)

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        for flag, name, type_ in _PIPELINE_FLAGS:
            parser.add_argument(flag, dest=name, type=type_, help=f"pipeline parameter {name}")
        parser.add_argument("--arg", action="append", metavar="NAME=VALUE", help="any pipeline parameter")

    run = actions.add_parser("run", help="run the pipeline through kfp.local in this environment (CPU)")
    run.add_argument("--local", action="store_true", help="execute with kfp.local (required)")
    run.add_argument("--workdir", default="runs/local", help="pipeline root, MLflow store and artifacts")
    run.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite under --workdir)")
    add_arguments(run)
    run.set_defaults(handler=_cmd_pipeline_run)

    for name, help_ in (("submit", "start one run on a Kubeflow cluster"),
                        ("schedule", "create a recurring run on a Kubeflow cluster")):
        sub = actions.add_parser(name, help=help_)
        sub.add_argument("--host", required=True, help="Kubeflow Pipelines API URL")
        if name == "schedule":
            sub.add_argument("--cron", required=True, help="cron schedule, e.g. '0 0 3 * * *' (seconds first)")
        sub.add_argument("--name", default=f"shardwise-{name}", help="run or recurring-run name")
        sub.add_argument("--experiment", default="shardwise", help="KFP experiment name")
        sub.add_argument("--namespace", help="Kubeflow namespace (multi-user installs)")
        sub.add_argument("--service-account", help="Kubernetes service account the run uses")
        sub.add_argument("--gpu-product", help="pin GPU steps to nodes labelled nvidia.com/gpu.product=VALUE")
        add_arguments(sub)
        sub.set_defaults(handler=_cmd_pipeline_submit)


def _load_task_and_plan(task_path: str, plan_path: str):  # type: ignore[no-untyped-def]
    """The task and plan files, or a CliError naming what is wrong with the plan."""
    from shardwise.search.plan import PlanError, load_plan, validate_plan
    from shardwise.workload import load_task

    task = load_task(task_path)
    try:
        plan = load_plan(plan_path)
        validate_plan(plan, task)
    except PlanError as err:
        raise CliError(f"{plan_path}: invalid plan for {task_path}: {err}") from None
    return task, plan


def _evaluation_tracking_uri(args: argparse.Namespace) -> str | None:
    """Log to MLflow only when asked: `--tracking-uri` or $MLFLOW_TRACKING_URI."""
    import os

    return args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")


def _evaluation_protocol(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from shardwise.profiling.kernel import TimingProtocol

    return TimingProtocol(warmup_iters=args.warmup_iters, iters=args.timing_iters)


def _plan_names(paths: list[str], plans: list) -> list[str]:  # type: ignore[type-arg]
    """Report names for plan files: their file stems, else their methods, else stem-<i> (all unique)."""
    from pathlib import Path

    for names in ([Path(p).stem for p in paths], [plan.method for plan in plans]):
        if len(set(names)) == len(names):
            return names
    return [f"{Path(p).stem}-{i}" for i, p in enumerate(paths)]


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from shardwise.evaluation.measured import evaluate_plans

    loaded = [_load_task_and_plan(args.task, p) for p in args.plan]
    task = loaded[0][0]
    plans = [plan for _, plan in loaded]
    if args.name and len(args.name) != len(args.plan):
        raise CliError(f"--name given {len(args.name)} times for {len(args.plan)} --plan; give one per plan or none")
    names = args.name or _plan_names(args.plan, plans)
    cost_model = None
    if args.model:
        from shardwise.integrations.mlflow import load_cost_model

        cost_model = load_cost_model(args.model, tracking_uri=args.tracking_uri)
    first = Path(args.plan[0])
    out = Path(args.out) if args.out else first.with_name(first.stem + "_eval")
    try:
        costs, comparison, paths = evaluate_plans(
            task, list(zip(names, plans)), out, cost_model=cost_model, device=args.device,
            protocol=_evaluation_protocol(args), reference_ms=args.reference_ms, batch_size=args.batch_size,
            compute_rounds=args.timing_rounds, comm_iters=args.comm_iters, comm_rounds=args.comm_rounds,
        )
    except ValueError as err:
        raise CliError(str(err)) from None
    for name, cost in zip(names, costs):
        print(f"{name}:\n{cost.table()}" if len(costs) > 1 else cost.table())
    if len(costs) > 1:
        print(comparison.table())
    print(f"wrote {', '.join(str(p) for p in paths)}")
    uri = _evaluation_tracking_uri(args)
    if uri:
        import mlflow

        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment("shardwise-evaluate")
        with mlflow.start_run(run_name="evaluate-" + "-vs-".join(names if len(names) > 1 else [plans[0].method])):
            mlflow.log_params({"methods": ",".join(p.method for p in plans), "num_devices": plans[0].num_devices,
                               "batch_size": costs[0].batch_size})
            for name, cost in zip(names, costs):
                prefix = f"{name}_" if len(costs) > 1 else ""
                mlflow.log_metrics({f"{prefix}max_cost_ms": cost.max_cost_ms, f"{prefix}imbalance": cost.imbalance,
                                    f"{prefix}memory_headroom": cost.memory_headroom})
            mlflow.log_artifacts(str(out), artifact_path="evaluation")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from shardwise.evaluation.dlrm import measure_dlrm_throughput

    task, plan = _load_task_and_plan(args.task, args.plan)
    plans = [plan] + [_load_task_and_plan(args.task, p)[1] for p in args.compare]
    results = [
        measure_dlrm_throughput(
            task, p, iters=args.iters, warmup=args.warmup, batch_size=args.batch_size, device=args.device,
            seed=args.seed,
        )
        for p in plans
    ]
    for r in results:
        print(r.summary())
    for r in results[1:]:
        print(f"{results[0].method} / {r.method} throughput: {results[0].samples_per_s / r.samples_per_s:.3f}x")
    if args.out:
        import json
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps([r.to_json() for r in results], indent=1))
        print(f"wrote {args.out}")
    return 0


def _cmd_benchmark(args: argparse.Namespace) -> int:
    from shardwise.evaluation.suite import (
        MEASURED_GREEDY,
        TASK_SETS,
        TaskSetSpec,
        format_summary,
        log_benchmark_to_mlflow,
        make_task_set,
        run_benchmark,
    )
    from shardwise.search import METHODS
    from shardwise.workload.tableset import load_tables

    pool = load_tables(args.tables)
    methods = args.methods.split(",") if args.methods else [*METHODS, MEASURED_GREEDY]
    specs: tuple[TaskSetSpec, ...] = TASK_SETS[args.task_sets]
    if args.num_tasks:
        specs = tuple(s.model_copy(update={"num_tasks": args.num_tasks}) for s in specs)
    try:
        task_sets = {s.name: make_task_set(pool, s, seed=args.seed) for s in specs}
    except ValueError as err:
        raise CliError(f"--tables {args.tables}: {err}") from None
    cost_model = None
    if args.model:
        from shardwise.integrations.mlflow import load_cost_model

        cost_model = load_cost_model(args.model, tracking_uri=args.tracking_uri)
    batch = args.batch_size or (cost_model.batch_size if cost_model is not None else None)
    _, rows = run_benchmark(
        task_sets, methods, cost_model=cost_model, device=args.device, protocol=_evaluation_protocol(args),
        reference_ms=args.reference_ms, batch_size=batch, compute_rounds=args.timing_rounds,
        comm_iters=args.comm_iters, comm_rounds=args.comm_rounds, seed=args.seed,
        out_dir=args.out, throughput_tasks=args.throughput_tasks, throughput_iters=args.throughput_iters,
        throughput_warmup=args.throughput_warmup,
    )
    print(format_summary(rows))
    print(f"report: {args.out}/benchmark.html")
    uri = _evaluation_tracking_uri(args)
    if uri:
        params = {"tables": args.tables, "methods": ",".join(methods), "model": args.model, "seed": args.seed,
                  "batch_size": batch, "task_sets": [s.model_dump() for s in specs],
                  "throughput_tasks": args.throughput_tasks, "throughput_iters": args.throughput_iters,
                  "throughput_warmup": args.throughput_warmup}
        run_id = log_benchmark_to_mlflow(rows, args.out, tracking_uri=uri, params=params)
        print(f"mlflow run {run_id} at {uri}")
    return 0


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int >= `minimum` (argparse names the flag in the error)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "int"  # argparse's message for a non-number: "invalid int value"
    return parse


def _add_evaluation_verbs(verbs: argparse._SubParsersAction) -> None:
    """`evaluate` (measured plan cost), `validate` (end-to-end DLRM throughput), `benchmark` (all methods)."""

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when present)")
        parser.add_argument("--batch-size", type=int, default=None,
                            help="measure at this batch (default: the cost model's, else the task's)")
        parser.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (else $MLFLOW_TRACKING_URI)")

    def timing(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model", default=None, help="cost model URI: its reference timing, batch, predictions")
        parser.add_argument("--warmup-iters", type=int, default=3, help="kernel warm-up iterations per shard")
        parser.add_argument("--timing-iters", type=int, default=10, help="timed kernel iterations per shard")
        parser.add_argument("--timing-rounds", type=int, default=3,
                            help="interleaved kernel timings per shard (per device: their median)")
        parser.add_argument("--comm-iters", type=int, default=20, help="timed all-to-all iterations per round")
        parser.add_argument("--comm-rounds", type=int, default=5,
                            help="interleaved all-to-all rounds (per device: median of rounds x iterations)")
        parser.add_argument("--reference-ms", type=float, default=None,
                            help="reference kernel ms to normalise by (default: the model's, else calibrate)")

    evaluate = verbs.add_parser("evaluate", help="measure plans' per-device cost on this machine's kernels")
    evaluate.add_argument("--task", required=True, help="shardwise.task/v1 file")
    evaluate.add_argument("--plan", required=True, action="append",
                          help="shardwise.plan/v1 file (from any tool); repeat to measure and compare several "
                               "plans in one session")
    evaluate.add_argument("--out", default=None,
                          help="report directory (default: <first plan>_eval next to the first plan)")
    evaluate.add_argument("--name", action="append", default=[],
                          help="report name of each --plan, in order (default: file stems, else methods)")
    common(evaluate)
    timing(evaluate)
    evaluate.set_defaults(handler=_cmd_evaluate)

    validate = verbs.add_parser("validate", help="train a TorchRec DLRM sharded by the plan(s); samples/s")
    validate.add_argument("--task", required=True, help="shardwise.task/v1 file")
    validate.add_argument("--plan", required=True, help="shardwise.plan/v1 file")
    validate.add_argument("--compare", action="append", default=[], help="another plan to time in the same run")
    validate.add_argument("--iters", type=int, default=20, help="timed training iterations")
    validate.add_argument("--warmup", type=int, default=5, help="warm-up iterations (not timed)")
    validate.add_argument("--seed", type=int, default=0)
    validate.add_argument("--out", default=None, help="write the throughput results as JSON here")
    common(validate)
    validate.set_defaults(handler=_cmd_validate)

    bench = verbs.add_parser("benchmark", help="plan the papers' task sets with every method; measure all plans "
                                "(with --throughput-tasks, also their DLRM training samples/s)")
    bench.add_argument("--tables", required=True, help="held-out shardwise.tables/v1 file the tasks are drawn from")
    bench.add_argument("--methods", default=None, help="comma-separated (default: every method + measured_greedy)")
    bench.add_argument("--task-sets", choices=("paper", "small"), default="paper",
                       help="paper: 10-60 tables on 4 devices, 80-120 on 8; small: 6-10 on 4, 16-24 on 8")
    bench.add_argument("--num-tasks", type=int, default=None, help="tasks per set (default: the set's)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--out", default="runs/benchmark", help="plans, measurements and the report")
    thru = bench.add_argument_group("end-to-end DLRM throughput (slow on CPU: one training run per plan)")
    thru.add_argument("--throughput-tasks", type=_int_at_least(0), default=0, metavar="N",
                      help="also train TorchRec's DLRM under every method's plan of the first N tasks of each set "
                           "(as `validate` does) and report samples/s and thru/torchrec, higher is better "
                           "(default 0: off)")
    thru.add_argument("--throughput-iters", type=_int_at_least(1), default=20, help="timed training iterations per plan")
    thru.add_argument("--throughput-warmup", type=_int_at_least(0), default=5,
                      help="warm-up training iterations per plan (not timed)")
    common(bench)
    timing(bench)
    bench.set_defaults(handler=_cmd_benchmark)


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from shardwise.costmodel import CostDataError, TrainConfig, format_table, train_cost_model
    from shardwise.profiling.dataset import DatasetError, load_costs

    try:
        df = load_costs(args.data)
        sources = None
        if args.holdout_tables:
            from shardwise.workload.tableset import load_tables

            sources = tuple(sorted({t.source or t.name for t in load_tables(args.holdout_tables).tables}))
        config = TrainConfig(
            epochs=args.epochs, holdout_fraction=args.holdout_fraction, device=args.device, holdout_sources=sources,
            holdout_num_tables=tuple(args.holdout_num_tables) if args.holdout_num_tables is not None else None,
        )
        model, report = train_cost_model(df, args.seed, config)
    except (CostDataError, DatasetError) as err:
        raise CliError(f"--data {' '.join(args.data)}: {err}") from None
    model.save(args.out)
    report.evaluation.to_csv(f"{args.out}/evaluation.csv", index=False)
    print(format_table(report.evaluation))
    for note in report.notes:
        print(f"note: {note}")
    print(f"model: {args.out} ({report.hardware_kind}, batch {report.batch_size}, {report.sizes['train']} training shards)")
    if args.no_register:
        return 0
    from shardwise.integrations.mlflow import log_training_run

    run = log_training_run(model, report, config=config, tracking_uri=args.tracking_uri, register=True,
                           extra_params={"data": ",".join(args.data)})
    promo = run.promotion
    if promo is not None:
        versus = "" if promo.champion_mape_pct is None else f" vs champion v{promo.champion_version} {promo.champion_mape_pct:.2f}%"
        print(f"registered {promo.name} v{promo.version} as {promo.alias!r} "
              f"(held-out MAPE {promo.new_mape_pct:.2f}%{versus}); run {run.run_id}")
    return 0


def _add_pretrain_verbs(verbs: argparse._SubParsersAction) -> None:
    pretrain = verbs.add_parser(
        "pretrain", help="train the cost model on cost datasets, evaluate on held-out tables, register in MLflow"
    )
    pretrain.add_argument("--data", action="append", required=True, help="cost dataset (Parquet file or dir); repeatable")
    pretrain.add_argument("--out", required=True, help="directory for the model (weights.pt + cost_model.json)")
    pretrain.add_argument("--seed", type=int, default=0)
    pretrain.add_argument("--epochs", type=int, default=400, help="maximum epochs (early stopping on validation)")
    pretrain.add_argument("--holdout-fraction", type=float, default=0.2, help="share of shards on held-out tables")
    pretrain.add_argument("--holdout-tables", default=None,
                          help="tables file whose source tables are the held-out ones (default: found in the data)")
    pretrain.add_argument("--holdout-num-tables", type=int, nargs="*", default=None,
                          help="shard sizes kept out of training and reported separately (default: one picked)")
    pretrain.add_argument("--device", default="cpu", help="torch device to train on (cpu, cuda)")
    pretrain.add_argument("--tracking-uri", default=None,
                          help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    pretrain.add_argument("--no-register", action="store_true", help="skip MLflow logging and registration")
    pretrain.set_defaults(handler=_cmd_pretrain)


def _cmd_profile(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from shardwise.profiling.dataset import DatasetError, load_costs, noise_floor
    from shardwise.profiling.kernel import TimingProtocol
    from shardwise.profiling.runner import ProfileSettings, profile
    from shardwise.workload.tableset import TableSetError, load_tables

    try:
        tableset = load_tables(args.tables)
    except TableSetError as err:
        raise CliError(str(err)) from None
    index_data = None
    if args.indices:
        from shardwise.workload.dlrm_datasets import DlrmDatasetError, read_dlrm_dataset

        try:
            index_data = read_dlrm_dataset(args.indices).index_data
        except DlrmDatasetError as err:
            raise CliError(f"--indices: {err}") from None
        missing = sorted({t.source or t.name for t in tableset.tables} - set(index_data))
        if missing:
            raise CliError(f"--indices {args.indices}: no index data for table(s) {missing[:5]}")
    try:
        settings = ProfileSettings(
            num_shards=args.num_shards,
            comm_layouts=args.comm_layouts,
            max_tables=args.max_tables,
            repeats=args.repeats,
            repeat_shards=args.repeat_shards,
            seed=args.seed,
            device=args.device,
            batch_size=args.batch_size or tableset.batch_size,
            optimizer=args.optimizer,
            weights_precision=args.weights_precision,
            memory_cap_bytes=args.memory_cap_bytes,
            max_devices=args.max_devices,
            protocol=TimingProtocol(
                warmup_iters=args.warmup_iters,
                iters=args.timing_iters,
                num_threads=args.threads,
                reference_normalised=False if args.no_reference_normalisation else None,
            ),
        )
    except ValidationError as err:
        raise CliError(str(err)) from None
    try:
        summary = profile(tableset.tables, args.out, settings, index_data=index_data)
    except (ValueError, DatasetError) as err:
        raise CliError(str(err)) from None
    except KeyboardInterrupt:
        print(f"shardwise profile: interrupted; what was measured is stored in {args.out}; rerun the same "
              "command to measure the rest", file=sys.stderr)
        return 130
    print(
        f"{args.out}: {summary.measured} measured, {summary.skipped} already stored, {summary.total_rows} rows "
        f"({summary.hardware_kind}, reference {summary.reference_ms or float('nan'):.3f} ms)"
    )
    if args.repeats:
        floor = noise_floor(load_costs(args.out).query("kind == 'compute'"))
        print(
            f"noise floor over {int(floor['configs'])} repeated shards: median relative deviation "
            f"{floor['median_rel_dev']:.1%}, spread median {floor['median_spread']:.1%} max {floor['max_spread']:.1%}"
        )
    return 0


def _add_profile_verbs(verbs: argparse._SubParsersAction) -> None:
    """`profile`: measure sampled shards and all-to-all layouts into a Parquet cost dataset (resumable)."""
    prof = verbs.add_parser("profile", help="measure sampled shards on this machine's kernels -> cost dataset")
    prof.add_argument("--tables", required=True, help="shardwise.tables/v1 file to sample shards from")
    prof.add_argument("--out", required=True, help="Parquet cost dataset to append to (reruns resume)")
    prof.add_argument("--indices", default=None, help="index data in the DLRM dataset format (default: sampled)")
    prof.add_argument("--num-shards", type=int, default=100, help="shard configurations to measure")
    prof.add_argument("--comm-layouts", type=int, default=0, help="all-to-all layouts to measure")
    prof.add_argument("--max-tables", type=int, default=15, help="most tables in one shard")
    prof.add_argument("--repeats", type=int, default=0, help="re-measure some shards this many more times")
    prof.add_argument("--repeat-shards", type=int, default=10, help="how many shards get repeats")
    prof.add_argument("--seed", type=int, default=0)
    prof.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when present)")
    prof.add_argument("--batch-size", type=int, default=None, help="default: the table file's batch size")
    prof.add_argument("--optimizer", default="rowwise_adagrad", choices=["rowwise_adagrad", "sgd", "adam"])
    prof.add_argument("--weights-precision", default="fp32", choices=["fp32", "fp16"])
    prof.add_argument("--memory-cap-bytes", type=int, default=None, help="per shard (default: 1 GiB on CPU)")
    prof.add_argument("--max-devices", type=int, default=None, help="largest all-to-all (default: GPUs or 4)")
    prof.add_argument("--warmup-iters", type=int, default=3, help="kernel warm-up iterations per shard")
    prof.add_argument("--timing-iters", type=int, default=10, help="timed kernel iterations per shard")
    prof.add_argument("--threads", type=int, default=1, help="CPU threads per measurement (one device)")
    prof.add_argument("--no-reference-normalisation", action="store_true",
                      help="report raw medians (normalisation is on by default on CPU, off on CUDA)")
    prof.set_defaults(handler=_cmd_profile)


def _load_tableset(path: str):  # type: ignore[no-untyped-def]
    from shardwise.workload.tableset import TableSetError, load_tables

    try:
        return load_tables(path)
    except TableSetError as err:
        raise CliError(str(err)) from None


def _cmd_workload_synth(args: argparse.Namespace) -> int:
    from pathlib import Path

    import numpy as np

    from shardwise.workload.synthetic import synthesize_tables, write_index_data
    from shardwise.workload.tableset import save_tables

    try:
        tableset = synthesize_tables(args.num_tables, args.seed, row_scale=args.row_scale, batch_size=args.batch_size)
    except ValueError as err:
        raise CliError(str(err)) from None
    out = Path(args.out)
    tables_path = save_tables(tableset, out / "tables.json")
    pooling = np.array([t.pooling_factor for t in tableset.tables])
    rows = np.array([t.rows for t in tableset.tables])
    print(
        f"{tables_path}: {len(tableset.tables)} tables, batch {tableset.batch_size}; pooling mean {pooling.mean():.1f} "
        f"sd {pooling.std():.1f} ({(pooling == 0).mean():.1%} empty); rows mean {rows.mean():,.0f} sd {rows.std():,.0f}"
    )
    if not args.no_index_data:
        print(f"{write_index_data(tableset, out / 'indices.pt', compress=args.gzip)}: index data (DLRM dataset format)")
    return 0


def _cmd_workload_split(args: argparse.Namespace) -> int:
    from pathlib import Path

    from shardwise.workload.tableset import TableSetError, save_tables, split_tables

    try:
        train, holdout = split_tables(_load_tableset(args.tables), args.holdout_fraction, args.seed)
    except TableSetError as err:
        raise CliError(f"--tables {args.tables}: {err}") from None
    for name, part in (("train", train), ("holdout", holdout)):
        print(f"{save_tables(part, Path(args.out) / f'{name}.json')}: {len(part.tables)} tables")
    return 0


def _cmd_workload_task(args: argparse.Namespace) -> int:
    from shardwise.workload import save_task, shard_memory_bytes
    from shardwise.workload.tableset import TableSetError, sample_task

    try:
        task = sample_task(
            _load_tableset(args.tables), args.num_tables, args.num_devices, args.seed,
            memory_slack=args.memory_slack, device_memory_bytes=args.device_memory_bytes,
            optimizer=args.optimizer, weights_precision=args.weights_precision,
        )
    except TableSetError as err:
        raise CliError(f"--tables {args.tables}: {err}") from None
    total = shard_memory_bytes(task.tables, task.batch_size, task.optimizer, task.weights_precision)
    print(
        f"{save_task(task, args.out)}: {len(task.tables)} tables on {task.num_devices} devices, "
        f"{task.device_memory_bytes / 2**30:.3f} GiB each ({total / 2**30:.3f} GiB in all)"
    )
    return 0


def _cmd_augment(args: argparse.Namespace) -> int:
    from shardwise.workload.augment import augment_tables
    from shardwise.workload.tableset import save_tables

    tableset = _load_tableset(args.tables)
    try:
        augmented = augment_tables(
            tableset, args.seed, dims=args.dims, halvings=args.halvings, pooling_resamples=args.pooling_resamples
        )
    except ValueError as err:
        raise CliError(str(err)) from None
    print(f"{save_tables(augmented, args.out)}: {len(augmented.tables)} tables from {len(tableset.tables)}")
    return 0


def _add_workload_verbs(verbs: argparse._SubParsersAction) -> None:
    """`workload synth|split|task` (table populations and tasks) and `augment` (NeuroShard augmentation)."""
    from shardwise.workload.synthetic import DIMS, DLRM_2021_BATCH_SIZE, DLRM_2021_NUM_TABLES

    workload = verbs.add_parser("workload", help="synthetic DLRM tables, train/holdout splits, sharding tasks")
    actions = workload.add_subparsers(dest="workload_verb", metavar="ACTION", required=True)

    synth = actions.add_parser("synth", help="tables with the DLRM 2021 dataset's statistics + their index data")
    synth.add_argument("--num-tables", type=int, default=DLRM_2021_NUM_TABLES)
    synth.add_argument("--row-scale", type=float, default=1.0, help="multiply rows (e.g. 0.01 to fit CPU memory)")
    synth.add_argument("--batch-size", type=int, default=DLRM_2021_BATCH_SIZE,
                       help="batch the index data and the access skew are made for")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--out", required=True, help="directory: tables.json (shardwise.tables/v1) and indices.pt")
    synth.add_argument("--gzip", action="store_true", help="gzip indices.pt (the reader detects it)")
    synth.add_argument("--no-index-data", action="store_true", help="skip indices.pt (large at full scale)")
    synth.set_defaults(handler=_cmd_workload_synth)

    split = actions.add_parser("split", help="split a table file into train/holdout by source table")
    split.add_argument("--tables", required=True, help="shardwise.tables/v1 file")
    split.add_argument("--holdout-fraction", type=float, default=0.2)
    split.add_argument("--seed", type=int, default=0)
    split.add_argument("--out", required=True, help="directory: train.json and holdout.json")
    split.set_defaults(handler=_cmd_workload_split)

    task = actions.add_parser("task", help="sample a sharding task (shardwise.task/v1) from a table file")
    task.add_argument("--tables", required=True, help="shardwise.tables/v1 file")
    task.add_argument("--num-tables", type=int, required=True)
    task.add_argument("--num-devices", type=int, required=True)
    task.add_argument("--memory-slack", type=float, default=1.5,
                      help="memory per device = slack x total memory / devices")
    task.add_argument("--device-memory-bytes", type=int, default=None, help="fixed memory per device instead")
    task.add_argument("--optimizer", default="rowwise_adagrad", choices=["rowwise_adagrad", "sgd", "adam"])
    task.add_argument("--weights-precision", default="fp32", choices=["fp32", "fp16"])
    task.add_argument("--seed", type=int, default=0)
    task.add_argument("--out", required=True, help="task JSON path")
    task.set_defaults(handler=_cmd_workload_task)

    augment = verbs.add_parser("augment", help="NeuroShard augmentation: every dim, column halves, pooling resampling")
    augment.add_argument("--tables", required=True, help="shardwise.tables/v1 file")
    augment.add_argument("--seed", type=int, default=0)
    augment.add_argument("--out", required=True, help="augmented shardwise.tables/v1 file")
    augment.add_argument("--dims", type=int, nargs="+", default=list(DIMS), help="dims every table gets")
    augment.add_argument("--halvings", type=int, default=1, help="column halvings per table")
    augment.add_argument("--pooling-resamples", type=int, default=1, help="pooling-resampled copies per table")
    augment.set_defaults(handler=_cmd_augment)


def _cmd_train_policy(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from shardwise.integrations.mlflow import load_cost_model
    from shardwise.search.policy_common import (
        load_policy,
        log_policy,
        mean_plan_cost,
        policy_searcher,
        registered_policy_name,
        sample_training_tasks,
        train_policy,
    )
    from shardwise.workload.tableset import load_tables

    cost_model = load_cost_model(args.model, tracking_uri=args.tracking_uri)
    tables = load_tables(args.tables)
    shape = {"min_tables": args.min_tables, "max_tables": args.max_tables, "num_devices": args.num_devices,
             "memory_slack": args.memory_slack}
    try:
        tasks = sample_training_tasks(tables, args.num_tasks, args.seed, **shape)
        # validation tasks come from another seed: the alias goes to the policy that plans them best
        validation = sample_training_tasks(tables, args.validation_tasks, args.seed + 1, **shape)
    except ValueError as err:
        raise CliError(str(err)) from None
    policy, history = train_policy(args.method, cost_model, tasks, args.seed, episodes=args.episodes)
    out = Path(args.out)
    policy.save(out / "policy")
    (out / "history.json").write_text(json.dumps(history, indent=1))
    cost = mean_plan_cost(policy_searcher(args.method, policy=policy), validation, cost_model)
    print(f"{args.method}: validation plan cost {cost:.4f} x (sum of table costs / devices) on "
          f"{len(validation)} tasks; wrote {out / 'policy'}")
    champion_cost = None
    if not args.no_register:
        name = registered_policy_name(args.method, cost_model.hardware_kind)
        try:
            champion = load_policy(f"models:/{name}@champion", tracking_uri=args.tracking_uri)
            champion_cost = mean_plan_cost(policy_searcher(args.method, policy=champion), validation, cost_model)
        except Exception:  # no champion yet (or an unreadable one): the new policy takes the alias
            champion_cost = None
    logged = log_policy(
        policy, history, params={"method": args.method, "model": args.model, "tables": args.tables,
                                 "num_tasks": args.num_tasks, "seed": args.seed, "episodes": args.episodes, **shape},
        validation_cost=cost, tracking_uri=args.tracking_uri, register=not args.no_register,
        champion_cost=champion_cost,
    )
    if logged.name:
        print(f"registered {logged.name} version {logged.version} as @{logged.alias}"
              + (f" (champion's validation cost {champion_cost:.4f})" if champion_cost is not None else ""))
    return 0


def _add_policy_verbs(verbs: argparse._SubParsersAction) -> None:
    """`train-policy`: train a DreamShard or AutoShard placement policy against a cost model; log it to MLflow."""
    train = verbs.add_parser("train-policy", help="train a DreamShard/AutoShard placement policy on sampled tasks")
    train.add_argument("--method", required=True, choices=["dreamshard", "autoshard"])
    train.add_argument("--model", required=True, help="cost model: directory, models:/<name>@<alias> or runs:/...")
    train.add_argument("--tables", required=True, help="shardwise.tables/v1 file to sample training tasks from")
    train.add_argument("--num-tasks", type=int, default=40, help="training tasks")
    train.add_argument("--validation-tasks", type=int, default=8, help="tasks that decide the registry alias")
    train.add_argument("--min-tables", type=int, default=20)
    train.add_argument("--max-tables", type=int, default=60)
    train.add_argument("--num-devices", type=int, default=4)
    train.add_argument("--memory-slack", type=float, default=1.5)
    train.add_argument("--episodes", type=int, default=200, help="batches of rollouts to train on")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", required=True, help="directory for policy/ and history.json")
    train.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, "
                       "else sqlite:///mlflow.db)")
    train.add_argument("--no-register", action="store_true", help="log the run but do not register the policy")
    train.set_defaults(handler=_cmd_train_policy)


def _registry_reachable(tracking_uri: str) -> bool:
    """False for an embedded sqlite registry that does not exist yet (looking would create it)."""
    from pathlib import Path

    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///")).is_file()
    return True


def _plan_cost_model(args: argparse.Namespace, required: bool):  # type: ignore[no-untyped-def]
    """The cost model for `plan` and its URI: --model, else this hardware's champion; (None, None) if optional."""
    from shardwise.integrations.mlflow import default_model_uri, load_cost_model, resolve_tracking_uri
    from shardwise.profiling.hardware import hardware_kind

    tracking_uri = resolve_tracking_uri(args.tracking_uri)
    if args.model:
        try:
            return load_cost_model(args.model, tracking_uri=tracking_uri, device=args.device or "cpu"), args.model
        except Exception as err:  # MLflow and file errors alike: name the URI, keep the cause
            raise CliError(f"--model {args.model}: cannot load the cost model: {err}") from None
    uri = default_model_uri(hardware_kind(args.device))
    how = (
        f"no cost model: {uri} is not in the registry at {tracking_uri}. Get one with `make run` (the local "
        "pipeline) or `shardwise profile ... && shardwise pretrain --data costs.parquet --out MODEL_DIR`, "
        "then pass --model MODEL_DIR or models:/<name>@champion"
    )
    if not _registry_reachable(tracking_uri):
        if required:
            raise CliError(how)
        return None, None
    try:
        return load_cost_model(uri, tracking_uri=tracking_uri, device=args.device or "cpu"), uri
    except Exception as err:  # no registered model / alias: the same advice, whatever MLflow raised
        if required:
            raise CliError(f"{how} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
        return None, None


def _cmd_plan(args: argparse.Namespace) -> int:
    from shardwise.search import (
        MODEL_METHODS,
        POLICY_METHODS,
        PlanError,
        format_plan,
        make_searcher,
        save_plan,
    )
    from shardwise.workload import load_task

    task = load_task(args.task)
    options: dict[str, object] = {}
    if args.method == "neuroshard":
        options = {"beam_width": args.beam_width, "num_candidates": args.num_candidates,
                   "max_depth": args.max_depth, "time_budget_s": args.time_budget_s}
    elif args.method in POLICY_METHODS:
        options = {"policy": args.policy, "samples": args.samples, "tracking_uri": args.tracking_uri}
    model, model_uri = _plan_cost_model(args, required=args.method in MODEL_METHODS)
    if model is None:
        print("shardwise plan: no cost model found, predicted costs are not shown (pass --model)", file=sys.stderr)
    elif model.batch_size != task.batch_size:
        print(
            f"shardwise plan: note: the cost model was profiled at batch {model.batch_size}, the task's batch is "
            f"{task.batch_size}; predicted ms are at the model's batch size",
            file=sys.stderr,
        )
    try:
        searcher = make_searcher(args.method, **options)
        plan = searcher.search(task, model, args.seed)
    except (PlanError, ValueError) as err:
        raise CliError(f"{args.task}: {err}") from None
    if model_uri:
        provenance = {**plan.extra.get("provenance", {}), "cost_model_uri": model_uri}
        plan = plan.model_copy(update={"extra": {**plan.extra, "provenance": provenance}})
    save_plan(plan, args.out)
    print(format_plan(plan))
    print(f"wrote {args.out}")
    return 0


def _add_plan_verbs(verbs: argparse._SubParsersAction) -> None:
    """`plan`: a memory-safe sharding plan for a task, by NeuroShard or a baseline."""
    from shardwise.search import METHODS, POLICY_METHODS

    plan = verbs.add_parser("plan", help="plan a task: NeuroShard (cost model) or a baseline -> shardwise.plan/v1")
    plan.add_argument("--task", required=True, help="shardwise.task/v1 JSON file")
    plan.add_argument("--method", default="neuroshard", choices=[*METHODS, *POLICY_METHODS])
    plan.add_argument("--model", default=None, help="cost model: directory, models:/<name>@<alias> or runs:/... "
                      "(default: models:/shardwise-cost-<hardware kind>@champion)")
    plan.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, "
                      "else sqlite:///mlflow.db)")
    plan.add_argument("--device", default=None, help="hardware the plan is for (cpu, cuda): picks the default "
                      "cost model (default: cuda if available)")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--out", required=True, help="where to write the plan (shardwise.plan/v1 JSON)")
    neuro = plan.add_argument_group("neuroshard")
    neuro.add_argument("--beam-width", type=int, default=2)
    neuro.add_argument("--num-candidates", type=int, default=2, help="largest and costliest tables tried per step")
    neuro.add_argument("--max-depth", type=int, default=3, help="column splits explored")
    neuro.add_argument("--time-budget-s", type=float, default=None, help="stop widening the beam after this")
    policy = plan.add_argument_group("dreamshard / autoshard")
    policy.add_argument("--policy", default=None, help="trained policy: directory or models:/<name>@<alias>")
    policy.add_argument("--samples", type=int, default=0, help="sampled rollouts besides the greedy one")
    plan.set_defaults(handler=_cmd_plan)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every verb."""
    parser = argparse.ArgumentParser(
        prog="shardwise",
        description=(
            "Shard DLRM embedding tables across devices with a cost model pre-trained on real fbgemm "
            "kernels: profile -> augment -> pretrain -> plan -> evaluate."
        ),
    )
    parser.add_argument("--version", action="version", version=f"shardwise {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    task = verbs.add_parser("task", help="inspect sharding task files (shardwise.task/v1)")
    task_verbs = task.add_subparsers(dest="task_verb", metavar="ACTION", required=True)
    check = task_verbs.add_parser("check", help="validate a task file and print a summary")
    check.add_argument("file", help="path to a shardwise.task/v1 JSON file")
    check.set_defaults(handler=_cmd_task_check)

    # one `_add_<step>_verbs(verbs)` per step, each with its handlers (thin calls into the library)
    # in the order of the method: workload -> profile -> pretrain -> plan -> evaluate, then the pipeline
    _add_workload_verbs(verbs)
    _add_profile_verbs(verbs)
    _add_pretrain_verbs(verbs)
    _add_policy_verbs(verbs)
    _add_plan_verbs(verbs)
    _add_evaluation_verbs(verbs)
    _add_pipeline_verbs(verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `shardwise` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from shardwise.workload import TaskError

    try:
        return int(args.handler(args) or 0)
    except (CliError, TaskError, FileNotFoundError) as err:
        print(f"shardwise {args.verb}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
