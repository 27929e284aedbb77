"""The pipeline's parameters: names, types and limits (PipelineParams), and their values as data
(presets.yaml: `cluster` holds every default, other presets override some). No kfp import: cheap to load."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shardwise.errors import ShardwiseError
from shardwise.workload.documents import describe_validation_error

PRESETS_FILE = Path(__file__).with_name("presets.yaml")
DEFAULT_PRESET = "cluster"


class PipelineArgumentError(ShardwiseError):
    """A pipeline argument the pipeline does not declare, of the wrong type, or out of range."""


class PipelineParams(BaseModel):
    """Every parameter of the pipeline, validated before anything is compiled, run or submitted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload_tables: str = Field(description="the tables the cost model learns from: a shardwise.tables/v1 file or a "
                                 "DLRM dataset file (its index data kept), a path or s3://bucket/key; '' = synthetic "
                                 "DLRM tables (num_tables, row_scale, batch_size)")
    num_tables: int = Field(ge=1, description="synthetic source tables")
    row_scale: float = Field(gt=0, description="multiply rows (e.g. 0.01 to fit CPU memory)")
    batch_size: int = Field(ge=1, description="batch the tables and the profiler use")
    holdout_fraction: float = Field(gt=0, lt=1, description="share of source tables held out")
    task_num_tables: int = Field(ge=1, description="held-out tables in the evaluation task")
    num_devices: int = Field(ge=2, description="devices of the evaluation task")
    memory_slack: float = Field(gt=0, description="memory per device = slack x total memory / devices")
    profile_num_shards: int = Field(ge=1, description="shards of training tables to profile")
    profile_holdout_shards: int = Field(ge=1, description="shards of held-out tables to profile (pretrain's test set)")
    profile_comm_layouts: int = Field(ge=1, description="all-to-all layouts to profile (their own step, on "
                                      "num_devices GPUs)")
    profile_data_parallel_shards: int = Field(ge=0, description="of the shards profiled, the first this many also "
                                              "timed as data-parallel tables (TorchRec's dense kernel at the local "
                                              "batch of 2, 4 and 8 devices; 0: data-parallel kernels priced by the "
                                              "compute network)")
    profile_row_wise_shards: int = Field(ge=0, description="of the shards profiled, the first this many also timed "
                                         "as row-wise tables (their row blocks over 2, 4 and 8 devices, at the batch; "
                                         "0: the compute network prices row blocks it never saw)")
    profile_workers: int = Field(ge=1, le=256, description="profiling pods the shards are split over (one GPU each)")
    dataset_uri: str = Field(description="object-store prefix (s3://bucket/prefix, one per hardware kind) that "
                             "every run's profiles add to and pretrain reads whole; '' = this run's profiles only")
    profile_max_tables: int = Field(ge=1, description="most tables in one profiled shard")
    profile_repeats: int = Field(ge=0, description="re-measure some shards this many more times (noise floor)")
    profile_timing_iters: int = Field(ge=1, description="timed kernel iterations per profiled shard (their median)")
    profile_budget_s: float = Field(ge=0, description="seconds a profiling worker takes shards for (training and "
                                    "held-out shards in their counts' proportion), at least half of each count "
                                    "however slow the machine (0: every shard asked for)")
    pretrain_epochs: int = Field(ge=0, description="maximum training epochs (0: training's default)")
    pretrain_patience: int = Field(ge=0, description="epochs without a better validation loss before training "
                                   "stops (0: training's default)")
    search_method: str = Field(description="search method of the plan compared with TorchRec's")
    model_alias: str = Field(description="plan with shardwise-cost-<hardware>@ALIAS; '' = this run's model")
    device: Literal["cpu", "cuda"] = Field(description="hardware the profile and evaluate steps run on")
    validate_iters: int = Field(ge=0, description="DLRM training iterations per plan (0: no throughput)")
    refine_rounds: int = Field(ge=0, le=50, description="refine the plan on the evaluate step's hardware for up to "
                               "this many rounds, from the faster of it and the measured-cost greedy (0: no refinement)")
    evaluate_timing_rounds: int = Field(ge=1, description="interleaved kernel timings per device shard in the "
                                        "evaluate step (per device: their median; more: less noise, longer)")
    # defaults here, not in presets.yaml's `cluster`, until that preset names them: `shardwise train-policy`'s
    policy_tasks: int = Field(default=40, ge=1, description="sampled training tasks of each placement policy "
                              "(DreamShard, AutoShard) the run trains against its cost model and registers")
    policy_episodes: int = Field(default=200, ge=0, description="rollout batches each placement policy trains for "
                                 "(0: no policies)")
    production_tasks: str = Field(description="production tasks to plan with the run's cost model, measure beside "
                                  "their champion plan and TorchRec's planner's on the evaluate step's hardware, and "
                                  "register as shardwise-plan-<task> (@champion gated on the measurement): "
                                  "comma-separated shardwise.task/v1 files with a 'torchrec' section (export_task), "
                                  "paths or s3://bucket/key; '' = none (no publish step)")
    publish_refine_s: float = Field(ge=0, allow_inf_nan=False, description="seconds the publish step refines each "
                                    "production task's plan on its hardware before measuring it (0: not refined)")
    seed: int = Field(description="seed of every random draw")

    @field_validator("dataset_uri")
    @classmethod
    def _dataset_uri(cls, uri: str) -> str:
        if uri and not uri.startswith("s3://"):
            raise ValueError(f"{uri!r} is not an object-store prefix (s3://bucket/prefix) or ''")
        return uri

    @field_validator("workload_tables")
    @classmethod
    def _workload_tables(cls, location: str) -> str:
        if "://" in location and not location.startswith("s3://"):
            raise ValueError(f"{location!r} is not a path, an object in the object store (s3://bucket/key) or ''")
        # a local run's steps start in its work directory: a path means what it meant where it was given
        return location if not location or "://" in location else str(Path(location).expanduser().resolve())

    @field_validator("production_tasks")
    @classmethod
    def _production_tasks(cls, locations: str) -> str:
        given = [location.strip() for location in locations.split(",")] if locations.strip() else []
        for location in given:
            if not location or ("://" in location and not location.startswith("s3://")):
                raise ValueError(f"{locations!r} is not comma-separated paths or objects (s3://bucket/key), or ''")
        # a local run's steps start in its work directory: a path means what it meant where it was given
        return ",".join(p if "://" in p else str(Path(p).expanduser().resolve()) for p in given)

    @field_validator("search_method")
    @classmethod
    def _method(cls, method: str) -> str:
        # the registry lives in search (torch); names are checked where it is loaded: the plan step
        if not method or not method.replace("_", "").isalnum():
            raise ValueError(f"{method!r} is not a method name")
        return method


@lru_cache(maxsize=1)
def _presets() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(PRESETS_FILE.read_text())


def preset_names() -> tuple[str, ...]:
    """The presets in presets.yaml."""
    return tuple(_presets())


def preset(name: str = DEFAULT_PRESET) -> dict[str, Any]:
    """The cluster defaults with preset `name`'s values over them."""
    presets = _presets()
    if name not in presets:
        raise PipelineArgumentError(f"preset {name!r} is not one of {', '.join(presets)}")
    return {**presets[DEFAULT_PRESET], **presets[name]}


def pipeline_params(values: Mapping[str, Any] | None = None, *, preset_name: str = DEFAULT_PRESET) -> PipelineParams:
    """The preset's values with `values` over them, validated (a PipelineArgumentError names the argument)."""
    merged = {**preset(preset_name), **(values or {})}
    try:
        return PipelineParams.model_validate(merged)
    except ValidationError as err:
        unknown = [str(e["loc"][0]) for e in err.errors() if e["type"] == "extra_forbidden"]
        if unknown:
            raise PipelineArgumentError(
                f"pipeline argument '{unknown[0]}' is unknown; parameters are: {', '.join(PipelineParams.model_fields)}"
            ) from None
        message = describe_validation_error(err).replace("field '", "pipeline argument '")
        raise PipelineArgumentError(message) from None


DEFAULTS = pipeline_params()
