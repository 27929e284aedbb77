"""`shardwise pipeline compile|run|submit|schedule`: the kfp compiler, kfp.local and kfp.Client around the pipeline."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp import Client, compiler, local

from shardwise.errors import ShardwiseError

from . import components
from .params import PipelineParams
from .pipeline import build_pipeline


class PipelineRunError(ShardwiseError):
    """A local pipeline run that failed in one of its steps."""


def compile_pipeline(out: str | Path, *, gpu_product: str | None = None) -> Path:
    """Compile the pipeline to Kubeflow's YAML (IR) at `out`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(gpu_product), str(out))
    return out


def compile_components(out_dir: str | Path) -> list[Path]:
    """Compile each step's component to `out_dir/<name>.yaml` (reusable with kfp's load_component_from_file)."""
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
        raise PipelineRunError(f"expected one {what} under '{run_dir}', found {len(paths)}")
    return paths[0]


def run_local(workdir: str | Path, params: PipelineParams, *, tracking_uri: str | None = None) -> LocalRunResult:
    """Run the pipeline through kfp.local in this environment (CPU, embedded MLflow under `workdir`)."""
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    args = params.model_dump()
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
    kwargs: dict[str, Any] = {"host": host, "existing_token": existing_token}
    if namespace:
        kwargs["namespace"] = namespace
    return Client(**kwargs)


@dataclass(frozen=True)
class Submitted:
    """What the Kubeflow API answered: the run (or recurring run) and the experiment it belongs to."""

    experiment_id: str
    run_id: str


def submit(
    host: str,
    params: PipelineParams,
    *,
    run_name: str = "shardwise",
    experiment: str = "shardwise",
    namespace: str | None = None,
    service_account: str | None = None,
    gpu_product: str | None = None,
    existing_token: str | None = None,
) -> Submitted:
    """Compile the pipeline and start one run of it on the Kubeflow Pipelines API at `host`."""
    args = params.model_dump()
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
    params: PipelineParams,
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
        raise ShardwiseError(f"cron '{cron}': expected 5 or 6 fields (KFP's cron has seconds first)")
    if len(fields) == 5:
        # KFP's scheduler reads seconds first; a standard 5-field cron runs at second 0
        cron = "0 " + cron
    args = params.model_dump()
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
