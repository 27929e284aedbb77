"""`shardwise pipeline compile|run|submit|schedule`: the kfp compiler, kfp.local and kfp.Client around the pipeline."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp import Client, compiler, local

from shardwise.errors import ShardwiseError, redacted
from shardwise.jobs.models import store_uri
from shardwise.search import get_method

from . import components, containers
from .console import ANSI_COLOURS, console_to_log
from .params import PipelineArgumentError, PipelineParams
from .pipeline import build_pipeline


class PipelineRunError(ShardwiseError):
    """A local pipeline run that failed in one of its steps."""


def compile_pipeline(out: str | Path, *, gpu_product: str | None = None, image: str | None = None) -> Path:
    """Compile the pipeline to Kubeflow's YAML (IR) at `out`; with `image`, every step runs that image (CI: the
    image built from the commit, so a run uses the code committed and cached steps are keyed on it)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with containers.steps_in_image(image) if image else contextlib.nullcontext():
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
    #: the publish step's result (publish.json), where the run had production tasks
    published_path: Path | None = None


#: the pretrain step's figures a local run reports: held-out-table accuracy next to TorchRec's estimator and the
#: noise floor, the kernels of the other sharding types on held-out tables, and training size
_COST_MODEL_FIGURES = (
    "neural_heldout_tables_total_mape_pct", "neural_heldout_tables_total_spearman", "train_shards",
    "neural_heldout_tables_total_top_decile_mape_pct", "neural_heldout_row_blocks_total_mape_pct", "data_parallel_kernel_line_heldout_dense_kernels_total_mape_pct",
    "data_parallel_kernel_network_dense_kernels_total_mape_pct",
    "torchrec_estimator_heldout_tables_total_mape_pct", "torchrec_estimator_heldout_tables_total_spearman",
    "noise_floor_repeats_total_mape_pct", "noise_floor_dense_kernel_repeats_total_mape_pct",
)


def _step_metadata(run_dir: Path, step: str, artifact: str) -> dict[str, float]:
    """The numeric metadata a step logged on one output artifact (empty if it logged none)."""
    path = run_dir / step / "executor_output.json"
    try:
        (output,) = json.loads(path.read_text())["artifacts"][artifact]["artifacts"]
    except (OSError, KeyError, ValueError):
        return {}
    return {k: float(v) for k, v in output.get("metadata", {}).items() if isinstance(v, int | float)}


def run_figures(run_dir: Path) -> dict[str, float]:
    """A finished run's figures, read from its pipeline root: the evaluate step's comparison against TorchRec's
    planner (measured plan cost, refined, DLRM throughput), the pretrain step's cost-model accuracy, and each
    method's predicted plan cost on the task (`<method>_predicted_ms`: the searched plan's and the policies')."""
    accuracy = _step_metadata(run_dir, "pretrain-cost-model", "metrics")
    return (_profiled(run_dir) | _step_metadata(run_dir, "evaluate-plans", "comparison")
            | {k: accuracy[k] for k in _COST_MODEL_FIGURES if k in accuracy}
            | _step_metadata(run_dir, "train-policies", "predicted"))


def _profiled(run_dir: Path) -> dict[str, float]:
    """The profiling workers' whole shards and shards left by the time budget, summed, and the slowest one's
    seconds (`profiled_shards`, `profile_shards_left`, `profile_s`; none where the run profiled nothing)."""
    workers = [_step_metadata(run_dir, path.parent.relative_to(run_dir).as_posix(), "costs")
               for path in sorted(run_dir.glob("*/profile-costs/executor_output.json"))]
    workers = [w for w in workers if "profiled_shards" in w]
    if not workers:
        return {}
    return {"profiled_shards": sum(w["profiled_shards"] for w in workers),
            "profile_shards_left": sum(w.get("profile_shards_left", 0.0) for w in workers),
            "profile_s": max(w.get("profile_s", 0.0) for w in workers)}


def _latest_report(report: Path, workdir: Path) -> Path:
    """The run's HTML report, copied to `workdir/report.html` (a name a browser opens as a page)."""
    latest = workdir / "report.html"
    shutil.copyfile(report, latest)
    return latest


def _single(paths: list[Path], what: str, run_dir: Path) -> Path:
    if len(paths) != 1:
        raise PipelineRunError(f"expected one {what} under '{run_dir}', found {len(paths)}")
    return paths[0]


#: the steps whose outputs a local run reads (run_figures, the plans, the report's inputs)
_READ_STEPS = ("pretrain-cost-model", "search-plan", "search-plan-2", "train-policies")


class _CacheHits:
    """The cache entries kfp.local served during a run (`recording()` wraps its cache's lookup). Not its log line
    for a hit: kfp.local runs steps in threads that each set and reset the root logger's level, so the INFO line is
    dropped whenever another step's thread has just set the level back (a resumed run then missed its baseline
    plan)."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """While the run lasts, every key kfp.local's cache answers is kept."""
        from kfp.local import cache

        lookup = cache.LocalCache.get

        def recorded(local_cache: Any, key: str) -> Any:
            found = lookup(local_cache, key)
            if found is None or _shards_left(found):  # a profile the time budget cut short runs again, resuming
                return None
            self.keys.append(key)
            return found

        cache.LocalCache.get = recorded  # type: ignore[method-assign]
        try:
            yield
        finally:
            cache.LocalCache.get = lookup  # type: ignore[method-assign]


def _shards_left(outputs: Mapping[str, Any]) -> bool:
    """Whether a cached step's outputs are a profile its time budget left shards of (metadata
    `profile_shards_left`)."""
    return any((getattr(out, "metadata", None) or {}).get("profile_shards_left", 0) > 0 for out in outputs.values())


def _code_key() -> str:
    """A digest of shardwise's source: a local run never reuses a step that other code cached (a step's cache key
    holds its component's own source, not the library code it calls)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.yaml")]):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _link_cached_steps(run_dir: Path, hits: Sequence[str], cache_root: Path) -> None:
    """Each step of `_READ_STEPS` served from the cache appears in `run_dir` as the run that made it left it: its
    executor output (artifacts with their metadata) and links to its artifacts. A served entry belongs to the step
    whose directory holds its artifacts (kfp.local writes a step's outputs under <run>/<step>/)."""
    served: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(hits):
        entry = cache_root / f"{key}.json"
        if not entry.exists():
            continue
        outputs = {name: out for name, out in json.loads(entry.read_text()).items()
                   if isinstance(out, dict) and out.get("__kfp_artifact__")}
        steps = {Path(str(out.get("uri"))).parent.name for out in outputs.values()}
        if len(steps) == 1:
            served[steps.pop()] = outputs
    for step in _READ_STEPS:
        target = run_dir / step
        if target.exists() or step not in served:
            continue
        artifacts = {name: {"artifacts": [{k: out.get(k) for k in ("name", "uri", "metadata")}]}
                     for name, out in served[step].items()}
        target.mkdir(parents=True)
        for name, spec in artifacts.items():
            made = Path(str(spec["artifacts"][0]["uri"]))
            if made.exists():
                (target / name).symlink_to(made)
        (target / "executor_output.json").write_text(json.dumps({"artifacts": artifacts}))


def _check_method(params: PipelineParams) -> None:
    """A search method this installation has, checked before anything runs or is submitted (PipelineParams
    checks only the name's shape: the registry needs torch)."""
    try:
        get_method(params.search_method)
    except ShardwiseError as err:
        raise PipelineArgumentError(f"search_method: {err}") from None


def run_local(
    workdir: str | Path,
    params: PipelineParams,
    *,
    tracking_uri: str | None = None,
    verbose: bool = False,
    image: str | None = None,
) -> LocalRunResult:
    """Run the pipeline through kfp.local: in this environment (CPU, the default embedded MLflow store), or with
    `image` each step in a container of that image (`containers`); the steps' output goes to
    `workdir/pipeline.log` (to the terminal with `verbose`)."""
    _check_method(params)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    args = params.model_dump()
    pipeline_root = workdir / "pipeline_root"
    log_path = workdir / "pipeline.log"
    before = set(pipeline_root.glob("*")) if pipeline_root.exists() else set()
    # The steps inherit this process's environment, or get it from the Docker runner (kfp.local ignores the
    # config-map/secret settings): point them at the store the next command will look in.
    # the store the CLI and the TorchRec planner read by default: the next `shardwise plan` finds the model
    uri = store_uri(tracking_uri)
    remote = bool(params.dataset_uri) or params.workload_tables.startswith("s3://") or "s3://" in params.production_tasks
    runner = (containers.docker_runner(workdir, uri, image=image, remote_data=remote) if image
              else local.SubprocessRunner(use_venv=False))
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    console = contextlib.nullcontext() if verbose else console_to_log(log_path)
    in_image = containers.steps_in_image(image) if image else contextlib.nullcontext()
    # a rerun in this workdir with the same arguments and code resumes: steps that finished (profiling workers
    # included) are taken from kfp.local's cache, the rest run; a profile the time budget cut short runs again,
    # adding to the shards its dataset in the profile store holds
    cache_root = workdir / "step_cache" / _code_key()
    hits = _CacheHits()
    try:
        with console, in_image, hits.recording():
            local.init(runner=runner, pipeline_root=str(pipeline_root), enable_caching=True,
                       cache_root=str(cache_root))
            # MLflow's default artifact root is relative to the working directory: keep it in the workdir
            with _working_directory(workdir):
                build_pipeline(reuse_measurements=True, profile_store=str(cache_root / "profiles"))(**args)
    except RuntimeError as err:
        where = "above" if verbose else f"in {log_path}"
        raise PipelineRunError(f"{ANSI_COLOURS.sub('', str(err))} (its log is {where}; outputs under {pipeline_root})") from err
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved
    run_dirs = sorted(set(pipeline_root.glob("*")) - before)
    run_dir = _single(run_dirs, "new run directory", pipeline_root)
    _link_cached_steps(run_dir, hits.keys, cache_root)
    comparison = run_figures(run_dir)  # the pipeline's output is the evaluate step's comparison
    published = _published(run_dir, params)
    return LocalRunResult(
        run_dir=run_dir,
        plan_path=_single(list(run_dir.glob("search-plan/plan")), "plan", run_dir),
        baseline_plan_path=_single(list(run_dir.glob("search-plan-2/plan")), "baseline plan", run_dir),
        report_path=_latest_report(_single(list(run_dir.glob("evaluate-plans/report")), "report", run_dir), workdir),
        comparison=comparison,
        published_path=published,
    )


def _published(run_dir: Path, params: PipelineParams) -> Path | None:
    """The publish step's result where the run had production tasks (a condition kfp.local could not evaluate skips
    the step without a word: said here instead)."""
    if not params.production_tasks:
        return None
    found = sorted(run_dir.glob("**/publish-plans/published/publish.json"))
    if not found:
        raise PipelineRunError(f"production_tasks {params.production_tasks!r}: the publish step did not run "
                               f"(no publish-plans/published/publish.json under '{run_dir}')")
    return _single(found, "publish result", run_dir)


def _client(host: str, namespace: str | None = None, existing_token: str | None = None) -> Any:
    kwargs: dict[str, Any] = {"host": host, "existing_token": existing_token}
    if namespace:
        kwargs["namespace"] = namespace
    with warnings.catch_warnings():  # kfp warns on every client that it needs a v2 API: we target v2 anyway
        warnings.simplefilter("ignore", FutureWarning)
        return Client(**kwargs)


def _answered_id(host: str, what: str, value: Any) -> str:
    """An id the API returned; an answer without one means `host` is not a Kubeflow Pipelines API."""
    if not value:
        raise PipelineRunError(f"{redacted(host)} answered without {what}: not a Kubeflow Pipelines API? "
                               "(check --host: the KFP UI/API address, e.g. http://ml-pipeline-ui.kubeflow)")
    return str(value)


@dataclass(frozen=True)
class Submitted:
    """What the Kubeflow API answered: the run (or recurring run) and the experiment it belongs to."""

    experiment_id: str
    run_id: str
    #: how the run ended, when the caller waited for it (KFP's state: SUCCEEDED, FAILED, ...)
    state: str | None = None
    #: the pipeline version the run was made from, when the package was uploaded as one
    pipeline_version_id: str | None = None
    #: the run's page in the Kubeflow UI (credentials in the host redacted)
    url: str | None = None


@contextlib.contextmanager
def _api_errors(host: str) -> Iterator[None]:
    """A Kubeflow Pipelines API that cannot be reached, refuses us or answers garbage: one line naming the host
    (credentials redacted), not the HTTP stack's traceback. kfp's own printed links ("Experiment details: URL",
    "Run details: URL") are kept off the terminal: they carry the host as given, credentials and all."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    except ShardwiseError:
        raise
    except Exception as err:
        package = type(err).__module__.split(".")[0]
        if package not in ("urllib3", "requests", "kfp", "kfp_server_api", "http", "socket", "ssl", "json") \
                and not isinstance(err, (OSError, ValueError)):
            raise
        detail = redacted(str(err).strip().splitlines()[0][:300]) if str(err).strip() else type(err).__name__
        raise PipelineRunError(
            f"Kubeflow Pipelines API at {redacted(host)}: {type(err).__name__}: {detail} "
            "(check --host, that the API answers there, and the token)"
        ) from None


def _experiment(host: str, namespace: str | None, token: str | None, name: str) -> tuple[Any, str]:
    """A client of the KFP API at `host` and the id of experiment `name` (created if absent)."""
    with _api_errors(host):
        client = _client(host, namespace, token)
        # create_experiment returns the existing experiment of that name, if any
        found = client.create_experiment(name=name, namespace=namespace)
    return client, _answered_id(host, "an experiment id", getattr(found, "experiment_id", None))


@contextlib.contextmanager
def _package(gpu_product: str | None, image: str | None) -> Iterator[str]:
    """The pipeline compiled into a temporary file, for the API to upload."""
    with tempfile.TemporaryDirectory() as tmp:
        yield str(compile_pipeline(Path(tmp) / "shardwise_pipeline.yaml", gpu_product=gpu_product, image=image))


def _upload_version(client: Any, host: str, package: str, pipeline: str, version: str,
                    namespace: str | None) -> tuple[str, str]:
    """The compiled package uploaded as version `version` of pipeline `pipeline` (created on first use): the ids
    of both. The Kubeflow UI then lists what each run ran, version by version."""
    with _api_errors(host):
        pipeline_id = client.get_pipeline_id(pipeline)
        if pipeline_id is None:
            made = client.upload_pipeline(package, pipeline_name=pipeline, namespace=namespace)
            pipeline_id = _answered_id(host, "a pipeline id", getattr(made, "pipeline_id", None))
        uploaded = client.upload_pipeline_version(package, pipeline_version_name=version, pipeline_id=pipeline_id)
    return pipeline_id, _answered_id(host, "a pipeline version id", getattr(uploaded, "pipeline_version_id", None))


def submit(
    host: str,
    params: PipelineParams,
    *,
    run_name: str = "shardwise",
    experiment: str = "shardwise",
    namespace: str | None = None,
    service_account: str | None = None,
    gpu_product: str | None = None,
    image: str | None = None,
    existing_token: str | None = None,
    wait_s: float | None = None,
    pipeline: str | None = None,
    version: str | None = None,
) -> Submitted:
    """Compile the pipeline and start one run of it on the Kubeflow Pipelines API at `host`. With `pipeline`, the
    package is first uploaded as version `version` (default: the run's name) of that pipeline and the run made from
    it. With `wait_s`, wait that long for the run to end and raise unless it succeeded (CI retraining fails when
    its run fails)."""
    _check_method(params)
    if version and not pipeline:
        raise PipelineArgumentError("--pipeline-version names a version of a pipeline: give --pipeline NAME too")
    client, experiment_id = _experiment(host, namespace, existing_token, experiment)
    version_id = None
    with _package(gpu_product, image) as package:
        source: dict[str, Any] = {"pipeline_package_path": package}
        if pipeline:
            pipeline_id, version_id = _upload_version(client, host, package, pipeline, version or run_name,
                                                      namespace)
            source = {"pipeline_id": pipeline_id, "version_id": version_id}
        with _api_errors(host):  # the summary gives the run's link, redacted
            run = client.run_pipeline(
                experiment_id=experiment_id,
                job_name=run_name,
                params=params.model_dump(),
                service_account=service_account,
                **source,
            )
    run_id = _answered_id(host, "a run id", getattr(run, "run_id", None))
    submitted = Submitted(experiment_id=experiment_id, run_id=run_id, pipeline_version_id=version_id,
                          url=f"{redacted(host).rstrip('/')}/#/runs/details/{run_id}")
    if wait_s is None:
        return submitted
    with _api_errors(host):
        try:
            finished = client.wait_for_run_completion(run_id=run_id, timeout=int(wait_s), sleep_duration=5)
        except TimeoutError:
            raise PipelineRunError(f"run {run_id} did not end within {wait_s:.0f} s (still running on {redacted(host)})") from None
    state = str(getattr(finished, "state", None))
    if state != "SUCCEEDED":
        raise PipelineRunError(f"run {run_id} ended {state} on {redacted(host)}: see the run in the Kubeflow UI")
    return dataclasses.replace(submitted, state=state)


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
    image: str | None = None,
    max_concurrency: int = 1,
    existing_token: str | None = None,
) -> Submitted:
    """Create a recurring run of the pipeline on a cron schedule (KFP's 6-field cron: seconds first)."""
    _check_method(params)
    fields = cron.split()
    if len(fields) not in (5, 6):
        raise ShardwiseError(f"cron '{cron}': expected 5 or 6 fields (KFP's cron has seconds first)")
    if len(fields) == 5:
        # KFP's scheduler reads seconds first; a standard 5-field cron runs at second 0
        cron = "0 " + cron
    client, experiment_id = _experiment(host, namespace, existing_token, experiment)
    with _package(gpu_product, image) as package, _api_errors(host):
        job = client.create_recurring_run(
            experiment_id=experiment_id,
            job_name=job_name,
            cron_expression=cron,
            max_concurrency=max_concurrency,
            no_catchup=True,
            params=params.model_dump(),
            pipeline_package_path=package,
            service_account=service_account,
        )
    return Submitted(experiment_id=experiment_id,
                     run_id=_answered_id(host, "a recurring run id", getattr(job, "recurring_run_id", None)))
