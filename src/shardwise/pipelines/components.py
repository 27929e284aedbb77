"""One Kubeflow component per step of the method; each is a thin call into the `shardwise` command.

Lightweight Python components: KFP embeds each function's source in the compiled YAML and runs it in
IMAGE (which has shardwise installed, so `install_kfp_package=False`); `kfp.local` runs the same source in
the current environment. Component bodies only turn typed artifacts into CLI flags (helpers in steps.py,
which imports no kfp): the work is in the CLI.
"""

# No `from __future__ import annotations`: KFP reads the component signatures' types at import time.
from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output

from shardwise import __version__

# The project's image (Dockerfile); set explicitly on every component so no step runs on a default image.
IMAGE = f"ghcr.io/shardwise/shardwise:{__version__}"
# The components, in pipeline order (components/<name>.yaml holds each one compiled).
STEPS = (
    "synth_workload",
    "augment_tables",
    "profile_costs",
    "pretrain_cost_model",
    "make_task",
    "search_plan",
    "evaluate_plans",
)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def synth_workload(
    num_tables: int,
    row_scale: float,
    batch_size: int,
    holdout_fraction: float,
    seed: int,
    workload: Output[Dataset],
    train_tables: Output[Dataset],
    holdout_tables: Output[Dataset],
):
    """Synthetic DLRM tables, split into tables the cost model trains on and held-out tables."""
    import os

    from shardwise.pipelines.steps import copy_file, run_step

    run_step(["workload", "synth", "--num-tables", str(num_tables), "--row-scale", str(row_scale),
              "--batch-size", str(batch_size), "--seed", str(seed), "--out", workload.path])
    split_dir = os.path.join(workload.path, "split")
    run_step(["workload", "split", "--tables", os.path.join(workload.path, "tables.json"),
              "--holdout-fraction", str(holdout_fraction), "--seed", str(seed), "--out", split_dir])
    copy_file(os.path.join(split_dir, "train.json"), train_tables.path)
    copy_file(os.path.join(split_dir, "holdout.json"), holdout_tables.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def augment_tables(tables: Input[Dataset], seed: int, augmented: Output[Dataset]):
    """More training tables: other dims, column halves, resampled pooling."""
    from shardwise.pipelines.steps import run_step

    run_step(["augment", "--tables", tables.path, "--seed", str(seed), "--out", augmented.path])


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def profile_costs(
    tables: Input[Dataset],
    holdout_tables: Input[Dataset],
    num_shards: int,
    holdout_shards: int,
    comm_layouts: int,
    max_tables: int,
    repeats: int,
    seed: int,
    device: str,
    costs: Output[Dataset],
) -> str:
    """Measure shards of the training tables, shards of the held-out tables alone, and all-to-alls on this
    node's hardware, into one dataset; returns its hardware kind."""
    from shardwise.pipelines.steps import profile_argvs, run_step
    from shardwise.profiling.hardware import hardware_kind

    for argv in profile_argvs(tables.path, holdout_tables.path, costs.path, num_shards=num_shards,
                              holdout_shards=holdout_shards, comm_layouts=comm_layouts, max_tables=max_tables,
                              repeats=repeats, seed=seed, device=device):
        run_step(argv)
    kind = hardware_kind(device)
    costs.metadata["hardware_kind"] = kind
    return kind


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def pretrain_cost_model(
    costs: Input[Dataset],
    holdout_tables: Input[Dataset],
    seed: int,
    epochs: int,
    model: Output[Model],
    metrics: Output[Metrics],
):
    """Train the cost model on the training tables' shards, evaluate it on the held-out tables' shards, register
    it in MLflow (the promotion gate decides on `champion`)."""
    import os

    from shardwise.pipelines.steps import evaluation_metrics, run_step, training_size_metrics

    argv = ["pretrain", "--data", costs.path, "--holdout-tables", holdout_tables.path, "--out", model.path,
            "--seed", str(seed)]
    if epochs > 0:
        argv += ["--epochs", str(epochs)]
    run_step(argv)
    for name, value in training_size_metrics(model.path).items():
        metrics.log_metric(name, value)
    table = os.path.join(model.path, "evaluation.csv")
    if os.path.exists(table):
        for name, value in evaluation_metrics(table).items():
            metrics.log_metric(name, value)


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
    from shardwise.pipelines.steps import run_step

    run_step(["workload", "task", "--tables", tables.path, "--num-tables", str(num_tables),
              "--num-devices", str(num_devices), "--memory-slack", str(memory_slack), "--seed", str(seed),
              "--out", task.path])


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def search_plan(
    task: Input[Dataset],
    method: str,
    model_alias: str,
    hardware_kind: str,
    plan: Output[Dataset],
    model: Input[Model] = None,
):
    """Search a plan; with a model alias the registered model `shardwise-cost-<hardware>@alias` is used."""
    from shardwise.pipelines.steps import model_ref, run_step

    argv = ["plan", "--task", task.path, "--method", method, "--out", plan.path]
    ref = model_ref(model_alias, hardware_kind, model.path if model is not None else None)
    if ref:
        argv += ["--model", ref]
    run_step(argv)
    plan.metadata["method"] = method


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
    evaluation: Output[Artifact],
    comparison: Output[Metrics],
    report: Output[HTML],
):
    """Measure the plan and TorchRec's plan on this node in one session (same reference, interleaved
    all-to-alls); compare; report."""
    import json
    import os

    from shardwise.pipelines import steps

    method = plan.metadata.get("method", "plan")
    names = steps.plan_names(method)
    # the model's reference timing and batch: measure the way the profiler did
    ref = steps.model_ref(model_alias, hardware_kind, model.path)
    argv = ["evaluate", "--task", task.path, "--plan", plan.path, "--name", names[0],
            "--plan", baseline_plan.path, "--name", names[1], "--out", evaluation.path, "--device", device]
    steps.run_step(argv + (["--model", ref] if ref else []))
    docs, reports = steps.load_evaluation(evaluation.path, names)
    result = steps.comparison(docs[names[0]], docs[names[1]])
    if validate_iters > 0:
        # end-to-end DLRM throughput of both plans in the same run
        validated = os.path.join(evaluation.path, "validate.json")
        steps.run_step(["validate", "--task", task.path, "--plan", plan.path, "--compare", baseline_plan.path,
                        "--iters", str(validate_iters), "--device", device, "--out", validated])
        result |= steps.throughput_comparison(validated)
    for key, value in result.items():
        comparison.log_metric(key, value)
    with open(os.path.join(evaluation.path, "summary.json"), "w") as out:
        json.dump({"method": method, **result}, out, indent=1)
    with open(report.path, "w") as out:
        out.write(steps.comparison_html(method, result, docs, reports))
