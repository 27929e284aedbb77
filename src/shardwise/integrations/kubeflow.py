"""The library side of `shardwise pipeline compile|run|submit|schedule`: kfp compiler, kfp.local, kfp.Client."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The local run's sizes: meant to fit 2 CPU cores in well under 10 minutes (tests/e2e checks the budget) while
# the comparison still means something: a task of 32 held-out tables on 4 devices at the profiler's CPU batch,
# so plans differ by more than the kernel's fixed per-call cost, and enough profiled shards (about 3 per
# second here) and 4-device all-to-alls for the cost model to rank them.
# The held-out share (holdout_fraction 0.2 of num_tables) must hold at least task_num_tables tables. The held-out
# tables are profiled apart (profile_holdout_shards, about 1/6 of the training shards) so that no shard mixes
# the two: 560 + 100 shards train on 468 and test on 100 (700 shards drawn from all tables trained on 157 and
# tested on 15), in about the same time, the shards saved paying for the longer training.
# Distinct source tables matter more for unseen tables than shard count: 360 tables instead of 180 cut the
# pretrain step's held-out MAPE from 6.3% to 4.6-4.9% at the same profiling time (the whole run: 4-5 min here).
LOCAL_ARGUMENTS: dict[str, Any] = {
    "num_tables": 360,
    "row_scale": 0.002,
    "batch_size": 2048,
    "task_num_tables": 32,
    "num_devices": 4,
    # TorchRec's planner (table-wise, no column split under 128 wide) must find a plan for the comparison
    # to exist; the benchmark's task sets use the same 2x slack
    "memory_slack": 2.0,
    "profile_num_shards": 560,
    "profile_holdout_shards": 100,
    "profile_comm_layouts": 40,
    "profile_max_tables": 15,
    "profile_repeats": 1,
    # end-to-end DLRM training under both plans (validate): about a minute more on 2 cores
    "validate_iters": 10,
    "device": "cpu",
}


class PipelineArgumentError(ValueError):
    """A pipeline argument that the pipeline does not declare, or of the wrong type."""


class PipelineRunError(RuntimeError):
    """A local pipeline run that failed in one of its steps."""


def pipeline_parameters() -> dict[str, Any]:
    """The pipeline's parameters and their defaults."""
    from shardwise.pipelines.pipeline import build_pipeline

    spec = build_pipeline().component_spec
    return {name: spec.inputs[name].default for name in spec.inputs}


def check_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments checked against the pipeline's parameters (names and types); returned as a dict."""
    params = pipeline_parameters()
    checked: dict[str, Any] = {}
    for name, value in arguments.items():
        if name not in params:
            raise PipelineArgumentError(
                f"pipeline argument '{name}' is unknown; parameters are: {', '.join(sorted(params))}"
            )
        default = params[name]
        if isinstance(default, bool) or default is None:
            checked[name] = value
            continue
        try:
            checked[name] = type(default)(value)
        except (TypeError, ValueError) as err:
            raise PipelineArgumentError(
                f"pipeline argument '{name}': {value!r} is not a {type(default).__name__}"
            ) from err
        if isinstance(default, int) and float(value) != checked[name]:
            raise PipelineArgumentError(f"pipeline argument '{name}': {value!r} is not an int")
    return checked


def compile_pipeline(out: str | Path, *, gpu_product: str | None = None) -> Path:
    """Compile the pipeline to Kubeflow's YAML (IR) at `out`."""
    from kfp import compiler

    from shardwise.pipelines.pipeline import build_pipeline

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(gpu_product), str(out))
    return out


def compile_components(out_dir: str | Path) -> list[Path]:
    """Compile each step's component to `out_dir/<name>.yaml` (reusable with kfp's load_component_from_file)."""
    from kfp import compiler

    from shardwise.pipelines import components

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in components.STEPS:
        path = out_dir / f"{name}.yaml"
        compiler.Compiler().compile(getattr(components, name), str(path))
        written.append(path)
    return written


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    previous = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


@dataclass(frozen=True)
class LocalRunResult:
    """Where a local run left its outputs, and the measured comparison against TorchRec's planner."""

    run_dir: Path
    plan_path: Path
    baseline_plan_path: Path
    report_path: Path
    comparison: dict[str, float]


def _single(paths: list[Path], what: str, run_dir: Path) -> Path:
    if len(paths) != 1:
        raise FileNotFoundError(f"expected one {what} under '{run_dir}', found {len(paths)}")
    return paths[0]


def run_local(
    workdir: str | Path, arguments: Mapping[str, Any] | None = None, *, tracking_uri: str | None = None
) -> LocalRunResult:
    """Run the pipeline through kfp.local in this environment (CPU, embedded MLflow under `workdir`)."""
    from kfp import local

    from shardwise.pipelines.pipeline import build_pipeline

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    args = check_arguments({**LOCAL_ARGUMENTS, **(arguments or {})})
    pipeline_root = workdir / "pipeline_root"
    before = set(pipeline_root.glob("*")) if pipeline_root.exists() else set()
    # The steps run as subprocesses of this one and inherit its environment (kfp.local ignores the
    # config-map/secret settings): point MLflow at a sqlite store in the workdir unless told otherwise.
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{workdir / 'mlflow.db'}"
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root))
        # MLflow's default artifact root is relative to the working directory: keep it in the workdir
        with _working_directory(workdir):
            task = build_pipeline()(**args)
    except RuntimeError as err:
        # kfp.local colours its messages; the failing step's own log is printed above it
        message = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
        raise PipelineRunError(f"{message} (its log is above; outputs under {pipeline_root})") from err
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved
    run_dirs = sorted(set(pipeline_root.glob("*")) - before)
    run_dir = _single(run_dirs, "new run directory", pipeline_root)
    comparison = {k: float(v) for k, v in task.output.metadata.items() if isinstance(v, int | float)}
    return LocalRunResult(
        run_dir=run_dir,
        plan_path=_single(list(run_dir.glob("search-plan/plan")), "plan", run_dir),
        baseline_plan_path=_single(list(run_dir.glob("search-plan-2/plan")), "baseline plan", run_dir),
        report_path=_single(list(run_dir.glob("evaluate-plans/report")), "report", run_dir),
        comparison=comparison,
    )


def _client(host: str, namespace: str | None = None, existing_token: str | None = None) -> Any:
    import kfp

    kwargs: dict[str, Any] = {"host": host, "existing_token": existing_token}
    if namespace:
        kwargs["namespace"] = namespace
    return kfp.Client(**kwargs)


@dataclass(frozen=True)
class Submitted:
    """What the Kubeflow API answered: the run (or recurring run) and the experiment it belongs to."""

    experiment_id: str
    run_id: str


def submit(
    host: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    run_name: str = "shardwise",
    experiment: str = "shardwise",
    namespace: str | None = None,
    service_account: str | None = None,
    gpu_product: str | None = None,
    existing_token: str | None = None,
) -> Submitted:
    """Compile the pipeline and start one run of it on the Kubeflow Pipelines API at `host`."""
    args = check_arguments(arguments or {})
    client = _client(host, namespace, existing_token)
    # create_experiment returns the existing experiment of that name, if any
    exp = client.create_experiment(name=experiment, namespace=namespace)
    with tempfile.TemporaryDirectory() as tmp:
        package = compile_pipeline(Path(tmp) / "shardwise_pipeline.yaml", gpu_product=gpu_product)
        run = client.run_pipeline(
            experiment_id=exp.experiment_id,
            job_name=run_name,
            pipeline_package_path=str(package),
            params=args,
            service_account=service_account,
        )
    return Submitted(experiment_id=str(exp.experiment_id), run_id=str(run.run_id))


def schedule(
    host: str,
    cron: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    job_name: str = "shardwise-recurring",
    experiment: str = "shardwise",
    namespace: str | None = None,
    service_account: str | None = None,
    gpu_product: str | None = None,
    max_concurrency: int = 1,
    existing_token: str | None = None,
) -> Submitted:
    """Create a recurring run of the pipeline on a cron schedule (KFP's 6-field cron: seconds first)."""
    fields = cron.split()
    if len(fields) not in (5, 6):
        raise PipelineArgumentError(f"cron '{cron}': expected 5 or 6 fields (KFP's cron has seconds first)")
    if len(fields) == 5:
        # KFP's scheduler reads seconds first; a standard 5-field cron runs at second 0
        cron = "0 " + cron
    args = check_arguments(arguments or {})
    client = _client(host, namespace, existing_token)
    exp = client.create_experiment(name=experiment, namespace=namespace)
    with tempfile.TemporaryDirectory() as tmp:
        package = compile_pipeline(Path(tmp) / "shardwise_pipeline.yaml", gpu_product=gpu_product)
        job = client.create_recurring_run(
            experiment_id=exp.experiment_id,
            job_name=job_name,
            cron_expression=cron,
            max_concurrency=max_concurrency,
            no_catchup=True,
            params=args,
            pipeline_package_path=str(package),
            service_account=service_account,
        )
    return Submitted(experiment_id=str(exp.experiment_id), run_id=str(job.recurring_run_id))
