"""`shardwise pipeline compile|run|submit|schedule`: a pipeline parameter's value comes from the preset (presets.yaml,
`--preset`), or from its flag (one per PipelineParams field, typed, in `--help` with its description): the same
two places for `run --local`, `submit` and `schedule`."""

from __future__ import annotations

import argparse
import os
import time

from shardwise.jobs.base import JobResult
from shardwise.pipelines.params import PipelineParams, pipeline_params, preset, preset_names
from shardwise.profiling.budget import rate_line
from shardwise.search import format_plan, load_plan

from .options import UsageError, add_settings_options


def _params(args: argparse.Namespace) -> PipelineParams:
    """The preset's values with the flags given over them (a flag not given is absent from `args`)."""
    given = {name: value for name, value in vars(args).items() if name in PipelineParams.model_fields}
    return pipeline_params(given, preset_name=args.preset)


#: the pretrain step's figures for the kernels of each sharding type beyond table-wise, on held-out tables, and the
#: noise floor of their repeated timings where the profile has one
_KERNELS_BY_TYPE = (("row-wise (row blocks)", "neural_heldout_row_blocks_total_mape_pct", None),
                    ("data-parallel (dense kernel line)", "data_parallel_kernel_line_heldout_dense_kernels_total_mape_pct",
                     "noise_floor_dense_kernel_repeats_total_mape_pct"))


class LocalRun(JobResult):
    """What a local run printed at its end: the plan, the report, the measured comparison."""

    plan_path: str
    plan_text: str
    report_path: str
    comparison: dict[str, float]
    elapsed_s: float
    #: the publish step's table (shardwise publish's), where the run had production tasks
    published: str | None = None
    #: each production task's plan against TorchRec's planner's, one line each: what the summary leads with
    production: list[str] = []

    def summary(self) -> str:
        """The user's production models against TorchRec's planner where the run had any; then the held-out
        evaluation task's plan, the report's path, measured cost and DLRM throughput against TorchRec's planner."""
        c = self.comparison
        lead = (["\nyour models, measured here (publish step):", *(f"  {line}" for line in self.production),
                 "\nthe run's held-out evaluation task:"] if self.production else [])
        lines = [
            *lead,
            f"\nplan ({self.plan_path}):\n{self.plan_text}",
            f"report: {self.report_path}",
            f"cost model on shards of held-out tables: MAPE {c.get('neural_heldout_tables_total_mape_pct', float('nan')):.2f}%, "
            f"on their costliest tenth {c.get('neural_heldout_tables_total_top_decile_mape_pct', float('nan')):.2f}%, "
            f"Spearman {c.get('neural_heldout_tables_total_spearman', float('nan')):.3f} "
            f"({c.get('train_shards', float('nan')):.0f} training shards)",
            f"measured vs TorchRec's planner: {c.get('method_max_cost_ms', float('nan')):.3f} ms vs "
            f"{c.get('torchrec_max_cost_ms', float('nan')):.3f} ms per iteration "
            f"(ratio {c.get('ratio_to_torchrec', float('nan')):.3f}; below 1 is better)",
        ]
        by_type = [f"{name} {c[key]:.2f}%" + (f" (noise floor {c[floor]:.2f}%)" if floor in c else "")
                   for name, key, floor in _KERNELS_BY_TYPE if key in c]
        if by_type:  # held-out tables' kernels of the other sharding types, profiled with them
            lines.insert(len(lead) + 3, "  their kernels as other sharding types, MAPE: " + ", ".join(by_type))
        predicted = {k.removesuffix("_predicted_ms"): v for k, v in c.items() if k.endswith("_predicted_ms")}
        if predicted:  # the searched plan's first, then the trained policies'
            lines.append("predicted plan cost on the task (the cost model's ms per iteration): "
                         + ", ".join(f"{method} {ms:.3f}" for method, ms in predicted.items()))
        if "refined_ratio_to_torchrec" in c:
            lines.append(f"refined on this machine (evaluate step): {c['refined_max_cost_ms']:.3f} ms per iteration "
                         f"(ratio {c['refined_ratio_to_torchrec']:.3f} to TorchRec's planner, "
                         f"{c['refined_max_cost_ms'] / c['method_max_cost_ms']:.3f} to the plan above)")
        if "refinement_before_ms" in c:  # the two plans measured side by side in refinement's last session
            lines.append(f"  refinement's own paired session: {c['refinement_before_ms']:.3f} -> "
                         f"{c['refinement_after_ms']:.3f} ms ({c['refinement_after_ms'] / c['refinement_before_ms']:.3f}"
                         "x; two plans' ratio moves between sessions by up to 8.7% at 3 timings a device, 3.5% at 9: "
                         "record measurement_noise)")
        if "throughput_ratio_to_torchrec" in c:
            lines.append(
                f"DLRM training throughput vs TorchRec's planner: {c['method_samples_per_s']:,.0f} vs "
                f"{c['torchrec_samples_per_s']:,.0f} samples/s (ratio {c['throughput_ratio_to_torchrec']:.3f}; "
                "above 1 is better)"
            )
        if c.get("profiled_shards"):  # what the profile step's time budget bought on this machine
            left = int(c.get("profile_shards_left", 0))
            lines.append("profiled: " + rate_line(int(c["profiled_shards"]), c["profile_s"], left)
                         + (": the same command again adds them" if left else ""))
        if self.published:
            lines.append(f"production tasks planned, measured and registered (publish step):\n{self.published}")
        lines.append(f"the whole run: {self.elapsed_s / 60:.1f} min")
        return "\n".join(lines)


class Submitted(JobResult):
    """A run or recurring run the Kubeflow API accepted."""

    what: str
    run_id: str
    experiment_id: str
    cron: str | None = None
    state: str | None = None
    pipeline_version_id: str | None = None
    url: str | None = None

    def summary(self) -> str:
        """One line, then the run's page in the Kubeflow UI."""
        when = f" ({self.cron})" if self.cron else ""
        version = f" from pipeline version {self.pipeline_version_id}" if self.pipeline_version_id else ""
        ended = f": {self.state}" if self.state else ""
        page = f"\n{self.url}" if self.url else ""
        return f"{self.what} {self.run_id}{when}{version} in experiment {self.experiment_id}{ended}{page}"


def _compile(args: argparse.Namespace) -> None:
    from shardwise.pipelines import run  # kfp: heavy, only for the pipeline verbs that need it

    print(run.compile_pipeline(args.out, gpu_product=args.gpu_product, image=args.image))


def _run(args: argparse.Namespace) -> LocalRun:
    from shardwise.pipelines import containers, run  # kfp: heavy, only for the pipeline verbs that need it

    if not args.local:
        raise UsageError("only --local runs here; use `shardwise pipeline submit --host URL` for a cluster")
    if args.image and not args.containers:
        raise UsageError("--image names the image of --containers; add --containers")
    started = time.monotonic()
    image = (args.image or containers.default_image()) if args.containers else None
    done = run.run_local(args.workdir, _params(args), tracking_uri=args.tracking_uri, verbose=args.verbose,
                         image=image)
    published, production = None, []
    if done.published_path is not None:
        # the publish job's result type: imported only where a run published
        from shardwise.jobs.publish import PublishResult

        result = PublishResult.model_validate_json(done.published_path.read_text())
        published, production = result.table(), [t.headline() for t in result.tasks]
    return LocalRun(plan_path=str(done.plan_path), plan_text=format_plan(load_plan(done.plan_path)),
                    report_path=str(done.report_path), comparison=done.comparison,
                    elapsed_s=time.monotonic() - started, published=published, production=production)


def _submit(args: argparse.Namespace) -> Submitted:
    from shardwise.pipelines import run  # kfp: heavy, only for the pipeline verbs that need it

    # a bearer token from the environment, never a flag (flags show in process lists and CI logs)
    common = dict(experiment=args.experiment, namespace=args.namespace, service_account=args.service_account,
                  gpu_product=args.gpu_product, image=args.image, existing_token=os.environ.get(TOKEN_ENV) or None)
    if args.pipeline_verb == "schedule":
        done = run.schedule(args.host, args.cron, _params(args), job_name=args.name, **common)
        return Submitted(what="recurring run", cron=args.cron, run_id=done.run_id, experiment_id=done.experiment_id)
    done = run.submit(args.host, _params(args), run_name=args.name, wait_s=args.wait, pipeline=args.pipeline,
                      version=args.pipeline_version, **common)
    return Submitted(what="run", run_id=done.run_id, experiment_id=done.experiment_id, state=done.state,
                     pipeline_version_id=done.pipeline_version_id, url=done.url)


IMAGE_HELP = ("the image every step runs (default: ghcr.io/shardwise/shardwise:VERSION); CI passes the one it "
              "built from the commit")
#: the environment variable holding the Kubeflow Pipelines API's bearer token (a service account's)
TOKEN_ENV = "KFP_TOKEN"


def _parameters(parser: argparse.ArgumentParser, default_preset: str) -> None:
    """`--preset`, then one flag per pipeline parameter, each overriding the preset's value (no config file: a set
    of values worth keeping is a preset, beside the others in presets.yaml)."""
    parser.add_argument("--preset", default=default_preset, choices=preset_names(),
                        help=f"named values of every pipeline parameter, from presets.yaml (default: {default_preset})")
    # the usage line without the parameters (three dozen): --help lists them in their group
    parser.usage = parser.format_usage().removeprefix("usage: ").rstrip().replace("%", "%%") + " [--PARAMETER VALUE ...]"
    values = preset(default_preset)
    group = parser.add_argument_group("pipeline parameters (override the preset)")
    add_settings_options(group, PipelineParams, overrides={
        name: {"help": f"{field.description} (preset {default_preset}: {values.get(name, field.default)!r})"}
        for name, field in PipelineParams.model_fields.items()})


def configure(verb: str, parser: argparse.ArgumentParser) -> None:
    """The four pipeline actions."""
    actions = parser.add_subparsers(dest="pipeline_verb", metavar="ACTION", required=True)

    compile_ = actions.add_parser("compile", help="write the compiled pipeline YAML")
    compile_.add_argument("--out", required=True, help="output YAML path")
    compile_.add_argument("--gpu-product", help="pin GPU steps to nodes labelled nvidia.com/gpu.product=VALUE")
    compile_.add_argument("--image", help=IMAGE_HELP)
    compile_.set_defaults(handler=_compile)

    run = actions.add_parser("run", help="run the pipeline through kfp.local in this environment (CPU)")
    run.add_argument("--local", action="store_true", help="execute with kfp.local (required)")
    run.add_argument("--workdir", default="runs/local", help="pipeline root, MLflow store and artifacts")
    run.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else "
                     "sqlite:///mlflow.db: the store `shardwise plan` reads by default)")
    run.add_argument("--containers", action="store_true",
                     help="run each step in a container of the project's image through kfp.local's Docker runner, "
                     "as a cluster does (read-only root, no network, only the run's folders mounted; needs a "
                     "Docker engine and `make image-cpu`, or `make image` where NVIDIA's driver is)")
    run.add_argument("--image", help="the image of --containers (default: ghcr.io/shardwise/shardwise:VERSION-cpu, "
                     "or the GPU image where nvidia-smi is)")
    _parameters(run, "local")
    run.set_defaults(handler=_run)

    for name, help_ in (("submit", f"start one run on a Kubeflow cluster (bearer token: ${TOKEN_ENV})"),
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
        sub.add_argument("--image", help=IMAGE_HELP)
        if name == "submit":
            sub.add_argument("--wait", type=float, metavar="SECONDS",
                             help="wait up to SECONDS for the run to end; exit 2 unless it succeeded")
            sub.add_argument("--pipeline", metavar="NAME",
                             help="upload the compiled pipeline as a new version of pipeline NAME (created on "
                                  "first use) and run that version")
            sub.add_argument("--pipeline-version", metavar="NAME",
                             help="the uploaded version's name (default: the run's --name); with --pipeline")
        _parameters(sub, "cluster")
        sub.set_defaults(handler=_submit)


