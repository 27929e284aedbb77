"""The plan registry: a user's model's plans versioned in MLflow like cost models, `@champion` gated on measurement.

One registered model per production task, `shardwise-plan-<task name>`. A version's files (a directory, the run's
`plan/` artifacts): `plan.json` (shardwise's plan), `task.json` (the production task it was planned for),
`figures.json` (what it measured beside the champion and TorchRec's planner's plan, in one session) and, where
TorchRec's planner made it, `torchrec_plan.json` (what TorchRec's `PlanLoader` returns: `torchrec.plan_loader`).
The version's tags hold the figures, the task's fingerprint and the cost model that planned it; the gate
(`promotion.promote`) moves `@champion` only where the plan measured faster than the champion by more than the
session's noise, and says why on the version either way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardwise.errors import ShardwiseError
from shardwise.search import Plan, load_plan, save_plan
from shardwise.workload import ShardingTask, load_task

from .mlflow import MlflowService
from .mlflow_registry import MODELS_URI
from .promotion import Promotion

PLAN_EXPERIMENT = "shardwise-plans"
#: lower is better: the plan's slowest device, measured (forward + backward + all-to-all ms)
PLAN_METRIC = "measured_max_cost_ms"
PLAN_PATH = "plan"  # the version's files as run artifacts (`runs:/<id>/plan`)
PLAN_FILE, TASK_FILE, FIGURES_FILE, TORCHREC_FILE = "plan.json", "task.json", "figures.json", "torchrec_plan.json"


def plan_name(task_name: str) -> str:
    """Registry name of the plans of one production task."""
    return f"shardwise-plan-{task_name}"


@dataclass(frozen=True)
class RegisteredPlan:
    """A registered plan version's files, read."""

    name: str
    version: str | None
    plan: Plan
    task: ShardingTask
    figures: dict[str, Any]
    torchrec: dict[str, Any] | None
    directory: Path


def task_digest(task_path: Path) -> str:
    """A short digest of a task file's tables and devices (a version's tag: which inputs the plan is valid for)."""
    doc = json.loads(task_path.read_text())
    keep = {k: doc.get(k) for k in ("num_devices", "device_memory_bytes", "batch_size", "tables", "torchrec")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def write_plan_files(directory: Path, plan: Plan, task_path: Path, figures: Mapping[str, Any],
                     torchrec: Mapping[str, Any] | None) -> Path:
    """A version's files in `directory` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    save_plan(plan, directory / PLAN_FILE)
    (directory / TASK_FILE).write_bytes(task_path.read_bytes())
    (directory / FIGURES_FILE).write_text(json.dumps(dict(figures), indent=1) + "\n")
    if torchrec is not None:
        (directory / TORCHREC_FILE).write_text(json.dumps(dict(torchrec), indent=1) + "\n")
    return directory


def read_plan_files(directory: Path, name: str = "", version: str | None = None) -> RegisteredPlan:
    """A version's files, read; refused in one line where one is missing."""
    for required in (PLAN_FILE, TASK_FILE):
        if not (directory / required).is_file():
            raise ShardwiseError(f"{directory}: no {required}: not a registered plan's files")
    figures = directory / FIGURES_FILE
    torchrec = directory / TORCHREC_FILE
    return RegisteredPlan(
        name=name, version=version, plan=load_plan(directory / PLAN_FILE), task=load_task(directory / TASK_FILE),
        figures=json.loads(figures.read_text()) if figures.is_file() else {},
        torchrec=json.loads(torchrec.read_text()) if torchrec.is_file() else None, directory=directory)


def load_registered_plan(uri: str | Path, *, tracking_uri: str | None = None,
                         service: MlflowService | None = None) -> RegisteredPlan:
    """The plan at "models:/shardwise-plan-<task>@<alias>", "models:/<name>/<version>" or a directory of its files,
    read through the local registry cache (a registered version downloads once per machine)."""
    service = service or MlflowService(tracking_uri)
    uri = str(uri)
    name, version = _name_and_version(service, uri)
    # the version the alias named, read as that version: the files and the version they are labelled with agree
    # even where another run moves the alias meanwhile
    at = f"models:/{name}/{version}" if version is not None else uri
    return service.load(at, lambda root: read_plan_files(_files_dir(root), name, version))


def read_registered_plan(uri: str, *, tracking_uri: str | None = None) -> Plan:
    """The shardwise plan registered at `uri` (what `shardwise.search.load_plan` reads for a models:/ URI)."""
    return load_registered_plan(uri, tracking_uri=tracking_uri).plan


def _name_and_version(service: MlflowService, uri: str) -> tuple[str, str | None]:
    """The registered name and version `uri` names (the version an alias points at; None for a directory)."""
    match = MODELS_URI.match(uri)
    if match is None or (match["alias"] is None and match["version"] is None):
        return "", None
    if match["version"] is not None:
        return match["name"], match["version"]
    return match["name"], service.registered_version(match["name"], alias=match["alias"]).version


def _files_dir(root: Path) -> Path:
    """The directory holding plan.json: the version's root, or its `plan/` folder."""
    for candidate in (root, root / PLAN_PATH):
        if (candidate / PLAN_FILE).is_file():
            return candidate
    return root


def register_plan(
    service: MlflowService,
    task_name: str,
    files: Path,
    *,
    measured_ms: float,
    champion_ms: Callable[[str], float | None],
    min_gain: float,
    tags: Mapping[str, str],
    params: Mapping[str, Any],
    metrics: Mapping[str, float],
) -> Promotion:
    """Log `files` (`write_plan_files`) as a run, register them as a new version of `shardwise-plan-<task_name>`
    with `tags`, and gate `champion` on `measured_ms` against `champion_ms(models:/<name>/<version>)` (the champion
    measured in the same session as the plan, in its units; None where not comparable)."""
    run_id = service.log_run(experiment=PLAN_EXPERIMENT, run_name=f"plan-{task_name}", params=params,
                             metrics=metrics, artifacts_dir=files, artifact_path=PLAN_PATH)
    name = plan_name(task_name)
    version = service.register_version(name, f"{service.artifact_uri(run_id)}/{PLAN_PATH}", run_id,
                                       description=f"shardwise plans of production task {task_name!r}",
                                       tags=tags)
    return service.promote(name, version, metric=PLAN_METRIC, new_value=measured_ms, champion_value=champion_ms,
                           min_gain=min_gain)
