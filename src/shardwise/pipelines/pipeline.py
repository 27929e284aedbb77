"""The shardwise pipeline: workload (the user's tables, or synthetic ones) -> augment -> profile (K GPU pods in
parallel) + all-to-alls (GPUs of one node) -> pretrain -> task -> plan x2 -> evaluate (GPU) -> publish (GPU: the
user's production tasks planned, measured and registered, where the run names any), and the placement policies
trained against the cost model.

The held-out tables of the workload split go three ways: the profile step measures shards built only from them
(besides the training tables' shards), pretrain evaluates on those shards, and the task is drawn from them.

The same definition runs on a Kubeflow cluster (compiled YAML) and locally through `kfp.local`. The
Kubernetes settings (accelerators, tolerations, node selector, secrets, config maps) live in the compiled
platform spec, which `kfp.local` does not read: locally they are harmless, and the environment (for
example MLFLOW_TRACKING_URI) is inherited from the calling process instead.
"""

# No `from __future__ import annotations`: KFP reads the pipeline signature's types at import time.
from typing import Any

from kfp import dsl, kubernetes
from kfp.dsl.graph_component import GraphComponent

from shardwise.pipelines.components import (
    IMAGE,
    augment_tables,
    evaluate_plans,
    make_task,
    make_workload,
    pretrain_cost_model,
    profile_all_to_alls,
    profile_costs,
    publish_plans,
    search_plan,
    train_policies,
    worker_slices,
)
from shardwise.pipelines.params import DEFAULTS

PIPELINE_NAME = "shardwise"
# What the cluster provides (manifests/ creates them): S3 credentials and MLflow/S3 endpoints.
SECRET_NAME = "shardwise-s3"
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
CONFIG_MAP_NAME = "shardwise-config"
CONFIG_MAP_KEYS = ("MLFLOW_TRACKING_URI", "MLFLOW_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")
#: the label that admits a pod to MLflow (manifests/networkpolicy.yaml): every pipeline step carries it
MLFLOW_CLIENT_LABEL = "shardwise.io/mlflow-client"
#: the image's non-root user (Dockerfile)
IMAGE_UID = 10001
GPU_RESOURCE = "nvidia.com/gpu"
# The label NVIDIA's GPU feature discovery puts on nodes, e.g. "NVIDIA-H100-80GB-HBM3".
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

__all__ = [
    "CONFIG_MAP_KEYS",
    "CONFIG_MAP_NAME",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "IMAGE",
    "IMAGE_UID",
    "MLFLOW_CLIENT_LABEL",
    "PIPELINE_NAME",
    "SECRET_KEYS",
    "SECRET_NAME",
    "build_pipeline",
]


def _with_cluster_settings(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """S3 credentials from the secret, MLflow and S3 endpoints from the config map, the label the MLflow network
    policy admits, and the image's non-root user (the compiler adds no privilege escalation, drop ALL)."""
    kubernetes.add_pod_label(task, label_key=MLFLOW_CLIENT_LABEL, label_value="true")
    kubernetes.set_security_context(task, run_as_user=IMAGE_UID, run_as_non_root=True)
    kubernetes.use_secret_as_env(task, secret_name=SECRET_NAME, secret_key_to_env={k: k for k in SECRET_KEYS})
    kubernetes.use_config_map_as_env(
        task, config_map_name=CONFIG_MAP_NAME, config_map_key_to_env={k: k for k in CONFIG_MAP_KEYS}
    )
    return task


def _on_gpu(task: dsl.PipelineTask, count: Any, gpu_product: str | None) -> dsl.PipelineTask:
    """Ask for `count` GPUs on one node, tolerate GPU taints, optionally pin to one GPU product; a memory-backed
    /dev/shm, since NCCL's all-to-alls between the GPUs of a pod overflow the container default of 64 MiB."""
    task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(count)
    kubernetes.add_toleration(task, key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    if gpu_product:
        kubernetes.add_node_selector(task, label_key=GPU_PRODUCT_LABEL, label_value=gpu_product)
    return task


#: CPU and memory per step: requests, so steps on GPU nodes are not best-effort pods (noisy timings, first to be
#: evicted), and a memory limit twice the request
STEP_RESOURCES = {
    "workload": ("1", "2G"), "augment": ("1", "2G"), "workers": ("1", "1G"), "profile": ("8", "32G"),
    "pretrain": ("4", "8G"),
    "task": ("1", "1G"), "plan": ("2", "4G"), "train": ("2", "4G"), "evaluate": ("8", "32G"),
    "publish": ("8", "32G"),
}


def _sized(task: dsl.PipelineTask, step: str) -> dsl.PipelineTask:
    """`task` named `step`, with its CPU and memory requests (and steps that talk to MLflow retried once)."""
    cpu, memory = STEP_RESOURCES[step.split("-")[0]]
    limit = f"{2 * int(memory.removesuffix('G'))}G"
    task.set_display_name(step).set_cpu_request(cpu).set_memory_request(memory).set_memory_limit(limit)
    if step.split("-")[0] in ("pretrain", "plan", "train"):
        task.set_retry(num_retries=1)  # a registry call that meets a restarting MLflow server
    return task


def _data_steps(
    tables: Any, num_tables: Any, row_scale: Any, batch_size: Any, holdout_fraction: Any, seed: Any
) -> tuple[dsl.PipelineTask, dsl.PipelineTask]:
    """The workload (its training and held-out tables) and the training tables augmented."""
    workload = _sized(_with_cluster_settings(
        make_workload(
            tables=tables,
            num_tables=num_tables,
            row_scale=row_scale,
            batch_size=batch_size,
            holdout_fraction=holdout_fraction,
            seed=seed,
        )
    ), "workload")
    augment = _sized(_with_cluster_settings(
        augment_tables(tables=workload.outputs["train_tables"], seed=seed)
    ), "augment")
    return workload, augment


def _kernel_profile_steps(
    workload: dsl.PipelineTask, augment: dsl.PipelineTask, gpu_product: str | None, *, workers: Any,
    num_shards: Any, holdout_shards: Any, data_parallel_shards: Any, row_wise_shards: Any, max_tables: Any,
    repeats: Any, timing_iters: Any, budget_s: Any, seed: Any, device: Any, dataset_uri: Any, profile_store: str,
) -> dsl.PipelineTask:
    """The kernel profiling step, one pod of one GPU per worker (the step inside the fan-out)."""
    # kernel profiling fans out over profile_workers pods of one GPU each, every one its slice of the shards
    slices = _sized(_with_cluster_settings(worker_slices(workers=workers)), "workers")
    with dsl.ParallelFor(items=slices.output) as worker:
        profile = _sized(_on_gpu(
            _with_cluster_settings(
                profile_costs(
                    tables=augment.outputs["augmented"],
                    holdout_tables=workload.outputs["holdout_tables"],
                    num_shards=num_shards,
                    holdout_shards=holdout_shards,
                    data_parallel_shards=data_parallel_shards,
                    row_wise_shards=row_wise_shards,
                    max_tables=max_tables,
                    repeats=repeats,
                    timing_iters=timing_iters,
                    budget_s=budget_s,
                    seed=seed,
                    device=device,
                    worker=worker,
                    workers=workers,
                    dataset_uri=dataset_uri,
                    profile_store=profile_store,
                )
            ),
            1,
            gpu_product,
        ), "profile")
    return profile


def _all_to_all_step(
    augment: dsl.PipelineTask, gpu_product: str | None, *, comm_layouts: Any, num_devices: Any, seed: Any,
    device: Any, dataset_uri: Any,
) -> dsl.PipelineTask:
    """The all-to-all profiling step, on the GPUs of one node."""
    # all-to-alls span the GPUs of one node: their own step, on the task's device count (with one GPU,
    # profiling stops at "max_devices must be >= 2")
    return _sized(_on_gpu(
        _with_cluster_settings(
            profile_all_to_alls(
                tables=augment.outputs["augmented"],
                comm_layouts=comm_layouts,
                num_devices=num_devices,
                seed=seed,
                device=device,
                dataset_uri=dataset_uri,
            )
        ),
        num_devices,
        gpu_product,
    ), "profile-comm")


def _pretrain_step(
    workload: dsl.PipelineTask, profile: dsl.PipelineTask, comm: dsl.PipelineTask, reuse_measurements: bool, *,
    dataset_uri: Any, seed: Any, epochs: Any, patience: Any,
) -> dsl.PipelineTask:
    """The cost model pre-trained on every profiling worker's costs and the all-to-alls'."""
    return _sized(_with_cluster_settings(
        pretrain_cost_model(
            costs=dsl.Collected(profile.outputs["costs"]),
            comm_costs=comm.outputs["costs"],
            dataset_uri=dataset_uri,
            holdout_tables=workload.outputs["holdout_tables"],
            seed=seed,
            epochs=epochs,
            patience=patience,
            # KFP's id of this run, tagged on the MLflow run: the UI's run and the model's run find each other.
            # Not in a local run, whose id means nothing outside it and changes with every rerun: it is in the
            # step's cache key, so a rerun would train and register again what the killed run finished
            pipeline_run_id="" if reuse_measurements else dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        )
    ), "pretrain")


def _plan_steps(
    workload: dsl.PipelineTask, comm: dsl.PipelineTask, pretrain: dsl.PipelineTask, *, task_num_tables: Any,
    num_devices: Any, memory_slack: Any, seed: Any, search_method: Any, model_alias: Any,
) -> tuple[dsl.PipelineTask, dsl.PipelineTask, dsl.PipelineTask]:
    """The task drawn from the held-out tables, planned with the searched method and with TorchRec's planner."""
    task = _sized(_with_cluster_settings(
        make_task(
            tables=workload.outputs["holdout_tables"],
            num_tables=task_num_tables,
            num_devices=num_devices,
            memory_slack=memory_slack,
            seed=seed,
        )
    ), "task")
    plan = _sized(_with_cluster_settings(
        search_plan(
            task=task.outputs["task"],
            method=search_method,
            model_alias=model_alias,
            hardware_kind=comm.outputs["Output"],
            model=pretrain.outputs["model"],
        )
    ), "plan")
    baseline = _sized(_with_cluster_settings(
        search_plan(
            task=task.outputs["task"],
            method="torchrec",
            model_alias="",
            hardware_kind=comm.outputs["Output"],
        )
    ), "plan-torchrec")
    return task, plan, baseline


def _policies_step(
    workload: dsl.PipelineTask, task: dsl.PipelineTask, plan: dsl.PipelineTask, pretrain: dsl.PipelineTask,
    comm: dsl.PipelineTask, *, model_alias: Any, num_tasks: Any, episodes: Any, seed: Any,
) -> dsl.PipelineTask:
    """The placement policies of the other two methods, trained against the cost model."""
    # the other two methods, ready to plan after the run: their policies learn against the cost model above
    return _sized(_with_cluster_settings(
        train_policies(
            tables=workload.outputs["train_tables"],
            task=task.outputs["task"],
            plan=plan.outputs["plan"],
            model=pretrain.outputs["model"],
            model_alias=model_alias,
            hardware_kind=comm.outputs["Output"],
            num_tasks=num_tasks,
            episodes=episodes,
            seed=seed,
        )
    ), "train-policies")


def _evaluate_step(
    task: dsl.PipelineTask, plan: dsl.PipelineTask, baseline: dsl.PipelineTask, pretrain: dsl.PipelineTask,
    comm: dsl.PipelineTask, gpu_product: str | None, *, model_alias: Any, device: Any, num_devices: Any,
    validate_iters: Any, refine_rounds: Any, timing_rounds: Any,
) -> dsl.PipelineTask:
    """Both plans measured on the task's GPUs (and the searched one refined there)."""
    return _sized(_on_gpu(
        _with_cluster_settings(
            evaluate_plans(
                task=task.outputs["task"],
                plan=plan.outputs["plan"],
                baseline_plan=baseline.outputs["plan"],
                model=pretrain.outputs["model"],
                model_alias=model_alias,
                hardware_kind=comm.outputs["Output"],
                device=device,
                validate_iters=validate_iters,
                refine_rounds=refine_rounds,
                timing_rounds=timing_rounds,
            )
        ),
        num_devices,
        gpu_product,
    ), "evaluate")


def _publish_step(
    evaluate: dsl.PipelineTask, pretrain: dsl.PipelineTask, comm: dsl.PipelineTask, gpu_product: str | None, *,
    production_tasks: Any, model_alias: Any, device: Any, num_devices: Any, refine_s: Any, timing_rounds: Any,
    seed: Any,
) -> dsl.PipelineTask:
    """The production tasks planned with the run's cost model, measured on the evaluate step's hardware, registered."""
    publish = _sized(_on_gpu(
        _with_cluster_settings(
            publish_plans(
                production_tasks=production_tasks,
                model=pretrain.outputs["model"],
                model_alias=model_alias,
                hardware_kind=comm.outputs["Output"],
                device=device,
                # an input of the step, not only its GPU count: the compiler passes the GPU count's value into the
                # condition's group only for a parameter some step in it takes
                num_devices=num_devices,
                refine_s=refine_s,
                timing_rounds=timing_rounds,
                seed=seed,
            )
        ),
        num_devices,
        gpu_product,
    ), "publish")
    # after evaluate: measurement sessions of one run never time kernels against each other on a node
    return publish.after(evaluate)


def build_pipeline(gpu_product: str | None = None, *, reuse_measurements: bool = False,
                   profile_store: str = "") -> GraphComponent:
    """The pipeline function; `gpu_product` (a node label value) pins GPU steps to that product. With
    `reuse_measurements` (a local run resuming in its own work directory), a profiling step that finished with the
    same inputs is taken from the cache like any other step, and pre-training is not tagged with the run's id. With
    `profile_store` (a local directory; a cluster's runs add to `dataset_uri` instead), each profiling worker resumes
    the dataset there of its settings: a rerun adds to what a run its time budget cut short measured."""

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Profile fbgemm kernels, pre-train the cost model, plan with it, measure against TorchRec.",
    )
    # defaults: the `cluster` preset of presets.yaml (the one home of the pipeline's sizes)
    def shardwise_pipeline(
        workload_tables: str = DEFAULTS.workload_tables,
        num_tables: int = DEFAULTS.num_tables,
        row_scale: float = DEFAULTS.row_scale,
        batch_size: int = DEFAULTS.batch_size,
        holdout_fraction: float = DEFAULTS.holdout_fraction,
        task_num_tables: int = DEFAULTS.task_num_tables,
        num_devices: int = DEFAULTS.num_devices,
        memory_slack: float = DEFAULTS.memory_slack,
        profile_num_shards: int = DEFAULTS.profile_num_shards,
        profile_holdout_shards: int = DEFAULTS.profile_holdout_shards,
        profile_comm_layouts: int = DEFAULTS.profile_comm_layouts,
        profile_data_parallel_shards: int = DEFAULTS.profile_data_parallel_shards,
        profile_row_wise_shards: int = DEFAULTS.profile_row_wise_shards,
        profile_workers: int = DEFAULTS.profile_workers,
        dataset_uri: str = DEFAULTS.dataset_uri,
        profile_max_tables: int = DEFAULTS.profile_max_tables,
        profile_repeats: int = DEFAULTS.profile_repeats,
        profile_timing_iters: int = DEFAULTS.profile_timing_iters,
        profile_budget_s: float = DEFAULTS.profile_budget_s,
        pretrain_epochs: int = DEFAULTS.pretrain_epochs,
        pretrain_patience: int = DEFAULTS.pretrain_patience,
        search_method: str = DEFAULTS.search_method,
        model_alias: str = DEFAULTS.model_alias,
        device: str = DEFAULTS.device,
        validate_iters: int = DEFAULTS.validate_iters,
        refine_rounds: int = DEFAULTS.refine_rounds,
        evaluate_timing_rounds: int = DEFAULTS.evaluate_timing_rounds,
        policy_tasks: int = DEFAULTS.policy_tasks,
        policy_episodes: int = DEFAULTS.policy_episodes,
        production_tasks: str = DEFAULTS.production_tasks,
        publish_refine_s: float = DEFAULTS.publish_refine_s,
        seed: int = DEFAULTS.seed,
    ) -> dsl.Metrics:
        """The whole method; returns the measured comparison against TorchRec's planner."""
        workload, augment = _data_steps(workload_tables, num_tables, row_scale, batch_size, holdout_fraction, seed)
        profile = _kernel_profile_steps(
            workload, augment, gpu_product, workers=profile_workers, num_shards=profile_num_shards,
            holdout_shards=profile_holdout_shards, data_parallel_shards=profile_data_parallel_shards,
            row_wise_shards=profile_row_wise_shards, max_tables=profile_max_tables, repeats=profile_repeats,
            timing_iters=profile_timing_iters, budget_s=profile_budget_s, seed=seed, device=device,
            dataset_uri=dataset_uri, profile_store=profile_store,
        )
        comm = _all_to_all_step(augment, gpu_product, comm_layouts=profile_comm_layouts, num_devices=num_devices,
                                seed=seed, device=device, dataset_uri=dataset_uri)
        pretrain = _pretrain_step(workload, profile, comm, reuse_measurements, dataset_uri=dataset_uri, seed=seed,
                                  epochs=pretrain_epochs, patience=pretrain_patience)
        task, plan, baseline = _plan_steps(
            workload, comm, pretrain, task_num_tables=task_num_tables, num_devices=num_devices,
            memory_slack=memory_slack, seed=seed, search_method=search_method, model_alias=model_alias,
        )
        _policies_step(workload, task, plan, pretrain, comm, model_alias=model_alias, num_tasks=policy_tasks,
                       episodes=policy_episodes, seed=seed)
        evaluate = _evaluate_step(
            task, plan, baseline, pretrain, comm, gpu_product, model_alias=model_alias, device=device,
            num_devices=num_devices, validate_iters=validate_iters, refine_rounds=refine_rounds,
            timing_rounds=evaluate_timing_rounds,
        )
        # measurements are never reused from a cache: the point is to measure this run's hardware (a local rerun
        # in the same work directory, with the same code, resumes: it keeps what the killed run finished)
        for step in (evaluate,) if reuse_measurements else (profile, comm, evaluate):
            step.set_caching_options(False)
        with dsl.If(production_tasks != "", name="production-tasks"):  # a run without them is unchanged
            publish = _publish_step(
                evaluate, pretrain, comm, gpu_product, production_tasks=production_tasks, model_alias=model_alias,
                device=device, num_devices=num_devices, refine_s=publish_refine_s,
                timing_rounds=evaluate_timing_rounds, seed=seed,
            )
            publish.set_caching_options(False)  # measures this run's hardware and registers: never from a cache
        return evaluate.outputs["comparison"]

    return shardwise_pipeline
