"""One Kubeflow component per step of the method; each is a thin call into a job (`shardwise.jobs`).

Lightweight Python components: KFP embeds each function's source in the compiled YAML and runs it in IMAGE
(which has shardwise installed, so `install_kfp_package=False`); `kfp.local` runs the same source in the current
environment. Component bodies build a job's settings from typed parameters and artifact paths and call the job;
the work is in the job. Jobs import no kfp: in a step's container KFP sets _KFP_RUNTIME=true, and kfp.dsl then
lacks the pipeline-building API.
"""

# No `from __future__ import annotations`: KFP reads the component signatures' types at import time.

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from shardwise.version import __version__

# The project's image (Dockerfile); set explicitly on every component so no step runs on a default image.
IMAGE = f"ghcr.io/shardwise/shardwise:{__version__}"
# The components, in pipeline order (components/<name>.yaml holds each one compiled).
STEPS = (
    "make_workload",
    "augment_tables",
    "worker_slices",
    "profile_costs",
    "profile_all_to_alls",
    "pretrain_cost_model",
    "make_task",
    "search_plan",
    "train_policies",
    "evaluate_plans",
    "publish_plans",
)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def make_workload(
    tables: str,
    num_tables: int,
    row_scale: float,
    batch_size: int,
    holdout_fraction: float,
    seed: int,
    workload: Output[Dataset],
    train_tables: Output[Dataset],
    holdout_tables: Output[Dataset],
):
    """The user's tables (`tables`: a tables file or a DLRM dataset file, a path or s3://bucket/key) or, when it is
    "", synthetic DLRM tables; split into tables the cost model trains on and held-out tables."""
    import shutil

    from shardwise.jobs import workload as job

    result = job.build(job.WorkloadSettings(tables=tables, num_tables=num_tables, row_scale=row_scale,
                                            batch_size=batch_size, holdout_fraction=holdout_fraction, seed=seed,
                                            out=workload.path))
    print(result.summary())
    shutil.copyfile(result.split.train_path, train_tables.path)
    shutil.copyfile(result.split.holdout_path, holdout_tables.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def augment_tables(tables: Input[Dataset], seed: int, augmented: Output[Dataset]):
    """More training tables: other dims, column halves, resampled pooling."""
    from shardwise.jobs import workload as job

    print(job.augment(job.AugmentSettings(tables=tables.path, seed=seed, out=augmented.path)).summary())


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def worker_slices(workers: int) -> list[int]:
    """The profiling workers' indices 0 .. workers-1: the items the profiling fan-out loops over."""
    if workers < 1:
        raise ValueError(f"profile_workers {workers}: at least 1 profiling worker")
    return list(range(workers))


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def profile_costs(
    tables: Input[Dataset],
    holdout_tables: Input[Dataset],
    num_shards: int,
    holdout_shards: int,
    data_parallel_shards: int,
    row_wise_shards: int,
    max_tables: int,
    repeats: int,
    timing_iters: int,
    budget_s: float,
    seed: int,
    device: str,
    worker: int,
    workers: int,
    dataset_uri: str,
    profile_store: str,
    costs: Output[Dataset],
) -> str:
    """One worker's slice of the kernel profile (shards of the training tables, the first `data_parallel_shards` of
    them also as data-parallel tables' dense kernels and the first `row_wise_shards` as row-wise tables' row blocks,
    and shards of the held-out tables alone) on this node's GPU, for at most `budget_s` seconds past their floor
    (0: all of them), into `dataset_uri` (an object-store prefix every run adds to) or, when it is "", into this
    step's own dataset: with `profile_store` (a local run's directory), copied from the store's dataset of these
    settings, which a rerun resumes and adds to; returns the hardware kind."""
    import shutil

    from shardwise.jobs import profile as job

    settings = job.ProfileJobSettings(tables=tables.path, out=dataset_uri or costs.path, num_shards=num_shards,
                                      comm_layouts=0, data_parallel_shards=data_parallel_shards,
                                      row_wise_shards=row_wise_shards, max_tables=max_tables,
                                      repeats=repeats, timing_iters=timing_iters, budget_s=budget_s or None,
                                      seed=seed, device=device, worker=worker, workers=workers)
    store = None if dataset_uri or not profile_store else job.resume_directory(
        profile_store, settings, holdout_tables.path, holdout_shards)
    if store is not None:
        settings = settings.model_copy(update={"out": str(store)})
    result = job.run_apart(settings, holdout_tables.path, holdout_shards)
    if store is not None:  # this run's artifact: the store's rows as they are now (later runs add to the store)
        shutil.copytree(store, costs.path, dirs_exist_ok=True)
    out = settings.out if store is None else costs.path
    print(result.summary())
    costs.metadata.update({"hardware_kind": result.hardware_kind, "dataset": out, "profiled_shards": result.shards,
                           "profile_shards_left": result.shards_left, "profile_s": round(result.elapsed_s, 1)})
    return result.hardware_kind


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def profile_all_to_alls(
    tables: Input[Dataset],
    comm_layouts: int,
    num_devices: int,
    seed: int,
    device: str,
    dataset_uri: str,
    costs: Output[Dataset],
) -> str:
    """All-to-all layouts over 2, 4, ... up to `num_devices` ranks (the GPUs this step is given; processes on
    CPU), into `dataset_uri` or this step's own dataset; returns the hardware kind."""
    from shardwise.jobs import profile as job

    out = dataset_uri or costs.path
    result = job.run(job.ProfileJobSettings(tables=tables.path, out=out, num_shards=0, comm_layouts=comm_layouts,
                                            max_devices=num_devices if num_devices > 1 else None, seed=seed,
                                            device=device))
    print(result.summary())
    costs.metadata.update({"hardware_kind": result.hardware_kind, "dataset": out})
    return result.hardware_kind


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def pretrain_cost_model(
    costs: Input[list[Dataset]],
    comm_costs: Input[Dataset],
    dataset_uri: str,
    holdout_tables: Input[Dataset],
    seed: int,
    epochs: int,
    patience: int,
    pipeline_run_id: str,
    model: Output[Model],
    metrics: Output[Metrics],
):
    """Train the cost model on the training tables' shards (every profiling worker's, or the whole history at
    `dataset_uri`), evaluate it on the held-out tables' shards, register it in MLflow (the promotion gate decides
    on `champion`)."""
    from shardwise.jobs import pretrain as job
    from shardwise.pipelines.artifacts import write_metadata

    data = (dataset_uri,) if dataset_uri else (*(c.path for c in costs), comm_costs.path)
    settings = job.PretrainSettings(data=data, holdout_tables=holdout_tables.path, out=model.path, seed=seed,
                                    pipeline_run_id=pipeline_run_id)
    # 0: training's own default
    settings = settings.model_copy(update={k: v for k, v in {"epochs": epochs, "patience": patience}.items() if v > 0})
    result = job.run(settings)
    print(result.summary())
    for name, value in {"train_shards": result.train_shards, "heldout_sources": result.heldout_sources,
                        **result.metrics}.items():
        metrics.log_metric(name, float(value))
    if result.run_id:
        model.metadata["mlflow_run_id"] = result.run_id
    if result.registered_name:  # the version this run registered, as the registry names it
        model.metadata["registered_model_uri"] = f"models:/{result.registered_name}/{result.registered_version}"
    write_metadata(metrics)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def make_task(
    tables: Input[Dataset],
    num_tables: int,
    num_devices: int,
    memory_slack: float,
    seed: int,
    task: Output[Dataset],
):
    """A sharding task over held-out tables (the cost model never saw them)."""
    from shardwise.jobs import workload as job

    print(job.task(job.TaskSettings(tables=tables.path, num_tables=num_tables, num_devices=num_devices,
                                    memory_slack=memory_slack, seed=seed, out=task.path)).summary())


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def search_plan(
    task: Input[Dataset],
    method: str,
    model_alias: str,
    hardware_kind: str,
    plan: Output[Dataset],
    plan_table: Output[Markdown],
    model: Input[Model] = None,
):
    """Search a plan; with a model alias the registered model `shardwise-cost-<hardware>@alias` is used. The plan
    file, and its per-device table as Markdown (readable in the Kubeflow UI)."""
    from shardwise.jobs import plan as job
    from shardwise.jobs.models import registered_model_uri

    uri = registered_model_uri(hardware_kind, model_alias) if model_alias else (
        model.path if model is not None else None)
    result = job.run(job.PlanSettings(task=task.path, method=method, model=uri, out=plan.path))
    print(result.summary())
    plan.metadata["method"] = method
    with open(plan_table.path, "w") as out:
        out.write(result.markdown())


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def train_policies(
    tables: Input[Dataset],
    task: Input[Dataset],
    plan: Input[Dataset],
    model: Input[Model],
    model_alias: str,
    hardware_kind: str,
    num_tasks: int,
    episodes: int,
    seed: int,
    policies: Output[Artifact],
    predicted: Output[Metrics],
):
    """Train every placement policy (DreamShard, AutoShard) on tasks sampled from the training tables against the
    cost model the plan step used, and register each (the promotion gate decides on `champion`), so `shardwise
    plan --method dreamshard|autoshard` works after the run; plan the task with each, and log their plans'
    predicted cost beside the searched plan's (the same cost model's ms). `episodes` 0: no policies."""
    import os

    from shardwise.jobs import plan as plan_job
    from shardwise.jobs import train_policy as job
    from shardwise.jobs.models import registered_model_uri
    from shardwise.pipelines.artifacts import write_metadata
    from shardwise.search import load_plan

    uri = registered_model_uri(hardware_kind, model_alias) if model_alias else model.path
    searched = load_plan(plan.path)
    predicted.log_metric(f"{searched.method}_predicted_ms", float(searched.extra["predicted"]["max_cost_ms"]))
    methods = job.policy_methods() if episodes > 0 else ()
    for method in methods:
        out = os.path.join(policies.path, method)
        trained = job.run(job.TrainPolicySettings(method=method, model=uri, tables=tables.path, out=out,
                                                  num_tasks=num_tasks, episodes=episodes, seed=seed))
        print(trained.summary())
        planned = plan_job.run(plan_job.PlanSettings(task=task.path, method=method, model=uri, seed=seed,
                                                     out=os.path.join(out, "plan.json"),
                                                     options={"policy": trained.out}))
        print(planned.summary())
        predicted.log_metric(f"{method}_predicted_ms", float(planned.plan.extra["predicted"]["max_cost_ms"]))
    policies.metadata["methods"] = ",".join(methods)
    os.makedirs(policies.path, exist_ok=True)  # none trained (episodes 0): an empty folder, still an artifact
    write_metadata(predicted)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate_plans(
    task: Input[Dataset],
    plan: Input[Dataset],
    baseline_plan: Input[Dataset],
    model: Input[Model],
    model_alias: str,
    hardware_kind: str,
    device: str,
    validate_iters: int,
    refine_rounds: int,
    timing_rounds: int,
    evaluation: Output[Artifact],
    comparison: Output[Metrics],
    report: Output[HTML],
    summary: Output[Markdown],
):
    """Refine the plan on this node (measurement in the loop); measure it, the refined plan and TorchRec's plan in
    one session (same reference, interleaved all-to-alls); train the DLRM under both; compare; report."""
    import json
    import os

    from shardwise.jobs import evaluate, validate
    from shardwise.jobs.models import registered_model_uri
    from shardwise.profiling import MeasurementSettings

    method = plan.metadata.get("method", "plan")
    names = (method, "torchrec") if method != "torchrec" else (method, "torchrec-baseline")
    # the model's reference timing and batch: measure the way the profiler did
    uri = registered_model_uri(hardware_kind, model_alias) if model_alias else model.path
    evaluated = evaluate.run(evaluate.EvaluateSettings(
        task=task.path, plan=(plan.path, baseline_plan.path), name=names, out=evaluation.path, model=uri,
        refine=refine_rounds, measurement=MeasurementSettings(device=device, timing_rounds=timing_rounds),
    ))
    print(evaluated.summary())
    figures = evaluate.versus_baseline(evaluated, names[1])
    if validate_iters > 0:  # end-to-end DLRM throughput of both plans in the same run
        validated = validate.run(validate.ValidateSettings(
            task=task.path, plan=plan.path, compare=(baseline_plan.path,), iters=validate_iters, device=device,
            out=os.path.join(evaluation.path, "validate.json"),
        ))
        print(validated.summary())
        figures |= validate.versus_baseline(validated)
    for key, value in figures.items():
        comparison.log_metric(key, value)
    with open(os.path.join(evaluation.path, "summary.json"), "w") as out:
        json.dump({"method": method, **figures}, out, indent=1)
    with open(report.path, "w") as out:
        out.write(evaluate.comparison_page(method, figures, evaluated))
    with open(summary.path, "w") as out:
        out.write(evaluate.comparison_markdown(method, figures))


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def publish_plans(
    production_tasks: str,
    model: Input[Model],
    model_alias: str,
    hardware_kind: str,
    device: str,
    num_devices: int,
    refine_s: float,
    timing_rounds: int,
    seed: int,
    published: Output[Artifact],
    summary: Output[Markdown],
):
    """Plan each production task (`production_tasks`: comma-separated export_task files, paths or s3://bucket/key)
    with the cost model the plan step used, measure the plan beside the task's champion plan and TorchRec's
    planner's on this node, register it as `shardwise-plan-<task>` (the gate decides on `champion`): `shardwise
    publish`. `num_devices` is the step's GPU count (an input so that the compiler hands it to the step's condition
    group; the job refuses a task with more ranks than GPUs). Each plan is refined on this node for `refine_s`
    seconds (0: not refined). `published` holds each task's files and publish.json (the job's result); `summary` its
    Markdown, each task's plan against TorchRec's planner's first."""
    import json
    import os

    from shardwise.jobs import publish as job
    from shardwise.jobs.models import registered_model_uri
    from shardwise.profiling import MeasurementSettings

    uri = registered_model_uri(hardware_kind, model_alias) if model_alias else model.path
    result = job.run(job.PublishSettings(
        task=tuple(location.strip() for location in production_tasks.split(",")), model=uri, out=published.path,
        seed=seed, refine_s=refine_s,
        measurement=MeasurementSettings(device=device, timing_rounds=timing_rounds),
    ), progress=False)
    print(result.summary())
    os.makedirs(published.path, exist_ok=True)
    with open(os.path.join(published.path, "publish.json"), "w") as out:
        json.dump(result.to_json(), out, indent=1)
    published.metadata["plans"] = ",".join(f"{t.registered_name}/{t.version}" for t in result.tasks if t.version)
    with open(summary.path, "w") as out:
        out.write(result.markdown())
